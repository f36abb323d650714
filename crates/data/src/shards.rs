//! Datasets stored on disk as shards: safetensors or `.npy` files, memory-mapped, described by
//! a `kiln-dataset.json` manifest in the dataset's directory.
//!
//! A sample's target is a class label, a tensor of classes (a segmentation mask) or a tensor of
//! real values (regression, multi-label), of one fixed shape; version-1 manifests (class labels
//! only, under `labels`) are still read. Opening a dataset checks every shard against the
//! manifest (present, complete, same element type and sample shape, classes in range, values
//! finite, integer ids exact in `f32`) and names the file and sample at fault; reading a sample
//! then copies its bytes from the page cache with positioned reads (`f32` rows straight into
//! the batch buffer, other types converted on the way), so an epoch's reads never pile up in
//! the process's resident memory.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::dataset::check_batch_slots;
use crate::target::{not_labels, slot_mismatch, unravel};
use crate::{DType, DataError, Dataset, TargetSlot, TargetSpec, npy};

/// The manifest's file name inside a dataset directory.
pub const MANIFEST_FILE: &str = "kiln-dataset.json";
/// The manifest's `format` value.
pub const MANIFEST_FORMAT: &str = "kiln-dataset";
/// The manifest version this build writes; it reads every version from 1 up to this one.
pub const MANIFEST_VERSION: u32 = 2;
/// The features' tensor name in a safetensors shard.
pub const FEATURES_TENSOR: &str = "features";
/// The targets' tensor name in a safetensors shard (version 2 on).
pub const TARGETS_TENSOR: &str = "targets";
/// The labels' tensor name in a safetensors shard of a version-1 dataset.
pub const LABELS_TENSOR: &str = "labels";
pub use crate::target::MAX_EXACT_ID;

/// A dataset directory's description of itself.
///
/// In the file (version 2): `format`, `version`, `samples`, `features`, `target`, `shards`
/// (each `{features, targets, samples}`); a version-1 file has `labels` (`{dtype, classes,
/// class_names}`) instead of `target`, and shards with `labels`, and is read as one class label
/// per sample. A manifest is written back in the layout of its own version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawManifest", into = "RawManifest")]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// The file's version, 1 to [`MANIFEST_VERSION`].
    pub version: u32,
    /// Samples across all shards.
    pub samples: usize,
    pub features: FeatureSpec,
    /// What each sample's target is.
    pub target: StoredTarget,
    pub shards: Vec<ShardEntry>,
}

/// Element type and per-sample shape of the features.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSpec {
    pub dtype: DType,
    /// Shape of one sample (without the leading sample dimension).
    pub shape: Vec<usize>,
    /// The features are integer ids (token ids) that reach the model as `int64`; needs an
    /// integer `dtype`, and every value within ±[`MAX_EXACT_ID`]. Integer features without it
    /// (`u8` pixels) are numbers, read as `f32`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ids: bool,
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

/// A dataset's target as the manifest records it: the task, the stored element type, the
/// per-sample shape, and for class targets the class count (and names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredTarget {
    pub task: Task,
    /// Integer for class targets, floating-point for values.
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
    /// The record of targets `spec` stored as `dtype`.
    pub fn new(spec: &TargetSpec, dtype: DType, class_names: Option<Vec<String>>) -> Self {
        Self {
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
                 `classes`, value targets a floating-point type (f32, f16, bf16, f64)",
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

/// One shard: where its features and targets are (paths relative to the manifest; both may be
/// the same safetensors file) and how many samples it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardEntry {
    pub features: String,
    /// The targets' file (a version-1 manifest's `labels`).
    pub targets: String,
    pub samples: usize,
}

/// The manifest as the file holds it, in either version's layout.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    format: String,
    version: u32,
    samples: usize,
    features: FeatureSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<LabelSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<StoredTarget>,
    shards: Vec<RawShard>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShard {
    features: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    targets: Option<String>,
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
        let v1 = match raw.version {
            1 => true,
            v if (2..=MANIFEST_VERSION).contains(&v) => false,
            v => {
                return Err(format!(
                    "`version` is {v}, this kiln reads versions 1 to {MANIFEST_VERSION}"
                ));
            }
        };
        let target = match (v1, raw.labels, raw.target) {
            (true, Some(l), None) => StoredTarget {
                task: Task::Classification,
                dtype: l.dtype,
                shape: vec![],
                classes: Some(l.classes),
                class_names: l.class_names,
            },
            (false, None, Some(t)) => t,
            (true, ..) => return Err("a version-1 manifest has `labels` (and no `target`)".into()),
            (false, ..) => return Err("a version-2 manifest has `target` (and no `labels`)".into()),
        };
        let key = if v1 { "labels" } else { "targets" };
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
                match (wanted, other) {
                    (Some(targets), None) => Ok(ShardEntry {
                        features: s.features,
                        targets,
                        samples: s.samples,
                    }),
                    _ => Err(format!(
                        "`shards[{k}]` needs `{key}` (and no other target file) besides \
                         `features`"
                    )),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Manifest {
            format: raw.format,
            version: raw.version,
            samples: raw.samples,
            features: raw.features,
            target,
            shards,
        })
    }
}

