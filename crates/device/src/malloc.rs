//! The C allocator's thresholds for a run (glibc): memory a run frees is kept for its next
//! tensors instead of being given back to the system and faulted in again, page by page.

/// Allocations from this size up are mapped from the system one by one and unmapped when freed
/// (glibc's own threshold moves between 128 KiB and 32 MiB, below a 3-D convolution's
/// activations); smaller ones come from the heap and are reused.
pub const MMAP_THRESHOLD: usize = 256 << 20;

/// Free memory at the top of the heap beyond this is given back to the system (glibc's default
/// is 128 KiB, or twice the moving mmap threshold).
pub const TRIM_THRESHOLD: usize = 1 << 30;

/// Whether this process's C library is glibc, whose thresholds [`keep_freed_memory`] sets.
pub const SUPPORTED: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

/// Sets glibc's thresholds to [`MMAP_THRESHOLD`] and [`TRIM_THRESHOLD`] for this process; an
/// error saying why where its C library has none (not glibc) or refuses them.
pub fn keep_freed_memory() -> Result<(), String> {
    set_thresholds(MMAP_THRESHOLD, TRIM_THRESHOLD)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds(mmap: usize, trim: usize) -> Result<(), String> {
    let value = |v: usize| i32::try_from(v).map_err(|_| format!("{v} does not fit mallopt"));
    let (mmap, trim) = (value(mmap)?, value(trim)?);
    // SAFETY: mallopt only sets the allocator's parameters, under glibc's own lock.
    let set = unsafe {
        (
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap),
            libc::mallopt(libc::M_TRIM_THRESHOLD, trim),
        )
    };
    match set {
        (1, 1) => Ok(()),
        (m, t) => Err(format!(
            "glibc refused M_MMAP_THRESHOLD = {mmap} ({m}) or M_TRIM_THRESHOLD = {trim} ({t})"
        )),
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds(_mmap: usize, _trim: usize) -> Result<(), String> {
    Err("only glibc's malloc has these thresholds; this C library keeps its own".to_owned())
}
