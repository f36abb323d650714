//! Data-parallel training with the ranks as threads of this process, each with its own c10d
//! process group on Gloo over loopback (gradients through c10d's Reducer, PyTorch's DDP
//! engine), and once through the trainer's `Group` seam with an in-process all-reduce: 2 ranks
//! × batch B learn exactly as 1 rank × batch 2B (the same samples per step, gradients and
//! logged metrics averaged over the ranks, the same weights on every rank), and only rank 0
//! writes the run.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use kiln_config::load;
use kiln_device::Device;
use kiln_train::TrainError;
use kiln_train::distributed::{Group, SharedGroup};
use kiln_train::metrics::MetricValues;
use kiln_train::record::{EpochRecord, Observer, Progress, StepRecord, Summary};
use kiln_train::run::{Resume, RunControl, train};
use tch::{Kind, Tensor};

/// What the ranks of one in-process group share: a barrier and one slot per rank.
#[derive(Debug)]
struct Meeting {
    barrier: Barrier,
    slots: Mutex<Vec<Vec<f64>>>,
}

#[derive(Debug)]
struct ThreadGroup {
    rank: usize,
    meeting: Arc<Meeting>,
}

fn values(t: &Tensor) -> Result<Vec<f64>, TrainError> {
    let flat = t.f_to_kind(Kind::Double)?.f_reshape([-1])?;
    Ok(Vec::<f64>::try_from(&flat)?)
}

fn write(t: &Tensor, v: &[f64]) -> Result<(), TrainError> {
    let src = Tensor::f_from_slice(v)?.f_view_as(t)?.f_to_kind(t.kind())?;
    let _guard = tch::no_grad_guard();
    t.shallow_clone().f_copy_(&src)?;
    Ok(())
}

impl ThreadGroup {
    /// Every rank posts its values, then each reads what `pick` makes of all of them.
    fn exchange(
        &self,
        tensors: &[Tensor],
        pick: impl Fn(&[Vec<f64>]) -> Vec<f64>,
    ) -> Result<(), TrainError> {
        for t in tensors {
            self.meeting.slots.lock().unwrap()[self.rank] = values(t)?;
            self.meeting.barrier.wait();
            let result = pick(&self.meeting.slots.lock().unwrap());
            self.meeting.barrier.wait();
            write(t, &result)?;
        }
        Ok(())
    }
}

impl Group for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.meeting.slots.lock().unwrap().len()
    }
    fn broadcast_from_first(&mut self, tensors: &[Tensor]) -> Result<(), TrainError> {
        self.exchange(tensors, |all| all[0].clone())
    }
    fn all_reduce_mean(&mut self, tensors: &[Tensor]) -> Result<(), TrainError> {
        self.exchange(tensors, |all| {
            let n = all.len() as f64;
            (0..all[0].len())
                .map(|i| all.iter().map(|v| v[i]).sum::<f64>() / n)
                .collect()
        })
    }
}

/// One test at a time, with c10d's flight recorder off: it records a process group's first
/// collective into a map without its lock (libtorch 2.11), so groups of one process that start
/// collectives on several threads at once — ranks as threads, as here; never a real run's
/// single group — can corrupt it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    static OFF: std::sync::Once = std::sync::Once::new();
    // SAFETY: set before any group exists, while this test holds the lock and no other thread
    // of this process touches c10d or the environment.
    OFF.call_once(|| unsafe { std::env::set_var("TORCH_FR_BUFFER_SIZE", "0") });
    guard
}

