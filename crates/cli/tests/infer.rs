//! `kiln infer` as a user runs it: a model brought from PyTorch as TorchScript (exported by the
//! provisioned Python's torch) against PyTorch's own outputs, and a kiln checkpoint over a
//! prepared dataset, with the reports and the errors for bad input.

mod common;

use std::path::Path;
use std::process::Command;

use common::{kiln, python, read_tensor, stderr};

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The modules `export_torchscript.py` saves in a new directory, and its reference JSON.
fn exported() -> (tempfile::TempDir, serde_json::Value) {
    let tmp = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/export_torchscript.py");
    let python = python();
    let o = Command::new(&python)
        .arg(&script)
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "export failed: {}", stderr(&o));
    let reference =
        serde_json::from_slice(&std::fs::read(tmp.path().join("reference.json")).unwrap()).unwrap();
    (tmp, reference)
}

/// The reference's array `key` (its shape at `<key>_shape`).
fn array(reference: &serde_json::Value, key: &str) -> (Vec<usize>, Vec<f32>) {
    let list = |key: &str| -> Vec<f64> {
        reference[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    let shape = list(&format!("{key}_shape"))
        .iter()
        .map(|&d| d as usize)
        .collect();
    (shape, list(key).iter().map(|&v| v as f32).collect())
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON); `cargo xtask test` runs it"]
fn torchscript_models_from_pytorch_give_pytorchs_outputs_with_python_torch() {
    let (tmp, reference) = exported();
    let (x_shape, x) = array(&reference, "x");
    let (y_shape, y) = array(&reference, "y");
    let inputs = tmp.path().join("x.npy");
    std::fs::write(&inputs, kiln_data::npy_f32_bytes(&x_shape, &x).unwrap()).unwrap();

    for module in ["scripted.pt", "traced.pt"] {
        let model = tmp.path().join(module);
        let output = tmp.path().join(format!("{module}.safetensors"));
        let o = kiln(&[
            "infer",
            "--model",
            model.to_str().unwrap(),
            "--inputs",
            inputs.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
            "--precision",
            "fp32",
            "--batch-size",
            "16",
            "--device",
            "cpu",
        ]);
        let err = stderr(&o);
        assert!(o.status.success(), "{module}: {err}");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("50 samples in 4 batches of up to 16 (fp32"),
            "{text}"
        );
        let (shape, got) = read_tensor(&output, "outputs");
        assert_eq!(shape, y_shape);
        let diff = max_abs_diff(&got, &y);
        assert!(diff < 1e-5, "{module}: max |Δ| {diff} from PyTorch");
    }

    // Reduced precision: outputs close to fp32's, and the report says how close.
    let output = tmp.path().join("bf16.npy");
    let o = kiln(&[
        "infer",
        "--model",
        tmp.path().join("scripted.pt").to_str().unwrap(),
        "--inputs",
        inputs.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
        "--precision",
        "bf16",
        "--device",
        "cpu",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["precision"], "bf16");
    let dev = report["deviation_from_fp32"]["max_abs"].as_f64().unwrap();
    assert!(dev > 0.0 && dev < 0.25, "bf16 deviation {dev}");
    let bytes = std::fs::read(&output).unwrap();
    let array = kiln_data::NpyArray::parse(&bytes).unwrap();
    assert_eq!(array.shape, y_shape);
    assert!(max_abs_diff(&array.to_f32(), &y) <= dev as f32 + 1e-6);

    // The output is never overwritten; the error names it.
    let o = kiln(&[
        "infer",
        "--model",
        tmp.path().join("traced.pt").to_str().unwrap(),
        "--inputs",
        inputs.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("exists already"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&output).unwrap(), bytes);

    // Inputs of the wrong width: the model's own error, named.
    let wrong = tmp.path().join("wrong.npy");
    std::fs::write(
        &wrong,
        kiln_data::npy_f32_bytes(&[3, 7], &[0.5; 21]).unwrap(),
    )
    .unwrap();
    let o = kiln(&[
        "infer",
        "--model",
        tmp.path().join("scripted.pt").to_str().unwrap(),
        "--inputs",
        wrong.to_str().unwrap(),
        "--precision",
        "fp32",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("forward failed"), "{}", stderr(&o));
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON); `cargo xtask test` runs it"]
fn a_torchscript_conv_net_has_its_weights_laid_out_channels_last_when_asked() {
    let (tmp, reference) = exported();
    let (x_shape, x) = array(&reference, "conv_x");
    let (y_shape, y) = array(&reference, "conv_y");
    let inputs = tmp.path().join("conv_x.npy");
    std::fs::write(&inputs, kiln_data::npy_f32_bytes(&x_shape, &x).unwrap()).unwrap();
    for on in [true, false] {
        let output = tmp.path().join(format!("conv-{on}.npy"));
        let o = kiln(&[
            "infer",
            "--model",
            tmp.path().join("conv.pt").to_str().unwrap(),
            "--inputs",
            inputs.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
            "--precision",
            "fp32",
            "--device",
            "cpu",
            "--format",
            "json",
            "--set",
            &format!("performance.channels_last={on}"),
        ]);
        assert!(o.status.success(), "channels_last={on}: {}", stderr(&o));
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let model = report["model"].as_str().unwrap();
        assert_eq!(model.ends_with(", weights channels-last"), on, "{model}");
        let bytes = std::fs::read(&output).unwrap();
        let array = kiln_data::NpyArray::parse(&bytes).unwrap();
        assert_eq!(array.shape, y_shape);
        let diff = max_abs_diff(&array.to_f32(), &y);
        assert!(
            diff < 1e-5,
            "channels_last={on}: max |Δ| {diff} from PyTorch"
        );
    }
}

#[test]
fn checkpoints_infer_over_a_prepared_dataset_with_accuracy_and_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let mut text = String::from("x,y,label\n");
    for i in 0..300 {
        let x = ((i * 37) % 101) as f64 / 50.0 - 1.0;
        let y = ((i * 53) % 97) as f64 / 48.0 - 1.0;
        text.push_str(&format!("{x},{y},{}\n", i32::from(x + y > 0.0)));
    }
    let csv = tmp.path().join("points.csv");
    std::fs::write(&csv, &text).unwrap();
    let ds = tmp.path().join("points");
    let o = kiln(&[
        "data",
        "prepare",
        "--csv",
        csv.to_str().unwrap(),
        "--out",
        ds.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let runs = tmp.path().join("runs");
    let o = kiln(&[
        "train",
        "--model",
        "mlp",
        "--data",
        ds.to_str().unwrap(),
        "--epochs",
        "10",
        "--set",
        &format!("run.output_dir={}", runs.display()),
        "--set",
        "model.hidden=32",
        "--set",
        "train.lr=0.02",
        "--set",
        "train.warmup_steps=0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();

    let output = tmp.path().join("logits.csv");
    let o = kiln(&[
        "infer",
        "--model",
        run.to_str().unwrap(),
        "--inputs",
        ds.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
        "--batch-size",
        "64",
        "--format",
        "json",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    // The checkpoint's model settings are a configuration layer, shown as its source.
    assert!(err.contains("kiln mlp checkpoint"), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["samples"], 300);
    assert_eq!(report["batches"], 5);
    assert_eq!(report["output_shape"], serde_json::json!([2]));
    let accuracy = report["accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.9, "accuracy {accuracy}");
    let csv_out = std::fs::read_to_string(&output).unwrap();
    assert_eq!(csv_out.lines().next(), Some("output_0,output_1"));
    assert_eq!(csv_out.lines().count(), 301);

    // Plain CSV inputs (a label column is kept out of the features) give the same outputs.
    let again = tmp.path().join("again.csv");
    let o = kiln(&[
        "infer",
        "--model",
        run.to_str().unwrap(),
        "--inputs",
        csv.to_str().unwrap(),
        "--output",
        again.to_str().unwrap(),
        "--batch-size",
        "64",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&again).unwrap(), csv_out);

    // Settings that contradict the checkpoint are caught by name.
    let o = kiln(&[
        "infer",
        "--model",
        run.to_str().unwrap(),
        "--inputs",
        csv.to_str().unwrap(),
        "--set",
        "model.hidden=16",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("tensor `fc0.bias` is [16] in the model, [32] in the checkpoint")
            && err.contains("were model settings changed"),
        "{err}"
    );
    // An unknown output format, before any work.
    let o = kiln(&[
        "infer",
        "--model",
        run.to_str().unwrap(),
        "--inputs",
        csv.to_str().unwrap(),
        "--output",
        tmp.path().join("out.txt").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(".npy, .safetensors or .csv"),
        "{}",
        stderr(&o)
    );
}
