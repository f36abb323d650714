//! The `kiln` binary as a user runs it.

mod common;

use common::{kiln, stderr, stdout};
use std::process::Command;

#[test]
fn version_reports_libtorch_and_loads_its_cuda_library() {
    let out = kiln(&["version"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.contains("libtorch 2.11.0 at "), "{text}");
    // The binary must not have dropped libtorch_cuda (the as-needed trap) when it exists.
    let lib_dir = text
        .lines()
        .find_map(|l| l.strip_prefix("libtorch 2.11.0 at "))
        .unwrap();
    let shipped = std::path::Path::new(lib_dir)
        .join("libtorch_cuda.so")
        .exists();
    let expected = if shipped {
        "libtorch_cuda: linked"
    } else {
        "libtorch_cuda: not shipped"
    };
    assert!(text.contains(expected), "expected `{expected}` in:\n{text}");
    // NCCL is built exactly where libtorch has CUDA and the wheel brings NCCL's headers.
    let site = std::fs::canonicalize(lib_dir).unwrap();
    let nccl_header = site
        .ancestors()
        .nth(2)
        .is_some_and(|s| s.join("nvidia/nccl/include/nccl.h").exists());
    let nccl = if shipped && nccl_header {
        "data-parallel: Gloo (CPU), NCCL (CUDA)"
    } else {
        "data-parallel: Gloo (CPU)"
    };
    assert!(text.contains(nccl), "expected `{nccl}` in:\n{text}");
}

#[test]
fn doctor_reports_every_section_and_the_chosen_device() {
    let out = kiln(&["doctor"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    for section in [
        "libtorch",
        "NVML",
        "GPUs (",
        "CPU",
        "this run",
        "selected",
        "profile",
        "start line",
    ] {
        assert!(text.contains(section), "`{section}` missing:\n{text}");
    }
    let out = kiln(&["doctor", "--format", "json"]);
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("doctor --format json is JSON");
    assert_eq!(v["libtorch"]["version"], "2.11.0");
    assert!(v["machine"]["cpu"]["logical_cores"].as_u64().unwrap() >= 1);
    assert!(v["selection"]["device"].is_string());
}

#[test]
fn doctor_on_a_bad_config_says_so_and_fails() {
    let out = kiln(&["doctor", "--set", "train.batch_size=0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("ERROR: `train.batch_size` = 0"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn profiles_list_show_and_match() {
    let list = stdout(&kiln(&["profiles"]));
    for name in [
        "h100",
        "h200",
        "a100",
        "v100",
        "rtx4090",
        "rtx3090",
        "generic-cpu",
        "apple-mps",
    ] {
        assert!(
            list.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{list}"
        );
    }
    let show = kiln(&["profiles", "show", "h200"]);
    assert!(
        stdout(&show).contains("train_batch_size     512"),
        "{}",
        stdout(&show)
    );
    let json = kiln(&["profiles", "show", "h200", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["infer_batch_size"], 2048);

    let m = kiln(&[
        "profiles",
        "match",
        "--gpu-name",
        "NVIDIA A100-SXM4-80GB",
        "--cpus",
        "64",
    ]);
    let text = stdout(&m);
    assert!(
        text.starts_with("NVIDIA A100-SXM4-80GB → profile a100 (matched by `A100`)"),
        "{text}"
    );
    assert!(
        !text.contains("adjusted num_workers"),
        "64 cores: no cap needed\n{text}"
    );

    let unknown = kiln(&[
        "profiles",
        "match",
        "--gpu-name",
        "NVIDIA A40",
        "--memory-gib",
        "48",
        "--compute-capability",
        "8.6",
    ]);
    assert!(
        stdout(&unknown).contains("derived (nearest profile by memory: l40s)"),
        "{}",
        stdout(&unknown)
    );

    let bad = kiln(&["profiles", "show", "h10"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).contains("did you mean `a10` or `h100`?"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn user_profiles_are_listed_and_matched() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-profiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let l4 = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../profiles/l4.toml"
    ))
    .unwrap()
    .replace("name = \"l4\"", "name = \"a16\"")
    .replace("match = [\"L4\"]", "match = [\"A16\"]");
    std::fs::write(dir.join("a16.toml"), l4).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["profiles", "match", "--gpu-name", "NVIDIA A16"])
        .env("KILN_DEVICE__PROFILES_DIR", &dir)
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("profile a16 (matched by `A16`)"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = kiln(&["profiles", "--profiles-dir", dir.to_str().unwrap()]);
    assert!(
        stdout(&out).lines().any(|l| l.starts_with("a16")),
        "{}",
        stdout(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn config_explain_shows_each_value_with_its_layer() {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "config",
            "--explain",
            "--simulate-gpu",
            "NVIDIA H100 80GB HBM3",
            "--cpus",
            "16",
            "--batch-size",
            "32",
        ])
        .env("KILN_TRAIN__LR", "5e-4")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("# device cuda:0 (NVIDIA H100 80GB HBM3)"),
        "{text}"
    );
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        line("train.batch_size").contains("= 32")
            && line("train.batch_size").contains("[command line] command line (--batch-size)"),
        "{text}"
    );
    assert!(
        line("infer.batch_size").contains("= 1024")
            && line("infer.batch_size").contains("[profile] profile h100"),
        "{text}"
    );
    assert!(
        line("train.lr").contains("environment variable KILN_TRAIN__LR"),
        "{text}"
    );
    assert!(
        line("data.num_workers").contains("= auto (measures 0 to 16 on the first steps)")
            && line("data.num_workers")
                .contains("profile said 32; this machine has 16 CPU core(s)"),
        "{text}"
    );

    let json = kiln(&["config", "--simulate-gpu", "Tesla T4", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["values"]["train.amp"]["value"], "fp16");
    assert_eq!(v["values"]["train.amp"]["layer"], "profile");
}

#[test]
fn config_errors_name_the_key_and_exit_non_zero() {
    let out = kiln(&["config", "--set", "performance.tf23=true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("did you mean `performance.tf32`?"),
        "{}",
        stderr(&out)
    );
    let out = kiln(&["config", "--device", "cuda:3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("device `cuda:3` is not available"),
        "{}",
        stderr(&out)
    );
    let out = kiln(&["config", "--config", "/nonexistent/kiln.toml"]);
    assert!(
        stderr(&out).contains("config file /nonexistent/kiln.toml: no such file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn train_prints_settings_with_sources_trains_and_writes_the_run_directory() {
    let runs = tempfile::tempdir().unwrap();
    let out_dir = format!("run.output_dir={}", runs.path().display());
    let out = kiln(&[
        "train",
        "--model",
        "mlp",
        "--epochs",
        "2",
        "--precision",
        "fp32",
        "--run-name",
        "cli",
        "--workers",
        "1",
        "--set",
        "data.synthetic_samples=1200",
        "--set",
        &out_dir,
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(" · profile ") && err.contains("batch_size "),
        "{err}"
    );
    assert!(err.contains("name mlp [(--model)]"), "{err}");
    assert!(err.contains("epochs 2 [(--epochs)]"), "{err}");
    assert!(err.contains("amp fp32 [(--precision)]"), "{err}");
    // Not a terminal: plain progress lines, one per epoch, and the summary.
    assert!(err.contains("step ") && err.contains("samples/s"), "{err}");
    assert_eq!(err.matches("val acc ").count(), 2, "{err}");
    assert!(
        err.contains("done: ") && err.contains("chance 10.0%"),
        "{err}"
    );
    let dirs: Vec<_> = std::fs::read_dir(runs.path()).unwrap().flatten().collect();
    assert_eq!(dirs.len(), 1);
    let dir = dirs[0].path();
    assert!(
        dir.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("cli-")
    );
    for file in ["config.json", "metrics.jsonl", "summary.json", "curves.png"] {
        assert!(
            dir.join(file).is_file(),
            "{file} missing in {}",
            dir.display()
        );
    }
}

#[test]
fn train_rejects_bad_input_naming_what_is_wrong() {
    let out = kiln(&["train", "--precision", "fp8"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("train.amp") && err.contains("--precision"),
        "{err}"
    );
    let out = kiln(&["train", "--model", "resnet"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("model.name") && err.contains("transformer, mlp, convnet or unet3d"),
        "{err}"
    );
    let missing = tempfile::tempdir().unwrap();
    let path = missing.path().join("nothing-here");
    let out = kiln(&["train", "--data", path.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("nothing-here") && err.contains("kiln data prepare"),
        "{err}"
    );
    assert!(!path.exists(), "nothing was created");
    // A step in one CUDA graph where it cannot be: refused before any run directory exists.
    let runs = missing.path().join("runs");
    let out = kiln(&[
        "train",
        "--device",
        "cpu",
        "--set",
        "train.cuda_graphs=on",
        "--set",
        &format!("run.output_dir={}", runs.display()),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("train.cuda_graphs") && err.contains("not on a CUDA device"),
        "{err}"
    );
    assert!(
        !runs.exists(),
        "no run directory for a run that never started"
    );
}

#[test]
fn unknown_commands_fail_with_usage() {
    let out = kiln(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unrecognized subcommand 'frobnicate'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn data_prepare_writes_shards_that_inspect_checks() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("t.csv");
    std::fs::write(&csv, "x,y,kind\n1,2,cat\n3,4,dog\n5,6,cat\n").unwrap();
    let out = tmp.path().join("ds");
    let (csv_s, out_s) = (csv.to_str().unwrap(), out.to_str().unwrap());
    let args = [
        "data",
        "prepare",
        "--csv",
        csv_s,
        "--label-column",
        "kind",
        "--out",
        out_s,
        "--shard-samples",
        "2",
    ];
    let o = kiln(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("2 classes (cat, dog)"),
        "{}",
        stdout(&o)
    );

    let o = kiln(&["data", "inspect", out_s, "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["manifest"]["samples"], 3);
    assert_eq!(v["manifest"]["shards"].as_array().unwrap().len(), 2);

    // A second run refuses to overwrite, and the dataset is untouched.
    let manifest_before = std::fs::read(out.join("kiln-dataset.json")).unwrap();
    let o = kiln(&args);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(out.join("kiln-dataset.json")).unwrap(),
        manifest_before
    );

    // A broken dataset fails inspection, naming the file.
    std::fs::remove_file(out.join("shard-00001.safetensors")).unwrap();
    let o = kiln(&["data", "inspect", out_s]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("shard-00001.safetensors") && stderr(&o).contains("missing shard"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn train_on_a_prepared_dataset_learns_its_classes() {
    let tmp = tempfile::tempdir().unwrap();
    // Two separable classes: the label is whether x + y is positive.
    let mut text = String::from("x,y,noise,label\n");
    for i in 0..400 {
        let x = ((i * 37) % 101) as f64 / 50.0 - 1.0;
        let y = ((i * 53) % 97) as f64 / 48.0 - 1.0;
        let label = if x + y > 0.0 { "up" } else { "down" };
        text.push_str(&format!("{x},{y},{},{label}\n", (i % 7) as f64 / 7.0));
    }
    let csv = tmp.path().join("points.csv");
    std::fs::write(&csv, text).unwrap();
    let ds = tmp.path().join("points");
    let o = kiln(&[
        "data",
        "prepare",
        "--csv",
        csv.to_str().unwrap(),
        "--label-column",
        "label",
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
        "4",
        "--set",
        &format!("run.output_dir={}", runs.display()),
        "--set",
        "train.warmup_steps=0",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("data: ")
            && err.contains("points (400 samples of [3]; a class label in 0..2)"),
        "{err}"
    );
    let summary_path = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path()
        .join("summary.json");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(summary_path).unwrap()).unwrap();
    let acc = summary["final_val_accuracy"].as_f64().unwrap();
    assert!(
        acc > 0.8,
        "val accuracy {acc} on a linearly separable problem"
    );
    assert_eq!(summary["chance_accuracy"], 0.5);
    // The transformer needs [sequence, features] samples and says so.
    let o = kiln(&[
        "train",
        "--data",
        ds.to_str().unwrap(),
        "--set",
        &format!("run.output_dir={}", runs.display()),
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("model.name") && err.contains("[sequence, features]"),
        "{err}"
    );
}
