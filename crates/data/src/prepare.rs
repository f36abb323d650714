//! Turning CSV or `.npy` files into a sharded dataset directory with its manifest
//! (`kiln data prepare`): one features array and its labels or targets, or any number of named
//! arrays and a named target.
//!
//! The output directory must not exist yet: everything is written into a hidden sibling
//! directory and renamed into place at the end, so an interrupted or failed run leaves nothing
//! half-written and never touches existing files. The shards' size is known before the first
//! is written: a file system without room for them is refused up front ([`NoSpace`]), and one
//! that fills up midway gets the same error once the staged files are removed.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{NO_SPACE_HINT, write_failed};
use crate::manifest::{
    FEATURES_TENSOR, LABELS_TENSOR, MANIFEST_FORMAT, MANIFEST_VERSION, TARGETS_TENSOR, name_problem,
};
use crate::shards::{MappedArray, check_classes, check_finite, check_ids, open_array};
use crate::space::{self, NoSpace};
use crate::{
    ArraySpec, ColumnGroup, CsvDataset, CsvOptions, DType, DataError, Dataset, Manifest,
    ShardEntry, ShardedDataset, StoredTarget, TargetSpec, Targets, npy,
};

/// The file format of the shards written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardFormat {
    /// One `.safetensors` file per shard holding tensors `features` and `targets`.
    #[default]
    Safetensors,
    /// Two `.npy` files per shard.
    Npy,
}

/// Where the data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrepareSource {
    /// A CSV file: feature columns and a label column, or target columns (regression).
    Csv { path: PathBuf, options: CsvOptions },
    /// A features array `[samples, …]` and an integer labels array `[samples]`.
    Npy { features: PathBuf, labels: PathBuf },
    /// A features array `[samples, …]` and a targets array `[samples, …]` of any per-sample
    /// shape, kept in its element type. Integer targets are classes in `0..classes` (by default
    /// the largest class + 1, at least 2): one label, or a class map such as a segmentation
    /// mask; floating-point targets are values (regression, multi-label), which must be finite.
    NpyTargets {
        features: PathBuf,
        targets: PathBuf,
        /// The class count of integer targets; an error for floating-point ones.
        classes: Option<usize>,
    },
    /// Named `.npy` arrays `[samples, …]`, each kept in its element type and per-sample shape
    /// (`[samples]` gives one value per sample), and a named target array as for
    /// [`PrepareSource::NpyTargets`]. Every array holds the same number of samples; names are
    /// letters, digits and `_`, unique.
    Arrays {
        /// Name and file of each input array, in the order the manifest lists them.
        inputs: Vec<(String, PathBuf)>,
        /// Name and file of the target array.
        target: (String, PathBuf),
        /// The class count of integer targets; an error for floating-point ones.
        classes: Option<usize>,
    },
    /// Named groups of a CSV file's columns: each input group one array `[columns]` per row,
    /// `i64` where every value is an integer, else `f32`; the target group classes (integers,
    /// or a single column of names numbered in sorted order) or finite values, `[]` per row
    /// for one column.
    CsvArrays {
        path: PathBuf,
        inputs: Vec<ColumnGroup>,
        target: ColumnGroup,
        /// The class count of integer targets; an error for real ones.
        classes: Option<usize>,
        delimiter: u8,
    },
}

/// How to shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareOptions {
    /// Samples per shard (the last shard may hold fewer).
    pub shard_samples: usize,
    pub format: ShardFormat,
    /// The features are integer ids (token ids) that reach the model as `int64`: they must be
    /// an integer `.npy` array, every value within ±2^24. Off by default: integer features
    /// such as `u8` pixels are numbers.
    pub integer_features: bool,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        Self {
            shard_samples: 65_536,
            format: ShardFormat::Safetensors,
            integer_features: false,
        }
    }
}

/// One array of the source, sample after sample.
struct Part<'a> {
    dtype: DType,
    /// The per-sample shape.
    shape: Vec<usize>,
    /// Bytes of samples `start..end`.
    rows: RowsFn<'a>,
}

/// Bytes of samples `start..end` of an array.
type RowsFn<'a> = Box<dyn Fn(usize, usize) -> Cow<'a, [u8]> + 'a>;

