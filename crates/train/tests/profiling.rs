//! A profiled run: the `profiling` section's schedule writes Chrome traces into
//! `runs/<run>/profiler_traces/` whose `traceEvents` hold libtorch operator events and kiln's
//! named phases.

use std::path::{Path, PathBuf};

mod common;

use kiln_config::load;
use kiln_device::Device;
use kiln_train::record::Silent;
use kiln_train::run::{RunControl, RunOutcome, train};
use serde_json::Value;

fn cpu_plan(out: &Path, extra: &[&str]) -> kiln_config::RunPlan {
    let base = [
        "model.name=mlp",
        "data.synthetic_samples=400",
        "data.num_workers=1",
        "train.epochs=2",
        "train.batch_size=16",
        "checkpoint.enabled=false",
    ];
    load(&common::run_request(out, &base, extra)).unwrap().plan
}

fn run(plan: &kiln_config::RunPlan) -> RunOutcome {
    train(plan, Device::Cpu, None, RunControl::default(), &mut Silent).unwrap()
}

fn traces(out: &Path) -> Vec<PathBuf> {
    let run = std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let dir = run.join("profiler_traces");
    let mut v: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
        Err(_) => vec![],
    };
    v.sort();
    v
}

fn event_names(trace: &Path) -> Vec<String> {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(trace).unwrap()).unwrap();
    json["traceEvents"]
        .as_array()
        .expect("the trace has traceEvents")
        .iter()
        .filter_map(|e| e["name"].as_str().map(str::to_owned))
        .collect()
}

// One test: kineto is one per process.
#[test]
fn profiled_runs_write_traces_on_schedule() {
    // By steps: skip 1, warm up 1, record 2, twice.
    let out = tempfile::tempdir().unwrap();
    let plan = cpu_plan(
        out.path(),
        &[
            "profiling.wait=1",
            "profiling.warmup=1",
            "profiling.active=2",
            "profiling.repeat=2",
        ],
    );
    let outcome = run(&plan);
    let written = traces(out.path());
    assert_eq!(written.len(), 2, "{written:?}");
    assert_eq!(outcome.summary.profiler_traces, written);
    for trace in &written {
        let name = trace.file_name().unwrap().to_string_lossy();
        assert!(name.ends_with(".pt.trace.json"), "{name}");
    }
    let names = event_names(&written[0]);
    assert!(
        names
            .iter()
            .any(|n| n == "aten::linear" || n == "aten::addmm"),
        "no operator events"
    );
    for phase in [
        "kiln/data_wait",
        "kiln/forward",
        "kiln/backward",
        "kiln/optimizer",
    ] {
        assert!(names.iter().any(|n| n == phase), "{phase} missing");
    }
    // Steps 3 and 4 of the first cycle, 7 and 8 of the second, nothing else.
    let steps: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("kiln/step#"))
        .collect();
    assert_eq!(steps, ["kiln/step#3", "kiln/step#4"], "{steps:?}");
    let second = event_names(&written[1]);
    assert!(second.iter().any(|n| n == "kiln/step#7"));

    // By epochs: record the second epoch, with its validation pass.
    let out = tempfile::tempdir().unwrap();
    let plan = cpu_plan(
        out.path(),
        &[
            "profiling.unit=epochs",
            "profiling.wait=1",
            "profiling.warmup=0",
            "profiling.active=1",
            "profiling.record_shapes=false",
            "profiling.profile_memory=false",
        ],
    );
    run(&plan);
    let written = traces(out.path());
    assert_eq!(written.len(), 1, "{written:?}");
    let names = event_names(&written[0]);
    assert!(names.iter().any(|n| n == "kiln/validation"));
    // 360 training samples / 16 = 22 steps per epoch: the second epoch is steps 23..=44.
    assert!(names.iter().any(|n| n == "kiln/step#23"));
    assert!(!names.iter().any(|n| n == "kiln/step#22"));

    // Profiling off (the default): no trace directory.
    let out = tempfile::tempdir().unwrap();
    let plan = cpu_plan(out.path(), &["train.epochs=1"]);
    run(&plan);
    assert!(traces(out.path()).is_empty());
}
