//! CUDA graphs: a function of one tensor captured once for a fixed input shape and dtype, then
//! replayed, which launches all its kernels in one go (`at::cuda::CUDAGraph` in
//! `csrc/kiln_cuda.cpp`, the way `torch.cuda.graphs` does it: warm-up calls on a side stream,
//! then one call under capture). Replaying skips the per-operator CPU work, which dominates
//! small-batch inference.
//!
//! Where graphs cannot be used (no CUDA in this build, a CPU tensor, an operation that cannot
//! be captured), [`CudaGraph::capture`] returns an error and the caller runs eagerly.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{CallbackError, Error, Result};

/// What a graph computes; an error keeps its kind through C++.
#[cfg_attr(not(kiln_cuda), allow(dead_code))]
type GraphFn<'a> = dyn Fn(&tch::Tensor) -> std::result::Result<tch::Tensor, CallbackError> + 'a;

/// A captured CUDA graph with its own input and output buffers.
#[derive(Debug)]
pub struct CudaGraph {
    ptr: std::ptr::NonNull<c_void>,
    shape: Vec<i64>,
}

impl CudaGraph {
    /// Captures `f(input)` for inputs shaped and typed like `example` (a CUDA tensor): `warmup`
    /// eager calls first, then the captured one. `f` must not synchronise with the host or
    /// allocate in ways capture forbids; if it does, the error says so and nothing is kept.
    pub fn capture<F>(example: &tch::Tensor, warmup: usize, f: F) -> Result<Self>
    where
        F: Fn(&tch::Tensor) -> std::result::Result<tch::Tensor, CallbackError>,
    {
        Self::capture_in(example, warmup, false, f)
    }

    /// [`CudaGraph::capture`] in CUDA's relaxed capture mode: other threads (a batch feeder)
    /// keep working during the capture, and the host-side queries the captured code makes are
    /// allowed (an AOTInductor package asks whether its previous run finished). For a train
    /// step, captured after eager warm-up steps (`warmup` 0: a call under capture runs nothing).
    pub fn capture_relaxed<F>(example: &tch::Tensor, warmup: usize, f: F) -> Result<Self>
    where
        F: Fn(&tch::Tensor) -> std::result::Result<tch::Tensor, CallbackError>,
    {
        Self::capture_in(example, warmup, true, f)
    }

    fn capture_in<F>(example: &tch::Tensor, warmup: usize, relaxed: bool, f: F) -> Result<Self>
    where
        F: Fn(&tch::Tensor) -> std::result::Result<tch::Tensor, CallbackError>,
    {
        #[cfg(kiln_cuda)]
        {
            let f: &GraphFn<'_> = &f;
            let ctx = std::ptr::from_ref(&f).cast_mut().cast::<c_void>();
            let mut out: *mut c_void = std::ptr::null_mut();
            let warmup = c_int::try_from(warmup).unwrap_or(c_int::MAX);
            // SAFETY: `example` is a live handle; `ctx` points to `f`'s reference, which
            // outlives the call (C++ uses it only during capture).
            crate::ffi::check("cuda graph capture", unsafe {
                crate::ffi::kiln_cuda_graph_capture(
                    crate::ffi::tensor_ptr(example),
                    call_graph_fn,
                    ctx,
                    warmup,
                    relaxed,
                    &mut out,
                )
            })?;
            let ptr = std::ptr::NonNull::new(out).ok_or(Error::Torch {
                op: "cuda graph capture",
                kind: crate::ErrorKind::Other,
                message: "no graph was returned".to_owned(),
            })?;
            Ok(Self {
                ptr,
                shape: example.size(),
            })
        }
        #[cfg(not(kiln_cuda))]
        {
            let _ = (example, warmup, relaxed, &f);
            Err(Error::Unavailable {
                op: "cuda graph capture",
                reason: "this kiln was built against a libtorch without CUDA (or without CUDA \
                         headers)"
                    .to_owned(),
            })
        }
    }

