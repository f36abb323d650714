//! `kiln train` on the user's own model and data, as a user runs it: PyTorch models written and
//! scripted by the provisioned torch (a classifier, a segmenter, a forecaster with its own
//! quantile loss) trained against PyTorch eager's losses, resumed bit-exactly and served; a
//! CSV regression with a built-in model; and the errors for what kiln cannot train.

mod common;

use std::path::Path;
use std::process::Command;

use common::own_data::{
    assert_same_losses, checkpoint, make_reference, max_abs_diff, prepare, shape_of, train,
    values_of,
};
use common::{kiln, only_run, python, stderr, step_losses};
use kiln_data::npy_f32_bytes;
use serde_json::Value;

/// The models `own_models.py` writes into `dir`, and PyTorch's reference values.
fn make_models(dir: &Path) -> Value {
    make_reference("own_models.py", dir)
}

fn summary(run: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap()
}

/// `kiln infer` on the CPU in fp32: `model` over `inputs` into `output`; its JSON report.
fn infer_json(model: &Path, inputs: &Path, output: &Path) -> Value {
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
        "--device",
        "cpu",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON); `cargo xtask test` runs it"]
fn a_scripted_model_trains_as_pytorch_eager_resumes_exactly_and_serves_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = make_models(tmp.path());
    let case = &reference["classify"];
    let data = prepare(tmp.path(), "classify", &case["x"], &case["y"], true);
    let runs = tmp.path().join("runs");
    let model = tmp.path().join("mlp.pt");
    let o = train(&model, &data, &runs, 64, &["--epochs", "20"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = only_run(&runs);

    // Same weights, same batches, same fused AdamW: PyTorch eager's losses, step by step.
    let ours = step_losses(&run);
    assert_eq!(ours.len(), 20);
    assert_same_losses(&ours, &case["losses"], 1e-4);
    assert!(ours[19] < 0.5 * ours[0], "it learned: {ours:?}");
    let s = summary(&run);
    assert_eq!(
        (s["task"].as_str(), s["loss"].as_str()),
        (Some("classification"), Some("cross_entropy"))
    );

    // Resume from step 10: the same step-20 weights, bit for bit.
    let final_weights = std::fs::read(checkpoint(&run, 20).join("model.safetensors")).unwrap();
    let ckpt10 = checkpoint(&run, 10);
    let o = train(
        &model,
        &data,
        &runs,
        64,
        &["--epochs", "20", "--resume", ckpt10.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let resumed = std::fs::read(checkpoint(&run, 20).join("model.safetensors")).unwrap();
    assert!(resumed == final_weights, "resumed weights differ");
    assert_eq!(
        step_losses(&run),
        ours,
        "the resumed run logs what the first one did"
    );

    // The TorchScript in the checkpoint: PyTorch's outputs equal `kiln infer`'s.
    let ckpt = checkpoint(&run, 20);
    let inputs = tmp.path().join("x.npy");
    let xs: Vec<f32> = values_of(&case["x"]).iter().map(|&v| v as f32).collect();
    std::fs::write(&inputs, npy_f32_bytes(&shape_of(&case["x"]), &xs).unwrap()).unwrap();
    let x_json = tmp.path().join("x.json");
    std::fs::write(&x_json, case["x"].to_string()).unwrap();
    let y_json = tmp.path().join("y.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/own_models.py");
    let p = Command::new(python())
        .arg(&script)
        .args([
            "run".as_ref(),
            ckpt.join("model.pt").as_os_str(),
            x_json.as_os_str(),
            y_json.as_os_str(),
        ])
        .output()
        .unwrap();
    assert!(p.status.success(), "{}", stderr(&p));
    let py: Value = serde_json::from_slice(&std::fs::read(&y_json).unwrap()).unwrap();
    let out = tmp.path().join("out.npy");
    infer_json(&ckpt, &inputs, &out);
    let diff = max_abs_diff(&out, &py);
    assert!(
        diff < 1e-5,
        "kiln infer vs PyTorch on kiln's TorchScript: max |Δ| {diff}"
    );
}

#[test]
#[ignore = "needs Python with torch 2.11 and the ONNX export packages (KILN_PYTHON, \
            KILN_ONNX_PYTHONPATH); `cargo xtask test` runs it"]
fn a_segmenter_and_a_forecaster_with_its_own_loss_learn_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = make_models(tmp.path());

    // Segmentation: a class per pixel, per-pixel accuracy well above chance (one half).
    let seg = &reference["segment"];
    let data = prepare(tmp.path(), "segment", &seg["x"], &seg["y"], true);
    let runs = tmp.path().join("seg-runs");
    let seg_args = ["--epochs", "12", "--set", "data.val_fraction=0.25"];
    let o = train(&tmp.path().join("seg.pt"), &data, &runs, 16, &seg_args);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = only_run(&runs);
    let s = summary(&run);
    assert_eq!(s["task"], "dense classification");
    let acc = s["final_val_accuracy"].as_f64().unwrap();
    assert!(acc > 0.85, "per-pixel validation accuracy {acc}");
    // `kiln infer` on the run (its TorchScript checkpoint) reports per-pixel accuracy too.
    let infer = |out: &Path| {
        let report = infer_json(&run, &data, out);
        (
            report["accuracy"].as_f64().unwrap(),
            std::fs::read(out).unwrap(),
        )
    };
    let (infer_acc, outputs) = infer(&tmp.path().join("seg-first.npy"));
    assert!(
        infer_acc > 0.85,
        "kiln infer per-pixel accuracy {infer_acc}"
    );
    // Resumed from an end-of-epoch checkpoint (taken after validation put the module in eval
    // mode): the same weights, and the same batch-norm statistics in the saved module.
    let last = std::fs::read(checkpoint(&run, 48).join("model.safetensors")).unwrap();
    let ckpt = checkpoint(&run, 24);
    let mut resumed_args = seg_args.to_vec();
    resumed_args.extend(["--resume", ckpt.to_str().unwrap()]);
    let o = train(&tmp.path().join("seg.pt"), &data, &runs, 16, &resumed_args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("eval mode"), "{}", stderr(&o));
    let again = std::fs::read(checkpoint(&run, 48).join("model.safetensors")).unwrap();
    assert!(again == last, "the resumed segmenter's weights differ");
    let (_, resumed_outputs) = infer(&tmp.path().join("seg-resumed.npy"));
    assert!(
        resumed_outputs == outputs,
        "the resumed segmenter's outputs differ"
    );
    onnx_runs_as_libtorch(tmp.path(), &run, &data);

    // A forecaster with its own pinball loss: kiln minimises the module's `loss`, whose value
    // on the initial weights is PyTorch's.
    let fc = &reference["forecast"];
    let data = prepare(tmp.path(), "forecast", &fc["x"], &fc["y"], false);
    let runs = tmp.path().join("fc-runs");
    let o = train(
        &tmp.path().join("forecaster.pt"),
        &data,
        &runs,
        128,
        &["--epochs", "60", "--loss", "module"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let run = only_run(&runs);
    let losses = step_losses(&run);
    let initial = fc["initial_loss"].as_f64().unwrap();
    assert!(
        (losses[0] - initial).abs() <= 1e-4 * initial,
        "{} vs {initial}",
        losses[0]
    );
    assert!(losses[59] < losses[0] / 3.0, "{losses:?}");
    let s = summary(&run);
    assert_eq!(
        (s["task"].as_str(), s["loss"].as_str()),
        (Some("regression"), Some("module"))
    );
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON); `cargo xtask test` runs it"]
fn what_kiln_cannot_train_is_named_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = make_models(tmp.path());
    let classify = &reference["classify"];
    let classes = prepare(tmp.path(), "classify", &classify["x"], &classify["y"], true);
    let fc = &reference["forecast"];
    let values = prepare(tmp.path(), "forecast", &fc["x"], &fc["y"], false);
    let runs = tmp.path().join("runs");
    let mlp = tmp.path().join("mlp.pt");
    let fail = |model: &Path, data: &Path, extra: &[&str], expected: &[&str]| {
        let o = train(model, data, &runs, 16, extra);
        let err = stderr(&o);
        assert!(!o.status.success(), "{extra:?} should fail: {err}");
        assert!(!err.contains("panicked"), "{err}");
        for e in expected {
            assert!(err.contains(e), "{extra:?}: `{e}` not in: {err}");
        }
    };

    // A module saved in eval mode trains (in train mode), with a warning that says so; the
    // automatic batch size searches with TorchScript trials.
    let auto = ["--epochs", "1", "--set", "train.batch_size=auto"];
    let o = train(&tmp.path().join("mlp_eval.pt"), &classes, &runs, 16, &auto);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("saved in eval mode"), "{err}");
    assert!(err.contains("train.batch_size auto:"), "{err}");
    // A batch the forward rejects: the shape fed is named.
    fail(
        &mlp,
        &values,
        &["--epochs", "1"],
        &["mlp.pt", "forward on a batch of shape [16, 6]"],
    );
    // Losses that do not fit the targets or the model.
    let forecaster = tmp.path().join("forecaster.pt");
    fail(
        &forecaster,
        &values,
        &["--loss", "cross_entropy"],
        &["train.loss", "integer class targets"],
    );
    fail(
        &mlp,
        &classes,
        &["--loss", "module"],
        &["train.loss", "loss(output, target)"],
    );
    fail(
        &mlp,
        &classes,
        &["--loss", "mse"],
        &["train.loss", "use cross_entropy"],
    );
    // What kiln does only inside its own models.
    fail(
        &mlp,
        &classes,
        &["--set", "model.dropout=0.2"],
        &["model.dropout", "TorchScript"],
    );
    fail(
        &mlp,
        &classes,
        &["--set", "model.activation_checkpointing=true"],
        &["model.activation_checkpointing", "TorchScript"],
    );
}

/// The user's own model (a TorchScript checkpoint with batch norm, scripted in train mode)
/// exported to ONNX runs in ONNX Runtime as its checkpoint runs in libtorch: the same per-pixel
/// outputs within 1e-4 and the same accuracy.
fn onnx_runs_as_libtorch(dir: &Path, run: &Path, data: &Path) {
    let onnx = dir.join("own.onnx");
    let o = kiln(&[
        "export",
        "--model",
        run.to_str().unwrap(),
        "--out",
        onnx.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let torch = dir.join("own-torch.safetensors");
    let torch_report = infer_json(run, data, &torch);
    let ort = dir.join("own-ort.safetensors");
    let o = kiln(&[
        "infer",
        "--model",
        onnx.to_str().unwrap(),
        "--inputs",
        data.to_str().unwrap(),
        "--output",
        ort.to_str().unwrap(),
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--engine",
        "onnxruntime",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ort_report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let (torch_shape, torch_values) = common::read_tensor(&torch, "outputs");
    let (ort_shape, ort_values) = common::read_tensor(&ort, "outputs");
    assert_eq!(torch_shape, ort_shape);
    let gap = torch_values
        .iter()
        .zip(&ort_values)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(gap < 1e-4, "onnxruntime differs from libtorch by {gap}");
    assert_eq!(ort_report["accuracy"], torch_report["accuracy"]);
}

#[test]
fn a_file_that_is_not_torchscript_is_named_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("t.csv");
    let mut text = String::from("a,b,label\n");
    for i in 0..40 {
        text.push_str(&format!("{},{},{}\n", i % 7, i % 5, i % 2));
    }
    std::fs::write(&csv, text).unwrap();
    let data = tmp.path().join("ds");
    let o = kiln(&[
        "data",
        "prepare",
        "--csv",
        csv.to_str().unwrap(),
        "--out",
        data.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bogus = tmp.path().join("model.pt");
    std::fs::write(&bogus, b"not a zip archive").unwrap();
    let runs = tmp.path().join("runs");
    let o = train(&bogus, &data, &runs, 8, &["--epochs", "1"]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("model.pt") && err.contains("nor a TorchScript module"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let missing = tmp.path().join("missing.pt");
    let o = train(&missing, &data, &runs, 8, &["--epochs", "1"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("missing.pt") && stderr(&o).contains("no such file"),
        "{}",
        stderr(&o)
    );
    // No run directory was left behind for either.
    assert!(!runs.exists() || std::fs::read_dir(&runs).unwrap().next().is_none());
}

#[test]
fn a_csv_regression_is_learned_by_a_built_in_model() {
    // y = 1.5·a − 2·b + 0.5·c + noise: MSE falls from the target's variance to the noise's.
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("reg.csv");
    let mut text = String::from("a,b,c,y\n");
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut unit = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    for _ in 0..600 {
        let (a, b, c, noise) = (unit(), unit(), unit(), 0.1 * unit());
        text.push_str(&format!(
            "{a},{b},{c},{}\n",
            1.5 * a - 2.0 * b + 0.5 * c + noise
        ));
    }
    std::fs::write(&csv, text).unwrap();
    let data = tmp.path().join("reg");
    let o = kiln(&[
        "data",
        "prepare",
        "--csv",
        csv.to_str().unwrap(),
        "--target-columns",
        "y",
        "--out",
        data.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let runs = tmp.path().join("runs");
    let o = kiln(&[
        "train",
        "--model",
        "mlp",
        "--data",
        data.to_str().unwrap(),
        "--epochs",
        "8",
        "--device",
        "cpu",
        "--set",
        "train.amp=none",
        "--set",
        "train.batch_size=32",
        "--set",
        "train.log_interval=5",
        "--set",
        &format!("run.output_dir={}", runs.display()),
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("MAE") && err.contains("RMSE"), "{err}");
    let run = only_run(&runs);
    let first = step_losses(&run)[0];
    let s = summary(&run);
    assert_eq!(
        (s["task"].as_str(), s["loss"].as_str()),
        (Some("regression"), Some("mse"))
    );
    let val = s["final_val_loss"].as_f64().unwrap();
    assert!(val * 5.0 < first, "val MSE {val} vs first logged {first}");
    let rmse = s["final_val_rmse"].as_f64().unwrap();
    assert!(
        (rmse * rmse - val).abs() < 1e-3 * val.max(1e-3) + 1e-4,
        "RMSE² {rmse} vs MSE {val}"
    );
    assert!(s["final_val_accuracy"].is_null(), "{s}");

    // `kiln infer` over the dataset reports the regression's metrics, not an accuracy.
    let o = kiln(&[
        "infer",
        "--model",
        run.to_str().unwrap(),
        "--inputs",
        data.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    let text = common::stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let mae: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MAE: "))
        .and_then(|l| l.split(',').next())
        .unwrap_or_else(|| panic!("no MAE in: {text}"))
        .parse()
        .unwrap();
    assert!(
        mae > 0.0 && mae * mae < 2.0 * val,
        "MAE {mae} vs val MSE {val}"
    );
    assert!(!text.contains("accuracy"), "{text}");
}
