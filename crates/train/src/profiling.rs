//! The training profiler (seed 002): libtorch's kineto profiler on a wait → warmup → active
//! schedule counted in steps or epochs, repeated `repeat` times, each recorded cycle saved as
//! `runs/<run>/profiler_traces/<timestamp>.pt.trace.json` (Perfetto, chrome://tracing). The
//! trainer marks its phases in the trace as named ranges: `kiln/step#N`, `kiln/data_wait`,
//! `kiln/forward`, `kiln/backward`, `kiln/optimizer`, `kiln/validation`.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use kiln_config::{ProfileUnit, ProfilingPlan};
use kiln_torch_ext::profiler::{self, ProfilerOptions, Recording};

use crate::TrainError;

/// What the profiler does during one step (or epoch) of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Not profiling.
    Idle,
    /// The profiler is readied; nothing is kept.
    Warmup,
    /// Recording.
    Record,
    /// Recording, and the cycle's trace is saved at the end of this unit.
    RecordAndSave,
}

/// The schedule's action for unit `n` (0-based), as `torch.profiler.schedule` defines it.
pub fn action_at(plan: &ProfilingPlan, n: u64) -> Action {
    if !plan.enabled() {
        return Action::Idle;
    }
    let cycle = plan.wait + plan.warmup + plan.active;
    if plan.repeat > 0 && n / cycle >= plan.repeat {
        return Action::Idle;
    }
    let at = n % cycle;
    if at < plan.wait {
        Action::Idle
    } else if at < plan.wait + plan.warmup {
        Action::Warmup
    } else if at + 1 < cycle {
        Action::Record
    } else {
        Action::RecordAndSave
    }
}

/// Drives the profiler through the schedule; the trainer calls [`StepProfiler::begin`] and
/// [`StepProfiler::end`] around each unit.
#[derive(Debug)]
pub struct StepProfiler {
    plan: ProfilingPlan,
    dir: PathBuf,
    options: ProfilerOptions,
    recording: Option<Recording>,
    action: Action,
    /// Readied for the coming recording (during warmup).
    prepared: bool,
    written: Vec<PathBuf>,
}

impl StepProfiler {
    /// A profiler writing into `dir` (created on the first save). `cuda` also records kernels.
    pub fn new(plan: ProfilingPlan, dir: PathBuf, cuda: bool) -> Self {
        Self {
            options: ProfilerOptions {
                cuda,
                record_shapes: plan.record_shapes,
                profile_memory: plan.profile_memory,
                with_stack: plan.with_stack,
            },
            plan,
            dir,
            recording: None,
            action: Action::Idle,
            prepared: false,
            written: vec![],
        }
    }

    /// Whether events are being recorded (the trainer opens its named ranges only then).
    pub fn recording(&self) -> bool {
        self.recording.is_some()
    }

    /// Starts unit `n` when the schedule counts `unit`s (and does nothing otherwise): readies
    /// or starts the profiler as the schedule says. Returns whether it is recording.
    pub fn begin(&mut self, unit: ProfileUnit, n: u64) -> Result<bool, TrainError> {
        if unit != self.plan.unit {
            return Ok(self.recording());
        }
        self.action = action_at(&self.plan, n);
        match self.action {
            Action::Idle => {}
            Action::Warmup => {
                if !self.prepared {
                    profiler::prepare(self.options)?;
                    self.prepared = true;
                }
            }
            Action::Record | Action::RecordAndSave => {
                if self.recording.is_none() {
                    self.prepared = false;
                    self.recording = Some(Recording::start(self.options)?);
                }
            }
        }
        Ok(self.recording())
    }

    /// Ends the current unit (of `unit`s; otherwise nothing): saves the trace when the cycle's
    /// last active unit is done.
    pub fn end(&mut self, unit: ProfileUnit) -> Result<(), TrainError> {
        if unit == self.plan.unit && self.action == Action::RecordAndSave {
            self.save()?;
        }
        Ok(())
    }

    /// Saves a cycle cut short by the end of training (or a stop); returns every trace written.
    pub fn finish(mut self) -> Result<Vec<PathBuf>, TrainError> {
        self.save()?;
        Ok(std::mem::take(&mut self.written))
    }

    fn save(&mut self) -> Result<(), TrainError> {
        let Some(recording) = self.recording.take() else {
            return Ok(());
        };
        let trace = recording.stop()?;
        std::fs::create_dir_all(&self.dir).map_err(|e| TrainError::File {
            path: self.dir.clone(),
            message: format!("could not create the profiler trace directory: {e}"),
        })?;
        let path = trace_path(&self.dir, SystemTime::now());
        trace.save(&path)?;
        let stats = trace.stats()?;
        tracing::info!(
            "profiler trace {} ({} events, {} operators)",
            path.display(),
            stats.events,
            stats.operators
        );
        self.written.push(path);
        Ok(())
    }
}

/// `<dir>/<YYYYMMDD-HHMMSS.mmm>.pt.trace.json`, with `-2`, `-3`… when that name is taken.
fn trace_path(dir: &Path, now: SystemTime) -> PathBuf {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let stamp = format!(
        "{}.{:03}",
        crate::rundir::timestamp(since.as_secs()),
        since.subsec_millis()
    );
    let mut path = dir.join(format!("{stamp}.pt.trace.json"));
    let mut n = 2;
    while path.exists() {
        path = dir.join(format!("{stamp}-{n}.pt.trace.json"));
        n += 1;
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(wait: u64, warmup: u64, active: u64, repeat: u64) -> ProfilingPlan {
        ProfilingPlan {
            wait,
            warmup,
            active,
            repeat,
            unit: ProfileUnit::Steps,
            record_shapes: false,
            profile_memory: false,
            with_stack: false,
        }
    }

    #[test]
    fn the_schedule_waits_warms_up_records_and_repeats() {
        use Action::*;
        let p = plan(1, 1, 2, 2);
        let actions: Vec<Action> = (0..10).map(|n| action_at(&p, n)).collect();
        assert_eq!(
            actions,
            [
                Idle,
                Warmup,
                Record,
                RecordAndSave,
                Idle,
                Warmup,
                Record,
                RecordAndSave,
                Idle,
                Idle
            ]
        );
        // repeat = 0 cycles until the end; active = 0 is off.
        assert_eq!(action_at(&plan(0, 0, 1, 0), 1000), RecordAndSave);
        assert!((0..50).all(|n| action_at(&plan(1, 1, 0, 0), n) == Idle));
    }

    #[test]
    fn trace_names_are_timestamps_and_never_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_795_219_200_042);
        let first = trace_path(dir.path(), t);
        assert_eq!(
            first.file_name().unwrap(),
            "20261121-000000.042.pt.trace.json"
        );
        std::fs::write(&first, "{}").unwrap();
        let second = trace_path(dir.path(), t);
        assert_eq!(
            second.file_name().unwrap(),
            "20261121-000000.042-2.pt.trace.json"
        );
    }
}
