//! Turning CSV or `.npy` files into a sharded dataset directory with its manifest
//! (`kiln data prepare`).
//!
//! The output directory must not exist yet: everything is written into a hidden sibling
//! directory and renamed into place at the end, so an interrupted or failed run leaves nothing
//! half-written and never touches existing files.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::shards::{
    FEATURES_TENSOR, LABELS_TENSOR, MANIFEST_FORMAT, MANIFEST_VERSION, MappedArray, open_array,
};
use crate::{
    CsvDataset, CsvOptions, DType, DataError, FeatureSpec, LabelSpec, Manifest, ShardEntry,
    ShardedDataset, npy,
};

/// The file format of the shards written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardFormat {
    /// One `.safetensors` file per shard holding tensors `features` and `labels`.
    #[default]
    Safetensors,
    /// Two `.npy` files per shard.
    Npy,
}

/// Where the data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrepareSource {
    Csv {
        path: PathBuf,
        options: CsvOptions,
    },
    /// A features array `[samples, …]` and an integer labels array `[samples]`.
    Npy {
        features: PathBuf,
        labels: PathBuf,
    },
}

/// How to shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareOptions {
    /// Samples per shard (the last shard may hold fewer).
    pub shard_samples: usize,
    pub format: ShardFormat,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        Self {
            shard_samples: 65_536,
            format: ShardFormat::Safetensors,
        }
    }
}

/// The source's data, ready to be cut into shards.
struct Source<'a> {
    dtype: DType,
    sample_shape: Vec<usize>,
    len: usize,
    /// Bytes of samples `start..end`.
    features: Box<dyn Fn(usize, usize) -> Cow<'a, [u8]> + 'a>,
    labels: Vec<i64>,
    classes: usize,
    class_names: Option<Vec<String>>,
}

fn csv_source(csv: &CsvDataset) -> Source<'_> {
    let data = csv.in_memory();
    let numel: usize = csv.feature_columns().len();
    Source {
        dtype: DType::F32,
        sample_shape: vec![numel],
        len: data.labels().len(),
        features: Box::new(move |start, end| {
            Cow::Owned(
                data.features()[start * numel..end * numel]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            )
        }),
        labels: data.labels().to_vec(),
        classes: csv.classes(),
        class_names: csv.class_names().map(<[String]>::to_vec),
    }
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
                "labels have shape {:?}, expected one dimension [samples]",
                labels.shape
            ),
        ));
    }
    if !labels.dtype.is_integer() {
        return Err(DataError::file(
            labels_path,
            format!(
                "labels are {}, expected an integer type (u8, i8, i16, i32, i64)",
                labels.dtype
            ),
        ));
    }
    if labels.shape[0] != features.shape[0] {
        return Err(DataError::file(
            labels_path,
            format!(
                "holds {} labels but {} holds {} samples",
                labels.shape[0],
                features_path.display(),
                features.shape[0]
            ),
        ));
    }
    if features.shape.len() < 2 || features.shape[1..].contains(&0) {
        return Err(DataError::file(
            features_path,
            format!(
                "features have shape {:?}, expected [samples, …] with a non-empty sample",
                features.shape
            ),
        ));
    }
    let values: Vec<i64> = labels.integers().collect();
    if let Some(i) = values.iter().position(|&v| v < 0) {
        return Err(DataError::file(
            labels_path,
            format!("label {} of sample {i} is negative", values[i]),
        ));
    }
    let classes = values.iter().max().map_or(0, |m| *m as usize + 1).max(2);
    Ok(Source {
        dtype: features.dtype,
        sample_shape: features.shape[1..].to_vec(),
        len: features.shape[0],
        features: Box::new(move |start, end| Cow::Borrowed(features.rows(start, end))),
        labels: values,
        classes,
        class_names: None,
    })
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
    std::fs::write(path, bytes).map_err(|e| DataError::file(path, format!("cannot write: {e}")))
}

fn write_shards(
    source: &Source<'_>,
    dir: &Path,
    options: &PrepareOptions,
) -> Result<Manifest, DataError> {
    let mut shards = Vec::new();
    let mut start = 0;
    while start < source.len {
        let end = (start + options.shard_samples).min(source.len);
        let k = shards.len();
        let mut shape = vec![end - start];
        shape.extend_from_slice(&source.sample_shape);
        let features = View {
            dtype: source.dtype,
            shape,
            data: (source.features)(start, end),
        };
        let labels = View {
            dtype: DType::I64,
            shape: vec![end - start],
            data: Cow::Owned(
                source.labels[start..end]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
        };
        let entry = match options.format {
            ShardFormat::Safetensors => {
                let name = format!("shard-{k:05}.safetensors");
                let path = dir.join(&name);
                safetensors::serialize_to_file(
                    [(FEATURES_TENSOR, &features), (LABELS_TENSOR, &labels)],
                    None,
                    &path,
                )
                .map_err(|e| DataError::file(&path, format!("cannot write: {e}")))?;
                ShardEntry {
                    features: name.clone(),
                    labels: name,
                    samples: end - start,
                }
            }
            ShardFormat::Npy => {
                let fname = format!("shard-{k:05}.features.npy");
                let lname = format!("shard-{k:05}.labels.npy");
                write_npy(
                    &dir.join(&fname),
                    features.dtype,
                    &features.shape,
                    &features.data,
                )?;
                write_npy(&dir.join(&lname), labels.dtype, &labels.shape, &labels.data)?;
                ShardEntry {
                    features: fname,
                    labels: lname,
                    samples: end - start,
                }
            }
        };
        shards.push(entry);
        start = end;
    }
    let manifest = Manifest {
        format: MANIFEST_FORMAT.to_owned(),
        version: MANIFEST_VERSION,
        samples: source.len,
        features: FeatureSpec {
            dtype: source.dtype,
            shape: source.sample_shape.clone(),
        },
        labels: LabelSpec {
            dtype: DType::I64,
            classes: source.classes,
            class_names: source.class_names.clone(),
        },
        shards,
    };
    manifest.write(dir)?;
    Ok(manifest)
}

/// Writes `source` as a sharded dataset into `out`, which must not exist yet, and checks the
/// result by opening it. Returns the manifest written.
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
    let written = (|| {
        let manifest = match source {
            PrepareSource::Csv { path, options: csv } => {
                let csv = CsvDataset::open(path, csv)?;
                write_shards(&csv_source(&csv), &staging, options)?
            }
            PrepareSource::Npy { features, labels } => {
                let mut maps = HashMap::new();
                let f = open_array(features, FEATURES_TENSOR, &mut maps)?;
                let l = open_array(labels, LABELS_TENSOR, &mut maps)?;
                write_shards(&npy_source(features, &f, labels, &l)?, &staging, options)?
            }
        };
        ShardedDataset::open(&staging)?;
        std::fs::rename(&staging, out)
            .map_err(|e| DataError::file(out, format!("cannot move the shards into place: {e}")))?;
        Ok(manifest)
    })();
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    written
}
