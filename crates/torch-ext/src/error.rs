//! The error type of the native extension.

/// What can go wrong in a native call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libtorch threw a C++ exception; `message` is its text without the C++ backtrace.
    #[error("libtorch error in {op}: {message}")]
    Torch { op: &'static str, message: String },
    /// The arguments were rejected before reaching libtorch.
    #[error("invalid arguments to {op}: {message}")]
    InvalidArgument { op: &'static str, message: String },
    /// The operation needs a capability this build or machine does not have.
    #[error("{op} is unavailable: {reason}")]
    Unavailable { op: &'static str, reason: String },
}

/// Result alias of the native extension.
pub type Result<T, E = Error> = std::result::Result<T, E>;
