//! The error type of the configuration layer.

use std::path::PathBuf;

/// What can be wrong with a configuration; every variant names the key or file at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key no section has.
    #[error("unknown key `{key}` (set by {set_by}){suggestion}; valid keys here: {valid}")]
    UnknownKey {
        key: String,
        set_by: String,
        suggestion: String,
        valid: String,
    },
    /// A value of the wrong type or outside what is valid.
    #[error("`{key}` = {value} (set by {set_by}) is invalid: {expected}")]
    InvalidValue {
        key: String,
        value: String,
        expected: String,
        set_by: String,
    },
    /// The configuration file cannot be read or parsed.
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    /// A `--set` argument that is not `section.key=value`.
    #[error("--set {arg}: {message}")]
    BadSet { arg: String, message: String },
    /// Anything else figment reports, with its own wording.
    #[error("configuration: {0}")]
    Other(String),
    #[error(transparent)]
    Profile(#[from] kiln_profiles::ProfileError),
    #[error(transparent)]
    Device(#[from] kiln_core::SelectError),
}
