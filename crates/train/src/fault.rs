//! Fault injection for kill soaks (`cargo xtask soak kill`): `KILN_FAULT=POINT:N` makes the
//! process kill itself with SIGKILL the `N`th time it arrives at the named point, as a power
//! loss or the OOM killer would stop it there. Points: `step` (a train step's gradients
//! computed, the weights not yet updated; the steps of a batch-size search or an LR range test
//! count too), `checkpoint-write` (one of a checkpoint's tensor
//! files, weights then optimizer state, written into its temporary directory, its
//! `checkpoint.json` not yet: two arrivals a checkpoint), `validation` (a validation
//! batch evaluated) and `batch-search` (a trial of `train.batch_size = "auto"` about to run).
//! Several faults are separated by `,`; the first reached fires. Unset, a point costs one
//! relaxed atomic load.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::TrainError;

/// The environment variable that names the faults.
pub const ENV: &str = "KILN_FAULT";

/// Where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    Step,
    CheckpointWrite,
    Validation,
    BatchSearch,
}

impl Point {
    pub const ALL: [Point; 4] = [
        Point::Step,
        Point::CheckpointWrite,
        Point::Validation,
        Point::BatchSearch,
    ];

    /// The point's name in `KILN_FAULT`.
    pub fn name(self) -> &'static str {
        match self {
            Point::Step => "step",
            Point::CheckpointWrite => "checkpoint-write",
            Point::Validation => "validation",
            Point::BatchSearch => "batch-search",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The arrival at each point that fires (0: none).
static PLAN: OnceLock<[u64; 4]> = OnceLock::new();
/// Arrivals so far at each point.
static ARRIVALS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// Parses a `KILN_FAULT` value: the arrival that fires at each point (0: none).
pub fn parse(text: &str) -> Result<[u64; 4], String> {
    let mut plan = [0; 4];
    for fault in text.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        let names = || Point::ALL.map(Point::name).join(", ");
        let (name, n) = fault
            .split_once(':')
            .ok_or_else(|| format!("`{fault}` is not POINT:N (points: {})", names()))?;
        let point = Point::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| format!("no fault point `{name}` (points: {})", names()))?;
        plan[point.index()] = n
            .parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("`{fault}`: N must be a whole number from 1"))?;
    }
    Ok(plan)
}

/// Reads `KILN_FAULT` once for the process; a value that does not parse is an error naming
/// the variable. Points reached before this call never fire.
pub fn from_env() -> Result<(), TrainError> {
    let text = std::env::var(ENV).unwrap_or_default();
    let plan = parse(&text).map_err(|why| TrainError::InvalidPlan {
        key: ENV,
        value: format!("{text:?}"),
        expected: why,
    })?;
    let _ = PLAN.set(plan);
    Ok(())
}

/// Counts an arrival at `point`, and kills the process with SIGKILL when it is the one
/// `KILN_FAULT` names.
pub fn reached(point: Point) {
    let Some(plan) = PLAN.get() else { return };
    let fire = plan[point.index()];
    if fire == 0 {
        return;
    }
    if ARRIVALS[point.index()].fetch_add(1, Ordering::Relaxed) + 1 == fire {
        eprintln!("{ENV}: killing this process at {}:{fire}", point.name());
        kill_self();
    }
}

#[cfg(unix)]
fn kill_self() {
    use rustix::process::{Signal, getpid, kill_process};
    let _ = kill_process(getpid(), Signal::KILL);
    // SIGKILL cannot be caught; should the call itself fail, end as abruptly.
    std::process::abort();
}

#[cfg(not(unix))]
fn kill_self() {
    std::process::abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_by_point_and_arrival() {
        assert_eq!(parse(""), Ok([0; 4]));
        assert_eq!(parse("step:3"), Ok([3, 0, 0, 0]));
        assert_eq!(
            parse("checkpoint-write:1, batch-search:2"),
            Ok([0, 1, 0, 2])
        );
        let e = parse("optimizer:1").unwrap_err();
        assert!(
            e.contains("no fault point `optimizer`") && e.contains("validation"),
            "{e}"
        );
        assert!(parse("step").unwrap_err().contains("POINT:N"));
        assert!(parse("step:0").unwrap_err().contains("from 1"));
        assert!(parse("step:x").unwrap_err().contains("from 1"));
    }
}
