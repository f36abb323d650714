//! Moving host data to a device: staging buffers in pinned (page-locked) memory, and
//! host-to-device copies issued on a side stream so they overlap the compute stream's work.
//!
//! On the CPU, and on a build without the CUDA part of the extension, the same calls work and
//! simply do less: the staging buffer is ordinary memory and the "copy" to the CPU is the tensor
//! itself.

use std::ffi::c_void;

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::ffi;

/// A new CPU tensor of `shape` holding a copy of `data`, in pinned memory when `pinned` (which
/// needs a CUDA device: without one this is an error the caller can fall back from).
pub fn host_tensor_f32(data: &[f32], shape: &[i64], pinned: bool) -> Result<Tensor> {
    host_tensor(
        data.as_ptr().cast(),
        std::mem::size_of_val(data),
        shape,
        0,
        pinned,
    )
}

/// A new, uninitialized `f32` CPU tensor of `shape`, in pinned memory when `pinned` (which needs
/// a CUDA device, as for [`host_tensor_f32`]): a buffer to fill before copying it to a device.
pub fn host_empty_f32(shape: &[i64], pinned: bool) -> Result<Tensor> {
    let elements = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?));
    let bytes = elements
        .and_then(|n| n.checked_mul(std::mem::size_of::<f32>()))
        .ok_or_else(|| Error::InvalidArgument {
            op: "host_empty_f32",
            message: format!("shape {shape:?} has a negative or too large dimension"),
        })?;
    host_tensor(std::ptr::null(), bytes, shape, 0, pinned)
}

/// Like [`host_tensor_f32`], for `i64` data (labels, token ids).
pub fn host_tensor_i64(data: &[i64], shape: &[i64], pinned: bool) -> Result<Tensor> {
    host_tensor(
        data.as_ptr().cast(),
        std::mem::size_of_val(data),
        shape,
        1,
        pinned,
    )
}

