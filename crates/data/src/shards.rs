//! Datasets stored on disk as shards: safetensors or `.npy` files, memory-mapped, described by
//! a `kiln-dataset.json` manifest in the dataset's directory.
//!
//! A sample is one or more named input arrays and a target: a class label, a tensor of classes
//! (a segmentation mask) or a tensor of real values (regression, multi-label), each of one fixed
//! shape. Opening a dataset checks every shard against the manifest (present, complete, same
//! element type and sample shape, classes in range, values finite, integer ids exact in `f32`)
//! and names the file and sample at fault; reading then copies each run of consecutive samples
//! from the page cache with one positioned read per array (straight into the batch buffer where
//! the stored type is the one delivered, converted on the way otherwise), so an epoch's reads
//! never pile up in the process's resident memory. A dataset of one input is read as `f32`
//! features through [`Dataset`]; every dataset is read by name with
//! [`ShardedDataset::read_arrays`].

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dataset::{array_slots_error, check_batch_slots};
use crate::manifest::{ArraySpec, Manifest, ShardEntry, StoredTarget, Task};
use crate::target::{MAX_EXACT_ID, not_labels, slot_mismatch, unravel};
use crate::{DType, DataError, Dataset, TargetSlot, TargetSpec, npy};
use memmap2::Mmap;

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
    /// One array per [`Manifest::inputs`], in order.
    inputs: Vec<MappedArray>,
    target: MappedArray,
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

    /// Calls `read(shard, k, (start, end))` for each run of consecutive `indices` inside one
    /// shard: samples `k..k + (end - start)` of the batch are rows `start..end` of `shard`.
    fn for_each_run(
        &self,
        indices: &[usize],
        mut read: impl FnMut(&Shard, usize, (usize, usize)) -> std::io::Result<()>,
    ) -> Result<(), DataError> {
        let mut k = 0;
        while k < indices.len() {
            let index = indices[k];
            let (shard, i) = self
                .locate(index)
                .ok_or_else(|| crate::error::out_of_range(index, self.len()))?;
            let rows = shard.target.samples();
            let run = indices[k..]
                .iter()
                .enumerate()
                .take_while(|&(n, &j)| j == index + n && i + n < rows)
                .count();
            read(shard, k, (i, i + run)).map_err(|e| DataError::Sample {
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

    /// An error unless `inputs` and `targets` are the slots of the samples at `indices`.
    fn check_array_slots(
        &self,
        indices: &[usize],
        inputs: &[&mut [u8]],
        targets: &mut TargetSlot<'_>,
    ) -> Result<(), DataError> {
        let (samples, specs) = (indices.len(), &self.manifest.inputs);
        let fits = specs.len() == inputs.len()
            && specs
                .iter()
                .zip(inputs)
                .all(|(a, b)| b.len() == samples * model_row_bytes(a));
        if !fits {
            return Err(array_slots_error(specs, samples, inputs));
        }
        check_batch_slots(samples, (0, 0), (self.spec.numel(), targets.len()))?;
        if let Some(&first) = indices.first() {
            self.check_slot(first, &targets.part(0, self.spec.numel()))?;
        }
        Ok(())
    }

    /// The single input array read as `f32` features; an error naming the inputs where there
    /// are several.
    fn single_input(&self, index: usize) -> Result<(), DataError> {
        match &self.manifest.inputs[..] {
            [_] => Ok(()),
            many => Err(DataError::Sample {
                index,
                message: format!(
                    "this dataset's samples are {} named arrays ({}), not one features array: \
                     read them by name (`ShardedDataset::read_arrays`)",
                    many.len(),
                    many.iter()
                        .map(|a| a.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }
}

/// Bytes of one sample of `array` as the model receives it.
fn model_row_bytes(array: &ArraySpec) -> usize {
    array.numel() * array.dtype.model().size()
}

/// Opens one shard's arrays and checks them against the manifest.
fn open_shard(
    dir: &Path,
    manifest: &Manifest,
    entry: &ShardEntry,
    maps: &mut HashMap<PathBuf, Arc<Mmap>>,
    files: &mut HashMap<PathBuf, Option<Arc<File>>>,
) -> Result<Shard, DataError> {
    let mut open = |name: &str, dtype: DType, shape: &[usize]| {
        // Present for every array: `Manifest::read` checked it.
        let path = dir.join(entry.file(name).unwrap_or_default());
        let array = open_array(&path, name, maps)?.with_file(&path, files);
        let mut want = vec![entry.samples];
        want.extend_from_slice(shape);
        check_array(&path, name, &array, dtype, &want)?;
        Ok::<_, DataError>((path, array))
    };
    let mut inputs = Vec::with_capacity(manifest.inputs.len());
    for spec in &manifest.inputs {
        let (path, array) = open(&spec.name, spec.dtype, &spec.shape)?;
        if spec.ids {
            check_ids(&path, &array)?;
        }
        inputs.push(array);
    }
    let t = &manifest.target;
    let (path, target) = open(t.name(), t.dtype, &t.shape)?;
    check_targets(&path, &target, t)?;
    Ok(Shard { inputs, target })
}

/// "features are" / "the values of array `x` are": the subject of a sentence about array
/// `name`'s stored values (the names of versions 1 and 2 as they always read).
fn values_of(name: &str) -> String {
    match name {
        "features" | "targets" | "labels" => name.to_owned(),
        _ => format!("the values of array `{name}`"),
    }
}

fn check_array(
    path: &Path,
    name: &str,
    array: &MappedArray,
    dtype: DType,
    shape: &[usize],
) -> Result<(), DataError> {
    let what = values_of(name);
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
        &self.manifest.inputs[0].shape
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
        self.manifest.inputs[0].ids
    }

    fn read_sample(
        &self,
        index: usize,
        features: &mut [f32],
        target: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        self.single_input(index)?;
        self.locate(index)
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
        self.read_batch(&[index], features, target)
    }

    /// The manifest's input arrays.
    fn inputs(&self) -> Vec<ArraySpec> {
        self.manifest.inputs.clone()
    }

    /// Each run of consecutive indices inside a shard is one read per array, straight into
    /// the slot where the stored type is the model's.
    fn read_arrays(
        &self,
        indices: &[usize],
        inputs: &mut [&mut [u8]],
        mut targets: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        self.check_array_slots(indices, inputs, &mut targets)?;
        let sizes: Vec<usize> = self.manifest.inputs.iter().map(model_row_bytes).collect();
        let (per, unmapped) = (self.spec.numel(), self.release_pages);
        self.for_each_run(indices, |shard, k, (start, end)| {
            for ((array, out), size) in shard.inputs.iter().zip(inputs.iter_mut()).zip(&sizes) {
                read_model_rows(
                    array,
                    (start, end),
                    unmapped,
                    &mut out[k * size..][..(end - start) * size],
                )?;
            }
            read_target(
                &shard.target,
                (start, end),
                unmapped,
                targets.part(k * per, (end - start) * per),
            )
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
            self.single_input(first)?;
            self.check_slot(first, &targets.part(0, per))?;
        }
        let unmapped = self.release_pages;
        self.for_each_run(indices, |shard, k, (start, end)| {
            let n = end - start;
            read_target(
                &shard.target,
                (start, end),
                unmapped,
                targets.part(k * per, n * per),
            )?;
            let slot = &mut features[k * numel..(k + n) * numel];
            read_f32_rows(&shard.inputs[0], (start, end), unmapped, slot)
        })
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

/// Calls `convert` with the bytes of rows `start..end` of `array`: from the map, or
/// (`unmapped`) read with a positioned read into a per-thread scratch buffer.
fn with_rows<R>(
    array: &MappedArray,
    (start, end): (usize, usize),
    unmapped: bool,
    convert: impl FnOnce(&[u8]) -> R,
) -> std::io::Result<R> {
    if !unmapped {
        return Ok(convert(array.rows(start, end)));
    }
    SCRATCH.with_borrow_mut(|buf| {
        buf.resize(array.row_bytes * (end - start), 0);
        array.read_rows(start, end, buf)?;
        Ok(convert(buf))
    })
}

/// Rows `start..end` of a target array into `target`: class ids or `f32` values.
fn read_target(
    t: &MappedArray,
    rows: (usize, usize),
    unmapped: bool,
    target: TargetSlot<'_>,
) -> std::io::Result<()> {
    with_rows(t, rows, unmapped, |bytes| match target {
        TargetSlot::Classes(out) => integers_into(t.dtype, bytes, out),
        TargetSlot::Values(out) => t.dtype.to_f32(bytes, out),
    })
}

/// Rows `start..end` of an input array as `f32` into `out` (little-endian `f32` rows read
/// straight into it).
fn read_f32_rows(
    f: &MappedArray,
    (start, end): (usize, usize),
    unmapped: bool,
    out: &mut [f32],
) -> std::io::Result<()> {
    if unmapped && f.dtype == DType::F32 && cfg!(target_endian = "little") {
        return f.read_rows(start, end, bytemuck::cast_slice_mut(out));
    }
    with_rows(f, (start, end), unmapped, |bytes| {
        f.dtype.to_f32(bytes, out)
    })
}

/// Rows `start..end` of an input array as its [`DType::model`] type into `out` (rows whose
/// stored type is the model's read straight into it).
fn read_model_rows(
    a: &MappedArray,
    (start, end): (usize, usize),
    unmapped: bool,
    out: &mut [u8],
) -> std::io::Result<()> {
    if unmapped
        && a.dtype.model() == a.dtype
        && a.dtype != DType::Bool
        && cfg!(target_endian = "little")
    {
        return a.read_rows(start, end, out);
    }
    with_rows(a, (start, end), unmapped, |bytes| {
        a.dtype.to_model(bytes, out)
    })
}

/// `bytes`' elements of type `dtype` as integers, into `out` (`-1` for a floating-point type).
fn integers_into(dtype: DType, bytes: &[u8], out: &mut [i64]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(dtype.size())) {
        *o = dtype.to_i64(b).unwrap_or(-1);
    }
}
