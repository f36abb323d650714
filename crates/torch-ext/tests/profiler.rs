//! The kineto profiler through the native extension: a recorded trace is Chrome trace JSON with
//! real operator events and kiln's named ranges, and memory events give a peak.

use std::sync::Mutex;

use kiln_torch_ext::profiler::{self, ProfilerOptions, Range, Recording};
use tch::{Device, Kind, Tensor};

/// kineto is one per process: the tests take turns.
static KINETO: Mutex<()> = Mutex::new(());

fn options() -> ProfilerOptions {
    ProfilerOptions {
        record_shapes: true,
        profile_memory: true,
        ..ProfilerOptions::default()
    }
}

#[test]
fn a_trace_holds_operator_events_and_named_ranges() {
    let _turn = KINETO.lock().unwrap_or_else(|e| e.into_inner());
    profiler::prepare(options()).unwrap();
    let recording = Recording::start(options()).unwrap();
    assert!(profiler::is_recording().unwrap());
    {
        let _range = Range::new("kiln/forward").unwrap();
        let a = Tensor::ones([64, 32], (Kind::Float, Device::Cpu));
        let b = Tensor::ones([32, 16], (Kind::Float, Device::Cpu));
        let _ = a.matmul(&b).relu();
    }
    let trace = recording.stop().unwrap();
    assert!(!profiler::is_recording().unwrap());
    let stats = trace.stats().unwrap();
    assert!(stats.operators > 0, "{stats:?}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.pt.trace.json");
    trace.save(&path).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("aten::mm") || *n == "aten::matmul"),
        "no matmul event among {names:?}"
    );
    assert!(names.contains(&"aten::relu"), "{names:?}");
    let range = events
        .iter()
        .find(|e| e["name"] == "kiln/forward")
        .expect("the named range is in the trace");
    assert_eq!(range["ph"], "X", "{range}");
    // Shapes were recorded for the operators.
    assert!(
        events
            .iter()
            .any(|e| e["name"] == "aten::matmul" && e["args"]["Input Dims"].is_array()),
        "no input shapes recorded"
    );
}

#[test]
fn memory_events_give_the_peak_allocated_while_recording() {
    let _turn = KINETO.lock().unwrap_or_else(|e| e.into_inner());
    let (_, peak) = profiler::peak_allocated_during(ProfilerOptions::default(), || {
        // 8 MiB, freed before the next 4 MiB: the peak is the larger one, not the sum.
        let big = Tensor::zeros([2 * 1024 * 1024], (Kind::Float, Device::Cpu));
        drop(big);
        let small = Tensor::zeros([1024 * 1024], (Kind::Float, Device::Cpu));
        drop(small);
    })
    .unwrap();
    assert!(
        (8 << 20..9 << 20).contains(&peak),
        "peak {peak} bytes, expected 8 MiB and change"
    );
    let (_, none) = profiler::peak_allocated_during(ProfilerOptions::default(), || ()).unwrap();
    assert!(none < 1 << 16, "{none}");
}

#[test]
fn starting_twice_or_stopping_nothing_is_a_clear_error() {
    let _turn = KINETO.lock().unwrap_or_else(|e| e.into_inner());
    let recording = Recording::start(ProfilerOptions::default()).unwrap();
    let err = Recording::start(ProfilerOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("already recording"), "{err}");
    drop(recording);
    assert!(!profiler::is_recording().unwrap());
}
