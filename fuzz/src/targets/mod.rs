//! The targets, one module per parser kiln owns, and what they share: small datasets and
//! files written by kiln's own writers, for seeds and for the fixtures a parser reads beside
//! its input.
//!
//! Foreign loaders (libtorch's TorchScript reader, PyTorch's export loader, ONNX Runtime) are
//! not fuzzed in-process: the targets stop at what kiln itself reads of those files.

mod checkpoint;
mod config;
mod csv;
mod dataset;
mod http;
mod npy;
mod onnx;
mod parquet;
mod profile;
mod program;
mod safetensors;
mod selftest;
mod tiff;
mod windows;

use std::path::{Path, PathBuf};

use kiln_data::{DType, PrepareOptions, PrepareSource, ShardFormat};

use crate::Target;

/// Every target, those of the harness's self-checks last.
pub fn all() -> Vec<Target> {
    vec![
        npy::TARGET,
        safetensors::TARGET,
        dataset::TARGET,
        windows::TARGET,
        checkpoint::TARGET,
        csv::TARGET,
        parquet::TARGET,
        http::TARGET,
        onnx::TARGET,
        config::TOML,
        config::YAML,
        config::JSON,
        profile::TARGET,
        tiff::TARGET,
        program::TARGET,
        selftest::PANIC,
        selftest::HANG,
        selftest::MEMORY,
    ]
}

/// The target named `name`.
pub fn find(name: &str) -> Option<Target> {
    all().into_iter().find(|t| t.name == name)
}

/// An error's text.
pub(crate) fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Writes `bytes` to `path`.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads the file at `path`.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Removes the directory at `path` if it exists (what a successful `prepare` wrote).
pub(crate) fn remove_dir(path: &Path) {
    if path.exists() {
        let _ = std::fs::remove_dir_all(path);
    }
}

/// A `.npy` file of `dtype` and `shape`, its elements counting up, by kiln's header writer.
pub(crate) fn npy_bytes(dtype: DType, shape: &[usize]) -> Result<Vec<u8>, String> {
    let mut bytes = kiln_data::npy_header(dtype, shape)?;
    let n: usize = shape.iter().product();
    for i in 0..n {
        let v = (i % 5) as f64;
        match dtype {
            DType::F64 => bytes.extend_from_slice(&v.to_le_bytes()),
            DType::F32 => bytes.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::I64 => bytes.extend_from_slice(&(i as i64 % 3).to_le_bytes()),
            DType::I32 => bytes.extend_from_slice(&(i as i32 % 3).to_le_bytes()),
            DType::I16 => bytes.extend_from_slice(&(i as i16 % 3).to_le_bytes()),
            DType::F16 => bytes.extend_from_slice(&[0, 0x3c]),
            _ => bytes.push((i % 2) as u8),
        }
    }
    Ok(bytes)
}

/// A dataset kiln prepared from `.npy` features `[6, 4]` (f32) and labels `[6]` (i64), in
/// `out` (which must not exist), as `format` shards of 4 samples.
pub(crate) fn prepared_dataset(
    scratch: &Path,
    out: &Path,
    format: ShardFormat,
) -> Result<PathBuf, String> {
    let features = scratch.join("source-features.npy");
    let labels = scratch.join("source-labels.npy");
    write(&features, &npy_bytes(DType::F32, &[6, 4])?)?;
    write(&labels, &npy_bytes(DType::I64, &[6])?)?;
    let options = PrepareOptions {
        shard_samples: 4,
        format,
        integer_features: false,
    };
    kiln_data::prepare(&PrepareSource::Npy { features, labels }, out, &options).map_err(text)?;
    Ok(out.to_owned())
}

/// The files of `dir` whose names end with `suffix`, sorted.
pub(crate) fn files_ending(dir: &Path, suffix: &str) -> Result<Vec<PathBuf>, String> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    found.sort();
    Ok(found)
}
