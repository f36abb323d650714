//! The peers' pinned Python packages, which `cargo xtask bench` installs into `KILN_BENCH_PEERS`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The installed peers' directory, or why there is none (the text of a "not run" row).
pub fn dir() -> crate::Result<PathBuf> {
    const HOW: &str = "the pinned peers (Lightning, LitServe, pytorch-forecasting) are installed \
        by `cargo xtask bench`; run the suite through it (or set KILN_BENCH_PEERS to a directory \
        holding them)";
    let why = || std::env::var("KILN_BENCH_PEERS_ERROR").unwrap_or_else(|_| HOW.to_owned());
    let dir = std::env::var_os("KILN_BENCH_PEERS").filter(|d| !d.is_empty());
    dir.map(PathBuf::from).ok_or_else(why)
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
