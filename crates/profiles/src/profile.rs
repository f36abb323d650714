//! One profile: the raw file format (close to the TOML) and the validated, typed profile.

use std::fmt;
use std::path::PathBuf;

use kiln_core::ComputeCapability;
use kiln_core::settings::{AmpDtype, MatmulPrecision};
use serde::Deserialize;

use crate::ProfileError;
use crate::matching::{Pattern, tokenize};

/// Which kind of device a profile is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProfileDevice {
    Cuda,
    Mps,
    Cpu,
}

impl fmt::Display for ProfileDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cuda => "cuda",
            Self::Mps => "mps",
            Self::Cpu => "cpu",
        })
    }
}

/// Where a profile was defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Shipped with kiln (file name in the repository's `profiles/`).
    BuiltIn(String),
    /// A file in the user's profile directory.
    User(PathBuf),
    /// Derived by kiln for a GPU no profile names.
    Derived,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BuiltIn(file) => write!(f, "built-in profiles/{file}"),
            Self::User(path) => write!(f, "{}", path.display()),
            Self::Derived => f.write_str("derived by kiln"),
        }
    }
}

/// A profile file as written (stage one: close to the TOML; unknown keys rejected).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: String,
    display_name: String,
    device: ProfileDevice,
    #[serde(rename = "match")]
    patterns: Vec<String>,
    memory_gib: f64,
    compute_capability: String,
    train_batch_size: u32,
    infer_batch_size: u32,
    /// Optional in a user's file: [`DEFAULT_SLIDING_WINDOW_BATCH`] where absent.
    #[serde(default = "default_sliding_window_batch")]
    sliding_window_batch_size: u32,
    num_workers: u32,
    memory_fraction: f64,
    amp_dtype: String,
    tf32: bool,
    matmul_precision: String,
    cudnn_benchmark: bool,
    cudnn_deterministic: bool,
    #[serde(default)]
    notes: String,
}

/// The windows a batch of `kiln infer --sliding-window` takes where a profile does not say.
pub const DEFAULT_SLIDING_WINDOW_BATCH: u32 = 4;

fn default_sliding_window_batch() -> u32 {
    DEFAULT_SLIDING_WINDOW_BATCH
}

/// A validated profile (stage two: typed values).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Short unique name, e.g. `h100`.
    pub name: String,
    pub display_name: String,
    pub device: ProfileDevice,
    /// Name patterns matched against NVML GPU names (see [`crate::tokenize`]).
    pub patterns: Vec<Pattern>,
    /// The GPU memory the batch sizes were chosen for.
    pub memory_gib: f64,
    pub compute_capability: ComputeCapability,
    pub train_batch_size: u32,
    pub infer_batch_size: u32,
    /// Windows per batch of sliding-window inference (`infer.sliding_window.batch_size`).
    pub sliding_window_batch_size: u32,
    pub num_workers: u32,
    /// Fraction of GPU memory the caching allocator may use, in (0, 1].
    pub memory_fraction: f64,
    pub amp_dtype: AmpDtype,
    pub tf32: bool,
    pub matmul_precision: MatmulPrecision,
    pub cudnn_benchmark: bool,
    pub cudnn_deterministic: bool,
    pub notes: String,
    pub origin: Origin,
}

impl Profile {
    /// Parses and validates one profile file; errors name the file and the key.
    pub fn parse(text: &str, origin: Origin) -> Result<Profile, ProfileError> {
        let file = origin.to_string();
        let raw: RawProfile = toml::from_str(text).map_err(|e| ProfileError::Parse {
            file: file.clone(),
            message: e.message().to_owned()
                + &e.span()
                    .map(|s| {
                        let line = text[..s.start].lines().count().max(1);
                        format!(" (line {line})")
                    })
                    .unwrap_or_default(),
        })?;
        let invalid = |key: &'static str, message: String| ProfileError::Invalid {
            file: file.clone(),
            key,
            message,
        };
        if raw.name.is_empty()
            || !raw
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(invalid(
                "name",
                format!(
                    "must be lowercase letters, digits and '-', got `{}`",
                    raw.name
                ),
            ));
        }
        if raw.device == ProfileDevice::Cuda && raw.patterns.is_empty() {
            return Err(invalid(
                "match",
                "must list at least one GPU name pattern for a cuda profile".to_owned(),
            ));
        }
        let patterns = raw
            .patterns
            .iter()
            .map(|p| {
                let tokens = tokenize(p);
                if tokens.is_empty() {
                    Err(invalid(
                        "match",
                        format!("pattern `{p}` has no letters or digits"),
                    ))
                } else {
                    Ok(Pattern {
                        text: p.clone(),
                        tokens,
                    })
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !(raw.memory_gib.is_finite() && raw.memory_gib > 0.0) {
            return Err(invalid(
                "memory_gib",
                format!("must be > 0, got {}", raw.memory_gib),
            ));
        }
        for (key, value) in [
            ("train_batch_size", raw.train_batch_size),
            ("infer_batch_size", raw.infer_batch_size),
            ("sliding_window_batch_size", raw.sliding_window_batch_size),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1".to_owned()));
            }
        }
        if !(raw.memory_fraction > 0.0 && raw.memory_fraction <= 1.0) {
            return Err(invalid(
                "memory_fraction",
                format!("must be in (0, 1], got {}", raw.memory_fraction),
            ));
        }
        Ok(Profile {
            compute_capability: raw
                .compute_capability
                .parse()
                .map_err(|e| invalid("compute_capability", e))?,
            amp_dtype: raw
                .amp_dtype
                .parse::<AmpDtype>()
                .map_err(|e| invalid("amp_dtype", e.to_string()))?,
            matmul_precision: raw
                .matmul_precision
                .parse::<MatmulPrecision>()
                .map_err(|e| invalid("matmul_precision", e.to_string()))?,
            name: raw.name,
            display_name: raw.display_name,
            device: raw.device,
            patterns,
            memory_gib: raw.memory_gib,
            train_batch_size: raw.train_batch_size,
            infer_batch_size: raw.infer_batch_size,
            sliding_window_batch_size: raw.sliding_window_batch_size,
            num_workers: raw.num_workers,
            memory_fraction: raw.memory_fraction,
            tf32: raw.tf32,
            cudnn_benchmark: raw.cudnn_benchmark,
            cudnn_deterministic: raw.cudnn_deterministic,
            notes: raw.notes,
            origin,
        })
    }
}
