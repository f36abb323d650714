//! `train.ema`: the average of the weights is validated beside them every epoch, carried by
//! checkpoints (a resumed run continues it exactly), and its weights can stand in for the
//! model's (`infer.ema`).

use std::path::{Path, PathBuf};

mod common;

use kiln_config::load;
use kiln_train::checkpoint;
use kiln_train::run::Resume;
use serde_json::Value;

fn plan(out: &Path, extra: &[&str]) -> kiln_config::RunPlan {
    let base = [
        "model.name=mlp",
        "data.synthetic_samples=640",
        "data.num_workers=0",
        "train.batch_size=32",
        "train.epochs=2",
        "train.ema.decay=0.95",
        "checkpoint.keep_last=5",
    ];
    load(&common::run_request(out, &base, extra)).unwrap().plan
}

fn run(plan: &kiln_config::RunPlan, resume: Option<Resume>) -> PathBuf {
    common::train_quietly(plan, resume).run_dir
}

fn epochs(run: &Path) -> Vec<Value> {
    common::records(run, "epoch")
}

#[test]
fn the_average_is_validated_checkpointed_and_resumed_exactly() {
    let whole = tempfile::tempdir().unwrap();
    let dir = run(&plan(whole.path(), &[]), None);
    let records = epochs(&dir);
    let last = records.last().unwrap();
    let (raw, avg) = (&last["val_loss"], &last["val_ema_loss"]);
    assert!(raw.is_f64() && avg.is_f64() && raw != avg, "{last}");
    assert!(last["val_ema_accuracy"].is_f64(), "{last}");
    // The checkpoint at the end carries the average, one update per step.
    let newest = checkpoint::list(&dir.join("checkpoints")).unwrap();
    let (steps, path) = newest.last().unwrap().clone();
    let ckpt = checkpoint::load(&path).unwrap();
    let updates = ckpt.state.iter().find(|(n, _)| n == "ema.updates").unwrap();
    assert_eq!(updates.1.int64_value(&[0]) as u64, steps);
    // Its weights stand in for the model's, and differ from them.
    let model: Vec<_> = ckpt.model.iter().map(|(_, t)| t.shallow_clone()).collect();
    let averaged = ckpt.with_ema_weights().unwrap().model;
    assert_eq!(model.len(), averaged.len());
    assert!(model.iter().zip(&averaged).any(|(a, b)| *a != b.1));

    // Stopped at step 25 by a limit and resumed to the end: the last validation of both the
    // weights and their average equals the uninterrupted run's.
    let split = tempfile::tempdir().unwrap();
    let dir = run(&plan(split.path(), &["train.max_steps=25"]), None);
    run(&plan(split.path(), &[]), Some(Resume::Latest));
    let resumed = epochs(&dir);
    let end = resumed.last().unwrap();
    for key in [
        "val_loss",
        "val_accuracy",
        "val_ema_loss",
        "val_ema_accuracy",
    ] {
        assert_eq!(end[key], last[key], "{key}");
    }
}

#[test]
fn a_checkpoint_without_an_average_is_named_when_one_is_asked_for() {
    let out = tempfile::tempdir().unwrap();
    let dir = run(&plan(out.path(), &["train.ema.decay=0"]), None);
    let newest = checkpoint::list(&dir.join("checkpoints")).unwrap();
    let ckpt = checkpoint::load(&newest.last().unwrap().1).unwrap();
    assert!(ckpt.state.iter().all(|(n, _)| !n.starts_with("ema.")));
    assert!(epochs(&dir)[0].get("val_ema_loss").is_none());
    let err = ckpt.with_ema_weights().unwrap_err().to_string();
    assert!(
        err.contains("infer.ema") && err.contains("train.ema.decay > 0"),
        "{err}"
    );
}
