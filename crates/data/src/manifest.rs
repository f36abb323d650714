//! The `kiln-dataset.json` manifest: what a prepared dataset's samples hold (named input
//! arrays, each of its own element type and shape, and a target) and which shard files hold
//! them. Version 3 names any number of arrays; versions 1 and 2 (one `features` array and its
//! labels or targets) still open, and are written back in their own layout.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{DType, DataError, TargetSpec};

/// The manifest's file name inside a dataset directory.
pub const MANIFEST_FILE: &str = "kiln-dataset.json";
/// The manifest's `format` value.
pub const MANIFEST_FORMAT: &str = "kiln-dataset";
/// The newest manifest version this build reads and writes; it reads every version from 1.
/// `kiln data prepare` writes the oldest version that holds the dataset: 2 for one array named
/// `features` with a target named `targets`, else 3.
pub const MANIFEST_VERSION: u32 = 3;
/// The one input array of a version-1 or -2 dataset (and its tensor name in a shard).
pub const FEATURES_TENSOR: &str = "features";
/// The target array of a version-2 dataset (and its tensor name in a shard).
pub const TARGETS_TENSOR: &str = "targets";
/// The target array of a version-1 dataset (and its tensor name in a shard).
pub const LABELS_TENSOR: &str = "labels";

/// A dataset directory's description of itself.
///
/// In the file (version 3): `format`, `version`, `samples`, `inputs` (each `{name, dtype,
/// shape}`), `target` (with its `name`) and `shards` (each `{files: {array name: file},
/// samples}`); a safetensors shard holds each array as the tensor of its name. Version 2 has
/// one `features` record instead of `inputs`, an unnamed `target` (`targets`), and shards
/// `{features, targets, samples}`; version 1 has `labels` (`{dtype, classes, class_names}`) for
/// its target and shards with `labels`. In memory every version looks like version 3.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawManifest", into = "RawManifest")]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// The file's version, 1 to [`MANIFEST_VERSION`].
    pub version: u32,
    /// Samples across all shards.
    pub samples: usize,
    /// The arrays a sample gives the model, in order (before version 3, one: `features`).
    pub inputs: Vec<ArraySpec>,
    /// What each sample's target is; its `name` is the target array's.
    pub target: StoredTarget,
    pub shards: Vec<ShardEntry>,
}

/// One named per-sample array: its stored element type and the shape of one sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArraySpec {
    /// Letters, digits and `_`, not starting with a digit: it names a model input.
    pub name: String,
    pub dtype: DType,
    /// Shape of one sample (without the leading sample dimension); `[]` for one value.
    pub shape: Vec<usize>,
    /// Only for a dataset's single features array read as `f32` features: the values are
    /// integer ids (token ids) that reach the model as `int64` (needs an integer `dtype`, every
    /// value within ±[`crate::MAX_EXACT_ID`]). Integer arrays read by name always reach the
    /// model as `int64`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ids: bool,
}

impl ArraySpec {
    /// Elements per sample.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The kind of learning problem a dataset's target makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// One class label per sample.
    Classification,
    /// A tensor of classes per sample (a segmentation mask).
    DenseClassification,
    /// A tensor of real values per sample (regression, multi-label).
    Regression,
}

impl Task {
    /// The task a target spec makes.
    pub fn of(spec: &TargetSpec) -> Self {
        match spec {
            TargetSpec::Classes { shape, .. } if shape.is_empty() => Task::Classification,
            TargetSpec::Classes { .. } => Task::DenseClassification,
            TargetSpec::Values { .. } => Task::Regression,
        }
    }

    /// The manifest's name for the task.
    pub fn name(self) -> &'static str {
        match self {
            Task::Classification => "classification",
            Task::DenseClassification => "dense_classification",
            Task::Regression => "regression",
        }
    }
}

