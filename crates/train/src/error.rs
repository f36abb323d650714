//! The error type of the training layer.

/// What can go wrong while training; wraps the lower layers' errors, which name what is at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    #[error(transparent)]
    Data(#[from] kiln_data::DataError),
    #[error(transparent)]
    Torch(#[from] kiln_torch_ext::Error),
    #[error("libtorch: {0}")]
    Tch(#[from] tch::TchError),
    #[error(transparent)]
    Device(#[from] kiln_device::DeviceError),
    /// Reading or writing a run's files.
    #[error("{path}: {message}")]
    File {
        path: std::path::PathBuf,
        message: String,
    },
    /// A plan value that does not fit where it goes.
    #[error("`{key}` = {value} is invalid: {expected}")]
    InvalidPlan {
        key: &'static str,
        value: String,
        expected: String,
    },
}
