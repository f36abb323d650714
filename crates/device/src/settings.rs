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

/// The backend settings a run applies to libtorch (process-wide).
#[derive(Debug, Clone, PartialEq)]
pub struct BackendSettings {
    pub tf32: bool,
    pub matmul_precision: MatmulPrecision,
    pub cudnn_benchmark: bool,
    pub cudnn_deterministic: bool,
    pub deterministic: Determinism,
    /// Fraction of the GPU's memory the caching allocator may take, in (0, 1].
    pub memory_fraction: f64,
    /// CPU intra-op threads; 0 keeps libtorch's default.
    pub intra_op_threads: u64,
    /// CPU inter-op threads; 0 keeps libtorch's default.
    pub inter_op_threads: u64,
    pub seed: u64,
}

/// What happened to one setting.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    Applied,
    /// The setting has nothing to act on for this device; it was left alone.
    NotApplicable(String),
    /// libtorch refused it.
    Failed(String),
}

/// One line of the apply report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AppliedSetting {
    pub setting: &'static str,
    pub value: String,
    pub outcome: Outcome,
}

/// Applies `settings` for a run on `device` and reports each setting's outcome.
pub fn apply(settings: &BackendSettings, device: crate::Device) -> Vec<AppliedSetting> {
    use kiln_torch_ext::{cuda, flags, memory};
    let is_cuda = matches!(device, crate::Device::Cuda(_));
    let mut report = Vec::new();
    let mut record = |setting: &'static str, value: String, outcome: Outcome| {
        report.push(AppliedSetting {
            setting,
            value,
            outcome,
        });
    };
    let done = |r: kiln_torch_ext::Result<()>| match r {
        Ok(()) => Outcome::Applied,
        Err(e) => Outcome::Failed(e.to_string()),
    };
    let cuda_only = |what: &str| {
        Outcome::NotApplicable(format!(
            "{what} is a CUDA setting and this run uses {device}"
        ))
    };

    record(
        "matmul_precision",
        settings.matmul_precision.to_string(),
        done(flags::set_float32_matmul_precision(
            settings.matmul_precision,
        )),
    );
    for (name, flag, value) in [
        ("tf32 (cuBLAS)", flags::Flag::Tf32CuBlas, settings.tf32),
        ("tf32 (cuDNN)", flags::Flag::Tf32CuDnn, settings.tf32),
        (
            "cudnn_benchmark",
            flags::Flag::CuDnnBenchmark,
            settings.cudnn_benchmark,
        ),
        (
            "cudnn_deterministic",
            flags::Flag::CuDnnDeterministic,
            settings.cudnn_deterministic,
        ),
    ] {
        let outcome = if is_cuda {
            done(flags::set_flag(flag, value))
        } else {
            cuda_only(name)
        };
        record(name, value.to_string(), outcome);
    }
    record(
        "deterministic",
        format!("{:?}", settings.deterministic).to_ascii_lowercase(),
        done(flags::set_deterministic_algorithms(settings.deterministic)),
    );
    let fraction = settings.memory_fraction.to_string();
    match device {
        crate::Device::Cuda(i) => record(
            "memory_fraction",
            fraction,
            done(cuda::set_memory_fraction(settings.memory_fraction, i)),
        ),
        _ => record("memory_fraction", fraction, cuda_only("memory_fraction")),
    }
    for (name, n, set) in [
        (
            "intra_op_threads",
            settings.intra_op_threads,
            memory::set_num_threads as fn(usize) -> kiln_torch_ext::Result<()>,
        ),
        (
            "inter_op_threads",
            settings.inter_op_threads,
            memory::set_num_interop_threads,
        ),
    ] {
        let outcome = if n == 0 {
            Outcome::NotApplicable("0 keeps libtorch's default".to_owned())
        } else {
            done(set(usize::try_from(n).unwrap_or(usize::MAX)))
        };
        record(name, n.to_string(), outcome);
    }
    {
        let _generator = kiln_torch_ext::rng::cpu_generator_lock();
        tch::manual_seed(i64::from_ne_bytes(settings.seed.to_ne_bytes()));
    }
    record("seed", settings.seed.to_string(), Outcome::Applied);
    report
}
