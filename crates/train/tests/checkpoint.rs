//! Checkpoints: a run stopped or killed and resumed continues bit-exactly on the CPU; a
//! half-written, truncated or corrupted checkpoint is detected and an older one used; weights
//! are readable from Python's `safetensors`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use common::only_run;

use kiln_config::KeepBest;
use kiln_config::load;
use kiln_device::Device;
use kiln_train::TrainError;
use kiln_train::checkpoint::{self, Contents, Retention};
use kiln_train::record::{Observer, Progress, Silent};
use kiln_train::run::{Resume, RunControl, train};
use kiln_train::stopping::Clock;
use serde_json::Value;
use tch::{Kind, Tensor};

fn cpu_plan(out: &Path, extra: &[&str]) -> kiln_config::RunPlan {
    let base = [
        "model.name=mlp",
        "data.synthetic_samples=1000",
        "data.num_workers=1",
        "train.epochs=3",
        "train.log_interval=5",
        "train.batch_size=16",
        "checkpoint.every_steps=7",
        "checkpoint.keep_last=50",
    ];
    load(&common::run_request(out, &base, extra)).unwrap().plan
}

/// Stops the run at `step`: by the stop flag (a signal), or by failing (a crash).
struct StopAt {
    step: u64,
    flag: Option<Arc<AtomicBool>>,
}

