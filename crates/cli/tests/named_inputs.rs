//! `kiln train` on a dataset of named arrays (f32 features, an int64 category, a bool mask) with
//! TorchScript modules that take them by name — a `Dict[str, Tensor]`, or one tensor per
//! argument (matched by the argument's name, or in `model.inputs`' order) — learning as PyTorch
//! eager does on the same arrays and initial weights, as does the module exported as a program
//! taking its arguments by name; and every mismatch between the arrays and what the module or
//! program takes, named before anything is written.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::own_data::{assert_same_losses, made_once, shape_of, train, values_of};
use common::{kiln, only_run, stderr, step_losses};
use kiln_data::{DType, write_npy};
use serde_json::Value;

/// The directory of the modules and programs `named_inputs.py` saves, made once for every test
/// here, and PyTorch's reference values.
fn made_models() -> (PathBuf, Value) {
    static MADE: OnceLock<(PathBuf, Value)> = OnceLock::new();
    MADE.get_or_init(|| made_once("named_inputs.py")).clone()
}

/// Writes the reference's arrays as .npy (x f32, cat i64, mask bool, y i64) and prepares them
/// as a dataset of named arrays in `dir/data`.
fn prepare_named(dir: &Path, data: &Value) -> PathBuf {
    let file = |name: &str, dtype: DType| {
        let t = &data[name];
        let bytes: Vec<u8> = values_of(t)
            .iter()
            .flat_map(|&v| match dtype {
                DType::F32 => (v as f32).to_le_bytes().to_vec(),
                DType::I64 => (v as i64).to_le_bytes().to_vec(),
                _ => vec![v as u8],
            })
            .collect();
        let path = dir.join(format!("{name}.npy"));
        write_npy(&path, dtype, &shape_of(t), &bytes).unwrap();
        format!("{name}={}", path.display())
    };
    let out = dir.join("data");
    let o = kiln(&[
        "data",
        "prepare",
        "--array",
        &file("x", DType::F32),
        "--array",
        &file("cat", DType::I64),
        "--array",
        &file("mask", DType::Bool),
        "--target",
        &file("y", DType::I64),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON); `cargo xtask test` runs it"]
fn modules_taking_named_inputs_learn_as_pytorch_eager_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let (made, reference) = made_models();
    let data = prepare_named(tmp.path(), &reference["data"]);
    let cases: [(&str, &str, &[&str]); 4] = [
        ("dict", "dict", &[]),
        ("args", "args", &[]),
        ("args", "args", &["--set", "model.inputs=x, cat"]),
        // x and the optional mask by name; cat goes unused.
        ("masked", "masked", &[]),
    ];
    for (k, (model, losses, extra)) in cases.into_iter().enumerate() {
        let runs = tmp.path().join(format!("runs-{k}"));
        let mut args = vec!["--epochs", "20"];
        args.extend(extra);
        let o = train(&made.join(format!("{model}.pt")), &data, &runs, 64, &args);
        assert!(o.status.success(), "{model} {extra:?}: {}", stderr(&o));
        if model == "dict" {
            let err = stderr(&o);
            assert!(err.contains("feed: cpu: arrays read by name"), "{err}");
        }
        if model == "masked" {
            assert!(
                stderr(&o).contains("the dataset's cat go unused"),
                "{}",
                stderr(&o)
            );
        }
        let ours = step_losses(&only_run(&runs));
        assert_same_losses(&ours, &reference[losses], 1e-4);
        assert!(ours[19] < 0.7 * ours[0], "{model} learned: {ours:?}");
    }
    // The same module exported as a program: x and cat by its arguments' names, through the
    // compiled step; an argument named after no array is named before anything compiles.
    let runs = tmp.path().join("runs-program");
    let o = train(
        &made.join("args.pt2"),
        &data,
        &runs,
        64,
        &["--epochs", "20"],
    );
    assert!(o.status.success(), "args.pt2: {}", stderr(&o));
    assert_same_losses(&step_losses(&only_run(&runs)), &reference["args"], 1e-4);
    let runs = tmp.path().join("runs-renamed");
    let o = train(
        &made.join("renamed.pt2"),
        &data,
        &runs,
        64,
        &["--epochs", "1"],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("no dataset array is named category"), "{err}");
    assert!(!runs.exists(), "nothing is written: {err}");
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON); `cargo xtask test` runs it"]
fn what_a_module_takes_and_the_arrays_differ_named_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let (made, reference) = made_models();
    let data = prepare_named(tmp.path(), &reference["data"]);
    let runs = tmp.path().join("runs");
    let cases: [(&str, &[&str], &[&str]); 4] = [
        (
            "args",
            &["--set", "model.inputs=x,category"],
            &[
                "no dataset array is named category",
                "(x, cat)",
                "(x, cat, mask)",
            ],
        ),
        (
            "args",
            &["--set", "model.inputs=x"],
            &["model.inputs gives 1 arrays for 2 to 2 arguments"],
        ),
        (
            "dict",
            &["--set", "model.inputs=x,cat"],
            &["model.inputs", "Dict[str, Tensor]"],
        ),
        ("one", &[], &["no dataset array is named features"]),
    ];
    for (model, extra, wants) in cases {
        let path = made.join(format!("{model}.pt"));
        let mut args = vec!["--epochs", "1"];
        args.extend(extra);
        let o = train(&path, &data, &runs, 64, &args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{model} {extra:?}: {err}");
        for want in wants {
            assert!(err.contains(want), "{want}: {err}");
        }
        assert!(!runs.exists(), "nothing is written: {err}");
    }
}