/// `world` c10d process groups on Gloo over loopback, one per rank (they meet in parallel).
fn groups(world: usize) -> Vec<SharedGroup> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || {
                    let r = kiln_torch_ext::dist::Rendezvous::loopback(rank, world, port);
                    let timeout = std::time::Duration::from_secs(60);
                    let pg =
                        kiln_torch_ext::dist::ProcessGroup::connect(&r, timeout, Some("127.0.0.1"))
                            .unwrap();
                    let g: SharedGroup = Arc::new(Mutex::new(pg));
                    g
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `world` in-process groups (the `Group` seam's fallback: one flat all-reduce per step).
fn thread_groups(world: usize) -> Vec<SharedGroup> {
    let meeting = Arc::new(Meeting {
        barrier: Barrier::new(world),
        slots: Mutex::new(vec![vec![]; world]),
    });
    (0..world)
        .map(|rank| {
            let g: SharedGroup = Arc::new(Mutex::new(ThreadGroup {
                rank,
                meeting: meeting.clone(),
            }));
            g
        })
        .collect()
}

/// The logged losses.
#[derive(Default)]
struct Losses(Vec<f64>);

impl Observer for Losses {
    fn on_log(&mut self, r: &StepRecord) -> Result<(), TrainError> {
        self.0.push(r.metrics.loss());
        Ok(())
    }
}

fn plan(out: &Path, batch: usize) -> kiln_config::RunPlan {
    plan_with(out, batch, 1)
}

fn plan_with(out: &Path, batch: usize, accum: usize) -> kiln_config::RunPlan {
    let batch = format!("train.batch_size={batch}");
    let accum = format!("train.grad_accum_steps={accum}");
    let base = [
        "model.name=mlp",
        "model.dropout=0",
        "data.synthetic_samples=712",
        "data.num_workers=1",
        "train.amp=fp32",
        "train.epochs=2",
        "train.log_interval=1",
        "checkpoint.every_steps=5",
        batch.as_str(),
        accum.as_str(),
    ];
    load(&common::run_request(out, &base, &[])).unwrap().plan
}

/// What one rank's run gave: its logged losses, its run directory, its final validation loss
/// (computed by each rank on the whole validation set with its own weights), and the samples
/// its summary counts (every rank's).
type RankRun = (Vec<f64>, PathBuf, Option<f64>, u64);

/// Runs `plan` on `world` thread-ranks of c10d groups.
fn run_ranks(plan: &kiln_config::RunPlan, world: usize) -> Vec<RankRun> {
    run_on(groups(world), plan)
}

fn run_on(groups: Vec<SharedGroup>, plan: &kiln_config::RunPlan) -> Vec<RankRun> {
    let handles: Vec<_> = groups
        .into_iter()
        .map(|group| {
            let plan = plan.clone();
            std::thread::spawn(move || {
                let mut losses = Losses::default();
                let control = RunControl {
                    group: Some(group),
                    ..RunControl::default()
                };
                let outcome = train(&plan, Device::Cpu, None, control, &mut losses).unwrap();
                let s = outcome.summary;
                (
                    losses.0,
                    outcome.run_dir,
                    s.final_val.get("loss"),
                    s.samples,
                )
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn two_ranks_of_batch_b_learn_as_one_rank_of_batch_2b() {
    let _serial = serial();
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let single = run_ranks(&plan(one.path(), 64), 1);
    let pair = run_ranks(&plan(two.path(), 32), 2);
    same_learning(&single, &pair);
    let (a, b) = (pair[0].2.unwrap(), pair[1].2.unwrap());
    assert_eq!(a, b, "both ranks end with the same weights");
    assert!((a - single[0].2.unwrap()).abs() <= 1e-5 * a.abs());
    assert_eq!(
        pair[0].3, single[0].3,
        "the summary counts every rank's samples"
    );
}

#[test]
fn the_group_seams_fallback_learns_the_same() {
    let _serial = serial();
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let single = run_on(thread_groups(1), &plan(one.path(), 64));
    let pair = run_on(thread_groups(2), &plan(two.path(), 32));
    same_learning(&single, &pair);
}

/// 1 × 2B and 2 × B log the same losses, and rank 0 alone wrote one run.
fn same_learning(single: &[RankRun], pair: &[RankRun]) {
    let (reference, (rank0, rank1)) = (&single[0].0, (&pair[0].0, &pair[1].0));
    assert_eq!(reference.len(), 20, "2 epochs of 10 steps of 64");
    assert_eq!(rank0.len(), reference.len());
    for (step, (a, b)) in reference.iter().zip(rank0).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "step {}: 1×64 {a} vs 2×32 {b}",
            step + 1
        );
    }
    assert_eq!(rank0, rank1, "both ranks log the same averaged loss");
    assert!(
        reference.last() < reference.first(),
        "it learns: {reference:?}"
    );
    // Rank 0 alone writes the run, with its checkpoints; rank 1 writes nothing.
    assert!(pair[0].1.join("metrics.jsonl").is_file());
    assert!(pair[0].1.join("checkpoints").is_dir());
    assert_eq!(pair[1].1, PathBuf::new());
    assert_eq!(
        std::fs::read_dir(pair[0].1.parent().unwrap())
            .unwrap()
            .count(),
        1,
        "one run directory"
    );
}

#[test]
fn accumulated_micro_steps_average_once_per_step() {
    let _serial = serial();
    // 2 ranks × 2 micro-batches of 16 (the first skips the all-reduce) = 1 × 64.
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let single = run_ranks(&plan(one.path(), 64), 1);
    let pair = run_ranks(&plan_with(two.path(), 16, 2), 2);
    let (reference, rank0) = (&single[0].0, &pair[0].0);
    assert_eq!(rank0.len(), reference.len());
    for (step, (a, b)) in reference.iter().zip(rank0).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "step {}: 1×64 {a} vs 2×2×16 {b}",
            step + 1
        );
    }
}

#[test]
fn ranks_that_run_different_jobs_are_refused_naming_the_difference() {
    let _serial = serial();
    let out = tempfile::tempdir().unwrap();
    let plans = [plan(out.path(), 32), plan(out.path(), 16)];
    let handles: Vec<_> = groups(2)
        .into_iter()
        .zip(plans)
        .map(|(group, plan)| {
            std::thread::spawn(move || {
                let control = RunControl {
                    group: Some(group),
                    ..RunControl::default()
                };
                train(&plan, Device::Cpu, None, control, &mut Losses::default()).map(|_| ())
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let err = h.join().unwrap().unwrap_err().to_string();
        assert!(err.contains(&format!("rank {rank}")), "{err}");
        assert!(err.contains("the same job on every rank"), "{err}");
        if rank == 1 {
            assert!(
                err.contains("train.batch_size is 16 here and 32 on rank 0"),
                "{err}"
            );
        }
    }
}

/// Runs `plan` on 2 thread-ranks, stopping after step `stop_at` or resuming; each rank's
/// logged losses and result.
fn run_pair(
    plan: &kiln_config::RunPlan,
    stop_at: Option<u64>,
    resume: bool,
) -> Vec<(Vec<f64>, Result<(), String>)> {
    let losses = |l: Logged| l.steps.iter().map(|(_, m)| m.loss()).collect();
    logged_pair(plan, stop_at, resume)
        .into_iter()
        .map(|(logged, r)| (losses(logged), r))
        .collect()
}

#[test]
fn a_stopped_two_rank_run_resumes_exactly() {
    let _serial = serial();
    let (whole, parts) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let reference = run_pair(&plan(whole.path(), 32), None, false);
    let plan = plan(parts.path(), 32);
    let first = run_pair(&plan, Some(7), false);
    for (_, r) in &first {
        assert!(r.as_ref().unwrap_err().contains("stop"), "{r:?}");
    }
    let second = run_pair(&plan, None, true);
    for rank in 0..2 {
        assert!(second[rank].1.is_ok(), "{:?}", second[rank].1);
        let joined: Vec<f64> = first[rank]
            .0
            .iter()
            .chain(&second[rank].0)
            .copied()
            .collect();
        assert_eq!(
            joined, reference[rank].0,
            "rank {rank}: stopped at 7 and resumed = whole"
        );
    }
}

/// Every logged metric of a run: `(step, metrics)` of each log line, then of each epoch.
#[derive(Default)]
struct Logged {
    steps: Vec<(u64, MetricValues)>,
    epochs: Vec<(u64, MetricValues)>,
    stop: Option<(u64, Arc<AtomicBool>)>,
}

impl Observer for Logged {
    fn on_step(&mut self, p: &Progress) -> Result<(), TrainError> {
        if let Some((at, flag)) = &self.stop
            && p.step == *at
        {
            flag.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
    fn on_log(&mut self, r: &StepRecord) -> Result<(), TrainError> {
        self.steps.push((r.step, r.metrics.clone()));
        Ok(())
    }
    fn on_epoch(&mut self, r: &EpochRecord) -> Result<(), TrainError> {
        self.epochs.push((r.step, r.train.clone()));
        Ok(())
    }
}

/// Runs `plan` on 2 thread-ranks, stopping after step `stop_at` or resuming; each rank's
/// logged metrics and result.
fn logged_pair(
    plan: &kiln_config::RunPlan,
    stop_at: Option<u64>,
    resume: bool,
) -> Vec<(Logged, Result<(), String>)> {
    let handles: Vec<_> = groups(2)
        .into_iter()
        .map(|group| {
            let plan = plan.clone();
            std::thread::spawn(move || {
                let flag = Arc::new(AtomicBool::new(false));
                let mut logged = Logged {
                    stop: stop_at.map(|s| (s, flag.clone())),
                    ..Logged::default()
                };
                let control = RunControl {
                    group: Some(group),
                    stop: Some(flag),
                    resume: resume.then_some(Resume::Latest),
                    ..RunControl::default()
                };
                let r = train(&plan, Device::Cpu, None, control, &mut logged);
                (logged, r.map(|_| ()).map_err(|e| e.to_string()))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// The checkpoints directory of the run under `out`.
fn checkpoints_of(out: &Path) -> PathBuf {
    let run = std::fs::read_dir(out).unwrap().flatten().next().unwrap();
    run.path().join("checkpoints")
}

/// Each rank's share of the metrics survives a resume from the middle of a log interval:
/// logging every 3 steps with a checkpoint every 5, a run asked to stop at step 7 (both ranks
/// stop after step 8) resumes from the periodic checkpoint of step 5 (the stop's own is
/// removed, as if the run had been killed), whose open interval holds steps 4 and 5 on both
/// ranks; every log line and epoch record after it equals the uninterrupted run's on every
/// rank.
#[test]
fn every_rank_continues_its_own_metric_sums_after_a_resume() {
    let _serial = serial();
    let (whole, parts) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let with_logs_every_3 = |out: &Path| {
        let mut p = plan(out, 32);
        p.train.log_interval = 3;
        p
    };
    let ok = |runs: Vec<(Logged, Result<(), String>)>| -> Vec<Logged> {
        runs.into_iter()
            .map(|(logged, r)| {
                r.unwrap();
                logged
            })
            .collect()
    };
    let reference = ok(logged_pair(&with_logs_every_3(whole.path()), None, false));
    let plan = with_logs_every_3(parts.path());
    for (_, r) in logged_pair(&plan, Some(7), false) {
        assert!(r.as_ref().unwrap_err().contains("stop"), "{r:?}");
    }
    let checkpoints = checkpoints_of(parts.path());
    std::fs::remove_dir_all(checkpoints.join(kiln_train::checkpoint::dir_name(8))).unwrap();
    assert!(
        checkpoints
            .join(kiln_train::checkpoint::dir_name(5))
            .is_dir()
    );
    let resumed = ok(logged_pair(&plan, None, true));
    for rank in 0..2 {
        let (r, whole) = (&resumed[rank], &reference[rank]);
        let after_5: Vec<_> = whole.steps.iter().filter(|s| s.0 > 5).cloned().collect();
        assert_eq!(r.steps.first().map(|s| s.0), Some(6), "rank {rank}");
        assert_eq!(r.steps, after_5, "rank {rank}: log lines after the resume");
        assert_eq!(r.epochs, whole.epochs, "rank {rank}: epoch records");
    }
}

/// Runs `plan` on one rank (no group), resuming the latest run.
fn resume_alone(plan: &kiln_config::RunPlan) -> Result<Vec<f64>, String> {
    let mut losses = Losses::default();
    let control = RunControl {
        resume: Some(Resume::Latest),
        ..RunControl::default()
    };
    train(plan, Device::Cpu, None, control, &mut losses)
        .map(|_| losses.0)
        .map_err(|e| e.to_string())
}

#[test]
fn another_number_of_ranks_resumes_from_an_epochs_end_but_not_from_its_middle() {
    let _serial = serial();
    let mid = tempfile::tempdir().unwrap();
    let plan = plan(mid.path(), 32);
    let stopped = run_pair(&plan, Some(7), false);
    assert!(stopped[0].1.as_ref().unwrap_err().contains("stop"));
    let err = resume_alone(&plan).unwrap_err();
    assert!(err.contains("in the middle of epoch 1"), "{err}");
    assert!(err.contains("Resume with 2 rank(s)"), "{err}");

    let end = tempfile::tempdir().unwrap();
    let one_epoch = plan_with_epochs(end.path(), 32, 1);
    run_pair(&one_epoch, None, false)
        .into_iter()
        .for_each(|(_, r)| r.unwrap());
    let losses = resume_alone(&plan_with_epochs(end.path(), 32, 2)).unwrap();
    assert_eq!(losses.len(), 20, "epoch 2 alone: 20 steps of 32");
}

fn plan_with_epochs(out: &Path, batch: usize, epochs: u64) -> kiln_config::RunPlan {
    let mut p = plan(out, batch);
    p.train.epochs = epochs;
    p
}

#[test]
fn ranks_agree_on_the_smallest_automatic_batch_size_any_of_them_found() {
    let _serial = serial();
    let found = [96_u64, 64, 128];
    let handles: Vec<_> = groups(3)
        .into_iter()
        .zip(found)
        .map(|(g, mine)| {
            std::thread::spawn(move || kiln_train::distributed::min_over_ranks(&g, mine).unwrap())
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 64);
    }
}

/// Counts a rank's steps for its clock.
struct StepCounter(Arc<std::sync::atomic::AtomicU64>);

impl Observer for StepCounter {
    fn on_step(&mut self, _: &Progress) -> Result<(), TrainError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Runs `plan` on 2 thread-ranks, each on a clock the test drives: rank `r`'s reads
/// `per_step[r]` seconds for every step it has taken. Each rank's summary.
fn on_clocks(plan: &kiln_config::RunPlan, per_step: [f64; 2]) -> Vec<Summary> {
    let handles: Vec<_> = groups(2)
        .into_iter()
        .zip(per_step)
        .map(|(group, per_step)| {
            let plan = plan.clone();
            std::thread::spawn(move || {
                let steps = Arc::new(std::sync::atomic::AtomicU64::new(0));
                let seen = Arc::clone(&steps);
                let clock = kiln_train::stopping::Clock::driven(move || {
                    std::time::Duration::from_secs_f64(
                        per_step * seen.load(Ordering::SeqCst) as f64,
                    )
                });
                let control = RunControl {
                    group: Some(group),
                    clock: Some(clock),
                    ..RunControl::default()
                };
                let mut counter = StepCounter(steps);
                train(&plan, Device::Cpu, None, control, &mut counter)
                    .unwrap()
                    .summary
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// `train.max_time` in a data-parallel run: each rank reads its own clock, and the ranks vote,
/// so they stop together once any rank's time is up. Here rank 1's clock runs 0.25 s a step and
/// rank 0's 0.1 s, on clocks the test drives: with a limit of 1 s, rank 1's time is up after
/// step 4, and its vote, which overlaps the next step, is read after step 5, where both stop
/// (rank 0 alone would go on to step 10), each saying why.
#[test]
fn ranks_stop_together_when_the_first_of_them_runs_out_of_time() {
    let _serial = serial();
    let out = tempfile::tempdir().unwrap();
    let mut plan = plan(out.path(), 8);
    plan.train.max_time = Some(std::time::Duration::from_secs(1));
    for (rank, summary) in on_clocks(&plan, [0.1, 0.25]).into_iter().enumerate() {
        assert_eq!(summary.steps, 5, "rank {rank}");
        let stop = summary.stopped_by.expect("stopped by the clock");
        assert_eq!(stop.kind, "max_time", "rank {rank}");
    }
}

/// `checkpoint.every_seconds` in a data-parallel run goes by rank 0's clock (the one that
/// writes), voted like a stop so that every rank takes part at the same step. Rank 0's clock
/// runs 0.25 s a step, rank 1's 10 s (were its clock read, every step would checkpoint): a
/// second has passed after step 4, the vote is read after step 5, which checkpoints; then 10
/// and 15, and the end at step 16. Each checkpoint inside the epoch holds rank 1's sums.
#[test]
fn time_based_checkpoints_follow_rank_0s_clock_on_every_rank() {
    let _serial = serial();
    let out = tempfile::tempdir().unwrap();
    let mut plan = plan(out.path(), 8);
    plan.checkpoint.every_steps = 0;
    plan.checkpoint.every_seconds = 1;
    plan.checkpoint.keep_last = 10;
    plan.train.max_steps = Some(16);
    for summary in on_clocks(&plan, [0.25, 10.0]) {
        assert_eq!(summary.steps, 16);
    }
    let checkpoints = checkpoints_of(out.path());
    let mut saved: Vec<String> = std::fs::read_dir(&checkpoints)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    saved.sort();
    let expected: Vec<String> = [5, 10, 15, 16].map(kiln_train::checkpoint::dir_name).into();
    assert_eq!(saved, expected);
    let meta = checkpoints.join(&expected[1]).join("checkpoint.json");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(meta).unwrap()).unwrap();
    let others = meta["sums"]["other_ranks"]
        .as_array()
        .expect("rank 1's sums");
    assert_eq!(others.len(), 1);
    assert!(
        others[0]["epoch"]["samples"].as_u64().unwrap() > 0,
        "{meta}"
    );
}
