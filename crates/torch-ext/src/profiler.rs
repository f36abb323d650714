//! libtorch's own profiler (kineto): operator events (and on CUDA, kernel events), tensor
//! shapes, memory events and stacks, saved as a Chrome trace that Perfetto and chrome://tracing
//! load; plus named ranges that mark a program's own phases in the trace.
//!
//! The profiler records the thread that started it. Start and stop it, and open ranges, on the
//! thread that runs the model.

use std::cell::Cell;
use std::ffi::{CString, c_void};
use std::path::Path;

use crate::error::{Error, Result};
use crate::ffi;

/// What to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProfilerOptions {
    /// Also record CUDA kernels and runtime calls (needs a CUDA build and device).
    pub cuda: bool,
    pub record_shapes: bool,
    pub profile_memory: bool,
    pub with_stack: bool,
}

thread_local! {
    /// Whether [`prepare`] ran on this thread since the last start: kineto must be prepared
    /// before every recording (starting an unprepared one crashes inside libkineto).
    static PREPARED: Cell<bool> = const { Cell::new(false) };
}

/// Readies the profiler without recording (its warm-up), so that starting it later is cheap.
/// [`Recording::start`] prepares by itself when this was not called.
pub fn prepare(options: ProfilerOptions) -> Result<()> {
    // SAFETY: plain values in; null or an error string out.
    ffi::check("profiler prepare", unsafe {
        ffi::kiln_profiler_prepare(
            options.cuda,
            options.record_shapes,
            options.profile_memory,
            options.with_stack,
        )
    })?;
    PREPARED.with(|p| p.set(true));
    Ok(())
}

/// Whether a profiler is recording on this thread.
pub fn is_recording() -> Result<bool> {
    let mut on = false;
    // SAFETY: `on` is a valid out-pointer.
    ffi::check("profiler state", unsafe {
        ffi::kiln_profiler_is_enabled(&mut on)
    })?;
    Ok(on)
}

/// A recording in progress; [`Recording::stop`] ends it and returns the trace. Dropping it
/// without stopping stops it and discards the trace.
#[derive(Debug)]
pub struct Recording {
    stopped: bool,
}

impl Recording {
    /// Starts recording on this thread. Fails if a profiler is already recording here.
    pub fn start(options: ProfilerOptions) -> Result<Self> {
        if is_recording()? {
            return Err(Error::InvalidArgument {
                op: "profiler start",
                message: "a profiler is already recording on this thread".to_owned(),
            });
        }
        if !PREPARED.with(Cell::get) {
            prepare(options)?;
        }
        PREPARED.with(|p| p.set(false));
        // SAFETY: plain values in; null or an error string out.
        ffi::check("profiler start", unsafe {
            ffi::kiln_profiler_start(
                options.cuda,
                options.record_shapes,
                options.profile_memory,
                options.with_stack,
            )
        })?;
        Ok(Self { stopped: false })
    }

    /// Stops recording and returns what was recorded.
    pub fn stop(mut self) -> Result<Trace> {
        self.stopped = true;
        stop_raw()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = stop_raw();
        }
    }
}

fn stop_raw() -> Result<Trace> {
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: on success `out` is a heap `ProfilerResult` that `Trace` owns and frees.
    ffi::check("profiler stop", unsafe {
        ffi::kiln_profiler_stop(&mut out)
    })?;
    Ok(Trace { raw: out })
}

/// A finished recording.
#[derive(Debug)]
pub struct Trace {
    raw: *mut c_void,
}

// SAFETY: the result is plain data, not tied to the thread that recorded it.
unsafe impl Send for Trace {}

/// Counts over a trace's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceStats {
    pub events: u64,
    /// ATen operator events.
    pub operators: u64,
    /// The most bytes allocated at once while recording, above what was allocated when it
    /// began (from the memory events; 0 unless `profile_memory` was on).
    pub peak_allocated_bytes: u64,
}

impl Trace {
    /// Writes the Chrome trace JSON to `path` (its directory must exist).
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = path.to_str().ok_or_else(|| Error::InvalidArgument {
            op: "profiler save",
            message: format!("{} is not valid UTF-8", path.display()),
        })?;
        let c = CString::new(text).map_err(|_| Error::InvalidArgument {
            op: "profiler save",
            message: format!("{} contains a NUL byte", path.display()),
        })?;
        // SAFETY: `raw` is live until drop; `c` outlives the call.
        ffi::check("profiler save", unsafe {
            ffi::kiln_profiler_result_save(self.raw, c.as_ptr())
        })
    }

    pub fn stats(&self) -> Result<TraceStats> {
        let (mut events, mut operators, mut peak) = (0i64, 0i64, 0i64);
        // SAFETY: `raw` is live; the out-pointers are valid.
        ffi::check("profiler stats", unsafe {
            ffi::kiln_profiler_result_stats(self.raw, &mut events, &mut operators, &mut peak)
        })?;
        Ok(TraceStats {
            events: events.max(0) as u64,
            operators: operators.max(0) as u64,
            peak_allocated_bytes: peak.max(0) as u64,
        })
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `kiln_profiler_stop` and is freed exactly once.
        unsafe { ffi::kiln_profiler_result_free(self.raw) };
    }
}

/// A named range on this thread, shown in the trace around everything recorded while it is
/// open; closed when dropped (on the same thread: it is neither `Send` nor `Sync`).
#[derive(Debug)]
pub struct Range {
    raw: *mut c_void,
}

impl Range {
    /// Opens a range called `name` (costs next to nothing when no profiler is recording).
    pub fn new(name: &str) -> Result<Self> {
        let c = CString::new(name).map_err(|_| Error::InvalidArgument {
            op: "profiler range",
            message: format!("{name:?} contains a NUL byte"),
        })?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `c` outlives the call (the name is copied); `raw` receives a heap object.
        ffi::check("profiler range", unsafe {
            ffi::kiln_range_begin(c.as_ptr(), &mut raw)
        })?;
        Ok(Self { raw })
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `kiln_range_begin` on this thread and is ended exactly once.
        unsafe { ffi::kiln_range_end(self.raw) };
    }
}

/// Runs `f` while recording with `options` (memory events on) and returns its result and the
/// peak bytes allocated above the starting point while it ran: a CPU peak-memory measurement,
/// since libtorch's CPU allocator keeps no statistics of its own.
pub fn peak_allocated_during<T>(
    options: ProfilerOptions,
    f: impl FnOnce() -> T,
) -> Result<(T, u64)> {
    let recording = Recording::start(ProfilerOptions {
        profile_memory: true,
        ..options
    })?;
    let value = f();
    let trace = recording.stop()?;
    Ok((value, trace.stats()?.peak_allocated_bytes))
}