impl Observer for StopAt {
    fn on_step(&mut self, p: &Progress) -> Result<(), TrainError> {
        if p.step == self.step {
            match &self.flag {
                Some(flag) => flag.store(true, Ordering::SeqCst),
                None => {
                    return Err(TrainError::InvalidPlan {
                        key: "test",
                        value: "crash".into(),
                        expected: "the run dies here".into(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The deterministic content of a run's step and epoch records.
fn learning_curve(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["kind"] == "step" || v["kind"] == "epoch")
        .map(|v| {
            let keep = [
                "kind",
                "step",
                "epoch",
                "epoch_progress",
                "loss",
                "accuracy",
                "lr",
                "train_loss",
                "train_accuracy",
                "val_loss",
                "val_accuracy",
            ];
            keep.iter()
                .map(|k| ((*k).to_owned(), v[*k].clone()))
                .collect::<serde_json::Map<_, _>>()
                .into()
        })
        .collect()
}

/// The learning curve of an uninterrupted run of `cpu_plan`.
fn uninterrupted_curve() -> Vec<Value> {
    let reference = tempfile::tempdir().unwrap();
    let plan = cpu_plan(reference.path(), &[]);
    train(&plan, Device::Cpu, None, RunControl::default(), &mut Silent).unwrap();
    learning_curve(&only_run(reference.path()))
}

/// Runs `plan` (resuming as `resume` says) until it crashes at `step`.
fn crash_at(plan: &kiln_config::RunPlan, resume: Option<Resume>, step: u64) {
    let err = train(
        plan,
        Device::Cpu,
        None,
        RunControl {
            resume,
            ..RunControl::default()
        },
        &mut StopAt { step, flag: None },
    )
    .unwrap_err();
    assert!(err.to_string().contains("the run dies here"), "{err}");
}

/// Resumes the newest run of `plan` and trains it to the end.
fn resume_to_end(plan: &kiln_config::RunPlan, resume: Resume) {
    train(
        plan,
        Device::Cpu,
        None,
        RunControl {
            resume: Some(resume),
            ..RunControl::default()
        },
        &mut Silent,
    )
    .unwrap();
}

/// The entries of `dir` whose names start with `prefix`, sorted.
fn entries_starting(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

fn truncate_to_half(file: &Path) {
    let len = std::fs::metadata(file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.set_len(len / 2).unwrap();
}

fn flip_middle_byte(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x04;
    std::fs::write(file, bytes).unwrap();
}

/// An uninterrupted run's learning curve, and a run of the same plan under a new directory that
/// crashed at step 20 (checkpoints 7 and 14): (curve, directory, plan, its `checkpoints/`).
fn crashed_at_20() -> (Vec<Value>, tempfile::TempDir, kiln_config::RunPlan, PathBuf) {
    let expected = uninterrupted_curve();
    let out = tempfile::tempdir().unwrap();
    let plan = cpu_plan(out.path(), &[]);
    crash_at(&plan, None, 20);
    let ckpts = only_run(out.path()).join("checkpoints");
    (expected, out, plan, ckpts)
}

#[test]
fn damaged_newest_checkpoints_are_moved_aside_and_the_run_trains_past_them() {
    // A crash at step 20 leaves checkpoints 7 and 14; 14's optimizer state is then cut short.
    let (expected, out, plan, ckpts) = crashed_at_20();
    let step14 = ckpts.join(checkpoint::dir_name(14));
    truncate_to_half(&step14.join(checkpoint::STATE_FILE));
    let truncated = std::fs::read(step14.join(checkpoint::STATE_FILE)).unwrap();
    // The resumed run passes over 14 to 7, writes 14 and 21 afresh, and crashes at step 26;
    // then a bit of 21's checkpoint.json flips.
    crash_at(&plan, Some(Resume::Latest), 26);
    let aside = entries_starting(&ckpts, &format!("{}.damaged-", checkpoint::dir_name(14)));
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(aside[0].join(checkpoint::STATE_FILE)).unwrap(),
        truncated,
        "the damaged files stay as they were"
    );
    let note = std::fs::read_to_string(aside[0].join(checkpoint::MOVED_NOTE)).unwrap();
    assert!(
        note.contains("state.safetensors") && note.contains("truncated"),
        "{note}"
    );
    flip_middle_byte(
        &ckpts
            .join(checkpoint::dir_name(21))
            .join(checkpoint::META_FILE),
    );
    resume_to_end(&plan, Resume::Latest);

    assert_eq!(learning_curve(&only_run(out.path())), expected);
    for step in [14, 21] {
        let name = format!("{}.damaged-", checkpoint::dir_name(step));
        assert_eq!(entries_starting(&ckpts, &name).len(), 1, "{name}");
    }
    // Every step checkpointed again, each one good; the moved-aside ones are not listed.
    assert_eq!(&steps(&ckpts)[..4], [7, 14, 21, 28]);
    for (_, dir) in checkpoint::list(&ckpts).unwrap() {
        checkpoint::load(&dir).unwrap();
    }
}

#[test]
fn resuming_an_older_checkpoint_sets_newer_ones_aside_and_clears_dead_writes() {
    let (expected, out, plan, ckpts) = crashed_at_20();
    // What a write killed midway leaves behind.
    let dead = ckpts.join(".tmp-step-000000021-999999");
    std::fs::create_dir(&dead).unwrap();
    std::fs::write(dead.join(checkpoint::MODEL_FILE), b"half").unwrap();
    let newer = std::fs::read(
        ckpts
            .join(checkpoint::dir_name(14))
            .join(checkpoint::MODEL_FILE),
    );

    resume_to_end(&plan, Resume::From(ckpts.join(checkpoint::dir_name(7))));
    assert_eq!(learning_curve(&only_run(out.path())), expected);
    assert!(!dead.exists(), "the dead write's directory is cleared");
    let aside = entries_starting(&ckpts, &format!("{}.superseded-", checkpoint::dir_name(14)));
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(aside[0].join(checkpoint::MODEL_FILE)).unwrap(),
        newer.unwrap()
    );
    checkpoint::load(&ckpts.join(checkpoint::dir_name(14))).unwrap();
}

/// A training clock that reads 0.1 s per step done, and a crash at step `crash_at`.
struct Ticking {
    now_ms: Arc<AtomicU64>,
    crash_at: u64,
}

impl Observer for Ticking {
    fn on_step(&mut self, p: &Progress) -> Result<(), TrainError> {
        self.now_ms.store(p.step * 100, Ordering::SeqCst);
        if p.step == self.crash_at {
            return Err(TrainError::InvalidPlan {
                key: "test",
                value: "crash".into(),
                expected: "the run dies here".into(),
            });
        }
        Ok(())
    }
}

/// `checkpoint.every_seconds`: checkpoints between epoch ends by the clock alone (here a
/// clock of 0.1 s a step, so that what it decides is the same on any machine), and a run
/// killed after one resumes from it, bit-exactly.
#[test]
fn a_run_killed_between_time_based_checkpoints_resumes_from_the_latest() {
    let expected = uninterrupted_curve();
    let out = tempfile::tempdir().unwrap();
    let timed = ["checkpoint.every_steps=0", "checkpoint.every_seconds=1"];
    let plan = cpu_plan(out.path(), &timed);
    let now_ms = Arc::new(AtomicU64::new(0));
    let clock = {
        let now_ms = now_ms.clone();
        Clock::driven(move || Duration::from_millis(now_ms.load(Ordering::SeqCst)))
    };
    let control = RunControl {
        clock: Some(clock),
        ..RunControl::default()
    };
    let mut ticking = Ticking {
        now_ms,
        crash_at: 73,
    };
    let err = train(&plan, Device::Cpu, None, control, &mut ticking).unwrap_err();
    assert!(err.to_string().contains("the run dies here"), "{err}");
    // Every second of the clock (10 steps) since the last checkpoint, and the epoch's end
    // (step 56), which restarts the count.
    let ckpts = only_run(out.path()).join("checkpoints");
    assert_eq!(steps(&ckpts), [10, 20, 30, 40, 50, 56, 66]);
    resume_to_end(&plan, Resume::Latest);
    assert_eq!(learning_curve(&only_run(out.path())), expected);
}

#[test]
fn stopped_or_killed_runs_resume_bit_exactly() {
    let expected = uninterrupted_curve();
    assert!(expected.len() > 20);

    // A signal at step 17: the step finishes, a checkpoint is written, the run stops.
    let stopped = tempfile::tempdir().unwrap();
    let plan = cpu_plan(stopped.path(), &[]);
    let flag = Arc::new(AtomicBool::new(false));
    let err = train(
        &plan,
        Device::Cpu,
        None,
        RunControl {
            resume: None,
            stop: Some(flag.clone()),
            ..RunControl::default()
        },
        &mut StopAt {
            step: 17,
            flag: Some(flag),
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            TrainError::Stopped {
                step: 17,
                checkpoint: Some(_)
            }
        ),
        "{err}"
    );
    let run = only_run(stopped.path());
    assert!(
        run.join("checkpoints")
            .join(checkpoint::dir_name(17))
            .is_dir()
    );
    let outcome = train(
        &plan,
        Device::Cpu,
        None,
        RunControl {
            resume: Some(Resume::Latest),
            stop: None,
            ..RunControl::default()
        },
        &mut Silent,
    )
    .unwrap();
    assert_eq!(
        outcome.run_dir, run,
        "the resumed run continues in its directory"
    );
    assert_eq!(
        learning_curve(&run),
        expected,
        "resumed after a stop at step 17"
    );

    // A crash at step 20 (no checkpoint then; the last one is step 14's).
    let crashed = tempfile::tempdir().unwrap();
    let plan = cpu_plan(crashed.path(), &[]);
    crash_at(&plan, None, 20);
    let run = only_run(crashed.path());
    assert_eq!(steps(&run.join("checkpoints")), [7, 14]);
    resume_to_end(&plan, Resume::From(run.clone()));
    assert_eq!(
        learning_curve(&run),
        expected,
        "resumed after a crash at step 20"
    );
}

fn small_checkpoint(dir: &Path, step: u64) -> PathBuf {
    small_checkpoint_with(dir, step, Default::default())
}

fn small_checkpoint_with(dir: &Path, step: u64, sums: checkpoint::SavedSums) -> PathBuf {
    let mut meta = small_meta(step);
    if matches!(sums, checkpoint::SavedSums::Legacy(_)) {
        meta.version = 1;
    }
    meta.sums = sums;
    save_small(dir, meta)
}

/// Writes a small checkpoint of `meta.step` with `meta`.
fn save_small(dir: &Path, meta: checkpoint::Meta) -> PathBuf {
    let step = meta.step;
    let w = Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).view([2, 3]);
    checkpoint::save(
        dir,
        Contents {
            model: &[("fc.weight".to_owned(), &w * step as f64)],
            state: &[("fc.weight.step".to_owned(), Tensor::from(step as f32))],
            meta,
            script: None,
            program: None,
        },
    )
    .unwrap()
}

fn small_meta(step: u64) -> checkpoint::Meta {
    checkpoint::Meta {
        format: checkpoint::FORMAT.to_owned(),
        version: checkpoint::VERSION,
        kiln_version: "test".into(),
        libtorch_version: "test".into(),
        step,
        epoch: 0,
        batch: step as usize,
        batch_size: Some(8),
        lr: Some(0.01),
        world_size: None,
        loss_scale: None,
        loss_scale_growth_tracker: None,
        model_rng: vec![step],
        val_accuracy: Some(step as f64 / 100.0),
        val_loss: None,
        val_metrics: Default::default(),
        sums: Default::default(),
        config: Value::Null,
        input: None,
        files: Default::default(),
        file_bytes: Default::default(),
        meta_sha256: String::new(),
    }
}

#[test]
fn running_sums_of_any_value_survive_the_checksum() {
    // The checksum is over the JSON as kiln writes it, so every float must read back to the
    // same bits (serde_json's exact float parsing; its fast default is off by an ulp at times).
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    for step in 1..=300u64 {
        let x = (step as f64).ln() / 7.0 + (step as f64).sqrt() * 1e-9;
        let named = |pairs: [(&str, f64); 2]| pairs.map(|(n, v)| (n.to_owned(), v)).into();
        let sums = checkpoint::RunningSums {
            epoch: kiln_train::metrics::SavedTally {
                samples: step,
                sums: named([("loss.sum", x * 1234.567), ("accuracy.right", 1.0 / x)]),
            },
            interval: kiln_train::metrics::SavedTally {
                samples: 1,
                sums: named([("loss.sum", x.exp() * 1e-7), ("accuracy.judged", x)]),
            },
            best_val: named([("accuracy", x.sin().abs()), ("loss", x.cos())]),
            ..Default::default()
        };
        // Version 1's fixed fields, read back as written.
        let legacy = checkpoint::LegacySums {
            epoch_loss: x * 1234.567,
            epoch_correct: 1.0 / x,
            interval_loss: x.exp() * 1e-7,
            best_val_accuracy: Some(x.sin().abs()),
            ..Default::default()
        };
        for saved in [sums.clone().into(), checkpoint::SavedSums::Legacy(legacy)] {
            let path = small_checkpoint_with(&dir, step, saved.clone());
            let back = checkpoint::load(&path).unwrap_or_else(|e| panic!("step {step}: {e}"));
            assert_eq!(back.meta.sums, saved);
            std::fs::remove_dir_all(&path).unwrap();
        }
    }
}

#[test]
fn damaged_checkpoints_are_named_and_an_older_good_one_is_used() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    for step in [10, 20, 30, 40] {
        small_checkpoint(&dir, step);
    }
    let (latest, skipped) = checkpoint::latest_good(&dir).unwrap();
    assert_eq!((latest.meta.step, skipped.len()), (40, 0));
    assert_eq!(latest.meta.model_rng, [40]);

    // Corrupt one byte of step 40's weights, truncate step 30's state, break step 20's JSON.
    let model = dir
        .join(checkpoint::dir_name(40))
        .join(checkpoint::MODEL_FILE);
    let mut bytes = std::fs::read(&model).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&model, bytes).unwrap();
    let state = dir
        .join(checkpoint::dir_name(30))
        .join(checkpoint::STATE_FILE);
    let len = std::fs::metadata(&state).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&state)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let meta = dir
        .join(checkpoint::dir_name(20))
        .join(checkpoint::META_FILE);
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, text.replace("\"step\": 20", "\"step\": 21")).unwrap();

    let (good, skipped) = checkpoint::latest_good(&dir).unwrap();
    assert_eq!(good.meta.step, 10);
    let reasons: Vec<String> = skipped.iter().map(|(_, why)| why.clone()).collect();
    assert_eq!(reasons.len(), 3);
    assert!(
        reasons[0].contains("model.safetensors") && reasons[0].contains("checksum"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].contains("state.safetensors") && reasons[1].contains("truncated"),
        "{reasons:?}"
    );
    assert!(
        reasons[2].contains("checkpoint.json") && reasons[2].contains("corrupted"),
        "{reasons:?}"
    );
    // Pointing --resume at the damaged newest one falls back too, and says why.
    let (via_path, skipped) = checkpoint::resolve(&dir.join(checkpoint::dir_name(40))).unwrap();
    assert_eq!(via_path.meta.step, 10);
    assert!(skipped[0].0.ends_with(checkpoint::dir_name(40)));
    // Nothing good at all: an error naming the directory and each reason.
    std::fs::remove_dir_all(dir.join(checkpoint::dir_name(10))).unwrap();
    let err = checkpoint::latest_good(&dir).unwrap_err().to_string();
    assert!(
        err.contains("all 3 are damaged") && err.contains("checksum"),
        "{err}"
    );
    for step in [20, 30, 40] {
        assert!(err.contains(&checkpoint::dir_name(step)), "{err}");
    }
    assert_eq!(checkpoint::list(&dir).unwrap().len(), 3, "nothing moved");
}

#[test]
fn a_write_that_dies_midway_leaves_the_previous_checkpoint_loadable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    small_checkpoint(&dir, 5);
    // A tensor kiln cannot store fails the write after the weights file was written.
    let bad = Tensor::zeros([2], (Kind::ComplexFloat, tch::Device::Cpu));
    let mut meta = checkpoint::load(&dir.join(checkpoint::dir_name(5)))
        .unwrap()
        .meta;
    meta.step = 6;
    let err = checkpoint::save(
        &dir,
        Contents {
            model: &[("ok".to_owned(), Tensor::from(1.0f32))],
            state: &[("bad".to_owned(), bad)],
            meta,
            script: None,
            program: None,
        },
    );
    let err = err.unwrap_err().to_string();
    assert!(err.contains("bad"), "{err}");
    // The failed write removed its temporary directory, and made no new step directory (a
    // process killed midway leaves its `.tmp-…`, which a resume clears: crates/cli/tests/resume.rs).
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [checkpoint::dir_name(5)]);
    assert_eq!(checkpoint::list(&dir).unwrap().len(), 1);
    assert_eq!(checkpoint::latest_good(&dir).unwrap().0.meta.step, 5);
    // Same step again is refused rather than overwritten.
    let again = checkpoint::save(
        &dir,
        Contents {
            model: &[],
            state: &[],
            meta: checkpoint::load(&dir.join(checkpoint::dir_name(5)))
                .unwrap()
                .meta,
            script: None,
            program: None,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(again.contains("does not overwrite"), "{again}");
}

/// The steps of the checkpoints `checkpoint::list` finds in `dir`.
fn steps(dir: &Path) -> Vec<u64> {
    checkpoint::list(dir).unwrap().iter().map(|c| c.0).collect()
}

/// Small checkpoints of steps 1 to 5 in `dir`; step 2 is the best by validation accuracy.
fn five_with_step_2_best(dir: &Path) {
    for step in [1, 2, 3, 4, 5] {
        let mut meta = small_meta(step);
        meta.val_accuracy = Some(if step == 2 { 0.99 } else { 0.5 });
        save_small(dir, meta);
    }
}

#[test]
fn pruning_keeps_the_last_k_and_the_best() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    five_with_step_2_best(&dir);
    let pruned = checkpoint::prune(&dir, &Retention::new(2, KeepBest::TaskDefault)).unwrap();
    assert_eq!(pruned.removed.len(), 2);
    assert!(pruned.moved.is_empty());
    assert_eq!(steps(&dir), [2, 4, 5]);
    checkpoint::prune(&dir, &Retention::new(1, KeepBest::Off)).unwrap();
    assert_eq!(steps(&dir), [5]);
}

#[test]
#[ignore = "needs Python with torch and safetensors (KILN_PYTHON); `cargo xtask test` runs it"]
fn weights_are_readable_from_python_safetensors_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = small_checkpoint(&tmp.path().join("checkpoints"), 3);
    let python = common::python_with_torch();
    let script = "import sys, json\n\
        from safetensors import safe_open\n\
        with safe_open(sys.argv[1], framework='numpy' if False else 'pt') as f:\n\
        \x20   w = f.get_tensor('fc.weight')\n\
        \x20   print(json.dumps({'shape': list(w.shape), 'values': w.flatten().tolist()}))\n";
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .arg(ckpt.join(checkpoint::MODEL_FILE))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["shape"], serde_json::json!([2, 3]));
    assert_eq!(
        v["values"],
        serde_json::json!([0.0, 3.0, 6.0, 9.0, 12.0, 15.0])
    );
}

