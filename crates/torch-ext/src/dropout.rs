//! A fast dropout for CPU tensors: the mask comes from a counter-based generator in one parallel
//! pass, where libtorch's CPU `bernoulli_` draws element by element (it was a third of a
//! transformer's train step). Deterministic: the mask depends on (seed, offset) only.

use crate::error::{Error, Result};
use crate::ffi;

/// Dropout of a CPU tensor: elements zeroed with probability `p` (exactly those
/// [`dropout_mask`] zeroes for the same seed and offset), the rest scaled by `1 / (1 - p)`.
/// Differentiable, and stores nothing for backward: the mask is regenerated from
/// `(seed, offset)`, so forward and backward are one pass each.
pub fn dropout(x: &tch::Tensor, p: f64, seed: u64, offset: u64) -> Result<tch::Tensor> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::InvalidArgument {
            op: "dropout",
            message: format!("p must be in [0, 1), got {p}"),
        });
    }
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `x` is a live handle; on success `out` is a new heap tensor we own.
    ffi::check("dropout", unsafe {
        ffi::kiln_dropout(ffi::tensor_ptr(x), p, seed, offset, &mut out)
    })?;
    // SAFETY: `out` came from `new at::Tensor`, which tch's Tensor owns and deletes.
    Ok(unsafe { tch::Tensor::from_ptr(out.cast()) })
}

/// A mask shaped and typed like `like` (a CPU tensor): each element is 0 with probability `p`
/// and `1 / (1 - p)` otherwise, drawn from `(seed, offset + element index)`. `x * mask` is
/// dropout, and autograd differentiates it as such.
pub fn dropout_mask(like: &tch::Tensor, p: f64, seed: u64, offset: u64) -> Result<tch::Tensor> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::InvalidArgument {
            op: "dropout mask",
            message: format!("p must be in [0, 1), got {p}"),
        });
    }
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `like` is a live handle; on success `out` is a new heap tensor we own.
    ffi::check("dropout mask", unsafe {
        ffi::kiln_dropout_mask(ffi::tensor_ptr(like), p, seed, offset, &mut out)
    })?;
    // SAFETY: `out` came from `new at::Tensor`, which tch's Tensor owns and deletes.
    Ok(unsafe { tch::Tensor::from_ptr(out.cast()) })
}
