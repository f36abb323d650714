//! The libtorch this process runs on, as plain facts: version, location, and whether its CUDA
//! support is really usable.

use std::path::PathBuf;

use kiln_torch_ext::{cuda, runtime};

use crate::DeviceError;

/// How libtorch's CUDA library came to be (or not be) in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CudaLibraryState {
    /// This libtorch is a CPU (or MPS) build: it has no `libtorch_cuda`.
    NotShipped,
    /// Loaded at start-up because the binary links it (kiln's build scripts see to that).
    Linked,
    /// The binary had dropped it (linked with `--as-needed`); kiln loaded it at run time.
    LoadedAtRuntime,
}

/// Facts about the libtorch in this process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LibtorchInfo {
    /// The libtorch version kiln was compiled against, e.g. `2.11.0`.
    pub version: String,
    /// Directory the running `libtorch_cpu` was loaded from.
    pub lib_dir: PathBuf,
    pub cuda_library: CudaLibraryState,
    /// Whether libtorch can use CUDA now (a driver and at least one GPU are present).
    pub cuda_available: bool,
    /// CUDA devices libtorch sees (after `CUDA_VISIBLE_DEVICES`).
    pub cuda_device_count: usize,
    /// Whether kiln's native CUDA functions were compiled in.
    pub native_cuda: bool,
    /// The CUDA runtime version libtorch was compiled with ("13.0"), if it has CUDA.
    pub cuda_compiled: Option<String>,
    /// The cuDNN version libtorch was compiled with, if any.
    pub cudnn_compiled: Option<String>,
}

/// Makes sure libtorch's CUDA library is loaded if this libtorch has one (loading it now, with a
/// warning, when the binary was linked without it); call before the first CUDA query.
pub fn ensure_cuda_library() -> Result<CudaLibraryState, DeviceError> {
    Ok(match runtime::cuda_library()? {
        runtime::CudaLibrary::NotShipped => CudaLibraryState::NotShipped,
        runtime::CudaLibrary::Loaded(_) => CudaLibraryState::Linked,
        runtime::CudaLibrary::NotLoaded(path) => {
            tracing::warn!(
                "{} was not linked into this binary; loading it now",
                path.display()
            );
            runtime::ensure_cuda_library()?;
            CudaLibraryState::LoadedAtRuntime
        }
    })
}

/// Looks at the running libtorch, first making sure its CUDA library is loaded if it has one.
pub fn libtorch_info() -> Result<LibtorchInfo, DeviceError> {
    let cuda_library = ensure_cuda_library()?;
    let (cuda_compiled, cudnn_compiled) = match cuda_library {
        CudaLibraryState::NotShipped => (None, None),
        _ => match cuda::build_versions() {
            Ok((cudart, cudnn)) => (Some(cudart), cudnn),
            Err(e) => {
                tracing::debug!("CUDA build versions unavailable: {e}");
                (None, None)
            }
        },
    };
    Ok(LibtorchInfo {
        cuda_compiled,
        cudnn_compiled,
        version: runtime::torch_version().to_owned(),
        lib_dir: runtime::libtorch_lib_dir()?,
        cuda_library,
        cuda_available: tch::Cuda::is_available(),
        cuda_device_count: cuda::device_count()?,
        native_cuda: cuda::built_with_cuda(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_the_libtorch_kiln_was_built_against() {
        let info = libtorch_info().unwrap();
        assert_eq!(info.version, "2.11.0");
        assert!(info.lib_dir.join("libtorch_cpu.so").exists());
        // In kiln's own binaries the CUDA library is linked, never patched in at run time.
        let shipped = info.lib_dir.join("libtorch_cuda.so").exists();
        let expected = if shipped {
            CudaLibraryState::Linked
        } else {
            CudaLibraryState::NotShipped
        };
        assert_eq!(info.cuda_library, expected);
        assert_eq!(info.cuda_available, info.cuda_device_count > 0);
    }
}
