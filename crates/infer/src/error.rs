//! The error type of the inference layer.

use std::path::PathBuf;

/// What can go wrong in inference; every variant names what is at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InferError {
    #[error(transparent)]
    Data(#[from] kiln_data::DataError),
    #[error(transparent)]
    Train(#[from] kiln_train::TrainError),
    #[error(transparent)]
    Device(#[from] kiln_device::DeviceError),
    #[error(transparent)]
    Torch(#[from] kiln_torch_ext::Error),
    #[error("libtorch: {0}")]
    Tch(#[from] tch::TchError),
    /// A file that cannot be read, written or understood.
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    /// The model cannot be loaded or run as asked.
    #[error("model {model}: {message}")]
    Model { model: String, message: String },
    /// Inputs that do not fit the model.
    #[error("inputs: {0}")]
    Input(String),
    /// ONNX Runtime's library cannot be found or used; the message says what was tried and
    /// how to provision it.
    #[error("{0}")]
    OnnxRuntimeMissing(String),
    /// An export whose file does not compute what kiln's model computes.
    #[error(
        "the exported model's outputs differ from kiln's by up to {max_abs:.3e} (tolerance \
         {tolerance:.0e}); nothing was written"
    )]
    ExportMismatch { max_abs: f64, tolerance: f64 },
    /// An int8 model that scores worse than its fp32 original beyond the task's limit.
    #[error(
        "int8 quantization refused: on {samples} samples of {data} the {metric} is {int8:.4} \
         with int8 weights against {fp32:.4} in fp32 (allowed: {limit}); nothing was written"
    )]
    Quantization {
        data: String,
        samples: usize,
        metric: &'static str,
        fp32: f64,
        int8: f64,
        limit: &'static str,
    },
    /// A setting that does not fit this machine or model.
    #[error("`{key}` = {value}: {expected}")]
    Setting {
        key: &'static str,
        value: String,
        expected: String,
    },
}

impl InferError {
    /// Whether an allocator (CUDA's, or the CPU's) ran out of memory, by the kind of the error
    /// underneath (tch's by [`kiln_torch_ext::tch_out_of_memory`]).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            InferError::Train(e) => e.is_out_of_memory(),
            InferError::Torch(e) => e.is_out_of_memory(),
            InferError::Tch(e) => kiln_torch_ext::tch_out_of_memory(e),
            _ => false,
        }
    }

    pub(crate) fn file(path: &std::path::Path, message: impl std::fmt::Display) -> Self {
        InferError::File {
            path: path.to_owned(),
            message: message.to_string(),
        }
    }
}

/// A failure inside a function captured as a CUDA graph, handed back through C++ with its
/// kind.
impl From<InferError> for kiln_torch_ext::CallbackError {
    fn from(e: InferError) -> Self {
        let kind = match &e {
            InferError::Torch(inner) => inner.kind(),
            other if other.is_out_of_memory() => kiln_torch_ext::ErrorKind::OutOfMemory,
            _ => kiln_torch_ext::ErrorKind::Other,
        };
        Self::new(kind, e.to_string())
    }
}
