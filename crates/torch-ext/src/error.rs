//! The error type of the native extension, the kinds of error callers tell apart, and the one
//! recogniser of libtorch's out-of-memory errors that reach Rust through tch instead.

/// What can go wrong in a native call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libtorch threw a C++ exception; `kind` comes from its C++ type (see [`ErrorKind`]),
    /// `message` is its text without the C++ backtrace.
    #[error("libtorch error in {op}: {message}")]
    Torch {
        op: &'static str,
        kind: ErrorKind,
        message: String,
    },
    /// The arguments were rejected before reaching libtorch.
    #[error("invalid arguments to {op}: {message}")]
    InvalidArgument { op: &'static str, message: String },
    /// The operation needs a capability this build or machine does not have.
    #[error("{op} is unavailable: {reason}")]
    Unavailable { op: &'static str, reason: String },
}

impl Error {
    /// The kind of the error: a libtorch error's own, [`ErrorKind::InvalidArgument`] for
    /// arguments rejected on the Rust side, [`ErrorKind::Other`] for a missing capability.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Torch { kind, .. } => *kind,
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::Unavailable { .. } => ErrorKind::Other,
        }
    }

    /// Whether an allocator (CUDA's, or the CPU's) ran out of memory.
    pub fn is_out_of_memory(&self) -> bool {
        self.kind() == ErrorKind::OutOfMemory
    }

    /// Whether a collective or the rendezvous of a process group failed.
    pub fn is_distributed(&self) -> bool {
        self.kind() == ErrorKind::Distributed
    }

    /// A libtorch error that reached us through tch (as text), with its kind as far as tch
    /// lets us tell ([`tch_out_of_memory`]).
    pub(crate) fn from_tch(op: &'static str, e: &tch::TchError) -> Self {
        Error::Torch {
            op,
            kind: ErrorKind::of_tch(e),
            message: e.to_string(),
        }
    }
}

/// The kind of a libtorch error, from the type of the C++ exception (`csrc/boundary.h` sorts
/// them; the codes are that file's `kiln::ErrorKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An allocator ran out of memory (`c10::OutOfMemoryError`, `std::bad_alloc`).
    OutOfMemory,
    /// An argument libtorch (or kiln's C++) rejected (`c10::ValueError`, `IndexError`,
    /// `TypeError`).
    InvalidArgument,
    /// No implementation for these arguments, e.g. no kernel for the tensor's backend
    /// (`c10::NotImplementedError`).
    NotImplemented,
    /// A collective or the rendezvous failed: a timeout, a rank that left, an unreachable
    /// master, ranks that disagree (`c10::DistError`, or anything thrown out of a collective).
    Distributed,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// The kind of C ABI code `code`; an unknown code is [`ErrorKind::Other`].
    pub(crate) fn from_code(code: u8) -> Self {
        match code {
            2 => ErrorKind::OutOfMemory,
            3 => ErrorKind::InvalidArgument,
            4 => ErrorKind::NotImplemented,
            5 => ErrorKind::Distributed,
            _ => ErrorKind::Other,
        }
    }

    /// The kind of a tch error, as far as its text tells ([`tch_out_of_memory`]).
    fn of_tch(e: &tch::TchError) -> Self {
        if tch_out_of_memory(e) {
            ErrorKind::OutOfMemory
        } else {
            ErrorKind::Other
        }
    }

    /// The C ABI code of this kind (what a Rust callback returns to C++).
    pub(crate) fn code(self) -> u8 {
        match self {
            ErrorKind::Other => 1,
            ErrorKind::OutOfMemory => 2,
            ErrorKind::InvalidArgument => 3,
            ErrorKind::NotImplemented => 4,
            ErrorKind::Distributed => 5,
        }
    }
}

/// Whether a tch error is an allocator running out of memory.
///
/// tch turns every C++ exception into the text of a `TchError::Torch`, so for errors of tch's
/// own calls (`f_` methods, a TorchScript module's forward) the text is the only signal there
/// is; kiln's own calls carry the kind ([`Error::is_out_of_memory`]).
pub fn tch_out_of_memory(e: &tch::TchError) -> bool {
    matches!(e, tch::TchError::Torch(text) if out_of_memory_text(text))
}

/// Whether libtorch's error text says an allocator ran out of memory: CUDA's caching allocator
/// says "CUDA out of memory", the CPU allocator "DefaultCPUAllocator: can't allocate memory".
/// The one place that reads libtorch's text for this; it serves where the C++ type does not
/// tell: tch's errors ([`tch_out_of_memory`]), and the CPU allocator's failure, which is a
/// plain `c10::Error` (a `CAFFE_ENFORCE`), not a `c10::OutOfMemoryError`.
pub(crate) fn out_of_memory_text(text: &str) -> bool {
    text.contains("out of memory") || text.contains("can't allocate memory")
}

/// An error a Rust callback hands back through C++ (a checkpointed block, a function captured
/// as a CUDA graph): its kind survives the round trip, so running out of memory inside the
/// callback is still [`ErrorKind::OutOfMemory`] when the call returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CallbackError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// A message alone is an error of kind [`ErrorKind::Other`].
impl From<String> for CallbackError {
    fn from(message: String) -> Self {
        Self::new(ErrorKind::Other, message)
    }
}

impl From<&str> for CallbackError {
    fn from(message: &str) -> Self {
        Self::new(ErrorKind::Other, message)
    }
}

impl From<Error> for CallbackError {
    fn from(e: Error) -> Self {
        Self::new(e.kind(), e.to_string())
    }
}

impl From<tch::TchError> for CallbackError {
    fn from(e: tch::TchError) -> Self {
        Self::new(ErrorKind::of_tch(&e), e.to_string())
    }
}

/// Result alias of the native extension.
pub type Result<T, E = Error> = std::result::Result<T, E>;
