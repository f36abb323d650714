//! `kiln profile-model` as a user runs it: built-in models in both modes, a checkpoint from a
//! tiny `kiln train` run, the JSON report's fields checked against each other and against the
//! models' known sizes, and the errors for bad flags. Tiny models and few iterations; nothing
//! here asserts a time.

mod common;

use std::path::Path;

use common::{kiln, stderr, stdout};
use serde_json::Value;

/// Runs `kiln profile-model args… --device cpu --format json`; the report, after checking that
/// it succeeded.
fn profile_json(args: &[&str]) -> Value {
    let mut all = vec!["profile-model"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--device", "cpu", "--format", "json"]);
    let o = kiln(&all);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: not one JSON object ({e}): {}", stdout(&o)))
}

fn number(report: &Value, key: &str) -> f64 {
    report[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {report:#}"))
}

/// The fields every report has, consistent with each other and with what was asked.
fn check_report(report: &Value, batch: u64, iterations: u64, warmup: u64) {
    for key in [
        "model",
        "parameters",
        "device",
        "precision",
        "mode",
        "batch_size",
        "input_shape",
        "warmup",
        "iterations",
        "mean_ms",
        "p50_ms",
        "p95_ms",
        "min_ms",
        "max_ms",
        "samples_per_s",
        "peak_memory_bytes",
        "peak_memory_source",
    ] {
        assert!(report.get(key).is_some(), "no `{key}` in {report:#}");
    }
    assert_eq!(report["device"], "cpu");
    assert_eq!(report["batch_size"], batch);
    assert_eq!(report["iterations"], iterations);
    assert_eq!(report["warmup"], warmup);
    let [mean, p50, p95, min, max] =
        ["mean_ms", "p50_ms", "p95_ms", "min_ms", "max_ms"].map(|k| number(report, k));
    assert!(
        0.0 < min && min <= p50 && p50 <= p95 && p95 <= max,
        "{report:#}"
    );
    assert!(min <= mean && mean <= max, "{report:#}");
    let expected = batch as f64 * 1000.0 / mean;
    let got = number(report, "samples_per_s");
    assert!(
        (got - expected).abs() <= 1e-9 * expected,
        "samples/s {got}, batch × 1000 / mean = {expected}"
    );
    // On the CPU the peak is the process's resident high-water mark: libtorch alone is more
    // than 10 MiB of it.
    assert_eq!(report["peak_memory_source"], "process_rss_high_water_mark");
    assert!(number(report, "peak_memory_bytes") > 10.0 * 1024.0 * 1024.0);
}

#[test]
fn built_in_models_report_consistent_times_and_their_parameter_counts() {
    // MLP 64 → 32 → 10: 64·32 + 32 + 32·10 + 10 parameters.
    let r = profile_json(&[
        "--model",
        "mlp",
        "--set",
        "model.hidden=32",
        "--batch-size",
        "8",
        "--iterations",
        "7",
        "--warmup",
        "1",
        "--precision",
        "fp32",
    ]);
    check_report(&r, 8, 7, 1);
    assert_eq!(r["parameters"], 64 * 32 + 32 + 32 * 10 + 10);
    assert_eq!(r["mode"], "infer");
    assert_eq!(r["precision"], "fp32");
    assert_eq!(r["input_shape"], serde_json::json!([64]));
    assert!(r["model"].as_str().unwrap().starts_with("mlp"), "{r:#}");

    // Another input shape (flattened: 4·8 = 32 features), given space- or comma-separated,
    // and the configuration's batch size when --batch-size is not given.
    for shape in [&["4", "8"][..], &["4,8"][..]] {
        let mut args = vec![
            "--model",
            "mlp",
            "--set",
            "model.hidden=32",
            "--input-shape",
        ];
        args.extend_from_slice(shape);
        args.extend_from_slice(&[
            "--set",
            "infer.batch_size=3",
            "--iterations",
            "4",
            "--warmup",
            "0",
        ]);
        let r = profile_json(&args);
        check_report(&r, 3, 4, 0);
        assert_eq!(r["parameters"], 32 * 32 + 32 + 32 * 10 + 10);
        assert_eq!(r["input_shape"], serde_json::json!([4, 8]));
    }

    // Conv net, channels 4,8 on 3×16×16 images: 3×3 convolutions without bias, batch-norm
    // scale and shift, linear head to 10 classes.
    let r = profile_json(&[
        "--model",
        "convnet",
        "--set",
        "model.channels=4,8",
        "--input-shape",
        "3,16,16",
        "--batch-size",
        "2",
        "--iterations",
        "3",
        "--warmup",
        "1",
        "--precision",
        "bf16",
    ]);
    check_report(&r, 2, 3, 1);
    assert_eq!(
        r["parameters"],
        3 * 4 * 9 + 2 * 4 + 4 * 8 * 9 + 2 * 8 + 8 * 10 + 10
    );
    assert_eq!(r["precision"], "bf16");
}

#[test]
fn train_mode_times_whole_train_steps() {
    let r = profile_json(&[
        "--model",
        "mlp",
        "--mode",
        "train",
        "--set",
        "model.hidden=16,16",
        "--batch-size",
        "4",
        "--iterations",
        "5",
        "--warmup",
        "2",
        "--precision",
        "fp32",
    ]);
    check_report(&r, 4, 5, 2);
    assert_eq!(r["mode"], "train");
    assert_eq!(r["parameters"], 64 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10);

    // A small transformer, in text: every line of the report is there.
    let o = kiln(&[
        "profile-model",
        "--model",
        "transformer",
        "--mode",
        "train",
        "--set",
        "model.d_model=16",
        "--set",
        "model.heads=2",
        "--set",
        "model.layers=1",
        "--set",
        "model.ff=32",
        "--input-shape",
        "8",
        "12",
        "--batch-size",
        "2",
        "--iterations",
        "2",
        "--warmup",
        "1",
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for line in [
        "model        transformer (kiln reference model: d_model 16, heads 2, layers 1, ff 32",
        "device       cpu",
        "mode         train (forward, loss, backward, optimizer step)",
        "batch        2 samples of shape [8, 12]",
        "iterations   2 timed after 1 warm-up",
        "time/iter    mean ",
        " samples/s",
        "peak memory  ",
        "VmHWM",
    ] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }
    // Where the batch size and precision came from goes to stderr.
    let err = stderr(&o);
    assert!(
        err.contains("profiling in train mode: batch size 2 (command line (--batch-size))"),
        "{err}"
    );
}

/// Trains a tiny MLP (hidden 16) for one epoch on 64 synthetic samples; its run directory.
fn tiny_run(dir: &Path) -> std::path::PathBuf {
    let runs = dir.join("runs");
    let o = kiln(&[
        "train",
        "--model",
        "mlp",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--set",
        &format!("run.output_dir={}", runs.display()),
        "--set",
        "model.hidden=16",
        "--set",
        "data.synthetic_samples=64",
        "--set",
        "train.batch_size=16",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path()
}

#[test]
fn checkpoints_from_a_training_run_are_profiled_in_both_modes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tiny_run(tmp.path());
    let parameters = 64 * 16 + 16 + 16 * 10 + 10;

    // The run directory (its newest checkpoint); the model settings come from the checkpoint.
    let r = profile_json(&[
        "--model",
        run.to_str().unwrap(),
        "--batch-size",
        "5",
        "--iterations",
        "3",
        "--warmup",
        "1",
    ]);
    check_report(&r, 5, 3, 1);
    assert_eq!(r["parameters"], parameters);
    assert_eq!(r["input_shape"], serde_json::json!([64]));
    let model = r["model"].as_str().unwrap();
    assert!(model.starts_with("kiln mlp checkpoint"), "{model}");

    // A checkpoint directory, in train mode.
    let ckpt = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let r = profile_json(&[
        "--model",
        ckpt.to_str().unwrap(),
        "--mode",
        "train",
        "--batch-size",
        "4",
        "--iterations",
        "2",
        "--warmup",
        "1",
        "--precision",
        "fp32",
    ]);
    check_report(&r, 4, 2, 1);
    assert_eq!(r["mode"], "train");
    assert_eq!(r["parameters"], parameters);

    // A shape the checkpoint was not trained on.
    let o = kiln(&[
        "profile-model",
        "--model",
        run.to_str().unwrap(),
        "--input-shape",
        "32",
        "--device",
        "cpu",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("--input-shape 32") && err.contains("takes samples of shape [64]"),
        "{err}"
    );
}

#[test]
fn bad_flags_are_named_with_what_would_be_valid() {
    let tmp = tempfile::tempdir().unwrap();
    // Not a TorchScript module, but a file: what --model takes as one.
    let fake = tmp.path().join("fake.pt");
    std::fs::write(&fake, b"not a module").unwrap();
    let fake = fake.to_str().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--model", "mlp", "--batch-size", "0"],
            &["'--batch-size <N>'", "must be at least 1"],
        ),
        (
            &["--model", "mlp", "--iterations", "0"],
            &["'--iterations <N>'", "must be at least 1"],
        ),
        (
            &["--model", "mlp", "--input-shape", "4,0"],
            &["'--input-shape <D>...'", "must be at least 1"],
        ),
        (
            &["--model", "mlp", "--precision", "fp64"],
            &["'--precision <PRECISION>'", "fp32", "bf16", "fp16", "auto"],
        ),
        (
            &["--model", "mlp", "--mode", "eval"],
            &["'--mode <MODE>'", "infer, train"],
        ),
        (
            &["--model", "resnet"],
            &[
                "--model resnet: not a built-in model (transformer, mlp, convnet or unet3d)",
                "a kiln run or checkpoint directory, a TorchScript .pt file or an .onnx file",
            ],
        ),
        (
            &["--model", "transformer", "--input-shape", "469"],
            &[
                "--input-shape 469",
                "[sequence, features]",
                "--input-shape 64,469",
            ],
        ),
        (
            &["--model", "convnet", "--input-shape", "32", "32"],
            &["--input-shape 32,32", "[channels, height, width]"],
        ),
        (
            &["--model", "mlp", "--set", "infer.batch_size=0"],
            &["`infer.batch_size` = 0", "must be at least 1"],
        ),
        (
            &["--model", fake, "--mode", "train", "--input-shape", "4"],
            &["--mode train", "TorchScript", "--mode infer only"],
        ),
        (&["--model", fake], &["--input-shape is needed"]),
        (
            &["--model", fake, "--input-shape", "4"],
            &["not a loadable TorchScript module"],
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["profile-model"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--device", "cpu"]);
        let o = kiln(&all);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded: {err}");
        assert!(o.stdout.is_empty(), "{args:?} printed a report");
        for e in *expected {
            assert!(err.contains(e), "{args:?}: no `{e}` in: {err}");
        }
    }
}

#[test]
fn the_bench_placeholder_is_gone_and_help_lists_profile_model() {
    let o = kiln(&["bench"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unrecognized subcommand 'bench'"),
        "{}",
        stderr(&o)
    );
    let o = kiln(&["--help"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("profile-model"), "{}", stdout(&o));
}
