//! Data-parallel training through the trainer's `Group` seam, with the ranks as threads of this
//! process and an in-process all-reduce: 2 ranks × batch B learn exactly as 1 rank × batch 2B
//! (the same samples per step, gradients and logged metrics averaged over the ranks), and only
//! rank 0 writes the run.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};

use kiln_config::load;
use kiln_device::Device;
use kiln_train::TrainError;
use kiln_train::distributed::{Group, SharedGroup};
use kiln_train::record::{Observer, StepRecord};
use kiln_train::run::{RunControl, train};
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

fn groups(world: usize) -> Vec<SharedGroup> {
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

#[derive(Default)]
struct Losses(Vec<f64>);

impl Observer for Losses {
    fn on_log(&mut self, r: &StepRecord) -> Result<(), TrainError> {
        self.0.push(r.loss);
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

/// Runs `plan` on `world` thread-ranks; returns each rank's logged losses and run directory.
fn run_ranks(plan: &kiln_config::RunPlan, world: usize) -> Vec<(Vec<f64>, PathBuf)> {
    let handles: Vec<_> = groups(world)
        .into_iter()
        .map(|group| {
            let plan = plan.clone();
            std::thread::spawn(move || {
                let mut losses = Losses::default();
                let control = RunControl {
                    group: Some(group),
                    ..RunControl::default()
                };
                let outcome = train(
                    &plan,
                    Device::Cpu,
                    None,
                    control,
                    &mut losses,
                    &mut |_, _| {},
                )
                .unwrap();
                (losses.0, outcome.run_dir)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn two_ranks_of_batch_b_learn_as_one_rank_of_batch_2b() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let single = run_ranks(&plan(one.path(), 64), 1);
    let pair = run_ranks(&plan(two.path(), 32), 2);
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
        std::fs::read_dir(two.path()).unwrap().count(),
        1,
        "one run directory"
    );
}

#[test]
fn accumulated_micro_steps_average_once_per_step() {
    // 2 ranks × 2 micro-batches of 16 (gradients all-reduced once, after the last) = 1 × 64.
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
