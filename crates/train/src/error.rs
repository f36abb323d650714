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
    #[error(transparent)]
    Config(#[from] kiln_config::ConfigError),
    /// A stop was requested (SIGINT/SIGTERM); the run stopped after a whole step.
    #[error("stopped at step {step} as asked{}", checkpoint.as_ref().map_or_else(String::new, |c| format!("; checkpoint {} (continue with --resume)", c.display())))]
    Stopped {
        step: u64,
        checkpoint: Option<std::path::PathBuf>,
    },
    /// Too many consecutive steps had non-finite gradients.
    #[error(
        "{steps} consecutive steps had non-finite loss or gradients (train.max_bad_steps = {limit}); stopped at step {step}. Lower train.lr, keep train.clip_grad_norm on, or use train.amp = bf16 instead of fp16"
    )]
    NonFinite { steps: u64, limit: u64, step: u64 },
    /// CUDA ran out of memory even after splitting the step into the smallest micro-batches.
    #[error(
        "out of memory at step {step} with train.batch_size = {batch_size}, even in micro-batches of {micro_batch} ({message}). Lower train.batch_size or the model (model.d_model, model.layers), set model.activation_checkpointing = true, use train.amp = bf16, or raise performance.memory_fraction"
    )]
    OutOfMemory {
        step: u64,
        batch_size: u64,
        micro_batch: u64,
        message: String,
    },
    /// A checkpoint whose files are missing, cut short or fail their checksums: resume passes
    /// over it to an older one and moves it aside.
    #[error("{path}: {message}")]
    DamagedCheckpoint {
        path: std::path::PathBuf,
        message: String,
    },
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
    /// Tensors of shapes that do not go together (a model's output and the targets, a batch
    /// and the model's forward).
    #[error("{what}: expected {expected}; {got}")]
    ShapeMismatch {
        what: String,
        expected: String,
        got: String,
    },
    /// The user's model failed (a TorchScript forward or loss rejected its input).
    #[error("{what}: {message}")]
    Model { what: String, message: String },
}