fn host_tensor(
    data: *const c_void,
    bytes: usize,
    shape: &[i64],
    kind: i32,
    pinned: bool,
) -> Result<Tensor> {
    if shape.iter().any(|d| *d < 0) {
        return Err(Error::InvalidArgument {
            op: "host_tensor",
            message: format!("negative dimension in shape {shape:?}"),
        });
    }
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `data` is null (nothing is read) or points to `bytes` readable bytes (a live
    // slice), and `shape` to `ndim` values; the C side checks the sizes agree and writes a new
    // heap tensor to `out`.
    ffi::check("host_tensor", unsafe {
        ffi::kiln_host_tensor(
            data,
            bytes,
            shape.as_ptr(),
            shape.len(),
            kind,
            pinned,
            &mut out,
        )
    })?;
    // SAFETY: `out` is a `new at::Tensor`, the same representation tch owns and deletes.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// A CPU tensor of `shape` over `data`'s memory, without copying it: the tensor takes ownership
/// of the vector and frees it when its last reference goes.
pub fn tensor_from_vec_f32(data: Vec<f32>, shape: &[i64]) -> Result<Tensor> {
    tensor_from_vec(data, shape, 0)
}

/// Like [`tensor_from_vec_f32`], for `i64` data.
pub fn tensor_from_vec_i64(data: Vec<i64>, shape: &[i64]) -> Result<Tensor> {
    tensor_from_vec(data, shape, 1)
}

unsafe extern "C" fn drop_boxed_vec<T>(ctx: *mut c_void) {
    // SAFETY: `ctx` is the `Box<Vec<T>>` leaked in `tensor_from_vec`, freed here exactly once
    // (libtorch calls the deleter once, when the storage dies).
    drop(unsafe { Box::from_raw(ctx.cast::<Vec<T>>()) });
}

fn tensor_from_vec<T>(data: Vec<T>, shape: &[i64], kind: i32) -> Result<Tensor> {
    let numel = shape.iter().try_fold(1usize, |n, &d| {
        usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
    });
    if numel != Some(data.len()) {
        return Err(Error::InvalidArgument {
            op: "tensor_from_vec",
            message: format!("{} values do not fill shape {shape:?}", data.len()),
        });
    }
    let mut boxed = Box::new(data);
    let ptr = boxed.as_mut_ptr().cast::<c_void>();
    let ctx = Box::into_raw(boxed).cast::<c_void>();
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `ptr` points into the vector owned by `ctx`, which stays alive until libtorch
    // calls `drop_boxed_vec` with it; `shape` holds `ndim` values.
    let status = ffi::check("tensor_from_vec", unsafe {
        ffi::kiln_tensor_from_owned(
            ptr,
            shape.as_ptr(),
            shape.len(),
            kind,
            drop_boxed_vec::<T>,
            ctx,
            &mut out,
        )
    });
    // On an error the deleter may or may not have been handed to a storage, so the vector is
    // deliberately leaked rather than risk freeing it twice (the shape was checked above, so
    // this does not happen in practice).
    status?;
    // SAFETY: `out` is a `new at::Tensor`, which tch owns and deletes.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// A host-to-device copy that has been issued but is not yet visible to the compute stream.
/// [`PendingCopy::finish`] makes it visible; dropping it abandons it safely.
#[derive(Debug)]
pub struct PendingCopy {
    tensor: Tensor,
    event: Option<Event>,
}

#[derive(Debug)]
#[cfg_attr(not(kiln_cuda), allow(dead_code))]
struct Event {
    ptr: *mut c_void,
    index: i32,
}

impl Drop for Event {
    fn drop(&mut self) {
        #[cfg(kiln_cuda)]
        // SAFETY: the event came from kiln_cuda_copy_start and is freed exactly once.
        unsafe {
            ffi::kiln_cuda_event_free(self.ptr)
        };
    }
}

// SAFETY: a CUDA event may be waited on and destroyed from any host thread.
unsafe impl Send for Event {}

/// Starts copying host tensor `src` to `device`. On CUDA (with the extension's CUDA part) the
/// copy runs on a side stream from a pinned `src` without blocking the host; without it, it is
/// a non-blocking copy on the current stream; on the CPU the tensor is `src` itself.
pub fn copy_to_device(src: &Tensor, device: Device) -> Result<PendingCopy> {
    match device {
        Device::Cpu => Ok(PendingCopy {
            tensor: src.shallow_clone(),
            event: None,
        }),
        #[cfg(kiln_cuda)]
        Device::Cuda(index) => {
            let index = i32::try_from(index).map_err(|_| Error::InvalidArgument {
                op: "copy_to_device",
                message: format!("CUDA device index {index} out of range"),
            })?;
            let mut out: *mut c_void = std::ptr::null_mut();
            let mut event: *mut c_void = std::ptr::null_mut();
            // SAFETY: `src` is a live tensor; the C side writes a new tensor and a new event.
            ffi::check("copy_to_device", unsafe {
                ffi::kiln_cuda_copy_start(ffi::tensor_ptr(src), index, &mut out, &mut event)
            })?;
            let event = Event { ptr: event, index };
            Ok(PendingCopy {
                // SAFETY: `out` is a `new at::Tensor`, which tch owns and deletes.
                tensor: unsafe { Tensor::from_ptr(out.cast()) },
                event: Some(event),
            })
        }
        other => Ok(PendingCopy {
            tensor: src
                .f_to_device_(other, src.kind(), true, false)
                .map_err(|e| Error::from_tch("copy_to_device", &e))?,
            event: None,
        }),
    }
}

impl PendingCopy {
    /// Makes the copy visible to the device's current stream (which waits for it, without
    /// blocking the host) and returns the device tensor.
    pub fn finish(mut self) -> Result<Tensor> {
        // Without the CUDA part no event is ever made.
        #[cfg(kiln_cuda)]
        if let Some(event) = self.event.take() {
            // kiln_cuda_copy_finish frees the event, so its Drop must not run.
            let event = std::mem::ManuallyDrop::new(event);
            // SAFETY: a live event from copy_to_device, consumed here exactly once.
            ffi::check("copy_to_device", unsafe {
                ffi::kiln_cuda_copy_finish(event.ptr, ffi::tensor_ptr(&self.tensor), event.index)
            })?;
        }
        Ok(self.tensor.shallow_clone())
    }

    /// The dtype of the tensor being copied.
    pub fn kind(&self) -> Kind {
        self.tensor.kind()
    }
}
