//! What the own-model and program tests share: the user's data written as .npy and prepared
//! by `kiln data prepare`, `kiln train` with full batches and fixed settings, and checkpoints.
#![allow(dead_code)] // not every test binary uses every helper

use std::path::{Path, PathBuf};
use std::process::Output;

use kiln_data::{DType, npy_f32_bytes, write_npy};
use serde_json::Value;

use super::{kiln, kiln_with_env, stderr};

pub fn shape_of(t: &Value) -> Vec<usize> {
    t["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

pub fn values_of(t: &Value) -> Vec<f64> {
    t["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// Writes `x` (f32) and `y` (i64 classes, or f32 values) as .npy and runs `kiln data prepare`
/// into `dir/name`.
pub fn prepare(dir: &Path, name: &str, x: &Value, y: &Value, classes: bool) -> PathBuf {
    let xs: Vec<f32> = values_of(x).iter().map(|&v| v as f32).collect();
    let (fx, fy) = (
        dir.join(format!("{name}.x.npy")),
        dir.join(format!("{name}.y.npy")),
    );
    std::fs::write(&fx, npy_f32_bytes(&shape_of(x), &xs).unwrap()).unwrap();
    let ys = values_of(y);
    if classes {
        let bytes: Vec<u8> = ys.iter().flat_map(|&v| (v as i64).to_le_bytes()).collect();
        write_npy(&fy, DType::I64, &shape_of(y), &bytes).unwrap();
    } else {
        let ys: Vec<f32> = ys.iter().map(|&v| v as f32).collect();
        std::fs::write(&fy, npy_f32_bytes(&shape_of(y), &ys).unwrap()).unwrap();
    }
    let out = dir.join(name);
    let o = kiln(&[
        "data",
        "prepare",
        "--features",
        fx.to_str().unwrap(),
        "--targets",
        fy.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

/// `kiln train` on the CPU in fp32 over `data` with `extra` arguments, writing runs under
/// `runs`; full batches of `batch` samples, no validation split, constant lr 1e-2, weight
/// decay 0.01, no clipping, a log line and a checkpoint every step.
pub fn train(model: &Path, data: &Path, runs: &Path, batch: usize, extra: &[&str]) -> Output {
    let mut args = vec!["--set".to_owned(), format!("train.batch_size={batch}")];
    args.extend(extra.iter().map(|s| s.to_string()));
    kiln_with_env(&train_args(model, data, runs, &args), &[])
}

/// The arguments of [`train`], its fixed settings then `extra` (the batch size among them).
pub fn train_args<S: AsRef<str>>(
    model: &Path,
    data: &Path,
    runs: &Path,
    extra: &[S],
) -> Vec<String> {
    let sets = [
        "data.val_fraction=0".to_owned(),
        "data.num_workers=0".to_owned(),
        "train.amp=none".to_owned(),
        "train.lr=0.01".to_owned(),
        "train.weight_decay=0.01".to_owned(),
        "train.schedule=constant".to_owned(),
        "train.warmup_steps=0".to_owned(),
        "train.clip_grad_norm=0".to_owned(),
        "train.log_interval=1".to_owned(),
        "checkpoint.every_steps=1".to_owned(),
        "checkpoint.keep_last=100".to_owned(),
        format!("run.output_dir={}", runs.display()),
    ];
    let mut args: Vec<String> = ["train", "--model"].map(String::from).to_vec();
    args.push(model.display().to_string());
    args.extend(["--data".to_owned(), data.display().to_string()]);
    args.extend(["--device", "cpu"].map(String::from));
    for s in &sets {
        args.extend(["--set".to_owned(), s.clone()]);
    }
    args.extend(extra.iter().map(|s| s.as_ref().to_owned()));
    args
}

pub fn checkpoint(run: &Path, step: u64) -> PathBuf {
    run.join(format!("checkpoints/step-{step:09}"))
}

/// The largest difference between the `.npy` outputs at `out` (kiln's) and `expected` (a JSON
/// tensor, PyTorch's), whose shapes must be equal.
pub fn max_abs_diff(out: &Path, expected: &Value) -> f64 {
    let bytes = std::fs::read(out).unwrap();
    let ours = kiln_data::NpyArray::parse(&bytes).unwrap();
    assert_eq!(ours.shape, shape_of(expected));
    ours.to_f32()
        .iter()
        .zip(values_of(expected))
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max)
}

/// A JSON list of numbers.
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// kiln's per-step losses against PyTorch's (`theirs`, a JSON list of as many), each within
/// `rel` of PyTorch's (relative).
pub fn assert_same_losses(ours: &[f64], theirs: &Value, rel: f64) {
    let theirs = floats(theirs);
    assert_eq!(ours.len(), theirs.len(), "{ours:?}");
    for (step, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert!(
            (a - b).abs() <= rel * b.abs(),
            "step {}: kiln {a} vs PyTorch {b}",
            step + 1
        );
    }
}

/// What `tests/python/<script> make` writes (the user's models, saved as a user saves them,
/// and PyTorch's reference values), made once for every test that reads them: in the test
/// target's scratch directory, named by the script's text and the Python that runs it, and
/// published whole by a rename (a test process that made it first wins). The directory and
/// its `reference.json`; tests write nothing beside the files.
pub fn made_once(script: &str) -> (PathBuf, Value) {
    use std::hash::{Hash, Hasher};
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(&path).unwrap().hash(&mut hasher);
    super::python().hash(&mut hasher);
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = scratch.join(format!("{script}-{:016x}", hasher.finish()));
    if !dir.join("reference.json").is_file() {
        std::fs::create_dir_all(scratch).unwrap();
        let partial = tempfile::tempdir_in(scratch).unwrap();
        make_reference(script, partial.path());
        if std::fs::rename(partial.path(), &dir).is_ok() {
            let _ = partial.keep();
        }
    }
    let reference = std::fs::read(dir.join("reference.json")).unwrap();
    (dir, serde_json::from_slice(&reference).unwrap())
}

/// Runs `tests/python/<script> make DIR` (the user's models and PyTorch's reference values) and
/// returns the `reference.json` it writes.
pub fn make_reference(script: &str, dir: &Path) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let o = std::process::Command::new(super::python())
        .arg(&path)
        .arg("make")
        .arg(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{script} failed: {}", stderr(&o));
    serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap()
}
