//! The pinned Python packages of the benchmarks' peers (PyTorch Lightning, LitServe,
//! pytorch-forecasting), as `cargo xtask bench` hands them to a suite: `KILN_BENCH_PEERS` names
//! the directory it installed them into, or `KILN_BENCH_PEERS_ERROR` says why it could not.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The installed peers' directory, or why there is none (the text of a "not run" row).
pub fn dir() -> crate::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("KILN_BENCH_PEERS").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    Err(std::env::var("KILN_BENCH_PEERS_ERROR").unwrap_or_else(|_| {
        "the pinned peers (Lightning, LitServe, pytorch-forecasting) are installed by `cargo xtask bench`; run the \
         suite through it (or set KILN_BENCH_PEERS to a directory holding them)"
            .to_owned()
    }))
}

/// Puts `dir` first on the Python path of `cmd` (before any `PYTHONPATH` already set).
pub fn put_first_on_path(cmd: &mut Command, dir: &Path) {
    let mut path = dir.as_os_str().to_owned();
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    cmd.env("PYTHONPATH", path);
}