impl<'a> Part<'a> {
    fn mapped(array: &'a MappedArray) -> Self {
        Part {
            dtype: array.dtype,
            shape: array.shape[1..].to_vec(),
            rows: Box::new(move |start, end| Cow::Borrowed(array.rows(start, end))),
        }
    }

    /// The rows of an array read into memory.
    fn owned(g: &'a crate::csv_groups::GroupArray) -> Self {
        let row = g.shape.iter().product::<usize>() * g.dtype.size();
        let bytes = &g.bytes;
        Part {
            dtype: g.dtype,
            shape: g.shape.clone(),
            rows: Box::new(move |s, e| Cow::Borrowed(&bytes[s * row..e * row])),
        }
    }

    fn view(&self, start: usize, end: usize) -> View<'_> {
        let mut shape = vec![end - start];
        shape.extend_from_slice(&self.shape);
        View {
            dtype: self.dtype,
            shape,
            data: (self.rows)(start, end),
        }
    }
}

/// One named input array of the source.
struct Input<'a> {
    name: String,
    part: Part<'a>,
    /// Integer ids read as `f32` features (a single features array only).
    ids: bool,
}

impl<'a> Input<'a> {
    fn features(part: Part<'a>) -> Self {
        Input {
            name: FEATURES_TENSOR.to_owned(),
            part,
            ids: false,
        }
    }
}

/// The source's data, ready to be cut into shards.
struct Source<'a> {
    len: usize,
    inputs: Vec<Input<'a>>,
    targets: Part<'a>,
    /// The target's record, with its array's name.
    target: StoredTarget,
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn i64_bytes(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn csv_source<'a>(csv: &'a CsvDataset) -> Source<'a> {
    let data = csv.in_memory();
    let numel = csv.feature_columns().len();
    let spec = csv.target();
    let per = spec.numel();
    let (dtype, rows): (DType, RowsFn<'a>) = match data.targets() {
        Targets::Classes(v) => (
            DType::I64,
            Box::new(move |s, e| Cow::Owned(i64_bytes(&v[s * per..e * per]))),
        ),
        Targets::Values(v) => (
            DType::F32,
            Box::new(move |s, e| Cow::Owned(f32_bytes(&v[s * per..e * per]))),
        ),
    };
    let class_names = csv.class_names().map(<[String]>::to_vec);
    Source {
        len: csv.len(),
        inputs: vec![Input::features(Part {
            dtype: DType::F32,
            shape: vec![numel],
            rows: Box::new(move |s, e| {
                Cow::Owned(f32_bytes(&data.features()[s * numel..e * numel]))
            }),
        })],
        targets: Part {
            dtype,
            shape: spec.shape().to_vec(),
            rows,
        },
        target: StoredTarget::new(TARGETS_TENSOR, &spec, dtype, class_names),
    }
}

/// Checks a features array: `[samples, …]` with a non-empty sample.
fn check_features(path: &Path, features: &MappedArray) -> Result<(), DataError> {
    if features.shape.len() < 2 || features.shape[1..].contains(&0) {
        return Err(DataError::file(
            path,
            format!(
                "features have shape {:?}, expected [samples, …] with a non-empty sample",
                features.shape
            ),
        ));
    }
    Ok(())
}

/// Checks that `other` holds as many samples as `first`; `what` names its rows.
fn check_count(
    first_path: &Path,
    first: &MappedArray,
    other_path: &Path,
    other: &MappedArray,
    what: &str,
) -> Result<(), DataError> {
    if other.samples() != first.samples() {
        return Err(DataError::file(
            other_path,
            format!(
                "holds {} {what} but {} holds {} samples: every sample needs exactly one",
                other.samples(),
                first_path.display(),
                first.samples()
            ),
        ));
    }
    Ok(())
}

