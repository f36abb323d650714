//! The provisioned Python: the interpreter whose torch is the libtorch kiln runs on (the venv
//! `cargo xtask setup` makes, or the one that provided libtorch), for the work only PyTorch's
//! Python side does: compiling an exported program, exporting ONNX.

use std::path::PathBuf;

/// A setting from the environment, unless empty.
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A path recorded under `key` in the JSON file `name` of kiln's cache directory.
pub fn recorded(name: &str, key: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(kiln_device::measured::cache_dir()?.join(name)).ok()?;
    let record: serde_json::Value = serde_json::from_str(&text).ok()?;
    record.get(key)?.as_str().map(PathBuf::from)
}

/// The Python with libtorch's torch: `KILN_PYTHON`, else the one `cargo xtask` recorded
/// (`<cache>/onnx-export.json`), else the provisioned venv's, else `python3`.
pub fn python() -> PathBuf {
    env_path("KILN_PYTHON")
        .or_else(|| recorded("onnx-export.json", "python"))
        .or_else(|| {
            let venv = kiln_device::measured::cache_dir()?.join("torch-2.11.0/bin/python");
            venv.is_file().then_some(venv)
        })
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// How to provision it, for errors.
pub const HOW_TO_PROVISION: &str = "run `cargo xtask setup` (it installs torch 2.11 in kiln's \
     cache), or set KILN_PYTHON to a Python whose torch is 2.11";