impl From<Manifest> for RawManifest {
    fn from(m: Manifest) -> Self {
        let v1 = m.version == 1 && m.target.task == Task::Classification;
        let (labels, target) = match (v1, m.target.classes) {
            (true, Some(classes)) => (
                Some(LabelSpec {
                    dtype: m.target.dtype,
                    classes,
                    class_names: m.target.class_names,
                }),
                None,
            ),
            _ => (None, Some(m.target)),
        };
        let shards = m
            .shards
            .into_iter()
            .map(|s| RawShard {
                features: s.features,
                labels: v1.then(|| s.targets.clone()),
                targets: (!v1).then_some(s.targets),
                samples: s.samples,
            })
            .collect();
        RawManifest {
            format: m.format,
            version: m.version,
            samples: m.samples,
            features: m.features,
            labels,
            target,
            shards,
        }
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

    fn check(&self) -> Result<(), String> {
        if self.features.shape.contains(&0) {
            return Err(format!(
                "`features.shape` {:?} has a zero dimension",
                self.features.shape
            ));
        }
        if self.features.ids && !self.features.dtype.is_integer() {
            return Err(format!(
                "`features.ids` is true but `features.dtype` is {}: integer ids need an \
                 integer type (u8, i8, i16, i32, i64)",
                self.features.dtype
            ));
        }
        let key = if self.version == 1 {
            "labels"
        } else {
            "target"
        };
        if let Some(problem) = self.target.problem(key) {
            return Err(problem);
        }
        let total: usize = self.shards.iter().map(|s| s.samples).sum();
        if total != self.samples {
            return Err(format!(
                "`samples` is {} but the shards hold {total} samples together",
                self.samples
            ));
        }
        Ok(())
    }

    /// The name of the targets' tensor in this version's safetensors shards.
    pub fn targets_tensor(&self) -> &'static str {
        if self.version == 1 {
            LABELS_TENSOR
        } else {
            TARGETS_TENSOR
        }
    }

    /// Writes the manifest as `dir/kiln-dataset.json`.
    pub(crate) fn write(&self, dir: &Path) -> Result<(), DataError> {
        let path = dir.join(MANIFEST_FILE);
        let mut text = serde_json::to_string_pretty(self)
            .map_err(|e| DataError::file(&path, format!("cannot encode the manifest: {e}")))?;
        text.push('\n');
        std::fs::write(&path, text)
            .map_err(|e| DataError::file(&path, format!("cannot write: {e}")))
    }
}

/// A C-order array inside a memory-mapped file.
#[derive(Debug, Clone)]
pub(crate) struct MappedArray {
    map: Arc<Mmap>,
    /// The mapped file, for positioned reads of rows ([`MappedArray::read_row`]).
    file: Option<Arc<File>>,
    offset: usize,
    pub dtype: DType,
    /// Full shape, the sample dimension first.
    pub shape: Vec<usize>,
    row_bytes: usize,
}

impl MappedArray {
    /// The bytes of rows `start..end`.
    pub fn rows(&self, start: usize, end: usize) -> &[u8] {
        &self.map[self.offset + start * self.row_bytes..self.offset + end * self.row_bytes]
    }

    /// The bytes of row `i`.
    pub fn row(&self, i: usize) -> &[u8] {
        self.rows(i, i + 1)
    }

    /// Samples in the array (its first dimension).
    pub fn samples(&self) -> usize {
        self.shape[0]
    }

