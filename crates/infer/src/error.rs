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
    /// A setting that does not fit this machine or model.
    #[error("`{key}` = {value}: {expected}")]
    Setting {
        key: &'static str,
        value: String,
        expected: String,
    },
}

impl InferError {
    pub(crate) fn file(path: &std::path::Path, message: impl std::fmt::Display) -> Self {
        InferError::File {
            path: path.to_owned(),
            message: message.to_string(),
        }
    }
}