/// A dataset's target as the manifest records it: its array's name, the task, the stored
/// element type, the per-sample shape, and for class targets the class count (and names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredTarget {
    /// The target array's name: in a version-3 file; `targets` (version 2) or `labels`
    /// (version 1) in memory, and absent from their files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub task: Task,
    /// Integer for class targets, floating-point (or boolean) for values.
    pub dtype: DType,
    /// Shape of one sample's target: `[]` for one label or value.
    #[serde(default)]
    pub shape: Vec<usize>,
    /// Class targets lie in `0..classes`; absent for values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<usize>,
    /// Names of the classes, when the source had named labels (index = class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_names: Option<Vec<String>>,
}

impl StoredTarget {
    /// The record of targets `spec` stored as `dtype`, in the array named `name`.
    pub fn new(
        name: &str,
        spec: &TargetSpec,
        dtype: DType,
        class_names: Option<Vec<String>>,
    ) -> Self {
        Self {
            name: Some(name.to_owned()),
            task: Task::of(spec),
            dtype,
            shape: spec.shape().to_vec(),
            classes: spec.classes(),
            class_names,
        }
    }

    /// What the loader reads: classes or `f32` values of [`StoredTarget::shape`].
    pub fn spec(&self) -> TargetSpec {
        match self.classes {
            Some(classes) => TargetSpec::Classes {
                classes,
                shape: self.shape.clone(),
            },
            None => TargetSpec::Values {
                shape: self.shape.clone(),
            },
        }
    }

    /// Elements per sample.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The target array's name (`targets` where none is recorded).
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(TARGETS_TENSOR)
    }

    /// What is wrong with the record, if anything; `key` is its manifest key.
    fn problem(&self, key: &str) -> Option<String> {
        if self.shape.contains(&0) {
            return Some(format!(
                "`{key}.shape` {:?} has a zero dimension",
                self.shape
            ));
        }
        match self.classes {
            Some(_) if !self.dtype.is_integer() => Some(format!(
                "`{key}.dtype` is {}, but class targets need an integer type (u8, i8, i16, i32, \
                 i64)",
                self.dtype
            )),
            None if self.dtype.is_integer() => Some(format!(
                "`{key}.dtype` is {} and there is no `{key}.classes`: class targets need \
                 `classes`, value targets a floating-point type (f32, f16, bf16, f64) or bool",
                self.dtype
            )),
            Some(0) => Some(format!("`{key}.classes` is 0, expected at least 1")),
            _ if self.task != Task::of(&self.spec()) => Some(format!(
                "`{key}.task` is {}, but its classes and shape {:?} make it {}",
                self.task.name(),
                self.shape,
                Task::of(&self.spec()).name()
            )),
            _ => self.names_problem(key),
        }
    }

    fn names_problem(&self, key: &str) -> Option<String> {
        let names = self.class_names.as_ref()?;
        match self.classes {
            Some(classes) if names.len() == classes => None,
            Some(classes) => Some(format!(
                "`{key}.class_names` has {} names but `{key}.classes` is {classes}",
                names.len()
            )),
            None => Some(format!(
                "`{key}.class_names` is given for value targets, which have no classes"
            )),
        }
    }
}

/// A version-1 manifest's labels: element type and class count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelSpec {
    pub dtype: DType,
    /// Labels lie in `0..classes`.
    pub classes: usize,
    /// Names of the classes, when the source had named labels (index = label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_names: Option<Vec<String>>,
}

/// One shard: which file holds each array (paths relative to the manifest; several arrays may
/// share one safetensors file) and how many samples it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardEntry {
    /// Array name (every input's and the target's) to file.
    pub files: BTreeMap<String, String>,
    pub samples: usize,
}

impl ShardEntry {
    /// The file holding array `name`.
    pub fn file(&self, name: &str) -> Option<&str> {
        self.files.get(name).map(String::as_str)
    }
}

/// A version-1 or -2 manifest's features record.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FeatureSpec {
    dtype: DType,
    shape: Vec<usize>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    ids: bool,
}

/// The manifest as the file holds it, in any version's layout.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    format: String,
    version: u32,
    samples: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    features: Option<FeatureSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inputs: Option<Vec<ArraySpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<LabelSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<StoredTarget>,
    shards: Vec<RawShard>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShard {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    features: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    targets: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    files: Option<BTreeMap<String, String>>,
    samples: usize,
}