    /// Every element as an integer, in order (`-1` for a floating-point array, which no valid
    /// label is).
    pub fn integers(&self) -> impl Iterator<Item = i64> + '_ {
        let size = self.dtype.size();
        let numel: usize = self.shape.iter().product();
        self.map[self.offset..self.offset + numel * size]
            .chunks_exact(size)
            .map(|b| self.dtype.to_i64(b).unwrap_or(-1))
    }

    /// Opens `path`, the mapped file, for [`MappedArray::read_row`] (once per file: `files`
    /// holds those already open). Where it cannot be opened (the process may open no more
    /// files: a dataset of very many shards), its rows are read through the map instead.
    fn with_file(mut self, path: &Path, files: &mut HashMap<PathBuf, Option<Arc<File>>>) -> Self {
        let file = files
            .entry(path.to_owned())
            .or_insert_with(|| File::open(path).ok().map(Arc::new));
        self.file = file.clone();
        self
    }

    /// Copies the bytes of rows `start..end` into `out` with one positioned read of the file
    /// (from the page cache): none of its pages is mapped into the process, so an epoch's
    /// reads neither pile up in resident memory nor cost unmapping afterwards. Without the
    /// file, from the map.
    pub fn read_rows(&self, start: usize, end: usize, out: &mut [u8]) -> std::io::Result<()> {
        #[cfg(unix)]
        if let Some(file) = &self.file {
            use std::os::unix::fs::FileExt;
            return file.read_exact_at(out, (self.offset + start * self.row_bytes) as u64);
        }
        out.copy_from_slice(self.rows(start, end));
        Ok(())
    }

    fn new(map: Arc<Mmap>, offset: usize, dtype: DType, shape: Vec<usize>) -> Self {
        let row_bytes = shape.iter().skip(1).product::<usize>() * dtype.size();
        Self {
            map,
            file: None,
            offset,
            dtype,
            shape,
            row_bytes,
        }
    }
}

/// Maps a whole file read-only.
pub(crate) fn map_file(path: &Path) -> Result<Arc<Mmap>, DataError> {
    let file = File::open(path).map_err(|e| {
        let what = if e.kind() == std::io::ErrorKind::NotFound {
            "missing shard: the file does not exist".to_owned()
        } else {
            format!("cannot open: {e}")
        };
        DataError::file(path, what)
    })?;
    // SAFETY: the map is read-only; like every memory-mapped reader (numpy, safetensors), we
    // rely on nobody truncating or rewriting a dataset's files while it is open.
    let map = unsafe { Mmap::map(&file) }
        .map_err(|e| DataError::file(path, format!("cannot memory-map: {e}")))?;
    Ok(Arc::new(map))
}

/// The array in a `.npy` file.
pub(crate) fn open_npy(path: &Path, map: Arc<Mmap>) -> Result<MappedArray, DataError> {
    let header = npy::parse_header(&map).map_err(|m| DataError::file(path, m))?;
    let bytes = header.shape.iter().product::<usize>() * header.dtype.size();
    let have = map.len().saturating_sub(header.data_offset);
    if have < bytes {
        return Err(DataError::file(
            path,
            format!(
                "truncated: its header declares {:?} {} ({bytes} bytes of data) but the file \
                 holds only {have}",
                header.shape, header.dtype
            ),
        ));
    }
    if header.shape.is_empty() {
        return Err(DataError::file(
            path,
            "holds a scalar, expected an array with a sample dimension",
        ));
    }
    Ok(MappedArray::new(
        map,
        header.data_offset,
        header.dtype,
        header.shape,
    ))
}

/// The tensor `name` in a safetensors file.
pub(crate) fn open_safetensors(
    path: &Path,
    map: Arc<Mmap>,
    name: &str,
) -> Result<MappedArray, DataError> {
    let (header_len, metadata) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| {
        let why = match e {
            safetensors::SafeTensorError::MetadataIncompleteBuffer => format!(
                "truncated or corrupt: the file is {} bytes, not what its header declares",
                map.len()
            ),
            safetensors::SafeTensorError::InvalidHeaderLength
            | safetensors::SafeTensorError::HeaderTooSmall => {
                "truncated or not a safetensors file: its header is cut off".to_owned()
            }
            other => format!("not a valid safetensors file: {other}"),
        };
        DataError::file(path, why)
    })?;
    let info = metadata.info(name).ok_or_else(|| {
        let mut names: Vec<_> = metadata.tensors().into_keys().collect();
        names.sort();
        DataError::file(
            path,
            format!("has no tensor `{name}` (it holds: {})", names.join(", ")),
        )
    })?;
    let dtype = DType::from_safetensors(info.dtype).ok_or_else(|| {
        DataError::file(
            path,
            format!(
                "tensor `{name}` has element type {:?}, expected one of {}",
                info.dtype,
                DType::names()
            ),
        )
    })?;
    if info.shape.is_empty() {
        return Err(DataError::file(
            path,
            format!("tensor `{name}` is a scalar, expected a sample dimension"),
        ));
    }
    Ok(MappedArray::new(
        map,
        8 + header_len + info.data_offsets.0,
        dtype,
        info.shape.clone(),
    ))
}

