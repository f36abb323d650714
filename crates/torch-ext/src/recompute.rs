//! Activation (gradient) checkpointing: a block's forward runs without keeping its intermediate
//! activations, and backward recomputes them. tch has no custom autograd functions, so the
//! block is a C++ `torch::autograd::Function` (`csrc/kiln_autograd.cpp`) that calls back into
//! the Rust closure, once in forward and once more in backward.
//!
//! The recompute sees what the forward saw: the default CPU generator and the input device's
//! generator are set back to their forward-time state for it (and restored after), and the
//! forward-time autocast state is re-entered, because on CUDA backward runs on another thread.
//! Generators the closure keeps itself must be replayed by the closure.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{CallbackError, ErrorKind, Result};
use crate::ffi;

/// What a checkpointed block computes; an error keeps its kind through C++ (running out of
/// memory in the block is still [`ErrorKind::OutOfMemory`] when [`checkpoint`] returns).
pub type BlockFn = dyn Fn(&tch::Tensor) -> std::result::Result<tch::Tensor, CallbackError> + Send;

/// `block(input)`, computed without keeping the block's activations for backward: backward
/// recomputes them from `input` (kept) and backpropagates through the recomputation, which
/// accumulates the gradients of the parameters the block uses and yields `input`'s.
///
/// The closure is called once now and once in each backward through the result, so it must
/// compute the same function both times. It is released when the graph is.
pub fn checkpoint<F>(input: &tch::Tensor, block: F) -> Result<tch::Tensor>
where
    F: Fn(&tch::Tensor) -> std::result::Result<tch::Tensor, CallbackError> + Send + 'static,
{
    let boxed: Box<Box<BlockFn>> = Box::new(Box::new(block));
    let ctx = Box::into_raw(boxed).cast::<c_void>();
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `input` is a live handle; `ctx` is a leaked `Box<Box<BlockFn>>` that C++ owns
    // from here on and releases exactly once through `drop_block` (also on failure).
    ffi::check("checkpoint", unsafe {
        ffi::kiln_checkpoint(
            ffi::tensor_ptr(input),
            call_block,
            ctx,
            drop_block,
            &mut out,
        )
    })?;
    // SAFETY: `out` came from `new at::Tensor`, which tch's Tensor owns and deletes.
    Ok(unsafe { tch::Tensor::from_ptr(out.cast()) })
}

/// Copies `message` into C's `err` buffer, NUL-terminated and truncated to fit.
pub(crate) fn write_error(err: *mut c_char, len: usize, message: &str) {
    if err.is_null() || len == 0 {
        return;
    }
    let bytes = message.as_bytes();
    let n = bytes.len().min(len - 1);
    // SAFETY: C++ passes a writable buffer of `len` bytes; we write `n + 1 <= len` of them.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), err.cast::<u8>(), n);
        *err.add(n) = 0;
    }
}

unsafe extern "C" fn call_block(
    ctx: *mut c_void,
    input: *mut c_void,
    out: *mut *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    // SAFETY: `input` is a `new at::Tensor` whose ownership C++ hands to us.
    let input = unsafe { tch::Tensor::from_ptr(input.cast()) };
    // SAFETY: `ctx` is the `Box<Box<BlockFn>>` leaked in `checkpoint`, alive until `drop_block`.
    let block = unsafe { &*ctx.cast::<Box<BlockFn>>() };
    match catch_unwind(AssertUnwindSafe(|| block(&input))) {
        Ok(Ok(mut output)) => {
            // Hand the handle to C++, which takes it over (and deletes it).
            // SAFETY: `out` is a valid slot; the handle is not freed here (forgotten below).
            unsafe { *out = output.as_mut_ptr().cast() };
            std::mem::forget(output);
            0
        }
        Ok(Err(e)) => {
            write_error(err, err_len, &e.message);
            c_int::from(e.kind.code())
        }
        Err(_) => {
            write_error(err, err_len, "the block panicked");
            c_int::from(ErrorKind::Other.code())
        }
    }
}

unsafe extern "C" fn drop_block(ctx: *mut c_void) {
    // SAFETY: called exactly once by C++ with the pointer leaked in `checkpoint`.
    drop(unsafe { Box::from_raw(ctx.cast::<Box<BlockFn>>()) });
}
