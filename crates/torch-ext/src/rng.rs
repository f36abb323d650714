//! The state of libtorch's default random generators (the CPU's, and each CUDA device's), so a
//! checkpoint can restore them.

use crate::error::Result;
use crate::ffi;

/// Guards libtorch's default CPU generator, which is process-wide: code that seeds it and then
/// draws a sequence from it (a run's initial weights, the batch-size search) or restores its
/// state (a resume) holds this lock, so the draws of runs in one process (a library user's
/// threads, tests) never interleave.
static CPU_GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

thread_local! {
    /// Whether this thread holds [`CPU_GENERATOR`].
    static HOLDS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`CPU_GENERATOR`] held by this thread until dropped.
#[derive(Debug)]
#[must_use = "the generator is held only while the guard lives"]
pub struct GeneratorGuard {
    inner: Option<std::sync::MutexGuard<'static, ()>>,
}

impl Drop for GeneratorGuard {
    fn drop(&mut self) {
        if self.inner.take().is_some() {
            HOLDS.set(false);
        }
    }
}

/// Takes [`CPU_GENERATOR`] (poisoning is ignored: whoever holds it next seeds or restores the
/// generator anyway). Re-entrant per thread: where this thread holds it already (a run seeding
/// its weights while its model, being built, checks a compiled program), the guard is a no-op.
pub fn cpu_generator_lock() -> GeneratorGuard {
    if HOLDS.get() {
        return GeneratorGuard { inner: None };
    }
    let inner = CPU_GENERATOR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    HOLDS.set(true);
    GeneratorGuard { inner: Some(inner) }
}

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

fn cuda_index(op: &'static str, index: usize) -> Result<std::ffi::c_int> {
    std::ffi::c_int::try_from(index).map_err(|_| crate::error::Error::InvalidArgument {
        op,
        message: format!("CUDA device index {index} is out of range"),
    })
}

/// The default generator's state of CUDA device `index` (a uint8 tensor on the CPU): what
/// dropout on that device (libtorch's, or a TorchScript module's) draws from. An error where
/// libtorch has no CUDA or no such device.
pub fn cuda_rng_state(index: usize) -> Result<tch::Tensor> {
    let index = cuda_index("CUDA RNG state", index)?;
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: on success `out` is a new heap tensor we own.
    ffi::check("CUDA RNG state", unsafe {
        ffi::kiln_cuda_rng_state(index, &mut out)
    })?;
    // SAFETY: `out` came from `new at::Tensor`, which tch's Tensor owns and deletes.
    Ok(unsafe { tch::Tensor::from_ptr(out.cast()) })
}

/// Restores a state from [`cuda_rng_state`] on CUDA device `index`.
pub fn set_cuda_rng_state(index: usize, state: &tch::Tensor) -> Result<()> {
    let index = cuda_index("set CUDA RNG state", index)?;
    // SAFETY: `state` is a live handle.
    ffi::check("set CUDA RNG state", unsafe {
        ffi::kiln_set_cuda_rng_state(index, ffi::tensor_ptr(state))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether another thread could take the lock now.
    fn free_elsewhere() -> bool {
        std::thread::spawn(|| CPU_GENERATOR.try_lock().is_ok())
            .join()
            .unwrap()
    }

    #[test]
    fn the_generator_lock_is_reentrant_per_thread_and_exclusive_across_threads() {
        let outer = cpu_generator_lock();
        let inner = cpu_generator_lock(); // the same thread again: no deadlock
        drop(inner);
        assert!(!free_elsewhere(), "the outer guard still holds it");
        drop(outer);
        assert!(free_elsewhere());
        let again = cpu_generator_lock();
        assert!(!free_elsewhere());
        drop(again);
    }
}
