//! The error of device requests and selection.

/// A device request that is malformed, or that this machine cannot satisfy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SelectError {
    /// A device string that is not one of the accepted forms.
    #[error("`{request}` is not a device: use one of auto, cpu, cuda, cuda:N, mps")]
    BadRequest { request: String },
    /// A well-formed request this machine cannot satisfy.
    #[error("device `{request}` is not available: {reason}. This machine has: {available}")]
    Unavailable {
        request: String,
        reason: String,
        available: String,
    },
}
