//! Memory of the accelerator (CUDA) as libtorch's caching allocator sees it, and the CPU
//! threads libtorch uses.

use std::ffi::c_int;

use crate::error::{Error, Result};
use crate::ffi;

/// The caching allocator's statistics for one device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes in live tensors.
    pub allocated: u64,
    pub allocated_peak: u64,
    /// Bytes the allocator holds from the driver (allocated + cached).
    pub reserved: u64,
    pub reserved_peak: u64,
    /// How many allocations have failed with out-of-memory.
    pub num_ooms: u64,
}

fn index(op: &'static str, device: usize) -> Result<c_int> {
    c_int::try_from(device).map_err(|_| Error::InvalidArgument {
        op,
        message: format!("device index {device} is out of range"),
    })
}

/// Allocator statistics of accelerator device `device` (an error when there is none).
pub fn stats(device: usize) -> Result<MemoryStats> {
    let mut out = [0i64; 5];
    // SAFETY: `out` has the five slots the C side writes.
    ffi::check("memory stats", unsafe {
        ffi::kiln_memory_stats(index("memory stats", device)?, out.as_mut_ptr())
    })?;
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(MemoryStats {
        allocated: u(out[0]),
        allocated_peak: u(out[1]),
        reserved: u(out[2]),
        reserved_peak: u(out[3]),
        num_ooms: u(out[4]),
    })
}

/// Resets the peak statistics of `device`.
pub fn reset_peak(device: usize) -> Result<()> {
    // SAFETY: plain value in, error string out.
    ffi::check("reset peak memory", unsafe {
        ffi::kiln_reset_peak_memory(index("reset peak memory", device)?)
    })
}

/// Returns cached, unused accelerator memory to the driver (`torch.cuda.empty_cache`).
pub fn empty_cache() -> Result<()> {
    // SAFETY: no arguments, error string out.
    ffi::check("empty cache", unsafe { ffi::kiln_empty_cache() })
}

/// Sets libtorch's intra-op CPU threads.
pub fn set_num_threads(n: usize) -> Result<()> {
    let n = index("set_num_threads", n)?;
    // SAFETY: plain value in, error string out.
    ffi::check("set_num_threads", unsafe { ffi::kiln_set_num_threads(n) })
}

/// Sets libtorch's inter-op CPU threads; libtorch refuses once inter-op work has started.
pub fn set_num_interop_threads(n: usize) -> Result<()> {
    let n = index("set_num_interop_threads", n)?;
    // SAFETY: plain value in, error string out.
    ffi::check("set_num_interop_threads", unsafe {
        ffi::kiln_set_num_interop_threads(n)
    })
}

/// (intra-op, inter-op) CPU threads libtorch uses now.
pub fn num_threads() -> Result<(usize, usize)> {
    let (mut intra, mut inter): (c_int, c_int) = (0, 0);
    // SAFETY: both outputs outlive the call.
    ffi::check("num_threads", unsafe {
        ffi::kiln_num_threads(&mut intra, &mut inter)
    })?;
    Ok((intra.max(0) as usize, inter.max(0) as usize))
}