impl TryFrom<RawManifest> for Manifest {
    type Error = String;

    fn try_from(raw: RawManifest) -> Result<Self, String> {
        if raw.format != MANIFEST_FORMAT {
            return Err(format!(
                "`format` is \"{}\", expected \"{MANIFEST_FORMAT}\"",
                raw.format
            ));
        }
        match raw.version {
            1 | 2 => from_legacy(raw),
            3..=MANIFEST_VERSION => from_current(raw),
            v => Err(format!(
                "`version` is {v}, this kiln reads versions 1 to {MANIFEST_VERSION}"
            )),
        }
    }
}

/// A version-1 or -2 manifest: one `features` array and its `labels` or `targets`.
fn from_legacy(raw: RawManifest) -> Result<Manifest, String> {
    let (v1, version) = (raw.version == 1, raw.version);
    let (Some(features), None) = (raw.features, raw.inputs) else {
        return Err(format!(
            "a version-{version} manifest has `features` (and no `inputs`)"
        ));
    };
    let target = match (v1, raw.labels, raw.target) {
        (true, Some(l), None) => StoredTarget {
            name: Some(LABELS_TENSOR.to_owned()),
            task: Task::Classification,
            dtype: l.dtype,
            shape: vec![],
            classes: Some(l.classes),
            class_names: l.class_names,
        },
        (false, None, Some(t)) if t.name.is_none() => StoredTarget {
            name: Some(TARGETS_TENSOR.to_owned()),
            ..t
        },
        (true, ..) => return Err("a version-1 manifest has `labels` (and no `target`)".into()),
        (false, ..) => {
            return Err(
                "a version-2 manifest has a `target` without a `name` (and no `labels`)".into(),
            );
        }
    };
    let key = if v1 { LABELS_TENSOR } else { TARGETS_TENSOR };
    let shards = raw
        .shards
        .into_iter()
        .enumerate()
        .map(|(k, s)| {
            let (wanted, other) = if v1 {
                (s.labels, s.targets)
            } else {
                (s.targets, s.labels)
            };
            match (s.features, wanted, other, s.files) {
                (Some(features), Some(targets), None, None) => Ok(ShardEntry {
                    files: BTreeMap::from([
                        (FEATURES_TENSOR.to_owned(), features),
                        (key.to_owned(), targets),
                    ]),
                    samples: s.samples,
                }),
                _ => Err(format!(
                    "`shards[{k}]` needs `features` and `{key}` (and no other file)"
                )),
            }
        })
        .collect::<Result<_, _>>()?;
    let inputs = vec![ArraySpec {
        name: FEATURES_TENSOR.to_owned(),
        dtype: features.dtype,
        shape: features.shape,
        ids: features.ids,
    }];
    Ok(Manifest {
        format: raw.format,
        version,
        samples: raw.samples,
        inputs,
        target,
        shards,
    })
}

/// A version-3 manifest: named `inputs`, a named `target`, shards of `files`.
fn from_current(raw: RawManifest) -> Result<Manifest, String> {
    let (Some(inputs), None, None, Some(target)) =
        (raw.inputs, raw.features, raw.labels, raw.target)
    else {
        return Err(format!(
            "a version-{} manifest has `inputs` and `target` (and no `features` or `labels`)",
            raw.version
        ));
    };
    if target.name.is_none() {
        return Err("`target.name` is missing: it names the target array".into());
    }
    let shards = raw
        .shards
        .into_iter()
        .enumerate()
        .map(|(k, s)| match (s.files, s.features, s.labels, s.targets) {
            (Some(files), None, None, None) => Ok(ShardEntry {
                files,
                samples: s.samples,
            }),
            _ => Err(format!(
                "`shards[{k}]` needs `files` (array name to file) and `samples`, nothing else"
            )),
        })
        .collect::<Result<_, _>>()?;
    Ok(Manifest {
        format: raw.format,
        version: raw.version,
        samples: raw.samples,
        inputs,
        target,
        shards,
    })
}

impl From<Manifest> for RawManifest {
    fn from(m: Manifest) -> Self {
        match m.legacy_layout() {
            Some(v1) => legacy_raw(m, v1),
            None => current_raw(m),
        }
    }
}

