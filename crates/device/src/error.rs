//! The error type of the device layer.

/// What can go wrong while looking at or configuring hardware.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// A call into libtorch through the native extension failed.
    #[error(transparent)]
    Native(#[from] kiln_torch_ext::Error),
}
