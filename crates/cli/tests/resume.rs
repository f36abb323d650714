//! Resume as a user meets it: `kiln train` killed with SIGKILL in the middle of a checkpoint
//! write, twice, then resumed, learns exactly what an uninterrupted run learns; a run whose
//! checkpoints are all damaged is refused with each one named, and nothing is moved.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;

use common::{kiln, kiln_with_env, only_run, stderr};
use serde_json::Value;

/// `kiln train` on an MLP wide enough that a checkpoint takes a while to write (1.1M parameters:
/// about 14 MB with the optimizer state), checkpointing every step.
fn train_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--model",
        "mlp",
        "--epochs",
        "2",
        "--precision",
        "fp32",
        "--run-name",
        "resume",
        "--workers",
        "1",
        "--batch-size",
        "16",
        "--set",
        "model.hidden=1024,1024",
        "--set",
        "data.synthetic_samples=320",
        "--set",
        "checkpoint.every_steps=1",
        "--set",
        "checkpoint.keep_last=2",
    ]
    .map(str::to_owned)
    .to_vec();
    args.push("--set".to_owned());
    args.push(format!("run.output_dir={}", out.display()));
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// The step and epoch records of a run: what it learned, step by step.
fn learning_curve(run: &Path) -> Vec<Value> {
    let keep = [
        "kind",
        "step",
        "epoch",
        "loss",
        "accuracy",
        "lr",
        "val_loss",
        "val_accuracy",
    ];
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["kind"] == "step" || v["kind"] == "epoch")
        .map(|v| {
            keep.iter()
                .map(|k| ((*k).to_owned(), v[*k].clone()))
                .collect()
        })
        .collect()
}

/// The names in `dir` that start with `prefix`.
fn names_starting(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Starts `kiln train` and kills it with SIGKILL as soon as a checkpoint write after step
/// `after` is under way: its temporary directory holds the weights file but not yet
/// `checkpoint.json`. Returns the run directory.
fn kill_during_a_checkpoint_write(out: &Path, extra: &[&str], after: u64) -> PathBuf {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(train_args(out, extra))
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RUST_LOG")
        .env_remove("KILN_DEVICE__REQUEST")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let target = format!(".tmp-step-{:09}", after + 1);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("kiln train ended ({status}) before a write after step {after} was seen");
        }
        let ckpts = std::fs::read_dir(out)
            .ok()
            .and_then(|mut d| d.next())
            .and_then(Result::ok)
            .map(|run| run.path().join("checkpoints"));
        let writing = ckpts.as_deref().is_some_and(|c| {
            names_starting(c, ".tmp-").iter().any(|n| {
                n.as_str() >= target.as_str()
                    && c.join(n).join("model.safetensors").exists()
                    && !c.join(n).join("checkpoint.json").exists()
            })
        });
        if writing {
            child.kill().unwrap();
            child.wait().unwrap();
            break;
        }
        std::thread::yield_now();
    }
    only_run(out)
}