fn legacy_raw(m: Manifest, v1: bool) -> RawManifest {
    let key = if v1 { LABELS_TENSOR } else { TARGETS_TENSOR };
    let input = m.inputs.into_iter().next();
    let features = input.map(|a| FeatureSpec {
        dtype: a.dtype,
        shape: a.shape,
        ids: a.ids,
    });
    let (labels, target) = match (v1, m.target.classes) {
        (true, Some(classes)) => (
            Some(LabelSpec {
                dtype: m.target.dtype,
                classes,
                class_names: m.target.class_names,
            }),
            None,
        ),
        _ => (
            None,
            Some(StoredTarget {
                name: None,
                ..m.target
            }),
        ),
    };
    let shards = m
        .shards
        .into_iter()
        .map(|mut s| {
            let targets = s.files.remove(key);
            RawShard {
                features: s.files.remove(FEATURES_TENSOR),
                labels: if v1 { targets.clone() } else { None },
                targets: if v1 { None } else { targets },
                files: None,
                samples: s.samples,
            }
        })
        .collect();
    RawManifest {
        format: m.format,
        version: m.version,
        samples: m.samples,
        features,
        inputs: None,
        labels,
        target,
        shards,
    }
}

fn current_raw(m: Manifest) -> RawManifest {
    let shards = m
        .shards
        .into_iter()
        .map(|s| RawShard {
            features: None,
            labels: None,
            targets: None,
            files: Some(s.files),
            samples: s.samples,
        })
        .collect();
    RawManifest {
        format: m.format,
        version: m.version.max(3),
        samples: m.samples,
        features: None,
        inputs: Some(m.inputs),
        labels: None,
        target: Some(m.target),
        shards,
    }
}

