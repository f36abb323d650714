//! Datasets the suites write for both sides: `features.npy`/`labels.npy` (streamed, never all
//! in memory), kiln's sharded dataset prepared from them, and kiln's train/validation split.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_data::{DType, Dataset, PrepareOptions, PrepareSource, ShardedDataset, Subset};
use serde_json::json;

use crate::{Msg, Result};

/// Writes `data` as `dir/features.npy` (f32, sample by sample) and `dir/labels.npy`, prepares
/// kiln's dataset from them in `dir/name` (`shard_samples` a shard, else kiln's default),
/// removes the `.npy` files unless `keep_npy` (for a PyTorch side), returns the dataset opened.
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
    let header = kiln_data::npy_header(DType::F32, &shape)?;
    let mut w = std::io::BufWriter::new(std::fs::File::create(&fpath).at(&fpath)?);
    w.write_all(&header).at(&fpath)?;
    let (mut sample, mut labels) = (vec![0f32; shape[1..].iter().product()], vec![]);
    for i in 0..data.len() {
        labels.push(data.read(i, &mut sample).msg()?);
        let bytes: Vec<u8> = sample.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.write_all(&bytes).at(&fpath)?;
    }
    w.flush().at(&fpath)?;
    let labels: Vec<u8> = labels.iter().flat_map(|v| v.to_le_bytes()).collect();
    kiln_data::write_npy(&lpath, DType::I64, &[data.len()], &labels).msg()?;
    let (features, labels) = (fpath.clone(), lpath.clone());
    let source = PrepareSource::Npy { features, labels };
    let options = PrepareOptions {
        shard_samples: shard_samples.unwrap_or(PrepareOptions::default().shard_samples),
        ..PrepareOptions::default()
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

/// Writes a regression dataset as `dir/features.npy` and `dir/labels.npy` (f32 targets), kept,
/// and returns kiln's dataset prepared from them in `dir/name`, opened.
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

/// kiln's split of `prepared` as JSON at `path` for the PyTorch sides: `{"train", "val",
/// "classes"}` (no classes for values).
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
