//! The error type of the profiles crate.

use std::path::PathBuf;

/// What can be wrong with profiles or a request for one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// A profile file is not valid TOML or has unknown or missing keys.
    #[error("profile file {file}: {message}")]
    Parse { file: String, message: String },
    /// A key has a value outside what is valid.
    #[error("profile file {file}: `{key}` {message}")]
    Invalid {
        file: String,
        key: &'static str,
        message: String,
    },
    /// Two files define the same profile name in one source.
    #[error("profile `{name}` is defined twice: in {first} and in {second}")]
    DuplicateName {
        name: String,
        first: String,
        second: String,
    },
    /// Two profiles claim the same NVML name pattern, so matching would be ambiguous.
    #[error(
        "profiles `{first}` and `{second}` both match GPU names by `{pattern}`; make one more specific"
    )]
    AmbiguousPattern {
        pattern: String,
        first: String,
        second: String,
    },
    /// A GPU name matches two profiles equally well.
    #[error(
        "GPU `{gpu}` matches profiles `{first}` (by `{first_pattern}`) and `{second}` (by `{second_pattern}`) equally well; add a more specific pattern to one of them"
    )]
    AmbiguousMatch {
        gpu: String,
        first: String,
        first_pattern: String,
        second: String,
        second_pattern: String,
    },
    /// No profile has this name.
    #[error("no profile is named `{name}`{suggestion}; known profiles: {known}")]
    Unknown {
        name: String,
        suggestion: String,
        known: String,
    },
    /// The user's profile directory cannot be read.
    #[error("cannot read the profile directory {dir}: {message}")]
    UserDir { dir: PathBuf, message: String },
}
