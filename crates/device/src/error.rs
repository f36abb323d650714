//! The error type of the device layer.

/// What can go wrong while looking at or configuring hardware.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
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
    /// A call into libtorch through the native extension failed.
    #[error(transparent)]
    Native(#[from] kiln_torch_ext::Error),
}
