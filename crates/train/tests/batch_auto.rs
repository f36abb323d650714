//! `train.batch_size = "auto"` end to end on the CPU: real trials pick a size by throughput,
//! the answer is cached per model/hardware/precision, and a later run takes it from the cache.

use std::path::Path;

mod common;

use kiln_config::{ConfigRequest, load};
use kiln_device::Device;
use kiln_train::TrainError;
use kiln_train::record::{Observer, RunStart, Silent};
use kiln_train::run::{RunControl, train};

fn request(out: &Path, extra: &[&str]) -> ConfigRequest {
    let base = [
        "model.name=mlp",
        "data.synthetic_samples=600",
        "data.num_workers=1",
        "train.epochs=1",
        "checkpoint.enabled=false",
    ];
    common::run_request(out, &base, extra)
}

#[derive(Default)]
struct Start(Option<RunStart>);

impl Observer for Start {
    fn on_start(&mut self, s: &RunStart) -> Result<(), TrainError> {
        self.0 = Some(s.clone());
        Ok(())
    }
}

#[test]
fn auto_batch_size_searches_once_then_uses_the_cache() {
    let out = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let plan = load(&request(out.path(), &["train.batch_size=auto"]))
        .unwrap()
        .plan;
    assert!(plan.train.batch_size_auto);
    let start = plan.train.batch_size;
    let control = || RunControl {
        cache_dir: Some(cache.path().to_owned()),
        ..RunControl::default()
    };
    let mut first = Start::default();
    train(&plan, Device::Cpu, None, control(), &mut first).unwrap();
    let first = first.0.unwrap();
    let note = first.batch_size_search.clone().unwrap();
    assert!(note.contains("trials"), "{note}");
    assert!(note.contains(&format!("→ {}", first.batch_size)), "{note}");
    assert!(
        note.contains(&start.to_string()),
        "the search starts at the profile's {start}: {note}"
    );
    assert!((1..=540).contains(&first.batch_size));

    let cached: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cache.path().join("batch-size.json")).unwrap(),
    )
    .unwrap();
    let entries = cached.as_object().unwrap();
    assert_eq!(entries.len(), 1);
    let (key, answer) = entries.iter().next().unwrap();
    assert!(key.contains("mlp") && key.contains("fp32"), "{key}");
    assert_eq!(answer["batch_size"], first.batch_size);
    let trials = answer["trials"].as_array().unwrap();
    assert!((1..=8).contains(&trials.len()));

    // Same model, hardware and precision: the cache answers, no trials.
    let mut second = Start::default();
    train(&plan, Device::Cpu, None, control(), &mut second).unwrap();
    let second = second.0.unwrap();
    assert_eq!(second.batch_size, first.batch_size);
    assert!(second.batch_size_search.unwrap().contains("cached"));

    // A different precision is a different question.
    let bf16 = load(&request(
        out.path(),
        &["train.batch_size=auto", "train.amp=bf16"],
    ))
    .unwrap()
    .plan;
    train(&bf16, Device::Cpu, None, control(), &mut Silent).unwrap();
    let cached: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cache.path().join("batch-size.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cached.as_object().unwrap().len(), 2);
}

#[test]
fn a_batch_size_that_is_neither_a_number_nor_auto_is_rejected() {
    let out = tempfile::tempdir().unwrap();
    let err = load(&request(out.path(), &["train.batch_size=big"]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("train.batch_size") && err.contains("auto"),
        "{err}"
    );
    let err = load(&request(out.path(), &["train.batch_size=0"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("train.batch_size"), "{err}");
}
