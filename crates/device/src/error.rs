//! The error type of the device layer.

/// What can go wrong while looking at or configuring hardware.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// A device request that is malformed or that this machine cannot satisfy.
    #[error(transparent)]
    Select(#[from] kiln_core::SelectError),
    /// A call into libtorch through the native extension failed.
    #[error(transparent)]
    Native(#[from] kiln_torch_ext::Error),
    /// A file of kiln's cache could not be written.
    #[error("{}: {message}", path.display())]
    File {
        path: std::path::PathBuf,
        message: String,
    },
}
