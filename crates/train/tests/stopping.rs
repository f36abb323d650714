//! Runs that end before their epochs: early stopping on a validation metric (the best
//! checkpoint kept, the count carried over a resume), `train.max_steps` (mid-epoch, the schedule
//! following it, resumed where it stood) and `train.max_time` (within one step).

use std::path::Path;
use std::time::{Duration, Instant};

mod common;

use common::{only_run, records};
use kiln_config::load;
use kiln_device::Device;
use kiln_train::TrainError;
use kiln_train::checkpoint;
use kiln_train::record::{Observer, Progress, RunStart, Summary};
use kiln_train::run::{Resume, RunControl, train};
use serde_json::Value;

fn plan(out: &Path, extra: &[&str]) -> kiln_config::RunPlan {
    let base = [
        "model.name=mlp",
        "data.synthetic_samples=640",
        "data.num_workers=0",
        "train.batch_size=32",
        "train.log_interval=5",
        "checkpoint.keep_last=1",
    ];
    load(&common::run_request(out, &base, extra)).unwrap().plan
}

fn run(plan: &kiln_config::RunPlan, resume: Option<Resume>) -> Summary {
    common::train_quietly(plan, resume).summary
}

fn checkpoint_steps(run: &Path) -> Vec<u64> {
    let list = checkpoint::list(&run.join("checkpoints")).unwrap();
    list.iter().map(|c| c.0).collect()
}

#[test]
fn early_stopping_ends_the_run_keeps_the_best_and_resumes_counting() {
    let out = tempfile::tempdir().unwrap();
    // No validation loss improves on the first by 10: the second validation ends the run.
    let sets = [
        "train.epochs=30",
        "train.early_stopping.metric=val_loss",
        "train.early_stopping.patience=1",
        "train.early_stopping.min_delta=10",
    ];
    let p = plan(out.path(), &sets);
    let s = run(&p, None);
    let stop = s.stopped_by.expect("stopped early");
    assert_eq!(stop.kind, "early_stopping");
    assert!(
        stop.message.contains("val_loss has not improved"),
        "{}",
        stop.message
    );
    let dir = only_run(out.path());
    let epochs = records(&dir, "epoch");
    assert_eq!(epochs.len(), 2);
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["stopped_by"]["kind"], "early_stopping");
    // keep_last is 1, and the first epoch's checkpoint (the best loss) is kept beside it.
    let (first, second) = (epochs[0]["step"].as_u64(), epochs[1]["step"].as_u64());
    let best = if epochs[0]["val_loss"].as_f64() <= epochs[1]["val_loss"].as_f64() {
        first
    } else {
        second
    };
    let kept = checkpoint_steps(&dir);
    assert!(kept.contains(&best.unwrap()), "{kept:?}");
    assert_eq!(kept.last().copied(), second);

    // Resumed as it was, the run stays stopped: its count had reached the patience.
    let again = run(&p, Some(Resume::Latest));
    assert_eq!(again.steps, s.steps);
    let stop = again.stopped_by.expect("still stopped");
    assert!(
        stop.message.contains("had not improved for 1 epochs"),
        "{}",
        stop.message
    );
    // With a patience of 3 it counts on from 1: two more validations, then the end.
    let patient = plan(
        out.path(),
        &[&sets[..], &["train.early_stopping.patience=3"]].concat(),
    );
    let more = run(&patient, Some(Resume::Latest));
    assert_eq!(more.stopped_by.expect("stopped").kind, "early_stopping");
    assert_eq!(records(&dir, "epoch").len(), 4);
}

#[test]
fn max_steps_ends_the_run_mid_epoch_its_schedule_follows_and_a_resume_continues() {
    let out = tempfile::tempdir().unwrap();
    // 18 steps an epoch (576 training samples); 3 epochs would be 54 steps.
    let sets = [
        "train.epochs=3",
        "train.max_steps=25",
        "train.warmup_steps=5",
    ];
    let p = plan(out.path(), &sets);
    let s = run(&p, None);
    assert_eq!(s.steps, 25);
    assert_eq!(s.stopped_by.expect("stopped").kind, "max_steps");
    let dir = only_run(out.path());
    let start = &records(&dir, "start")[0];
    assert_eq!(
        start["total_steps"], 25,
        "the schedule's length is the limit"
    );
    assert_eq!(start["steps_per_epoch"], 18);
    // The cosine schedule reaches its end (lr 0) at the limit's step.
    let steps = records(&dir, "step");
    let last = steps.last().unwrap();
    assert_eq!(last["step"], 25);
    assert!(last["lr"].as_f64().unwrap() < 1e-5, "{last}");
    // The second epoch is validated where it stood, and checkpointed there.
    let epochs = records(&dir, "epoch");
    assert_eq!(epochs.len(), 2);
    assert_eq!(epochs[1]["step"], 25);
    let ckpt = checkpoint::load(&dir.join("checkpoints").join(checkpoint::dir_name(25))).unwrap();
    assert_eq!((ckpt.meta.epoch, ckpt.meta.batch), (1, 7));

    // A higher limit continues from that batch to the end of the epochs.
    let longer = plan(out.path(), &[&sets[..], &["train.max_steps=0"]].concat());
    let done = run(&longer, Some(Resume::Latest));
    assert_eq!(done.steps, 54);
    assert!(done.stopped_by.is_none());
}

/// Notes the time of each step, from when the run started.
struct StepTimes {
    started: Option<Instant>,
    at: Vec<Duration>,
}

impl Observer for StepTimes {
    fn on_start(&mut self, _: &RunStart) -> Result<(), TrainError> {
        self.started = Some(Instant::now());
        Ok(())
    }

    fn on_step(&mut self, _: &Progress) -> Result<(), TrainError> {
        let started = self.started.unwrap_or_else(Instant::now);
        self.at.push(started.elapsed());
        Ok(())
    }
}

#[test]
fn max_time_ends_the_run_within_one_step_and_counts_over_resumes() {
    let out = tempfile::tempdir().unwrap();
    let sets = ["train.epochs=1000", "train.max_time=1"];
    let p = plan(out.path(), &sets);
    let mut times = StepTimes {
        started: None,
        at: vec![],
    };
    let outcome = train(&p, Device::Cpu, None, RunControl::default(), &mut times).unwrap();
    let s = outcome.summary;
    let stop = s.stopped_by.expect("stopped by the clock");
    assert_eq!(stop.kind, "max_time");
    assert!(
        stop.message.contains("train.max_time = 1 s"),
        "{}",
        stop.message
    );
    // The trainer's clock starts before this observer's: the step before the last one ended
    // under the limit on both, so the run ended at the first step past it.
    let n = times.at.len();
    assert!(n >= 2 && n as u64 == s.steps, "{n} steps");
    assert!(
        times.at[n - 2] < Duration::from_secs(1),
        "{:?}",
        times.at[n - 2]
    );
    let dir = outcome.run_dir;
    let newest = checkpoint::list(&dir.join("checkpoints")).unwrap();
    let ckpt = checkpoint::load(&newest.last().unwrap().1).unwrap();
    assert_eq!(ckpt.meta.step, s.steps);
    let trained = ckpt.meta.sums.running().trained_seconds.unwrap();
    assert!(trained >= 1.0, "{trained}");
    // Resumed, the time already trained counts: the limit is met before any step.
    let again = run(&p, Some(Resume::Latest));
    assert_eq!(again.steps, s.steps);
    assert_eq!(again.stopped_by.expect("stopped").kind, "max_time");
}
