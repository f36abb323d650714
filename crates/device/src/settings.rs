//! Backend settings a run applies to libtorch, as plain types: precision choices and flags.
//!
//! The enums are what the crates above use in profiles and configuration, so they never need
//! the native extension's types themselves.

use std::fmt;
use std::str::FromStr;

pub use kiln_torch_ext::flags::{Determinism, MatmulPrecision};

/// Automatic mixed precision: which reduced dtype autocast runs eligible ops in, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AmpDtype {
    /// No autocast: everything in float32.
    None,
    Fp16,
    Bf16,
}

impl AmpDtype {
    pub const ALL: [AmpDtype; 3] = [Self::None, Self::Fp16, Self::Bf16];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Fp16 => "fp16",
            Self::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for AmpDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AmpDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "fp32" | "float32" | "off" => Ok(Self::None),
            "fp16" | "float16" | "half" => Ok(Self::Fp16),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            _ => Err(format!("`{s}` is not an AMP dtype: use none, fp16 or bf16")),
        }
    }
}

/// Parses a matmul precision, with an error that lists the valid names.
pub fn parse_matmul_precision(s: &str) -> Result<MatmulPrecision, String> {
    s.trim()
        .to_ascii_lowercase()
        .parse()
        .map_err(|_| format!("`{s}` is not a matmul precision: use highest, high or medium"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amp_dtypes_parse_with_common_spellings() {
        for d in AmpDtype::ALL {
            assert_eq!(d.as_str().parse::<AmpDtype>().unwrap(), d);
        }
        assert_eq!("bfloat16".parse::<AmpDtype>().unwrap(), AmpDtype::Bf16);
        assert_eq!("float16".parse::<AmpDtype>().unwrap(), AmpDtype::Fp16);
        let err = "fp8".parse::<AmpDtype>().unwrap_err();
        assert!(
            err.contains("`fp8`") && err.contains("none, fp16 or bf16"),
            "{err}"
        );
        assert_eq!(
            parse_matmul_precision("High").unwrap(),
            MatmulPrecision::High
        );
        assert!(
            parse_matmul_precision("low")
                .unwrap_err()
                .contains("highest, high or medium")
        );
    }
}
