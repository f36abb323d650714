//! `kiln gpu-check` on this machine: the report's shape, exit codes, not-run CUDA steps without a
//! GPU, the CPU-capable steps passing on the CPU, and an existing report never overwritten.

mod common;

use std::path::Path;

use common::{kiln, stderr};
use serde_json::Value;

fn cuda() -> bool {
    kiln_torch_ext::cuda::device_count().unwrap_or(0) > 0
}

fn report(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("report.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn step<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step"] == name)
        .unwrap_or_else(|| panic!("no step {name} in {r}"))
}

#[test]
fn cuda_steps_are_listed_as_not_run_and_require_gpu_fails_without_one() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    let out_s = out.to_str().unwrap();
    let steps = "doctor,backend-flags,memory-fraction,cuda-graphs,nccl";
    let o = kiln(&[
        "gpu-check",
        "--out",
        out_s,
        "--steps",
        steps,
        "--require-gpu",
    ]);
    let r = report(&out);
    let names: Vec<&str> = r["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    assert_eq!(names, steps.split(',').collect::<Vec<_>>());
    assert_eq!(step(&r, "doctor")["status"], "pass", "{r}");
    assert_eq!(step(&r, "backend-flags")["status"], "pass", "{r}");
    assert!(out.join("steps/doctor.log").is_file() && out.join("report.md").is_file());
    assert_eq!(step(&r, "nccl")["status"], "not-run");
    if cuda() {
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(step(&r, "memory-fraction")["status"], "pass", "{r}");
    } else {
        assert_eq!(
            o.status.code(),
            Some(2),
            "--require-gpu without a GPU: {}",
            stderr(&o)
        );
        for name in ["memory-fraction", "cuda-graphs"] {
            assert_eq!(step(&r, name)["status"], "not-run", "{r}");
            assert_eq!(step(&r, name)["summary"], "not run: no CUDA device");
        }
        assert!(stderr(&o).contains("--require-gpu and no CUDA device"));
    }
    let before = std::fs::read(out.join("report.json")).unwrap();
    let again = kiln(&["gpu-check", "--out", out_s, "--steps", "doctor"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("already exists and is not empty"),
        "{}",
        stderr(&again)
    );
    assert_eq!(
        std::fs::read(out.join("report.json")).unwrap(),
        before,
        "the report was kept"
    );
}

#[test]
fn training_resume_profiler_and_serving_steps_pass_on_this_device() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    let steps = "train-bf16,checkpoint-resume,profiler-trace,serve";
    let o = kiln(&[
        "gpu-check",
        "--out",
        out.to_str().unwrap(),
        "--steps",
        steps,
    ]);
    let r = report(&out);
    for name in steps.split(',') {
        assert_eq!(step(&r, name)["status"], "pass", "{name}: {r}");
    }
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let train = &step(&r, "train-bf16")["figures"];
    let diff = train["first_step_abs_diff"].as_f64().unwrap();
    assert!(
        diff <= 0.1,
        "bf16 first step within tolerance of CPU fp32: {train}"
    );
    assert_eq!(train["steps"], 100);
    assert_eq!(
        step(&r, "checkpoint-resume")["figures"]["resumed_from_step"],
        30
    );
    assert_eq!(step(&r, "serve")["figures"]["errors"], 0);
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and a C++ compiler; `cargo xtask test` runs it"]
fn the_compiled_train_step_passes_on_this_device_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    let o = kiln(&[
        "gpu-check",
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "compiled-train",
    ]);
    let r = report(&out);
    let compiled = step(&r, "compiled-train");
    assert_eq!(compiled["status"], "pass", "{r}");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let f = &compiled["figures"];
    assert!(
        f["gradient_max_relative_error"].as_f64().unwrap() <= 1e-5,
        "{f}"
    );
    let (ours, eager) = (
        f["bf16_losses"].as_array().unwrap(),
        f["eager_bf16_losses"].as_array().unwrap(),
    );
    assert_eq!((ours.len(), eager.len()), (30, 30), "{f}");
    assert!(f["compile_fp32_s"].as_f64().unwrap() > 0.0, "{f}");
}

#[test]
fn an_unknown_step_is_named_with_the_valid_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    let o = kiln(&[
        "gpu-check",
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "doctor,warp",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("`warp` is not a gpu-check step") && err.contains("pinned-feeder"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written for a bad request");
}