/// The learning curve of the job run without interruption.
fn uninterrupted_curve() -> Vec<Value> {
    let reference = tempfile::tempdir().unwrap();
    let out = kiln(
        &train_args(reference.path(), &[])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    learning_curve(&only_run(reference.path()))
}

#[test]
fn killed_twice_during_checkpoint_writes_then_resumed_learns_what_an_uninterrupted_run_does() {
    let expected = uninterrupted_curve();

    let runs = tempfile::tempdir().unwrap();
    let run = kill_during_a_checkpoint_write(runs.path(), &[], 4);
    let ckpts = run.join("checkpoints");
    assert_eq!(
        names_starting(&ckpts, ".tmp-").len(),
        1,
        "the kill left a half-written checkpoint"
    );
    let run_again = kill_during_a_checkpoint_write(runs.path(), &["--resume"], 12);
    assert_eq!(run_again, run);
    assert_eq!(
        names_starting(&ckpts, ".tmp-").len(),
        1,
        "the first dead write was cleared on resume; the second left its own"
    );

    let out = kiln(
        &train_args(runs.path(), &["--resume"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("resumed from "), "{err}");
    assert_eq!(learning_curve(&run), expected);
    assert!(names_starting(&ckpts, ".tmp-").is_empty());
    assert!(names_starting(&ckpts, "step-").len() >= 2);
}

#[test]
fn resume_with_every_checkpoint_damaged_names_them_and_moves_nothing() {
    let runs = tempfile::tempdir().unwrap();
    let args = train_args(runs.path(), &["--set", "checkpoint.every_steps=5"]);
    let out = kiln(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ckpts = only_run(runs.path()).join("checkpoints");
    let mut names = names_starting(&ckpts, "step-");
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    for name in &names {
        let state = ckpts.join(name).join("state.safetensors");
        let len = std::fs::metadata(&state).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&state)
            .unwrap();
        f.set_len(len - 100).unwrap();
    }

    let mut resume = args.clone();
    resume.push("--resume".to_owned());
    let out = kiln(&resume.iter().map(String::as_str).collect::<Vec<_>>());
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("all 2 are damaged"), "{err}");
    for name in &names {
        assert!(
            err.contains(&format!("{name}/state.safetensors: checksum mismatch")),
            "{err}"
        );
    }
    let mut after = names_starting(&ckpts, "");
    after.sort();
    assert_eq!(after, names, "nothing was moved, removed or added");
}

/// A checkpoint of format version 1 (running sums as fixed fields, before metrics were named)
/// resumes. `tests/fixtures/v1-run` is a run the kiln of that format wrote (an fp32 MLP on
/// the CPU, checkpointing every 5 steps); it is resumed from step 10, in the middle of its
/// second epoch, and logs what that kiln logged uninterrupted: the open log interval's and the
/// epoch's sums and the best validation accuracy carry over from the old checkpoint. (Within
/// 1e-4: the fixture was written on another CPU.)
#[test]
fn a_version_1_checkpoint_resumes_and_logs_what_its_own_run_logged() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-run");
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("v1-20261126-145741");
    common::copy_tree(&fixture, &run);
    let ckpt = run.join("checkpoints/step-000000010");
    let out = kiln(&[
        "train",
        "--model",
        "mlp",
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--precision",
        "fp32",
        "--workers",
        "1",
        "--batch-size",
        "32",
        "--run-name",
        "v1",
        "--set",
        "model.hidden=8",
        "--set",
        "data.synthetic_samples=256",
        "--set",
        "checkpoint.every_steps=5",
        "--set",
        "checkpoint.keep_last=10",
        "--set",
        "train.log_interval=4",
        "--set",
        &format!("run.output_dir={}", tmp.path().display()),
        "--resume",
        ckpt.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let after_step_10 = |run: &Path| -> Vec<Value> {
        std::fs::read_to_string(run.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| match v["kind"].as_str() {
                Some("step") => v["step"].as_u64().is_some_and(|s| s > 10),
                Some("epoch") => v["epoch"] == 1,
                _ => false,
            })
            .collect()
    };
    let (theirs, ours) = (after_step_10(&fixture), after_step_10(&run));
    assert_eq!(theirs.len(), 3, "steps 12 and 14, then epoch 2: {theirs:?}");
    assert_eq!(ours.len(), theirs.len(), "{ours:?}");
    for (a, b) in theirs.iter().zip(&ours) {
        let keys = [
            "loss",
            "accuracy",
            "train_loss",
            "train_accuracy",
            "val_loss",
        ];
        for key in keys.into_iter().chain(["val_accuracy"]) {
            match (a[key].as_f64(), b[key].as_f64()) {
                (Some(x), Some(y)) => assert!(
                    (x - y).abs() <= 1e-4 * x.abs().max(1.0),
                    "{key}: {x} logged uninterrupted, {y} resumed\n{a}\n{b}"
                ),
                (x, y) => assert_eq!(x, y, "{key}\n{a}\n{b}"),
            }
        }
    }
    let summary = |dir: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
    };
    let (theirs, ours) = (summary(&fixture), summary(&run));
    for key in [
        "final_train_loss",
        "best_val_accuracy",
        "final_val_accuracy",
    ] {
        let (x, y) = (theirs[key].as_f64().unwrap(), ours[key].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 1e-4 * x.abs().max(1.0),
            "{key}: {x} vs {y}"
        );
    }
}

/// Runs `kiln train` with `KILN_FAULT=fault` and `extra` arguments under `out`.
fn train_with_fault(out: &Path, extra: &[&str], fault: &str) -> std::process::Output {
    kiln_with_env(&train_args(out, extra), &[("KILN_FAULT", fault)])
}

#[test]
fn fault_points_kill_kiln_where_they_say_and_the_run_resumes_exactly() {
    use std::os::unix::process::ExitStatusExt;
    let expected = uninterrupted_curve();

    let runs = tempfile::tempdir().unwrap();
    // The 7th tensor file written: the 4th checkpoint's weights, its state not yet.
    let out = train_with_fault(runs.path(), &[], "checkpoint-write:7");
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    assert!(stderr(&out).contains("KILN_FAULT: killing this process at checkpoint-write:7"));
    let ckpts = only_run(runs.path()).join("checkpoints");
    let staged = names_starting(&ckpts, ".tmp-step-000000004");
    assert_eq!(staged.len(), 1, "{:?}", names_starting(&ckpts, ""));
    assert!(ckpts.join(&staged[0]).join("model.safetensors").is_file());
    assert!(!ckpts.join(&staged[0]).join("state.safetensors").exists());
    // Resumed from step 3, killed in the middle of its 3rd step (step 6: gradients, no update).
    // Step 5's checkpoint is written in the background while step 6 runs: the kill finds it
    // complete, or still staged (then step 4's is the newest), never in place half-written.
    let out = train_with_fault(runs.path(), &["--resume"], "step:3");
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    let mut steps = names_starting(&ckpts, "step-");
    steps.sort();
    let newest = steps.last().unwrap().as_str();
    assert!(
        ["step-000000004", "step-000000005"].contains(&newest),
        "{steps:?}"
    );
    if newest == "step-000000004" {
        assert_eq!(names_starting(&ckpts, ".tmp-step-000000005").len(), 1);
    }

    let out = train_with_fault(runs.path(), &["--resume"], "");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(learning_curve(&only_run(runs.path())), expected);
}

#[test]
fn a_fault_kiln_does_not_know_is_an_error_naming_the_variable() {
    let runs = tempfile::tempdir().unwrap();
    let out = train_with_fault(runs.path(), &[], "optimizer:1");
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("KILN_FAULT") && err.contains("no fault point `optimizer`"),
        "{err}"
    );
}
