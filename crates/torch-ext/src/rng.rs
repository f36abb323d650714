//! The state of libtorch's default CPU random generator, so a checkpoint can restore it.

use crate::error::Result;
use crate::ffi;

/// The default CPU generator's state (a uint8 tensor).
pub fn cpu_rng_state() -> Result<tch::Tensor> {
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: on success `out` is a new heap tensor we own.
    ffi::check("CPU RNG state", unsafe {
        ffi::kiln_cpu_rng_state(&mut out)
    })?;
    // SAFETY: `out` came from `new at::Tensor`, which tch's Tensor owns and deletes.
    Ok(unsafe { tch::Tensor::from_ptr(out.cast()) })
}

/// Restores a state from [`cpu_rng_state`]; libtorch rejects one of the wrong size or type.
pub fn set_cpu_rng_state(state: &tch::Tensor) -> Result<()> {
    // SAFETY: `state` is a live handle.
    ffi::check("set CPU RNG state", unsafe {
        ffi::kiln_set_cpu_rng_state(ffi::tensor_ptr(state))
    })
}
