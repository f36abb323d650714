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
    /// A checkpoint that does not fit on its file system (the path, the bytes needed and
    /// free); nothing of it was left behind.
    #[error(transparent)]
    NoSpace(#[from] kiln_data::NoSpace),
    /// A model file kiln will not hand to libtorch or Python: loading it could run code of its
    /// own (a pickle importing anything but tensor types, native code, a shape expression
    /// PyTorch would evaluate), or it is malformed in a way that could.
    /// `reason` is the `program::archive::Refusal`, as text.
    #[error(
        "{}: refused before loading: {reason} (see \"What kiln trusts\" in kiln's README)",
        path.display()
    )]
    Refused {
        path: std::path::PathBuf,
        reason: String,
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
    /// A collective of a data-parallel run failed: another rank stopped or died, the master
    /// could not be reached, or the ranks waited longer than `distributed.timeout_s`.
    #[error(
        "rank {rank} of {world_size}: {what} failed: {message}. Another rank has probably stopped or died (see its own output), or the ranks waited for each other longer than distributed.timeout_s"
    )]
    Distributed {
        rank: usize,
        world_size: usize,
        what: String,
        message: String,
    },
    /// The user's model failed (a TorchScript forward or loss rejected its input).
    #[error("{what}: {message}")]
    Model { what: String, message: String },
}

impl TrainError {
    /// Whether an allocator (CUDA's, or the CPU's) ran out of memory: a kiln call's error of
    /// that kind, a tch error that says so ([`kiln_torch_ext::tch_out_of_memory`]), or the
    /// trainer's own [`TrainError::OutOfMemory`].
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            TrainError::Torch(e) => e.is_out_of_memory(),
            TrainError::Tch(e) => kiln_torch_ext::tch_out_of_memory(e),
            TrainError::OutOfMemory { .. } => true,
            _ => false,
        }
    }
}

/// A failure inside a checkpointed block, handed back through C++ with its kind: running out
/// of memory there is still out of memory when the forward returns.
impl From<TrainError> for kiln_torch_ext::CallbackError {
    fn from(e: TrainError) -> Self {
        let kind = match &e {
            TrainError::Torch(inner) => inner.kind(),
            other if other.is_out_of_memory() => kiln_torch_ext::ErrorKind::OutOfMemory,
            _ => kiln_torch_ext::ErrorKind::Other,
        };
        Self::new(kind, e.to_string())
    }
}

/// The first line of an error text, trimmed.
pub(crate) fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_torch_ext::{CallbackError, ErrorKind};

    fn kiln(kind: ErrorKind, message: &str) -> TrainError {
        TrainError::Torch(kiln_torch_ext::Error::Torch {
            op: "fused AdamW",
            kind,
            message: message.to_owned(),
        })
    }

    #[test]
    fn out_of_memory_is_read_from_the_kind_of_kiln_errors_and_from_tch_errors() {
        assert!(kiln(ErrorKind::OutOfMemory, "allocator exhausted").is_out_of_memory());
        assert!(!kiln(ErrorKind::Other, "CUDA out of memory").is_out_of_memory());
        let tch = |m: &str| TrainError::Tch(tch::TchError::Torch(m.to_owned()));
        assert!(tch("CUDA out of memory. Tried to allocate 2.00 GiB").is_out_of_memory());
        assert!(tch("DefaultCPUAllocator: can't allocate memory: you tried").is_out_of_memory());
        assert!(!tch("mat1 and mat2 shapes cannot be multiplied").is_out_of_memory());
        let model = TrainError::Model {
            what: "forward".to_owned(),
            message: "out of memory".to_owned(),
        };
        assert!(!model.is_out_of_memory());
    }

    #[test]
    fn callback_errors_keep_the_kind() {
        let e = CallbackError::from(kiln(ErrorKind::InvalidArgument, "bad shape"));
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("bad shape"), "{}", e.message);
        let oom = TrainError::Tch(tch::TchError::Torch("CUDA out of memory.".to_owned()));
        assert_eq!(CallbackError::from(oom).kind, ErrorKind::OutOfMemory);
        let shape = TrainError::ShapeMismatch {
            what: "targets".to_owned(),
            expected: "[4]".to_owned(),
            got: "[3]".to_owned(),
        };
        assert_eq!(CallbackError::from(shape).kind, ErrorKind::Other);
    }

    /// What a checkpointed layer does (models.rs): a forward that runs out of memory inside
    /// the block is still out of memory once it has been through C++.
    #[test]
    fn out_of_memory_inside_a_checkpointed_block_is_still_out_of_memory() {
        let x = tch::Tensor::ones([2, 3], (tch::Kind::Float, tch::Device::Cpu));
        // A message that says nothing of memory: only the kind can carry it through.
        let failing = |_: &tch::Tensor| -> Result<tch::Tensor, TrainError> {
            Err(kiln(ErrorKind::OutOfMemory, "the allocator is exhausted"))
        };
        let e = kiln_torch_ext::recompute::checkpoint(&x, move |x| {
            failing(x).map_err(CallbackError::from)
        })
        .unwrap_err();
        assert!(TrainError::from(e).is_out_of_memory());
    }
}
