//! Datasets the suites write for both sides: a kiln dataset as `features.npy`/`labels.npy`
//! (streamed: a gigabyte of features never sits in memory at once), kiln's sharded dataset
//! prepared from them, and kiln's train/validation split as JSON.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_data::{DType, Dataset, PrepareOptions, PrepareSource, ShardedDataset, Subset};
use serde_json::json;

use crate::{Msg, Result};

/// Writes an f32 `.npy` array of `shape` sample by sample: `fill(i, out)` writes sample `i`
/// and returns its label. Returns the labels.
fn write_f32_npy(
    path: &Path,
    shape: &[usize],
    mut fill: impl FnMut(usize, &mut [f32]) -> Result<i64>,
) -> Result<Vec<i64>> {
    let header = kiln_data::npy_header(DType::F32, shape)?;
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).map_err(err)?);
    w.write_all(&header).map_err(err)?;
    let numel: usize = shape[1..].iter().product();
    let mut sample = vec![0f32; numel];
    let mut labels = Vec::with_capacity(shape[0]);
    for i in 0..shape[0] {
        labels.push(fill(i, &mut sample)?);
        let bytes: Vec<u8> = sample.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.write_all(&bytes).map_err(err)?;
    }
    w.flush().map_err(err)?;
    Ok(labels)
}

/// Writes `data` as `dir/features.npy` and `dir/labels.npy`, prepares kiln's dataset from them
/// in `dir/name` (`shard_samples` a shard, else kiln's default), removes the `.npy` files unless
/// `keep_npy` (a PyTorch side that reads them), and returns the prepared dataset opened.
pub fn write_prepared(
    dir: &Path,
    name: &str,
    data: &dyn Dataset,
    shard_samples: Option<usize>,
    keep_npy: bool,
) -> Result<Arc<ShardedDataset>> {
    let (fpath, lpath) = (dir.join("features.npy"), dir.join("labels.npy"));
    let mut shape = vec![data.len()];
    shape.extend(data.sample_shape());
    let labels = write_f32_npy(&fpath, &shape, |i, out| data.read(i, out).msg())?;
    let labels: Vec<u8> = labels.iter().flat_map(|v| v.to_le_bytes()).collect();
    kiln_data::write_npy(&lpath, DType::I64, &[data.len()], &labels).msg()?;
    let source = PrepareSource::Npy {
        features: fpath.clone(),
        labels: lpath.clone(),
    };
    let defaults = PrepareOptions::default();
    let options = PrepareOptions {
        shard_samples: shard_samples.unwrap_or(defaults.shard_samples),
        ..defaults
    };
    let out = dir.join(name);
    kiln_data::prepare(&source, &out, &options).msg()?;
    if !keep_npy {
        for p in [&fpath, &lpath] {
            std::fs::remove_file(p).at(p)?;
        }
    }
    Ok(Arc::new(ShardedDataset::open(&out).msg()?))
}

/// Writes a regression dataset as `dir/features.npy` (f32, `[samples, features]`) and
/// `dir/labels.npy` (f32 values, one per sample; kiln's targets), kept for a PyTorch side, prepares kiln's
/// dataset from them in `dir/name` and returns it opened.
pub fn write_prepared_values(
    dir: &Path,
    name: &str,
    features: &[f32],
    shape: [usize; 2],
    targets: &[f32],
) -> Result<Arc<ShardedDataset>> {
    let (fpath, lpath) = (dir.join("features.npy"), dir.join("labels.npy"));
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    kiln_data::write_npy(&fpath, DType::F32, &shape, &bytes(features)).msg()?;
    kiln_data::write_npy(&lpath, DType::F32, &[shape[0]], &bytes(targets)).msg()?;
    let source = PrepareSource::NpyTargets {
        features: fpath,
        targets: lpath,
        classes: None,
    };
    let out = dir.join(name);
    kiln_data::prepare(&source, &out, &PrepareOptions::default()).msg()?;
    Ok(Arc::new(ShardedDataset::open(&out).msg()?))
}

/// kiln's train/validation split of `prepared` (`val_fraction`, `seed`) as JSON at `path`:
/// `{"train": [...], "val": [...], "classes": N}` (no classes for values), which the PyTorch
/// sides read.
pub fn write_split(
    path: &Path,
    prepared: &Arc<ShardedDataset>,
    val_fraction: f64,
    seed: u64,
) -> Result<PathBuf> {
    let (train, val) = Subset::split(Arc::clone(prepared), val_fraction, seed).msg()?;
    let mut text = json!({"train": train.indices(), "val": val.indices()});
    if let Some(classes) = prepared.classes() {
        text["classes"] = json!(classes);
    }
    std::fs::write(path, text.to_string()).at(path)?;
    Ok(path.to_owned())
}