impl Manifest {
    /// Reads and checks `dir/kiln-dataset.json` (not the shards).
    pub fn read(dir: &Path) -> Result<Self, DataError> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::NotFound {
                " (a dataset directory holds a kiln-dataset.json manifest; `kiln data prepare` \
                 writes one)"
            } else {
                ""
            };
            DataError::file(&path, format!("cannot read the manifest: {e}{hint}"))
        })?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| DataError::file(&path, format!("not a valid manifest: {e}")))?;
        manifest.check().map_err(|m| DataError::file(&path, m))?;
        Ok(manifest)
    }

    /// The oldest version whose layout holds this dataset: 2 for one input named `features`
    /// and a target named `targets`, 1 for those of a version-1 file, else 3 (and 3 for any
    /// `bool` array, which older versions do not know).
    pub fn oldest_version(&self) -> u32 {
        let bools =
            self.inputs.iter().any(|a| a.dtype == DType::Bool) || self.target.dtype == DType::Bool;
        if bools {
            return 3;
        }
        match self.legacy_layout_for(self.version.min(2)) {
            Some(true) => 1,
            Some(false) => 2,
            None => 3,
        }
    }

    /// The layout to write: `Some(version 1?)` for a version-1 or -2 manifest that fits it.
    fn legacy_layout(&self) -> Option<bool> {
        (self.version <= 2)
            .then(|| self.legacy_layout_for(self.version))
            .flatten()
    }

    fn legacy_layout_for(&self, version: u32) -> Option<bool> {
        let v1 = version == 1 && self.target.task == Task::Classification;
        let key = if v1 { LABELS_TENSOR } else { TARGETS_TENSOR };
        let names = BTreeSet::from([FEATURES_TENSOR, key]);
        let fits = matches!(&self.inputs[..], [a] if a.name == FEATURES_TENSOR)
            && self.target.name() == key
            && self
                .shards
                .iter()
                .all(|s| s.files.keys().map(String::as_str).eq(names.iter().copied()));
        fits.then_some(v1)
    }

    fn check(&self) -> Result<(), String> {
        let legacy = self.version <= 2;
        let inputs_key = if legacy { "features" } else { "inputs" };
        if self.inputs.is_empty() {
            return Err(format!(
                "`{inputs_key}` is empty: a sample needs at least one input array"
            ));
        }
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for (k, a) in self.inputs.iter().enumerate() {
            let key = if legacy {
                "features".to_owned()
            } else {
                format!("inputs[{k}]")
            };
            check_input(&key, a)?;
            claim_name(&mut seen, &a.name, key)?;
        }
        let key = if self.version == 1 {
            "labels"
        } else {
            "target"
        };
        claim_name(&mut seen, self.target.name(), key.to_owned())?;
        if let Some(problem) = self.target.problem(key) {
            return Err(problem);
        }
        let names: Vec<&str> = self.inputs.iter().map(|a| a.name.as_str()).collect();
        self.check_shards(&[&names[..], &[self.target.name()]].concat())
    }

    /// Every shard names a file for each of `names` (every array), and for nothing else.
    fn check_shards(&self, names: &[&str]) -> Result<(), String> {
        let all = names.join(", ");
        for (k, shard) in self.shards.iter().enumerate() {
            if let Some(name) = names.iter().find(|n| shard.file(n).is_none()) {
                return Err(format!(
                    "`shards[{k}].files` has no file for array `{name}` (every shard holds \
                     every array: {all})"
                ));
            }
            if let Some(name) = shard.files.keys().find(|n| !names.contains(&n.as_str())) {
                return Err(format!(
                    "`shards[{k}].files` names `{name}`, which is neither an input nor the \
                     target (the arrays: {all})"
                ));
            }
        }
        // The counts are the file's to claim: their sum must not overflow.
        let total = self
            .shards
            .iter()
            .try_fold(0usize, |sum, s| sum.checked_add(s.samples));
        let Some(total) = total else {
            return Err(format!(
                "the shards' `samples` add up to more than {} samples",
                usize::MAX
            ));
        };
        if total != self.samples {
            return Err(format!(
                "`samples` is {} but the shards hold {total} samples together",
                self.samples
            ));
        }
        Ok(())
    }

    /// Writes the manifest as `dir/kiln-dataset.json`.
    pub(crate) fn write(&self, dir: &Path) -> Result<(), DataError> {
        let path = dir.join(MANIFEST_FILE);
        let mut text = serde_json::to_string_pretty(self)
            .map_err(|e| DataError::file(&path, format!("cannot encode the manifest: {e}")))?;
        text.push('\n');
        std::fs::write(&path, text).map_err(|e| crate::error::write_failed(&path, e))
    }
}

/// What is wrong with input array `a` (manifest key `key`), if anything.
fn check_input(key: &str, a: &ArraySpec) -> Result<(), String> {
    if a.shape.contains(&0) {
        return Err(format!("`{key}.shape` {:?} has a zero dimension", a.shape));
    }
    if a.ids && !a.dtype.is_integer() {
        return Err(format!(
            "`{key}.ids` is true but `{key}.dtype` is {}: integer ids need an integer type \
             (u8, i8, i16, i32, i64)",
            a.dtype
        ));
    }
    Ok(())
}

/// Records `name` as the name of the array at manifest key `key`: an error if it is not a
/// valid array name or already names another array.
fn claim_name(seen: &mut BTreeMap<String, String>, name: &str, key: String) -> Result<(), String> {
    if let Some(problem) = name_problem(name) {
        return Err(format!("`{key}.name` \"{name}\" {problem}"));
    }
    // Unique ignoring case: `.npy` shards are named after their arrays, and some file systems
    // do not tell `x` from `X`.
    let folded = name.to_ascii_lowercase();
    if let Some(other) = seen.get(folded.as_str()) {
        return Err(format!(
            "`{key}.name` \"{name}\" is already the name of `{other}`: array names are unique \
             (ignoring case)"
        ));
    }
    seen.insert(folded, key);
    Ok(())
}

/// Why `name` cannot name an array, if it cannot.
pub(crate) fn name_problem(name: &str) -> Option<&'static str> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    (!(first_ok && rest_ok)).then_some(
        "is not a valid array name: use ASCII letters, digits and `_`, not starting with a digit \
         (it names a model input and, in `.npy` shards, a file)",
    )
}
