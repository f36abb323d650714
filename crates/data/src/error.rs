//! The error type of the data layer.

/// What can go wrong while reading data; each variant names the sample, key or value at fault.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A sample could not be read.
    #[error("sample {index}: {message}")]
    Sample { index: usize, message: String },
    /// A worker panicked while reading a sample.
    #[error("data worker panicked on sample {index}: {message}")]
    WorkerPanic { index: usize, message: String },
    /// A loader or sampler setting outside what is valid.
    #[error("`{key}` = {value} is invalid: {expected}")]
    InvalidConfig {
        key: &'static str,
        value: String,
        expected: String,
    },
    /// Data that does not fit the dataset's declared shape.
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        what: String,
        expected: String,
        got: String,
    },
    /// A dataset file (manifest, shard, CSV) that is missing, malformed or inconsistent.
    #[error("{}: {message}", path.display())]
    File {
        path: std::path::PathBuf,
        message: String,
    },
    /// A write that does not fit on its file system (checked before writing, or found when a
    /// write failed for want of space).
    #[error(transparent)]
    NoSpace(#[from] crate::space::NoSpace),
    /// The worker threads are gone (the loader was shut down, or a worker died).
    #[error("the data loader's workers have stopped")]
    Disconnected,
}

impl DataError {
    /// An error about the file at `path`.
    pub fn file(path: &std::path::Path, message: impl Into<String>) -> Self {
        DataError::File {
            path: path.to_owned(),
            message: message.into(),
        }
    }
}

/// The error for reading sample `index` of a dataset of `len` samples.
pub(crate) fn out_of_range(index: usize, len: usize) -> DataError {
    DataError::Sample {
        index,
        message: format!("out of range (the dataset has {len} samples)"),
    }
}

/// What to do when a dataset does not fit.
pub(crate) const NO_SPACE_HINT: &str =
    "Free some space, or choose an output directory on a file system with more room";

/// The error of a failed write of `path`: [`NoSpace`](crate::space::NoSpace) where the file system is full (its
/// amounts filled in by the caller that knows them), else the I/O error.
pub(crate) fn write_failed(path: &std::path::Path, e: std::io::Error) -> DataError {
    if crate::space::is_full(&e) {
        return crate::space::NoSpace {
            path: path.to_owned(),
            what: "the dataset",
            needed: 0,
            available: 0,
            hint: NO_SPACE_HINT,
        }
        .into();
    }
    DataError::file(path, format!("cannot write: {e}"))
}