/// Opens the array in `path` (a `.npy` file, or tensor `tensor` of a `.safetensors` file).
pub(crate) fn open_array(
    path: &Path,
    tensor: &str,
    maps: &mut HashMap<PathBuf, Arc<Mmap>>,
) -> Result<MappedArray, DataError> {
    let map = match maps.get(path) {
        Some(m) => Arc::clone(m),
        None => {
            let m = map_file(path)?;
            maps.insert(path.to_owned(), Arc::clone(&m));
            m
        }
    };
    match path.extension().and_then(|e| e.to_str()) {
        Some("npy") => open_npy(path, map),
        Some("safetensors") => open_safetensors(path, map, tensor),
        _ => Err(DataError::file(
            path,
            "unknown shard format: expected a .safetensors or .npy file",
        )),
    }
}

#[derive(Debug)]
struct Shard {
    features: MappedArray,
    targets: MappedArray,
}

/// A dataset of memory-mapped shards, opened from its directory's manifest.
#[derive(Debug)]
pub struct ShardedDataset {
    dir: PathBuf,
    manifest: Manifest,
    /// The manifest's target, as the loader reads it.
    spec: TargetSpec,
    shards: Vec<Shard>,
    /// Global index of each shard's first sample, ascending.
    starts: Vec<usize>,
    release_pages: bool,
}

impl ShardedDataset {
    /// Opens the dataset in `dir`, checking every shard against the manifest. Every error names
    /// the file at fault (and the sample, for a bad value).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, DataError> {
        let dir = dir.as_ref().to_owned();
        let manifest = Manifest::read(&dir)?;
        let (mut maps, mut files) = (HashMap::new(), HashMap::new());
        let mut shards = Vec::with_capacity(manifest.shards.len());
        let mut starts = Vec::with_capacity(manifest.shards.len());
        let mut start = 0;
        for entry in &manifest.shards {
            shards.push(open_shard(&dir, &manifest, entry, &mut maps, &mut files)?);
            starts.push(start);
            start += entry.samples;
        }
        Ok(Self {
            dir,
            spec: manifest.target.spec(),
            manifest,
            shards,
            starts,
            release_pages: true,
        })
    }

    /// Whether reading keeps the dataset out of the process's resident memory (the default):
    /// each sample is copied from the page cache with positioned reads, never mapped, so
    /// resident memory stays at the batches in flight instead of growing to the whole dataset
    /// over an epoch. Off, samples are read through the memory map, whose pages stay resident
    /// once touched.
    pub fn with_release_pages(mut self, release: bool) -> Self {
        self.release_pages = release;
        self
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Which shard holds global sample `index`, and where in it.
    fn locate(&self, index: usize) -> Option<(&Shard, usize)> {
        if index >= self.manifest.samples {
            return None;
        }
        let s = self.starts.partition_point(|&start| start <= index) - 1;
        Some((&self.shards[s], index - self.starts[s]))
    }
}

/// Opens one shard's arrays and checks them against the manifest.
fn open_shard(
    dir: &Path,
    manifest: &Manifest,
    entry: &ShardEntry,
    maps: &mut HashMap<PathBuf, Arc<Mmap>>,
    files: &mut HashMap<PathBuf, Option<Arc<File>>>,
) -> Result<Shard, DataError> {
    let fpath = dir.join(&entry.features);
    let tpath = dir.join(&entry.targets);
    let features = open_array(&fpath, FEATURES_TENSOR, maps)?.with_file(&fpath, files);
    let targets = open_array(&tpath, manifest.targets_tensor(), maps)?.with_file(&tpath, files);
    let mut want = vec![entry.samples];
    want.extend_from_slice(&manifest.features.shape);
    check_array(
        &fpath,
        "features",
        &features,
        manifest.features.dtype,
        &want,
    )?;
    let mut want = vec![entry.samples];
    want.extend_from_slice(&manifest.target.shape);
    let what = if manifest.version == 1 {
        "labels"
    } else {
        "targets"
    };
    check_array(&tpath, what, &targets, manifest.target.dtype, &want)?;
    check_targets(&tpath, &targets, &manifest.target)?;
    if manifest.features.ids {
        check_ids(&fpath, &features)?;
    }
    Ok(Shard { features, targets })
}

