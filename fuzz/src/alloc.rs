//! A counting global allocator: live and peak bytes, the largest single request, and a limit.
//! The `kiln-fuzz` binary installs it, so that "memory bounded whatever sizes a header claims"
//! is checked on every input: a request over the limit (one allocation too large, or live
//! bytes past the total) is not served; the requesting thread waits while the watchdog saves
//! the input and ends the process (an allocator must not unwind, and a failed allocation
//! would abort before the input is saved).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// The largest single request served; 0: no limit.
static SINGLE_LIMIT: AtomicUsize = AtomicUsize::new(0);
/// The most bytes live at once; 0: no limit.
static LIVE_LIMIT: AtomicUsize = AtomicUsize::new(0);
/// The size of a request refused for the limits (0: none was).
static REFUSED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's requests are served past the limits (the watchdog's, which
    /// must save the input even when the live bytes are what is over).
    static EXEMPT: Cell<bool> = const { Cell::new(false) };
}

/// Serves this thread's requests past the limits.
pub fn exempt_this_thread() {
    EXEMPT.with(|e| e.set(true));
}

/// [`System`], counted and limited.
#[derive(Debug)]
pub struct CountingAlloc;

/// What the allocator saw since [`reset_peak`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Bytes live at the peak.
    pub peak: usize,
    /// The largest single request.
    pub largest: usize,
}

/// Sets the limits: the largest single allocation and the most bytes live at once.
pub fn set_limits(single: usize, live: usize) {
    SINGLE_LIMIT.store(single, Relaxed);
    LIVE_LIMIT.store(live, Relaxed);
}

/// Starts a new peak (from the bytes live now) and a new largest request.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Relaxed), Relaxed);
    LARGEST.store(0, Relaxed);
}

pub fn usage() -> Usage {
    Usage {
        peak: PEAK.load(Relaxed),
        largest: LARGEST.load(Relaxed),
    }
}

/// The size of a request refused for the limits, if one was.
pub fn refused() -> Option<usize> {
    match REFUSED.load(Relaxed) {
        0 => None,
        size => Some(size),
    }
}

/// Whether an allocation of `size` bytes, `more` of them new (all but a reallocation's),
/// stays within the limits; counts them if so.
fn admit(size: usize, more: usize) -> bool {
    let single = SINGLE_LIMIT.load(Relaxed);
    let live_limit = LIVE_LIMIT.load(Relaxed);
    let live = LIVE.load(Relaxed);
    let over =
        (single > 0 && size > single) || (live_limit > 0 && live.saturating_add(more) > live_limit);
    if over && !EXEMPT.try_with(Cell::get).unwrap_or(false) {
        return false;
    }
    let now = LIVE.fetch_add(more, Relaxed) + more;
    PEAK.fetch_max(now, Relaxed);
    LARGEST.fetch_max(size, Relaxed);
    true
}

/// Records the refused request and parks this thread: the watchdog sees [`refused`], saves
/// the input and ends the process.
fn refuse(size: usize) -> ! {
    REFUSED.store(size.max(1), Relaxed);
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

// SAFETY: every call goes to `System` with the caller's layout; the counters are atomics that
// never allocate, and `refuse` neither allocates nor unwinds.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size(), layout.size()) {
            refuse(layout.size());
        }
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size(), layout.size()) {
            refuse(layout.size());
        }
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout` (every path above).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if !admit(new_size, new_size.saturating_sub(old)) {
            refuse(new_size);
        }
        LIVE.fetch_sub(old.saturating_sub(new_size), Relaxed);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
