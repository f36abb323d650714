//! Per-thread autocast (automatic mixed precision) state, with any dtype on CPU and CUDA.
//!
//! tch's own `autocast` only knows CUDA fp16. Autocast state in libtorch is thread-local: set
//! it on the thread that runs the forward pass. [`AutocastGuard`] is the scoped way to do that
//! (like `with torch.autocast(...)`); it is `!Send` so it cannot leave its thread.

use std::ffi::c_int;
use std::marker::PhantomData;

use crate::error::Result;
use crate::ffi;

/// The device types autocast has state for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    Cpu,
    Cuda,
}

impl DeviceType {
    fn code(self) -> c_int {
        match self {
            Self::Cpu => 0,
            Self::Cuda => 1,
        }
    }
}

/// The reduced precisions autocast can run eligible ops in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AutocastDtype {
    Float16,
    BFloat16,
}

impl AutocastDtype {
    fn code(self) -> c_int {
        match self {
            Self::Float16 => 0,
            Self::BFloat16 => 1,
        }
    }

    /// The matching tch kind.
    pub fn kind(self) -> tch::Kind {
        match self {
            Self::Float16 => tch::Kind::Half,
            Self::BFloat16 => tch::Kind::BFloat16,
        }
    }
}

/// Enables or disables autocast for `device` on the calling thread.
pub fn set_enabled(device: DeviceType, enabled: bool) -> Result<()> {
    // SAFETY: plain values in, error string out.
    ffi::check("autocast set_enabled", unsafe {
        ffi::kiln_autocast_set_enabled(device.code(), enabled)
    })
}

/// Whether autocast is enabled for `device` on the calling thread.
pub fn is_enabled(device: DeviceType) -> Result<bool> {
    let mut out = false;
    // SAFETY: `out` outlives the call.
    ffi::check("autocast is_enabled", unsafe {
        ffi::kiln_autocast_is_enabled(device.code(), &mut out)
    })?;
    Ok(out)
}

/// Sets the dtype autocast uses for `device` on the calling thread.
pub fn set_dtype(device: DeviceType, dtype: AutocastDtype) -> Result<()> {
    // SAFETY: plain values in, error string out.
    ffi::check("autocast set_dtype", unsafe {
        ffi::kiln_autocast_set_dtype(device.code(), dtype.code())
    })
}

/// The dtype autocast uses for `device` on the calling thread (`None` for a dtype other than
/// fp16/bf16, which only another library could have set).
pub fn dtype(device: DeviceType) -> Result<Option<AutocastDtype>> {
    let mut code: c_int = -1;
    // SAFETY: `code` outlives the call.
    ffi::check("autocast dtype", unsafe {
        ffi::kiln_autocast_dtype(device.code(), &mut code)
    })?;
    Ok(match code {
        0 => Some(AutocastDtype::Float16),
        1 => Some(AutocastDtype::BFloat16),
        _ => None,
    })
}

/// Autocast enabled for one device and dtype until dropped; the previous state is restored then.
///
/// Nested guards work like nested `torch.autocast` regions: the cast cache is cleared when the
/// outermost one ends.
#[derive(Debug)]
#[must_use = "autocast is disabled again as soon as the guard is dropped"]
pub struct AutocastGuard {
    device: DeviceType,
    previous_enabled: bool,
    previous_dtype: Option<AutocastDtype>,
    /// Autocast state is per thread, so the guard must stay on its thread.
    _not_send: PhantomData<*const ()>,
}

impl AutocastGuard {
    /// Enables autocast for `device` with `dtype` on the calling thread.
    pub fn new(device: DeviceType, dtype: AutocastDtype) -> Result<Self> {
        let previous_enabled = is_enabled(device)?;
        let previous_dtype = self::dtype(device)?;
        set_dtype(device, dtype)?;
        set_enabled(device, true)?;
        let mut depth: c_int = 0;
        // SAFETY: `depth` outlives the call.
        ffi::check("autocast enter", unsafe {
            ffi::kiln_autocast_enter(&mut depth)
        })?;
        Ok(Self {
            device,
            previous_enabled,
            previous_dtype,
            _not_send: PhantomData,
        })
    }

    /// The device type this guard enables autocast for.
    pub fn device(&self) -> DeviceType {
        self.device
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        let mut depth: c_int = 0;
        // Restoring plain thread-local values cannot fail for valid codes; errors here would
        // only mean a libtorch bug, and a destructor has nowhere to return them.
        // SAFETY: `depth` outlives the call.
        let _ = ffi::check("autocast exit", unsafe {
            ffi::kiln_autocast_exit(&mut depth)
        });
        let _ = set_enabled(self.device, self.previous_enabled);
        if let Some(dtype) = self.previous_dtype {
            let _ = set_dtype(self.device, dtype);
        }
    }
}