fn check_array(
    path: &Path,
    what: &str,
    array: &MappedArray,
    dtype: DType,
    shape: &[usize],
) -> Result<(), DataError> {
    if array.dtype != dtype {
        return Err(DataError::file(
            path,
            format!(
                "{what} are {}, but the manifest (and the other shards) say {dtype}",
                array.dtype
            ),
        ));
    }
    if array.shape != shape {
        return Err(DataError::file(
            path,
            format!(
                "{what} have shape {:?}, but the manifest says {shape:?} for this shard",
                array.shape
            ),
        ));
    }
    Ok(())
}

/// " at [r, c]" for element `j` of a non-scalar sample shape, "" for a scalar.
fn position(j: usize, shape: &[usize]) -> String {
    if shape.is_empty() {
        String::new()
    } else {
        format!(" at {:?}", unravel(j, shape))
    }
}

/// Checks an array of targets `[samples, target.shape…]`: classes within `0..classes`, values
/// finite in `f32`. Errors name `path` and the sample (counted within the file).
pub(crate) fn check_targets(
    path: &Path,
    array: &MappedArray,
    target: &StoredTarget,
) -> Result<(), DataError> {
    match target.classes {
        Some(classes) => check_classes(path, array, Some(classes), &target.shape),
        None => check_finite(path, array, &target.shape),
    }
}