fn npy_source<'a>(
    features_path: &Path,
    features: &'a MappedArray,
    labels_path: &Path,
    labels: &MappedArray,
) -> Result<Source<'a>, DataError> {
    if labels.shape.len() != 1 {
        return Err(DataError::file(
            labels_path,
            format!(
                "labels have shape {:?}, expected one dimension [samples] (targets of another \
                 shape are prepared as targets, not labels)",
                labels.shape
            ),
        ));
    }
    if !labels.dtype.is_integer() {
        return Err(DataError::file(
            labels_path,
            format!(
                "labels are {}, expected an integer type (u8, i8, i16, i32, i64); real-valued \
                 targets are prepared as targets, not labels",
                labels.dtype
            ),
        ));
    }
    check_count(features_path, features, labels_path, labels, "labels")?;
    check_features(features_path, features)?;
    check_classes(labels_path, labels, None, &[])?;
    let values: Vec<i64> = labels.integers().collect();
    let classes = values.iter().max().map_or(0, |m| *m as usize + 1).max(2);
    Ok(Source {
        len: features.samples(),
        inputs: vec![Input::features(Part::mapped(features))],
        targets: Part {
            dtype: DType::I64,
            shape: vec![],
            rows: Box::new(move |s, e| Cow::Owned(i64_bytes(&values[s..e]))),
        },
        target: StoredTarget::new(
            TARGETS_TENSOR,
            &TargetSpec::label(classes),
            DType::I64,
            None,
        ),
    })
}

fn npy_targets_source<'a>(
    features_path: &Path,
    features: &'a MappedArray,
    targets_path: &Path,
    targets: &'a MappedArray,
    classes: Option<usize>,
) -> Result<Source<'a>, DataError> {
    check_count(features_path, features, targets_path, targets, "targets")?;
    check_features(features_path, features)?;
    Ok(Source {
        len: features.samples(),
        inputs: vec![Input::features(Part::mapped(features))],
        targets: Part::mapped(targets),
        target: stored_target(TARGETS_TENSOR, targets_path, targets, classes)?,
    })
}

/// The record of target array `targets` (in `path`), named `name`: integer arrays are classes
/// (checked within `classes`, by default the largest + 1 and at least 2), others finite values.
fn stored_target(
    name: &str,
    targets_path: &Path,
    targets: &MappedArray,
    classes: Option<usize>,
) -> Result<StoredTarget, DataError> {
    let shape = targets.shape[1..].to_vec();
    if shape.contains(&0) {
        return Err(DataError::file(
            targets_path,
            format!(
                "targets have shape {:?}, with an empty sample",
                targets.shape
            ),
        ));
    }
    let spec = if targets.dtype.is_integer() {
        check_classes(targets_path, targets, classes, &shape)?;
        let max = targets.integers().max().unwrap_or(0);
        let classes = classes.unwrap_or((max as usize + 1).max(2));
        TargetSpec::Classes { classes, shape }
    } else if let Some(classes) = classes {
        return Err(DataError::file(
            targets_path,
            format!(
                "holds {} values, which are regression targets, but a class count ({classes}) \
                 was given: class targets are an integer array",
                targets.dtype
            ),
        ));
    } else {
        check_finite(targets_path, targets, &shape)?;
        TargetSpec::Values { shape }
    };
    Ok(StoredTarget::new(name, &spec, targets.dtype, None))
}

/// Named input arrays and a named target, each opened from its file: the same sample count in
/// every one, valid and unique names.
fn arrays_source<'a>(
    inputs: &[(String, PathBuf)],
    arrays: &'a [MappedArray],
    target_entry: &(String, PathBuf),
    target: &'a MappedArray,
    classes: Option<usize>,
) -> Result<Source<'a>, DataError> {
    let (first_path, first) = (&inputs[0].1, &arrays[0]);
    let mut seen = std::collections::BTreeMap::new();
    let (target_name, target_path) = target_entry;
    let named = inputs.iter().chain([target_entry]);
    for ((name, path), array) in named.zip(arrays.iter().chain([target])) {
        if let Some(problem) = name_problem(name) {
            return Err(DataError::file(
                path,
                format!("is given as `{name}`, which {problem}"),
            ));
        }
        if let Some(other) = seen.insert(name.to_ascii_lowercase(), path) {
            return Err(DataError::file(
                path,
                format!(
                    "is given as `{name}`, the name of {} too: array names are unique \
                     (ignoring case)",
                    other.display()
                ),
            ));
        }
        if array.shape[1..].contains(&0) {
            return Err(DataError::file(
                path,
                format!("has shape {:?}, with an empty sample", array.shape),
            ));
        }
        check_count(first_path, first, path, array, "samples")?;
    }
    let inputs = inputs
        .iter()
        .zip(arrays)
        .map(|((name, _), array)| Input {
            name: name.clone(),
            part: Part::mapped(array),
            ids: false,
        })
        .collect();
    Ok(Source {
        len: first.samples(),
        inputs,
        targets: Part::mapped(target),
        target: stored_target(target_name, target_path, target, classes)?,
    })
}

