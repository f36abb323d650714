//! Finding and loading ONNX Runtime's shared library, once per process (ort's `load-dynamic`:
//! kiln links nothing of onnxruntime at build time and never lets ort look for it on its own,
//! whose fallback panics when the library is missing).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::environment::Environment;

use crate::InferError;

/// The onnxruntime version `cargo xtask setup` provisions; ort's `api-31` needs 1.31 or newer.
pub const ORT_VERSION: &str = "1.31.1";

/// The loaded ONNX Runtime. ort keeps the library in a process global, so there is one.
#[derive(Clone)]
pub struct OnnxRuntime {
    pub(crate) env: Environment,
    /// The library file that was loaded.
    pub library: PathBuf,
    /// Its version, from its file name (`libonnxruntime.so.1.31.1`), or "unknown".
    pub version: String,
    /// Whether the library was built with the CUDA execution provider (onnxruntime-gpu).
    pub has_cuda: bool,
}

impl std::fmt::Debug for OnnxRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxRuntime")
            .field("library", &self.library)
            .field("version", &self.version)
            .field("has_cuda", &self.has_cuda)
            .finish_non_exhaustive()
    }
}

impl OnnxRuntime {
    /// "onnxruntime 1.31.1 (CUDA build)", for reports.
    pub fn describe(&self) -> String {
        let build = if self.has_cuda {
            "CUDA build"
        } else {
            "CPU build"
        };
        format!("onnxruntime {} ({build})", self.version)
    }
}

static RUNTIME: OnceLock<Result<OnnxRuntime, String>> = OnceLock::new();

/// The process's ONNX Runtime, loaded on first use. Where it cannot be found or loaded, the
/// error says what was tried and how to provision it.
pub fn runtime() -> Result<&'static OnnxRuntime, InferError> {
    RUNTIME
        .get_or_init(load)
        .as_ref()
        .map_err(|m| InferError::OnnxRuntimeMissing(m.clone()))
}

const HOW_TO_GET_IT: &str = "run `cargo xtask setup` (it installs onnxruntime 1.31.1 from PyPI \
     beside torch), or set ORT_DYLIB_PATH to a libonnxruntime.so of version 1.31 or newer";

fn load() -> Result<OnnxRuntime, String> {
    let library = find_library()?;
    let builder = ort::init_from(&library).map_err(|e| {
        format!(
            "ONNX Runtime at {} cannot be used: {e}; {HOW_TO_GET_IT}",
            library.display()
        )
    })?;
    let env = builder
        .with_name("kiln")
        .with_telemetry(false)
        .build()
        .map_err(|e| format!("ONNX Runtime at {}: {e}", library.display()))?;
    let has_cuda = <ort::ep::CUDA as ort::ep::ExecutionProvider>::is_available().unwrap_or(false);
    Ok(OnnxRuntime {
        env,
        version: version_of(&library),
        library,
        has_cuda,
    })
}

/// `libonnxruntime.so.1.31.1` → "1.31.1".
fn version_of(library: &Path) -> String {
    let name = library
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.split_once(".so.")
        .map(|(_, v)| v.to_owned())
        .or_else(|| {
            // macOS: libonnxruntime.1.31.1.dylib
            name.strip_prefix("libonnxruntime.")
                .and_then(|rest| rest.strip_suffix(".dylib"))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The library to load, first hit wins: `ORT_DYLIB_PATH`; `KILN_ONNXRUNTIME` (the file, or a
/// directory holding it); the record `cargo xtask setup` leaves in kiln's cache directory.
fn find_library() -> Result<PathBuf, String> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let mut tried = Vec::new();
    if let Some(path) = set("ORT_DYLIB_PATH") {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        tried.push(format!("ORT_DYLIB_PATH={}: no such file", path.display()));
    } else {
        tried.push("ORT_DYLIB_PATH unset".to_owned());
    }
    if let Some(path) = set("KILN_ONNXRUNTIME") {
        let path = PathBuf::from(path);
        match library_at(&path) {
            Some(found) => return Ok(found),
            None => tried.push(format!(
                "KILN_ONNXRUNTIME={}: no libonnxruntime there",
                path.display()
            )),
        }
    }
    match recorded_library() {
        Ok(path) => return Ok(path),
        Err(why) => tried.push(why),
    }
    Err(format!(
        "ONNX Runtime 1.31 was not found (tried: {}); {HOW_TO_GET_IT}",
        tried.join("; ")
    ))
}

/// The directory holding the `onnxruntime` Python package whose library kiln loads (the
/// library sits in `<dir>/onnxruntime/capi/`, as the wheel `cargo xtask setup` installs lays it
/// out), where it has the package's quantization tools.
pub fn python_package_dir() -> Option<PathBuf> {
    let library = find_library().ok()?.canonicalize().ok()?;
    let capi = library.parent()?;
    let package = capi.parent()?;
    (capi.file_name()? == "capi" && package.join("quantization").is_dir())
        .then(|| package.parent().map(Path::to_path_buf))
        .flatten()
}

/// `path` itself if it is a file, else the onnxruntime library inside the directory `path`.
fn library_at(path: &Path) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path.to_owned());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(path)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("libonnxruntime.so") || n == "libonnxruntime.dylib"
            })
        })
        .collect();
    // The versioned file (libonnxruntime.so.1.31.1) sorts last.
    found.sort();
    found.pop()
}

/// The library named in `<kiln cache>/onnxruntime.json`, written by `cargo xtask setup`.
fn recorded_library() -> Result<PathBuf, String> {
    let Some(dir) = kiln_device::measured::cache_dir() else {
        return Err("no cache directory (HOME unset)".to_owned());
    };
    let record = dir.join("onnxruntime.json");
    let text =
        std::fs::read_to_string(&record).map_err(|e| format!("{}: {e}", record.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not valid JSON ({e})", record.display()))?;
    let library = value
        .get("library")
        .and_then(|l| l.as_str())
        .map(PathBuf::from)
        .ok_or_else(|| format!("{}: no \"library\" entry", record.display()))?;
    if library.is_file() {
        Ok(library)
    } else {
        Err(format!(
            "{} names {}, which does not exist",
            record.display(),
            library.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_file_name() {
        assert_eq!(
            version_of(Path::new("/x/libonnxruntime.so.1.31.1")),
            "1.31.1"
        );
        assert_eq!(
            version_of(Path::new("/x/libonnxruntime.1.31.1.dylib")),
            "1.31.1"
        );
        assert_eq!(version_of(Path::new("/x/libonnxruntime.so")), "unknown");
    }

    #[test]
    fn a_directory_is_searched_for_the_versioned_library() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "libonnxruntime.so.1.31.1",
            "libonnxruntime_providers_shared.so",
            "other.so",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        assert_eq!(
            library_at(dir.path()),
            Some(dir.path().join("libonnxruntime.so.1.31.1"))
        );
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(library_at(empty.path()), None);
    }
}