#[test]
fn pruning_moves_damaged_checkpoints_aside_and_counts_only_good_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    five_with_step_2_best(&dir);
    // Step 2 (the best by its record) gets a flipped bit in checkpoint.json; step 4's weights are
    // cut short.
    flip_middle_byte(
        &dir.join(checkpoint::dir_name(2))
            .join(checkpoint::META_FILE),
    );
    truncate_to_half(
        &dir.join(checkpoint::dir_name(4))
            .join(checkpoint::MODEL_FILE),
    );
    let damaged_meta = std::fs::read(
        dir.join(checkpoint::dir_name(2))
            .join(checkpoint::META_FILE),
    )
    .unwrap();

    let pruned = checkpoint::prune(&dir, &Retention::new(2, KeepBest::TaskDefault)).unwrap();
    let moved: Vec<&Path> = pruned.moved.iter().map(|m| m.from.as_path()).collect();
    assert_eq!(
        moved,
        [
            dir.join(checkpoint::dir_name(2)),
            dir.join(checkpoint::dir_name(4))
        ]
    );
    assert!(
        pruned.moved[1].why.contains("truncated"),
        "{:?}",
        pruned.moved
    );
    // Of the good ones (1, 3, 5) the last two stay; the best among them is one of those.
    assert_eq!(steps(&dir), [3, 5]);
    assert_eq!(pruned.removed, [dir.join(checkpoint::dir_name(1))]);
    let aside = entries_starting(&dir, &format!("{}.damaged-", checkpoint::dir_name(2)));
    assert_eq!(
        std::fs::read(aside[0].join(checkpoint::META_FILE)).unwrap(),
        damaged_meta
    );
    assert!(aside[0].join(checkpoint::MOVED_NOTE).is_file());
    // A second prune finds nothing more to move, and never counts the moved-aside ones.
    let again = checkpoint::prune(&dir, &Retention::new(1, KeepBest::Off)).unwrap();
    assert!(again.moved.is_empty());
    assert_eq!(again.removed, [dir.join(checkpoint::dir_name(3))]);
    assert_eq!(entries_starting(&dir, "step-").len(), 3);
}