/// Marks `source`'s features as integer ids, after checking that they are.
fn mark_ids(
    source: &mut Source<'_>,
    path: &Path,
    features: Option<&MappedArray>,
) -> Result<(), DataError> {
    let input = &mut source.inputs[0];
    match features {
        Some(array) if array.dtype.is_integer() => check_ids(path, array)?,
        _ => {
            return Err(DataError::file(
                path,
                format!(
                    "`integer_features` needs an integer features array (u8, i8, i16, i32, \
                     i64), but this file's features are {}",
                    input.part.dtype
                ),
            ));
        }
    }
    input.ids = true;
    Ok(())
}

struct View<'a> {
    dtype: DType,
    shape: Vec<usize>,
    data: Cow<'a, [u8]>,
}

impl safetensors::View for &View<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype.to_safetensors()
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes a `.npy` file holding `data` (C order, little-endian) as an array of `dtype` and
/// `shape`.
pub fn write_npy(path: &Path, dtype: DType, shape: &[usize], data: &[u8]) -> Result<(), DataError> {
    let want = shape.iter().product::<usize>() * dtype.size();
    if data.len() != want {
        return Err(DataError::file(
            path,
            format!(
                "{} bytes given for {shape:?} {dtype} ({want} bytes)",
                data.len()
            ),
        ));
    }
    let mut bytes = npy::header(dtype, shape).map_err(|m| DataError::file(path, m))?;
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).map_err(|e| write_failed(path, e))
}

