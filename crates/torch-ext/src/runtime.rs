//! Which libtorch this process runs on: its version, where it was loaded from, and whether its
//! CUDA library (`libtorch_cuda`) is really loaded.
//!
//! rustc links with `--as-needed`, and no kiln code calls into `libtorch_cuda` directly, so a
//! binary linked without care drops it and libtorch reports no CUDA on a GPU machine. kiln's
//! build scripts keep it linked (see `build/link_libtorch.rs`); [`ensure_cuda_library`] is the
//! run-time safety net for binaries built by others that link kiln as a library.

use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::ffi;

/// The libtorch version kiln was compiled against, e.g. `2.11.0`.
pub fn torch_version() -> &'static str {
    // SAFETY: returns a pointer to a static NUL-terminated string literal.
    unsafe { CStr::from_ptr(ffi::kiln_torch_version()) }
        .to_str()
        .unwrap_or("unknown")
}

/// The `libtorch_cpu` this process loaded.
pub fn libtorch_cpu_path() -> Result<PathBuf> {
    let mut buf = vec![0 as c_char; 4096];
    // SAFETY: `buf` outlives the call and we pass its true length.
    ffi::check("libtorch_cpu_path", unsafe {
        ffi::kiln_libtorch_cpu_path(buf.as_mut_ptr(), buf.len())
    })?;
    // SAFETY: on success the C side wrote a NUL-terminated string into `buf`.
    let path = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(PathBuf::from(path.to_string_lossy().into_owned()))
}

/// The `lib/` directory of the libtorch this process loaded.
pub fn libtorch_lib_dir() -> Result<PathBuf> {
    let cpu = libtorch_cpu_path()?;
    cpu.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| Error::Unavailable {
            op: "libtorch_lib_dir",
            reason: format!("{} has no parent directory", cpu.display()),
        })
}

/// The state of libtorch's CUDA library in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaLibrary {
    /// This libtorch has no `libtorch_cuda` (a CPU or MPS build).
    NotShipped,
    /// `libtorch_cuda` is loaded: CUDA works wherever a driver and GPU exist.
    Loaded(PathBuf),
    /// `libtorch_cuda` exists beside `libtorch_cpu` but was not loaded (the as-needed trap).
    NotLoaded(PathBuf),
}

/// The shared objects mapped into this process (Linux: from `/proc/self/maps`).
pub fn loaded_libraries() -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let mut libs: Vec<PathBuf> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/') && path.contains(".so"))
        .map(PathBuf::from)
        .collect();
    libs.sort();
    libs.dedup();
    libs
}

fn is_loaded(file_name: &str) -> Option<PathBuf> {
    loaded_libraries()
        .into_iter()
        .find(|p| p.file_name().and_then(|n| n.to_str()) == Some(file_name))
}

/// Whether `libtorch_cuda` is shipped with, and loaded by, this process's libtorch.
pub fn cuda_library() -> Result<CudaLibrary> {
    let candidate = libtorch_lib_dir()?.join("libtorch_cuda.so");
    if !candidate.exists() {
        return Ok(CudaLibrary::NotShipped);
    }
    Ok(match is_loaded("libtorch_cuda.so") {
        Some(path) => CudaLibrary::Loaded(path),
        None => CudaLibrary::NotLoaded(candidate),
    })
}

/// Loads `libtorch_cuda` globally if this libtorch ships it and it is not loaded yet; call it
/// before the first CUDA query. Returns the state after the attempt.
pub fn ensure_cuda_library() -> Result<CudaLibrary> {
    match cuda_library()? {
        CudaLibrary::NotLoaded(path) => {
            let c = CString::new(path.to_string_lossy().into_owned()).map_err(|_| {
                Error::InvalidArgument {
                    op: "ensure_cuda_library",
                    message: format!("{} contains a NUL byte", path.display()),
                }
            })?;
            // SAFETY: `c` is a valid path string for the duration of the call.
            ffi::check("dlopen libtorch_cuda", unsafe {
                ffi::kiln_dlopen_global(c.as_ptr())
            })?;
            cuda_library()
        }
        state => Ok(state),
    }
}