    /// The input shape the graph was captured for.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Runs the graph on `input` (the captured shape and dtype, on the captured device) and
    /// returns a fresh copy of its output.
    pub fn replay(&self, input: &tch::Tensor) -> Result<tch::Tensor> {
        #[cfg(kiln_cuda)]
        {
            let mut out: *mut c_void = std::ptr::null_mut();
            // SAFETY: `self.ptr` is a live graph from capture; `input` is a live handle.
            crate::ffi::check("cuda graph replay", unsafe {
                crate::ffi::kiln_cuda_graph_replay(
                    self.ptr.as_ptr(),
                    crate::ffi::tensor_ptr(input),
                    &mut out,
                )
            })?;
            // SAFETY: `out` came from `new at::Tensor`, which tch's Tensor owns and deletes.
            Ok(unsafe { tch::Tensor::from_ptr(out.cast()) })
        }
        #[cfg(not(kiln_cuda))]
        {
            let _ = input;
            Err(Error::Unavailable {
                op: "cuda graph replay",
                reason: "no CUDA in this build".to_owned(),
            })
        }
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        #[cfg(kiln_cuda)]
        // SAFETY: the graph came from capture and is freed exactly once, here.
        unsafe {
            crate::ffi::kiln_cuda_graph_free(self.ptr.as_ptr());
        }
    }
}

#[cfg_attr(not(kiln_cuda), allow(dead_code))]
unsafe extern "C" fn call_graph_fn(
    ctx: *mut c_void,
    input: *mut c_void,
    out: *mut *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    // SAFETY: `input` is a `new at::Tensor` whose ownership C++ hands to us.
    let input = unsafe { tch::Tensor::from_ptr(input.cast()) };
    // SAFETY: `ctx` points to the `&GraphFn` that `capture` keeps alive during the call.
    let f = unsafe { *ctx.cast::<&GraphFn<'_>>() };
    match catch_unwind(AssertUnwindSafe(|| f(&input))) {
        Ok(Ok(mut output)) => {
            // SAFETY: `out` is a valid slot; C++ takes the handle over (forgotten below).
            unsafe { *out = output.as_mut_ptr().cast() };
            std::mem::forget(output);
            0
        }
        Ok(Err(e)) => {
            crate::recompute::write_error(err, err_len, &e.message);
            c_int::from(e.kind.code())
        }
        Err(_) => {
            crate::recompute::write_error(err, err_len, "the captured function panicked");
            c_int::from(crate::ErrorKind::Other.code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capturing_a_cpu_tensor_is_an_error_not_a_crash() {
        let x = tch::Tensor::ones([2, 3], (tch::Kind::Float, tch::Device::Cpu));
        let err = CudaGraph::capture(&x, 1, |t| Ok(t * 2))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("CUDA graphs need a CUDA input") || err.contains("without CUDA"),
            "{err}"
        );
    }

    #[test]
    #[ignore = "needs CUDA; `cargo xtask test --cuda` runs it"]
    fn captured_graphs_on_cuda_replay_the_function_on_new_inputs() {
        assert!(
            tch::Cuda::is_available(),
            "this test needs a CUDA device and this machine has none (run it on one with a GPU)"
        );
        let device = tch::Device::Cuda(0);
        let w = tch::Tensor::randn([8, 4], (tch::Kind::Float, device));
        let example = tch::Tensor::zeros([3, 8], (tch::Kind::Float, device));
        let graph = CudaGraph::capture(&example, 2, |x| {
            x.f_matmul(&w)
                .and_then(|y| y.f_relu())
                .map_err(CallbackError::from)
        })
        .unwrap();
        for _ in 0..3 {
            let x = tch::Tensor::randn([3, 8], (tch::Kind::Float, device));
            let got = graph.replay(&x).unwrap();
            let want = x.matmul(&w).relu();
            assert!(got.allclose(&want, 1e-5, 1e-6, false));
        }
        let wrong = tch::Tensor::zeros([4, 8], (tch::Kind::Float, device));
        assert!(graph.replay(&wrong).is_err());
    }
}
