//! Channels-last memory format for 4-D tensors (NHWC in memory, NCHW in shape) and 5-D ones
//! (channels-last-3d: NDHWC in memory), which tch has no API for: 2-D and 3-D convolutions on
//! tensor cores and oneDNN run faster in it.

use crate::error::Result;
use crate::ffi;

/// A channels-last copy of a 4-D or 5-D tensor (shares storage when it already is one).
pub fn to_channels_last(t: &tch::Tensor) -> Result<tch::Tensor> {
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `t` is a live handle; on success `out` is a new heap tensor we own.
    ffi::check("to channels-last", unsafe {
        ffi::kiln_to_channels_last(ffi::tensor_ptr(t), &mut out)
    })?;
    // SAFETY: `out` came from `new at::Tensor`, which tch's Tensor owns and deletes.
    Ok(unsafe { tch::Tensor::from_ptr(out.cast()) })
}

/// Re-lays a 4-D or 5-D parameter out channels-last in place; it stays the same parameter.
pub fn param_to_channels_last(p: &tch::Tensor) -> Result<()> {
    // SAFETY: `p` is a live handle.
    ffi::check("param to channels-last", unsafe {
        ffi::kiln_param_to_channels_last(ffi::tensor_ptr(p))
    })
}

/// Re-lays a parameter out contiguous (the standard layout) in place, undoing
/// [`param_to_channels_last`]; it stays the same parameter.
pub fn param_to_contiguous(p: &tch::Tensor) -> Result<()> {
    // SAFETY: `p` is a live handle.
    ffi::check("param to contiguous", unsafe {
        ffi::kiln_param_to_contiguous(ffi::tensor_ptr(p))
    })
}

/// Whether `t` is a 4-D or 5-D tensor laid out channels-last.
pub fn is_channels_last(t: &tch::Tensor) -> Result<bool> {
    let mut out = false;
    // SAFETY: `t` is a live handle and `out` outlives the call.
    ffi::check("is channels-last", unsafe {
        ffi::kiln_is_channels_last(ffi::tensor_ptr(t), &mut out)
    })?;
    Ok(out)
}
