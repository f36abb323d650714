//! AOTInductor model packages (`.pt2` files `torch._inductor.aoti_compile_and_package` writes):
//! native code compiled for one machine, loaded and run through libtorch's
//! `AOTIModelPackageLoader` inside the error boundary. Loading one runs its code: callers load
//! only packages they compiled themselves.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_int};
use std::path::Path;

use tch::{Device, Tensor};

use crate::error::{Error, Result};
use crate::ffi;

/// A loaded package. Not `Sync`: one thread runs it at a time (wrap it in a mutex to share).
#[derive(Debug)]
pub struct Package {
    handle: *mut std::ffi::c_void,
    outputs: usize,
}

// SAFETY: the loader owns its model container and is not tied to the thread that made it; it
// is used from one thread at a time (`run` takes `&mut self`).
unsafe impl Send for Package {}

impl Package {
    /// Loads the package at `path` for `device`; `outputs` is the most outputs a run may return.
    pub fn load(path: &Path, device: Device, outputs: usize) -> Result<Self> {
        let text = path.to_str().ok_or_else(|| Error::InvalidArgument {
            op: "load an AOTInductor package",
            message: format!("{} is not valid UTF-8", path.display()),
        })?;
        let c_path = CString::new(text).map_err(|_| Error::InvalidArgument {
            op: "load an AOTInductor package",
            message: format!("{} holds a NUL byte", path.display()),
        })?;
        let index: c_int = match device {
            Device::Cuda(i) => c_int::try_from(i).unwrap_or(c_int::MAX),
            _ => -1,
        };
        let mut handle = std::ptr::null_mut();
        // SAFETY: a valid C string and an out pointer; on success `handle` is owned by us.
        ffi::check("load an AOTInductor package", unsafe {
            ffi::kiln_aoti_load(c_path.as_ptr(), index, &mut handle)
        })?;
        Ok(Self { handle, outputs })
    }

    /// Runs the package on `inputs` (in its input order) and returns its outputs.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let ptrs: Vec<*const std::ffi::c_void> = inputs.iter().map(ffi::tensor_ptr).collect();
        let mut out: Vec<*mut std::ffi::c_void> = vec![std::ptr::null_mut(); self.outputs];
        let mut n = 0usize;
        // SAFETY: live input handles, an output array of `outputs` slots; on success the first
        // `n` slots hold `new at::Tensor`s that we own.
        ffi::check("run an AOTInductor package", unsafe {
            ffi::kiln_aoti_run(
                self.handle,
                ptrs.as_ptr(),
                ptrs.len(),
                out.as_mut_ptr(),
                out.len(),
                &mut n,
            )
        })?;
        // SAFETY: each of the first `n` pointers is a `new at::Tensor`, which tch's Tensor owns.
        Ok(out[..n]
            .iter()
            .map(|&p| unsafe { Tensor::from_ptr(p.cast()) })
            .collect())
    }

    /// The package's metadata (`AOTI_DEVICE_KEY`, `AOTI_PLATFORM`, `AOTI_CPU_ISA`, …).
    pub fn metadata(&self) -> Result<BTreeMap<String, String>> {
        let mut text: *mut std::ffi::c_char = std::ptr::null_mut();
        // SAFETY: an out pointer; on success it is a malloc'd C string that we free below.
        ffi::check("read an AOTInductor package's metadata", unsafe {
            ffi::kiln_aoti_metadata(self.handle, &mut text)
        })?;
        // SAFETY: non-null on success, NUL-terminated, freed once after copying.
        let owned = unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: allocated with malloc by the C side; freed exactly once.
        unsafe { ffi::kiln_free_string(text) };
        Ok(owned
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect())
    }
}

impl Drop for Package {
    fn drop(&mut self) {
        // SAFETY: the handle came from kiln_aoti_load and is freed once.
        unsafe { ffi::kiln_aoti_free(self.handle) }
    }
}

/// Adds `weight` × `grads[i]` to the gradient of `params[i]` (which becomes it when there is
/// none yet): a compiled step returns gradients as outputs instead of running autograd.
pub fn accumulate_grads(params: &[Tensor], grads: &[Tensor], weight: f64) -> Result<()> {
    if params.len() != grads.len() {
        return Err(Error::InvalidArgument {
            op: "accumulate gradients",
            message: format!("{} parameters but {} gradients", params.len(), grads.len()),
        });
    }
    let p: Vec<_> = params.iter().map(ffi::tensor_ptr).collect();
    let g: Vec<_> = grads.iter().map(ffi::tensor_ptr).collect();
    // SAFETY: live handles borrowed for the call.
    ffi::check("accumulate gradients", unsafe {
        ffi::kiln_accumulate_grads(p.as_ptr(), g.as_ptr(), p.len(), weight)
    })
}