#[test]
fn a_newer_format_stops_the_search_instead_of_being_passed_over() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    for step in [10, 20] {
        small_checkpoint(&dir, step);
    }
    let meta = dir
        .join(checkpoint::dir_name(20))
        .join(checkpoint::META_FILE);
    let text = std::fs::read_to_string(&meta).unwrap();
    let (ours, newer) = (checkpoint::VERSION, checkpoint::VERSION + 1);
    let newer_text = text.replace(
        &format!("\"version\": {ours},"),
        &format!("\"version\": {newer},"),
    );
    assert_ne!(newer_text, text);
    std::fs::write(&meta, newer_text).unwrap();
    let err = checkpoint::latest_good(&dir).unwrap_err();
    let named = format!("version {newer}");
    assert!(
        !matches!(err, TrainError::DamagedCheckpoint { .. }) && err.to_string().contains(&named),
        "{err}"
    );
    let err = checkpoint::prune(&dir, &Retention::new(1, KeepBest::Off)).unwrap_err();
    assert!(err.to_string().contains(&named), "{err}");
    assert_eq!(checkpoint::list(&dir).unwrap().len(), 2, "nothing moved");
}

/// Writes `meta` as the `checkpoint.json` of the checkpoint in `dir`, edited as `edit` says
/// and resealed (its checksum recomputed, as anyone can).
fn reseal(dir: &Path, meta: &checkpoint::Meta, edit: impl FnOnce(&mut checkpoint::Meta)) {
    let mut meta = meta.clone();
    edit(&mut meta);
    meta.meta_sha256 = meta.digest().unwrap();
    let json = serde_json::to_string_pretty(&meta).unwrap();
    std::fs::write(dir.join(checkpoint::META_FILE), json).unwrap();
}

