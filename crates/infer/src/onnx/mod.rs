//! ONNX Runtime in kiln: the library (found and loaded at run time, once per process) and the
//! ONNX engine that runs `.onnx` models. Only this crate talks to ONNX Runtime, and no `ort`
//! type appears in its public API (ort is a release candidate; an upgrade touches only here).

mod engine;
pub mod metadata;
pub(crate) mod python;
mod runtime;

use std::path::{Path, PathBuf};

use kiln_train::checkpoint::{self, Checkpoint};

pub use engine::{OnnxEngine, OnnxOptions, Provenance};
pub use runtime::{ORT_VERSION, OnnxRuntime, python_package_dir, runtime};

/// The CUDA and cuDNN library directories of the torch wheel this process's libtorch came
/// from (`site-packages/nvidia/cu13/lib`, `…/cudnn/lib`), for the CUDA execution provider,
/// which has no search path of its own. Found through the loaded `libtorch_cpu.so`.
fn torch_cuda_libraries() -> Option<(PathBuf, PathBuf)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let torch_lib = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .map(PathBuf::from)?;
    // site-packages/torch/lib/libtorch_cpu.so → site-packages/nvidia
    let nvidia = torch_lib.parent()?.parent()?.parent()?.join("nvidia");
    let cuda = nvidia.join("cu13").join("lib");
    let cudnn = nvidia.join("cudnn").join("lib");
    (cuda.is_dir() && cudnn.is_dir()).then_some((cuda, cudnn))
}

/// The checkpoint `kiln export` recorded in the ONNX file `path`, if it is still there with the
/// same weights; otherwise why not (for the report: then only onnxruntime can run the file).
pub fn exported_from(path: &Path) -> Result<Checkpoint, String> {
    let props = metadata::read(path).map_err(|e| e.to_string())?;
    let Some(source) = metadata::get(&props, "kiln.source") else {
        return Err("it was not exported by kiln".to_owned());
    };
    let ckpt = crate::model::open_checkpoint(Path::new(&source))
        .map_err(|e| format!("the checkpoint it was exported from cannot be opened ({e})"))?;
    let recorded = metadata::get(&props, "kiln.weights_sha256");
    if recorded.is_none() || recorded != weights_digest(&ckpt) {
        return Err(format!(
            "the checkpoint it was exported from, {}, holds other weights now",
            ckpt.dir.display()
        ));
    }
    Ok(ckpt)
}

/// The SHA-256 of a checkpoint's weights file (a kiln model's, or a TorchScript module's).
pub fn weights_digest(ckpt: &Checkpoint) -> Option<String> {
    ckpt.meta
        .files
        .get(checkpoint::MODEL_FILE)
        .or_else(|| ckpt.meta.files.get(checkpoint::SCRIPT_FILE))
        .cloned()
}

/// The SHA-256 of a file, in hex.
pub fn file_digest(path: &Path) -> Result<String, crate::InferError> {
    use sha2::Digest as _;
    use std::io::Read as _;
    let mut file = std::fs::File::open(path).map_err(|e| crate::InferError::file(path, e))?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| crate::InferError::file(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