/// Writes shard `k` (samples `start..end`) into `dir`: every array in one safetensors file,
/// as the tensor of its name, or one `.npy` file per array.
fn write_shard(
    source: &Source<'_>,
    dir: &Path,
    format: ShardFormat,
    k: usize,
    (start, end): (usize, usize),
) -> Result<ShardEntry, DataError> {
    let mut views: Vec<(&str, View<'_>)> = source
        .inputs
        .iter()
        .map(|i| (i.name.as_str(), i.part.view(start, end)))
        .collect();
    views.push((source.target.name(), source.targets.view(start, end)));
    let mut files = std::collections::BTreeMap::new();
    match format {
        ShardFormat::Safetensors => {
            let name = format!("shard-{k:05}.safetensors");
            let path = dir.join(&name);
            safetensors::serialize_to_file(views.iter().map(|(n, v)| (*n, v)), None, &path)
                .map_err(|e| match e {
                    safetensors::SafeTensorError::IoError(e) => write_failed(&path, e),
                    e => DataError::file(&path, format!("cannot write: {e}")),
                })?;
            for (array, _) in &views {
                files.insert((*array).to_owned(), name.clone());
            }
        }
        ShardFormat::Npy => {
            for (array, view) in &views {
                let name = format!("shard-{k:05}.{array}.npy");
                write_npy(&dir.join(&name), view.dtype, &view.shape, &view.data)?;
                files.insert((*array).to_owned(), name);
            }
        }
    }
    Ok(ShardEntry {
        files,
        samples: end - start,
    })
}

/// Room for a manifest's text: its fixed part, and each shard's entry.
const MANIFEST_BYTES: u64 = 4096;
const MANIFEST_BYTES_PER_SHARD: u64 = 256;

/// The length of each file [`write_shards`] writes for `source` (the manifest's a generous
/// guess): what must fit before the first shard is written.
fn file_lengths(source: &Source<'_>, options: &PrepareOptions) -> Vec<u64> {
    let parts: Vec<(&str, &Part<'_>)> = source
        .inputs
        .iter()
        .map(|i| (i.name.as_str(), &i.part))
        .chain([(source.target.name(), &source.targets)])
        .collect();
    let row = |p: &Part<'_>| (p.shape.iter().product::<usize>() * p.dtype.size()) as u64;
    let per_shard = source.len.div_ceil(options.shard_samples.max(1)) as u64;
    let mut files = vec![MANIFEST_BYTES + MANIFEST_BYTES_PER_SHARD * per_shard];
    let mut start = 0;
    while start < source.len {
        let n = (source.len.min(start + options.shard_samples) - start) as u64;
        // A header: the safetensors JSON (about 128 bytes a tensor), or a .npy's 128 bytes.
        let header = |name: &str| 128 + name.len() as u64;
        match options.format {
            ShardFormat::Safetensors => files.push(
                8 + parts
                    .iter()
                    .map(|(name, p)| header(name) + n * row(p))
                    .sum::<u64>(),
            ),
            ShardFormat::Npy => files.extend(parts.iter().map(|(_, p)| 128 + n * row(p))),
        }
        start += options.shard_samples.max(1);
    }
    files
}

/// Writes `source` as shards and its manifest into `dir`, after checking that they fit; a
/// file system that fills up midway is [`NoSpace`] with what the shards need.
fn write_shards(
    source: &Source<'_>,
    dir: &Path,
    options: &PrepareOptions,
) -> Result<Manifest, DataError> {
    let files = file_lengths(source, options);
    NoSpace::check(dir, &files, "the dataset", NO_SPACE_HINT)?;
    write_shards_unchecked(source, dir, options).map_err(|e| match e {
        DataError::NoSpace(full) => DataError::NoSpace(NoSpace {
            needed: space::free(dir).map_or(0, |s| space::needed(files, s.block)),
            ..full
        }),
        e => e,
    })
}

fn write_shards_unchecked(
    source: &Source<'_>,
    dir: &Path,
    options: &PrepareOptions,
) -> Result<Manifest, DataError> {
    let mut shards = Vec::new();
    let mut start = 0;
    while start < source.len {
        let end = (start + options.shard_samples).min(source.len);
        shards.push(write_shard(
            source,
            dir,
            options.format,
            shards.len(),
            (start, end),
        )?);
        start = end;
    }
    let inputs = source
        .inputs
        .iter()
        .map(|i| ArraySpec {
            name: i.name.clone(),
            dtype: i.part.dtype,
            shape: i.part.shape.clone(),
            ids: i.ids,
        })
        .collect();
    let mut manifest = Manifest {
        format: MANIFEST_FORMAT.to_owned(),
        version: MANIFEST_VERSION,
        samples: source.len,
        inputs,
        target: source.target.clone(),
        shards,
    };
    manifest.version = manifest.oldest_version();
    manifest.write(dir)?;
    Ok(manifest)
}

/// Reads `source` and writes it as shards into `dir`.
fn write_source(
    source: &PrepareSource,
    dir: &Path,
    options: &PrepareOptions,
) -> Result<Manifest, DataError> {
    let mut maps = HashMap::new();
    match source {
        PrepareSource::Csv { path, options: csv } => {
            let csv = CsvDataset::open(path, csv)?;
            let mut source = csv_source(&csv);
            if options.integer_features {
                mark_ids(&mut source, path, None)?;
            }
            write_shards(&source, dir, options)
        }
        PrepareSource::Npy { features, labels } => {
            let f = open_array(features, FEATURES_TENSOR, &mut maps)?;
            let l = open_array(labels, LABELS_TENSOR, &mut maps)?;
            let mut source = npy_source(features, &f, labels, &l)?;
            if options.integer_features {
                mark_ids(&mut source, features, Some(&f))?;
            }
            write_shards(&source, dir, options)
        }
        PrepareSource::NpyTargets {
            features,
            targets,
            classes,
        } => {
            let f = open_array(features, FEATURES_TENSOR, &mut maps)?;
            let t = open_array(targets, TARGETS_TENSOR, &mut maps)?;
            let mut source = npy_targets_source(features, &f, targets, &t, *classes)?;
            if options.integer_features {
                mark_ids(&mut source, features, Some(&f))?;
            }
            write_shards(&source, dir, options)
        }
        PrepareSource::Arrays {
            inputs,
            target,
            classes,
        } => write_arrays(inputs, target, *classes, dir, options, &mut maps),
        PrepareSource::CsvArrays {
            path,
            inputs,
            target,
            classes,
            delimiter,
        } => {
            let groups =
                crate::csv_groups::read_groups(path, *delimiter, inputs, target, *classes)?;
            write_csv_groups(path, &groups, dir, options)
        }
    }
}

/// [`PrepareSource::CsvArrays`], read, into `dir`.
fn write_csv_groups(
    path: &Path,
    groups: &crate::csv_groups::CsvGroups,
    dir: &Path,
    options: &PrepareOptions,
) -> Result<Manifest, DataError> {
    let mut names = std::collections::BTreeSet::new();
    for name in groups
        .inputs
        .iter()
        .chain([&groups.target])
        .map(|g| &g.name)
    {
        if let Some(problem) = name_problem(name) {
            return Err(DataError::file(path, format!("array `{name}` {problem}")));
        }
        if !names.insert(name.to_ascii_lowercase()) {
            return Err(DataError::file(
                path,
                format!("array `{name}` is given twice: array names are unique (ignoring case)"),
            ));
        }
    }
    if options.integer_features {
        return Err(DataError::InvalidConfig {
            key: "integer_features",
            value: "true with CSV column groups".to_owned(),
            expected: "false: integer columns are stored as i64 and reach the model as int64"
                .to_owned(),
        });
    }
    let source = Source {
        len: groups.rows,
        inputs: groups
            .inputs
            .iter()
            .map(|g| Input {
                name: g.name.clone(),
                part: Part::owned(g),
                ids: false,
            })
            .collect(),
        targets: Part::owned(&groups.target),
        target: groups.record.clone(),
    };
    write_shards(&source, dir, options)
}

/// [`PrepareSource::Arrays`] into `dir`.
fn write_arrays(
    inputs: &[(String, PathBuf)],
    target: &(String, PathBuf),
    classes: Option<usize>,
    dir: &Path,
    options: &PrepareOptions,
    maps: &mut HashMap<PathBuf, std::sync::Arc<memmap2::Mmap>>,
) -> Result<Manifest, DataError> {
    if inputs.is_empty() {
        return Err(DataError::file(
            &target.1,
            "is the target, but no input array was given: a sample needs at least one",
        ));
    }
    let arrays = inputs
        .iter()
        .map(|(name, path)| open_array(path, name, maps))
        .collect::<Result<Vec<_>, _>>()?;
    let t = open_array(&target.1, &target.0, maps)?;
    let mut source = arrays_source(inputs, &arrays, target, &t, classes)?;
    if options.integer_features {
        match &arrays[..] {
            [one] => mark_ids(&mut source, &inputs[0].1, Some(one))?,
            _ => {
                return Err(DataError::InvalidConfig {
                    key: "integer_features",
                    value: format!("true with {} input arrays", inputs.len()),
                    expected: "one features array: named integer arrays always reach the model \
                               as int64"
                        .to_owned(),
                });
            }
        }
    }
    write_shards(&source, dir, options)
}

/// Writes `source` as a sharded dataset into `out`, which must not exist yet, and checks the
/// result by opening it. Returns the manifest written. Errors name the input file (and the
/// sample) at fault.
pub fn prepare(
    source: &PrepareSource,
    out: &Path,
    options: &PrepareOptions,
) -> Result<Manifest, DataError> {
    if options.shard_samples == 0 {
        return Err(DataError::InvalidConfig {
            key: "shard_samples",
            value: "0".to_owned(),
            expected: "at least 1".to_owned(),
        });
    }
    write_new_dir(out, |staging| {
        let manifest = write_source(source, staging, options)?;
        ShardedDataset::open(staging)?;
        Ok(manifest)
    })
}

/// Creates the directory `out`, which must not exist yet, through `write`: it fills a staging
/// directory beside `out`, which becomes `out` only once `write` succeeded and is removed
/// otherwise, so nothing half-written is left under `out`'s name and nothing is overwritten.
pub(crate) fn write_new_dir<T>(
    out: &Path,
    write: impl FnOnce(&Path) -> Result<T, DataError>,
) -> Result<T, DataError> {
    if out.exists() {
        return Err(DataError::file(
            out,
            "already exists; `kiln data prepare` never overwrites anything: choose a new \
             output directory (or remove this one yourself)",
        ));
    }
    let name = out
        .file_name()
        .ok_or_else(|| DataError::file(out, "is not a directory name"))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .map_err(|e| DataError::file(&parent, format!("cannot create: {e}")))?;
    let staging = parent.join(format!(
        ".{}.partial-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::create_dir(&staging)
        .map_err(|e| DataError::file(&staging, format!("cannot create: {e}")))?;
    let written = write(&staging).and_then(|value| {
        std::fs::rename(&staging, out)
            .map_err(|e| DataError::file(out, format!("cannot move the files into place: {e}")))?;
        Ok(value)
    });
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    // Named after the directory asked for, with the space free once the staging is gone.
    written.map_err(|e| match e {
        DataError::NoSpace(full) => DataError::NoSpace(full.at(out)),
        e => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source of `len` samples: f32 features of 3 values and i64 class targets.
    fn source(features: &[u8], targets: &[u8], len: usize) -> Source<'static> {
        let features = features.to_vec();
        let targets = targets.to_vec();
        Source {
            len,
            inputs: vec![Input::features(Part {
                dtype: DType::F32,
                shape: vec![3],
                rows: Box::new(move |s, e| Cow::Owned(features[s * 12..e * 12].to_vec())),
            })],
            targets: Part {
                dtype: DType::I64,
                shape: vec![],
                rows: Box::new(move |s, e| Cow::Owned(targets[s * 8..e * 8].to_vec())),
            },
            target: StoredTarget::new(TARGETS_TENSOR, &TargetSpec::label(2), DType::I64, None),
        }
    }

    /// A write that finds the file system full (`/dev/full` answers every write with ENOSPC)
    /// is [`NoSpace`] naming the directory asked for, and the staging directory is gone.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_write_that_runs_out_of_space_leaves_nothing_and_names_the_output() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("ds");
        let e = write_new_dir(&out, |staging| {
            std::fs::write(staging.join("shard-00000.npy"), [0u8; 100]).unwrap();
            write_npy(Path::new("/dev/full"), DType::U8, &[4], &[0; 4])
        })
        .unwrap_err();
        let DataError::NoSpace(full) = &e else {
            panic!("not NoSpace: {e}");
        };
        assert_eq!(full.path, out);
        assert!(
            full.available > 0,
            "measured after the staging was removed: {e}"
        );
        assert!(
            e.to_string()
                .contains("not enough free space for the dataset"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    /// The lengths of the files in `dir`, largest first.
    fn lengths_in(dir: &Path) -> Vec<u64> {
        let mut v: Vec<u64> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    }

    #[test]
    fn the_estimate_covers_every_file_written_and_not_much_more() {
        let len = 1000;
        let features = vec![0u8; len * 12];
        let targets = vec![0u8; len * 8];
        for format in [ShardFormat::Safetensors, ShardFormat::Npy] {
            let options = PrepareOptions {
                shard_samples: 300,
                format,
                integer_features: false,
            };
            let source = source(&features, &targets, len);
            let mut estimate = file_lengths(&source, &options);
            estimate.sort_unstable_by(|a, b| b.cmp(a));
            let tmp = tempfile::tempdir().unwrap();
            write_shards(&source, tmp.path(), &options).unwrap();
            let actual = lengths_in(tmp.path());
            // Four shards (300, 300, 300, 100 samples) and the manifest.
            let files = match format {
                ShardFormat::Safetensors => 5,
                ShardFormat::Npy => 9,
            };
            assert_eq!((estimate.len(), actual.len()), (files, files), "{format:?}");
            let (want, got): (u64, u64) = (estimate.iter().sum(), actual.iter().sum());
            assert!(
                got <= want,
                "{format:?}: wrote {got} bytes, estimated {want}"
            );
            assert!(
                want - got < 8192,
                "{format:?}: estimated {want} for {got} bytes"
            );
            // File by file too (both sorted by length, each estimate at least its file).
            for (e, a) in estimate.iter().zip(&actual) {
                assert!(e >= a, "{format:?}: {estimate:?} for {actual:?}");
            }
        }
    }
}