#[test]
fn a_checkpoint_naming_files_outside_its_directory_or_devices_is_damaged_not_read() {
    // kiln-fuzz's checkpoint-json target: a checkpoint.json listing "/dev/zero" made the quick
    // check read /dev/zero until the allocator gave up (`dir.join` of an absolute path is
    // that path).
    let tmp = tempfile::tempdir().unwrap();
    let dir = small_checkpoint(tmp.path(), 10);
    let meta = checkpoint::read_meta(&dir).unwrap();
    for name in ["/dev/zero", "../checkpoint.json", "sub/model.pt", ".."] {
        reseal(&dir, &meta, |m| {
            m.files = [(name.to_owned(), "00".repeat(32))].into();
        });
        let err = checkpoint::check_quick(&dir).unwrap_err();
        assert!(
            matches!(err, TrainError::DamagedCheckpoint { .. })
                && err
                    .to_string()
                    .contains(&format!("lists the file {name:?}")),
            "{name}: {err}"
        );
    }
    // A file of its own that links to a device is damage too.
    reseal(&dir, &meta, |m| {
        m.files = [("model.pt".to_owned(), "00".repeat(32))].into();
        m.file_bytes = Default::default();
    });
    std::os::unix::fs::symlink("/dev/zero", dir.join("model.pt")).unwrap();
    let err = checkpoint::check_quick(&dir).unwrap_err();
    assert!(
        matches!(err, TrainError::DamagedCheckpoint { .. })
            && err.to_string().contains("not a regular file"),
        "{err}"
    );
}

