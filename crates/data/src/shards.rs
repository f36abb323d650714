//! Datasets stored on disk as shards: safetensors or `.npy` files, memory-mapped, described by
//! a `kiln-dataset.json` manifest in the dataset's directory.
//!
//! Opening a dataset checks every shard against the manifest (present, complete, same element
//! type and sample shape, labels in range) and names the file at fault; reading a sample then
//! converts its bytes straight from the mapped file into the batch buffer, with no intermediate
//! copy.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::{DType, DataError, Dataset, npy};

/// The manifest's file name inside a dataset directory.
pub const MANIFEST_FILE: &str = "kiln-dataset.json";
/// The manifest's `format` value.
pub const MANIFEST_FORMAT: &str = "kiln-dataset";
/// The manifest version this build reads and writes.
pub const MANIFEST_VERSION: u32 = 1;
/// Names of the two tensors in a safetensors shard.
pub const FEATURES_TENSOR: &str = "features";
pub const LABELS_TENSOR: &str = "labels";

/// A dataset directory's description of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// [`MANIFEST_VERSION`].
    pub version: u32,
    /// Samples across all shards.
    pub samples: usize,
    pub features: FeatureSpec,
    pub labels: LabelSpec,
    pub shards: Vec<ShardEntry>,
}

/// Element type and per-sample shape of the features.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSpec {
    pub dtype: DType,
    /// Shape of one sample (without the leading sample dimension).
    pub shape: Vec<usize>,
}

/// Element type and class count of the labels.
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

/// One shard: where its features and labels are (paths relative to the manifest; both may be
/// the same safetensors file) and how many samples it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    pub features: String,
    pub labels: String,
    pub samples: usize,
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
        if self.format != MANIFEST_FORMAT {
            return Err(format!(
                "`format` is \"{}\", expected \"{MANIFEST_FORMAT}\"",
                self.format
            ));
        }
        if self.version != MANIFEST_VERSION {
            return Err(format!(
                "`version` is {}, this kiln reads version {MANIFEST_VERSION}",
                self.version
            ));
        }
        if self.features.shape.contains(&0) {
            return Err(format!(
                "`features.shape` {:?} has a zero dimension",
                self.features.shape
            ));
        }
        if !self.labels.dtype.is_integer() {
            return Err(format!(
                "`labels.dtype` is {}, expected an integer type (u8, i8, i16, i32, i64)",
                self.labels.dtype
            ));
        }
        if let Some(names) = &self.labels.class_names
            && names.len() != self.labels.classes
        {
            return Err(format!(
                "`labels.class_names` has {} names but `labels.classes` is {}",
                names.len(),
                self.labels.classes
            ));
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

    /// Every element as an integer, in order (`-1` for a floating-point array, which no valid
    /// label is).
    pub fn integers(&self) -> impl Iterator<Item = i64> + '_ {
        let size = self.dtype.size();
        let numel: usize = self.shape.iter().product();
        self.map[self.offset..self.offset + numel * size]
            .chunks_exact(size)
            .map(|b| self.dtype.to_i64(b).unwrap_or(-1))
    }

    /// Unmaps the pages of row `i` from this process (they stay in the page cache, and are
    /// faulted back in from there if read again), so data read once per epoch does not pile
    /// up in the process's resident memory.
    pub fn release_row(&self, i: usize) {
        #[cfg(unix)]
        {
            let start = self.offset + i * self.row_bytes;
            // SAFETY: the map is a read-only shared mapping of a file, and nothing holds a
            // reference into these pages across this call's return except through `row`,
            // which re-reads them: after MADV_DONTNEED a read-only file mapping faults the same
            // file contents back in. The kernel rounds the start down to a page boundary.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    self.row_bytes,
                )
            };
        }
        #[cfg(not(unix))]
        let _ = i;
    }

    fn new(map: Arc<Mmap>, offset: usize, dtype: DType, shape: Vec<usize>) -> Self {
        let row_bytes = shape.iter().skip(1).product::<usize>() * dtype.size();
        Self {
            map,
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
    labels: MappedArray,
}

/// A dataset of memory-mapped shards, opened from its directory's manifest.
#[derive(Debug)]
pub struct ShardedDataset {
    dir: PathBuf,
    manifest: Manifest,
    shards: Vec<Shard>,
    /// Global index of each shard's first sample, ascending.
    starts: Vec<usize>,
    release_pages: bool,
}

impl ShardedDataset {
    /// Opens the dataset in `dir`, checking every shard against the manifest. Every error names
    /// the file at fault.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, DataError> {
        let dir = dir.as_ref().to_owned();
        let manifest = Manifest::read(&dir)?;
        let mut maps = HashMap::new();
        let mut shards = Vec::with_capacity(manifest.shards.len());
        let mut starts = Vec::with_capacity(manifest.shards.len());
        let mut start = 0;
        for entry in &manifest.shards {
            let fpath = dir.join(&entry.features);
            let lpath = dir.join(&entry.labels);
            let features = open_array(&fpath, FEATURES_TENSOR, &mut maps)?;
            let labels = open_array(&lpath, LABELS_TENSOR, &mut maps)?;
            let mut want = vec![entry.samples];
            want.extend_from_slice(&manifest.features.shape);
            check_array(
                &fpath,
                "features",
                &features,
                manifest.features.dtype,
                &want,
            )?;
            check_array(
                &lpath,
                "labels",
                &labels,
                manifest.labels.dtype,
                &[entry.samples],
            )?;
            check_labels(&lpath, &labels, manifest.labels.classes)?;
            shards.push(Shard { features, labels });
            starts.push(start);
            start += entry.samples;
        }
        Ok(Self {
            dir,
            manifest,
            shards,
            starts,
            release_pages: true,
        })
    }

    /// Whether a sample's mapped pages are released from the process right after it is read
    /// (the default): resident memory stays at the batches in flight instead of growing to the
    /// whole dataset over an epoch, at the cost of re-mapping pages from the page cache when a
    /// sample is read again next epoch. Turn it off for small datasets read many times.
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

fn check_labels(path: &Path, labels: &MappedArray, classes: usize) -> Result<(), DataError> {
    for (i, label) in labels.integers().enumerate() {
        if label < 0 || label as u64 >= classes as u64 {
            return Err(DataError::file(
                path,
                format!(
                    "label {label} of sample {i} in this file is outside 0..{classes} (the \
                     manifest's `labels.classes`)"
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
        let (shard, i) = self
            .locate(index)
            .ok_or_else(|| crate::dataset::out_of_range(index, self.len()))?;
        shard.features.dtype.to_f32(shard.features.row(i), out);
        if self.release_pages {
            shard.features.release_row(i);
        }
        // Labels were checked to be integers in range when the dataset was opened.
        shard
            .labels
            .dtype
            .to_i64(shard.labels.row(i))
            .ok_or_else(|| DataError::Sample {
                index,
                message: "label is not an integer".to_owned(),
            })
    }

    fn classes(&self) -> Option<usize> {
        Some(self.manifest.labels.classes)
    }
}
