//! Process-wide libtorch math and algorithm flags: float32 matmul precision, TF32 on cuBLAS and
//! cuDNN, cuDNN benchmark/deterministic, and deterministic algorithms.
//!
//! These are global to the process (PyTorch's `torch.backends.*` and
//! `torch.set_float32_matmul_precision`). They can be set on any machine; on a machine without
//! CUDA the CUDA-only ones are stored and simply have nothing to act on. The option enums are
//! `kiln-core`'s, so they are parsed and printed in one place.

use std::ffi::{CString, c_int};

use crate::error::{Error, Result};
use crate::ffi;

pub use kiln_core::options::{Determinism, MatmulPrecision};

/// Sets the float32 matmul precision for the whole process.
pub fn set_float32_matmul_precision(precision: MatmulPrecision) -> Result<()> {
    let c = CString::new(precision.as_str()).expect("precision names have no NUL");
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    ffi::check("set_float32_matmul_precision", unsafe {
        ffi::kiln_set_float32_matmul_precision(c.as_ptr())
    })
}

/// The current float32 matmul precision.
pub fn float32_matmul_precision() -> Result<MatmulPrecision> {
    let mut code: c_int = -1;
    // SAFETY: `code` outlives the call.
    ffi::check("float32_matmul_precision", unsafe {
        ffi::kiln_float32_matmul_precision(&mut code)
    })?;
    match code {
        0 => Ok(MatmulPrecision::Highest),
        1 => Ok(MatmulPrecision::High),
        2 => Ok(MatmulPrecision::Medium),
        other => Err(Error::Torch {
            op: "float32_matmul_precision",
            kind: crate::ErrorKind::Other,
            message: format!("libtorch returned unknown precision code {other}"),
        }),
    }
}

/// A boolean backend flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flag {
    /// `torch.backends.cuda.matmul.allow_tf32`: TF32 in cuBLAS matmuls.
    Tf32CuBlas,
    /// `torch.backends.cudnn.allow_tf32`: TF32 in cuDNN convolutions.
    Tf32CuDnn,
    /// `torch.backends.cudnn.benchmark`: autotune convolution algorithms per shape.
    CuDnnBenchmark,
    /// `torch.backends.cudnn.deterministic`: only deterministic cuDNN algorithms.
    CuDnnDeterministic,
}

impl Flag {
    /// All flags.
    pub const ALL: [Flag; 4] = [
        Self::Tf32CuBlas,
        Self::Tf32CuDnn,
        Self::CuDnnBenchmark,
        Self::CuDnnDeterministic,
    ];

    fn code(self) -> c_int {
        match self {
            Self::Tf32CuBlas => 0,
            Self::Tf32CuDnn => 1,
            Self::CuDnnBenchmark => 2,
            Self::CuDnnDeterministic => 3,
        }
    }
}

/// Sets a backend flag for the whole process.
pub fn set_flag(flag: Flag, value: bool) -> Result<()> {
    // SAFETY: plain values in, error string out.
    ffi::check("set_flag", unsafe {
        ffi::kiln_set_flag(flag.code(), value)
    })
}

/// Reads a backend flag.
pub fn flag(flag: Flag) -> Result<bool> {
    let mut out = false;
    // SAFETY: `out` outlives the call.
    ffi::check("flag", unsafe { ffi::kiln_get_flag(flag.code(), &mut out) })?;
    Ok(out)
}

/// Sets deterministic-algorithms mode for the whole process.
pub fn set_deterministic_algorithms(mode: Determinism) -> Result<()> {
    let (enabled, warn_only) = match mode {
        Determinism::Off => (false, false),
        Determinism::Error => (true, false),
        Determinism::Warn => (true, true),
    };
    // SAFETY: plain values in, error string out.
    ffi::check("set_deterministic_algorithms", unsafe {
        ffi::kiln_set_deterministic_algorithms(enabled, warn_only)
    })
}

/// The current deterministic-algorithms mode.
pub fn deterministic_algorithms() -> Result<Determinism> {
    let (mut enabled, mut warn_only) = (false, false);
    // SAFETY: both outputs outlive the call.
    ffi::check("deterministic_algorithms", unsafe {
        ffi::kiln_deterministic_algorithms(&mut enabled, &mut warn_only)
    })?;
    Ok(match (enabled, warn_only) {
        (false, _) => Determinism::Off,
        (true, false) => Determinism::Error,
        (true, true) => Determinism::Warn,
    })
}