/// Checks that every class in `array` (`[samples, shape…]`, integer) is non-negative and, with
/// `classes`, below it.
pub(crate) fn check_classes(
    path: &Path,
    array: &MappedArray,
    classes: Option<usize>,
    shape: &[usize],
) -> Result<(), DataError> {
    let per = shape.iter().product::<usize>().max(1);
    let what = if shape.is_empty() { "label" } else { "class" };
    for (i, v) in array.integers().enumerate() {
        let (sample, at) = (i / per, position(i % per, shape));
        if v < 0 {
            return Err(DataError::file(
                path,
                format!("{what} {v}{at} of sample {sample} in this file is negative"),
            ));
        }
        if let Some(classes) = classes
            && v as u64 >= classes as u64
        {
            return Err(DataError::file(
                path,
                format!(
                    "{what} {v}{at} of sample {sample} in this file is outside 0..{classes} (the \
                     dataset's classes)"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that every value of `array` (`[samples, shape…]`) is finite once read as `f32`.
pub(crate) fn check_finite(
    path: &Path,
    array: &MappedArray,
    shape: &[usize],
) -> Result<(), DataError> {
    let mut row = vec![0f32; shape.iter().product()];
    for sample in 0..array.samples() {
        array.dtype.to_f32(array.row(sample), &mut row);
        if let Some(j) = row.iter().position(|v| !v.is_finite()) {
            return Err(DataError::file(
                path,
                format!(
                    "target value {}{} of sample {sample} in this file is not a finite number \
                     (regression targets must be finite in f32)",
                    row[j],
                    position(j, shape)
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that every integer id in `array` (`[samples, …]`) is exact in `f32`.
pub(crate) fn check_ids(path: &Path, array: &MappedArray) -> Result<(), DataError> {
    let shape = &array.shape[1..];
    let per = shape.iter().product::<usize>().max(1);
    for (i, v) in array.integers().enumerate() {
        if v.abs() > MAX_EXACT_ID {
            return Err(DataError::file(
                path,
                format!(
                    "integer feature {v}{} of sample {} in this file is not exact in f32 (ids \
                     must lie within ±{MAX_EXACT_ID})",
                    position(i % per, shape),
                    i / per
                ),
            ));
        }
    }
    Ok(())
}

impl Dataset for ShardedDataset {
    fn len(&self) -> usize {
        self.manifest.samples
    }

    fn sample_shape(&self) -> &[usize] {
        &self.manifest.features.shape
    }

    fn read(&self, index: usize, out: &mut [f32]) -> Result<i64, DataError> {
        if self.manifest.target.task != Task::Classification {
            return Err(not_labels(index, &self.spec));
        }
        let mut label = [0i64];
        self.read_sample(index, out, TargetSlot::Classes(&mut label))?;
        Ok(label[0])
    }

    fn classes(&self) -> Option<usize> {
        self.manifest.target.classes
    }

    fn target(&self) -> TargetSpec {
        self.spec.clone()
    }

    fn integer_features(&self) -> bool {
        self.manifest.features.ids
    }

    fn read_sample(
        &self,
        index: usize,
        features: &mut [f32],
        target: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        let (shard, i) = self
            .locate(index)
            .ok_or_else(|| crate::error::out_of_range(index, self.len()))?;
        if features.len() != self.sample_numel() {
            return Err(DataError::Sample {
                index,
                message: format!(
                    "the feature slot holds {} values, a sample {}",
                    features.len(),
                    self.sample_numel()
                ),
            });
        }
        self.check_slot(index, &target)?;
        read_run(shard, (i, i + 1), self.release_pages, features, target).map_err(|e| {
            DataError::Sample {
                index,
                message: format!("cannot read it from its shard: {e}"),
            }
        })
    }

    /// Reads each run of consecutive indices within a shard with one read (or one copy from
    /// the map) per array, converting the run's elements in one pass.
    fn read_batch(
        &self,
        indices: &[usize],
        features: &mut [f32],
        mut targets: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        let (numel, per) = (self.sample_numel(), self.spec.numel());
        check_batch_slots(indices.len(), (numel, features.len()), (per, targets.len()))?;
        if let Some(&first) = indices.first() {
            self.check_slot(first, &targets.part(0, per))?;
        }
        let mut k = 0;
        while k < indices.len() {
            let index = indices[k];
            let (shard, i) = self
                .locate(index)
                .ok_or_else(|| crate::error::out_of_range(index, self.len()))?;
            let run = indices[k..]
                .iter()
                .enumerate()
                .take_while(|&(n, &j)| j == index + n && i + n < shard.features.samples())
                .count();
            let feature_slot = &mut features[k * numel..(k + run) * numel];
            let target_slot = targets.part(k * per, run * per);
            read_run(
                shard,
                (i, i + run),
                self.release_pages,
                feature_slot,
                target_slot,
            )
            .map_err(|e| DataError::Sample {
                index,
                message: format!(
                    "cannot read it (and the {} after it) from its shard: {e}",
                    run - 1
                ),
            })?;
            k += run;
        }
        Ok(())
    }
}

impl ShardedDataset {
    /// An error unless `target` is one sample's slot of this dataset's kind and size.
    fn check_slot(&self, index: usize, target: &TargetSlot<'_>) -> Result<(), DataError> {
        let per = self.spec.numel();
        // Classes were checked to be integers in range, values finite, when the dataset opened.
        let fits = match target {
            TargetSlot::Classes(out) => self.spec.classes().is_some() && out.len() == per,
            TargetSlot::Values(out) => self.spec.classes().is_none() && out.len() == per,
        };
        if fits {
            Ok(())
        } else {
            Err(slot_mismatch(index, target, &self.spec))
        }
    }
}

thread_local! {
    /// A run's bytes on their way to a conversion (one buffer per loader thread).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows `start..end` of `shard`: the targets into `target`, the features into `features`.
/// `unmapped`: with positioned reads, never mapped (f32 rows straight into `features`, other
/// types through a scratch buffer); else converted straight from the map.
fn read_run(
    shard: &Shard,
    (start, end): (usize, usize),
    unmapped: bool,
    features: &mut [f32],
    target: TargetSlot<'_>,
) -> std::io::Result<()> {
    let (t, f) = (&shard.targets, &shard.features);
    if !unmapped {
        match target {
            TargetSlot::Classes(out) => integers_into(t.dtype, t.rows(start, end), out),
            TargetSlot::Values(out) => t.dtype.to_f32(t.rows(start, end), out),
        }
        f.dtype.to_f32(f.rows(start, end), features);
        return Ok(());
    }
    SCRATCH.with_borrow_mut(|buf| {
        buf.resize(t.row_bytes * (end - start), 0);
        t.read_rows(start, end, buf)?;
        match target {
            TargetSlot::Classes(out) => integers_into(t.dtype, buf, out),
            TargetSlot::Values(out) => t.dtype.to_f32(buf, out),
        }
        if f.dtype == DType::F32 && cfg!(target_endian = "little") {
            return f.read_rows(start, end, bytemuck::cast_slice_mut(features));
        }
        buf.resize(f.row_bytes * (end - start), 0);
        f.read_rows(start, end, buf)?;
        f.dtype.to_f32(buf, features);
        Ok(())
    })
}

/// `bytes`' elements of type `dtype` as integers, into `out` (`-1` for a floating-point type).
fn integers_into(dtype: DType, bytes: &[u8], out: &mut [i64]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(dtype.size())) {
        *o = dtype.to_i64(b).unwrap_or(-1);
    }
}