/// A checkpoint written in the background holds the tensors as they were when it began (a
/// snapshot: training goes on changing them at once), and what runs after it (pruning) sees it
/// complete.
#[test]
fn a_background_write_keeps_its_snapshot_and_runs_its_sequel_once_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    let w = Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).view([2, 3]);
    let sequel_saw = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&sequel_saw);
    let writing = checkpoint::save_in_background(
        &dir,
        Contents {
            model: &[("fc.weight".to_owned(), w.shallow_clone())],
            state: &[],
            meta: small_meta(7),
            script: None,
            program: None,
        },
        move |checkpoints| {
            let found = checkpoint::latest_good(checkpoints).map(|(c, _)| c.meta.step);
            *seen.lock().unwrap() = Some(found.map_err(|e| e.to_string()));
            Ok(())
        },
    )
    .unwrap();
    let _ = w.shallow_clone().f_mul_scalar_(100.0).unwrap();
    assert_eq!(writing.dir(), dir.join(checkpoint::dir_name(7)));
    let written = writing.wait().unwrap();
    assert_eq!(*sequel_saw.lock().unwrap(), Some(Ok(7)));
    let saved = checkpoint::load(&written).unwrap();
    let weight = &saved
        .model
        .iter()
        .find(|(n, _)| n == "fc.weight")
        .unwrap()
        .1;
    let expected = Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).view([2, 3]);
    assert!(weight.equal(&expected), "{weight}");
}
