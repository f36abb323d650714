//! The library examples run as tests, so `cargo test` (and `cargo xtask test`) trains them the
//! way a user runs them: `regression.rs` is compiled in here as a module and its `train` called.

#[allow(dead_code)] // its `main` is the example's, not the test's
#[path = "../regression.rs"]
mod regression;

#[test]
fn the_regression_example_learns_and_leaves_a_run_directory() {
    let out = tempfile::tempdir().unwrap();
    let outcome = regression::train(out.path().to_str().unwrap()).unwrap();
    assert!(outcome.run_dir.starts_with(out.path()));
    for file in ["config.json", "metrics.jsonl", "summary.json", "curves.png"] {
        assert!(outcome.run_dir.join(file).is_file(), "{file}");
    }
    let s = &outcome.summary;
    assert_eq!(s.task, "regression");
    assert!(s.final_val.get("mae").unwrap() < 0.2);
    // The example's own metric is reported beside the task's: in the summary, every record of
    // metrics.jsonl, and the checkpoints' validation values and best values.
    let within = s.final_val.get("within_0.1").unwrap();
    assert!((0.0..=1.0).contains(&within), "{within}");
    assert!(s.best_val.get("within_0.1").unwrap() >= within);
    let jsonl = std::fs::read_to_string(outcome.run_dir.join("metrics.jsonl")).unwrap();
    for line in jsonl.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let key = match v["kind"].as_str().unwrap() {
            "step" => "within_0.1",
            "epoch" => "val_within_0.1",
            _ => continue,
        };
        assert!(v[key].is_f64(), "{key} missing: {line}");
    }
    let ckpts = outcome.run_dir.join("checkpoints");
    let last = std::fs::read_dir(&ckpts)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .max()
        .unwrap();
    let meta = std::fs::read_to_string(last.join("checkpoint.json")).unwrap();
    let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
    assert!(meta["val_metrics"]["val_within_0.1"].is_f64(), "{meta}");
    assert!(meta["sums"]["best_val"]["within_0.1"].is_f64(), "{meta}");
}

#[allow(dead_code)] // its `main` is the example's, not the test's
#[path = "../own_model.rs"]
mod own_model;

/// A classifier exported as a user exports one: `torch.export.save(torch.export.export(
/// model.train(), (batch,), dynamic_shapes=…), path)`.
const EXPORT: &str = r#"
import sys, torch
from torch import nn
from torch.export import Dim
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 32), nn.GELU(), nn.Linear(32, 3)).train()
batch = torch.randn(8, 4)
torch.export.save(torch.export.export(model, (batch,), dynamic_shapes=({0: Dim("batch")},)), sys.argv[1])
"#;

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and a C++ compiler; `cargo xtask test` runs it"]
fn the_own_model_example_trains_an_exported_program_with_python_torch() {
    use kiln_train::prelude::{InMemory, TargetSpec, Targets};
    let out = tempfile::tempdir().unwrap();
    let program = out.path().join("model.pt2");
    let python = kiln_train::python::python();
    let status = std::process::Command::new(&python)
        .args(["-c", EXPORT])
        .arg(&program)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "{} could not export the program",
        python.display()
    );
    // Three classes decided by the features' signs: learnable in a few epochs.
    let (mut xs, mut ys) = (vec![], vec![]);
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..1024 {
        let mut v = [0f32; 4];
        for x in &mut v {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *x = (state >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0;
        }
        ys.push(i64::from(v[0] > 0.0) + i64::from(v[1] > 0.3));
        xs.extend(v);
    }
    let data =
        InMemory::with_targets(xs, vec![4], TargetSpec::label(3), Targets::Classes(ys)).unwrap();
    let runs = out.path().join("runs");
    let runs_text = runs.display().to_string();
    let sets = [
        ("train.epochs", "6"),
        ("train.lr", "0.01"),
        ("train.batch_size", "64"),
        ("train.amp", "fp32"),
        ("device.request", "cpu"),
        ("run.output_dir", runs_text.as_str()),
    ];
    let outcome = own_model::train(&program, data, &sets).unwrap();
    assert!(outcome.run_dir.starts_with(&runs));
    let accuracy = outcome.summary.final_val.get("accuracy").unwrap();
    assert!(
        accuracy > 0.8,
        "the program learned: val accuracy {accuracy}"
    );
    let checkpoints = outcome.run_dir.join("checkpoints");
    let newest = std::fs::read_dir(&checkpoints)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .max()
        .unwrap();
    assert!(
        newest.join("model.pt2").is_file(),
        "the checkpoint holds the program"
    );
}
