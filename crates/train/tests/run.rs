//! A whole run end to end on the CPU: it must learn (loss down, accuracy far above chance), and
//! leave a complete run directory behind.

mod common;

use kiln_config::{Layer, load};
use kiln_device::Device;
use kiln_train::record::{Observer, Silent, StepRecord};
use kiln_train::run::{RunControl, train};
use kiln_train::rundir::RunDir;

fn cpu_plan(sets: &[String]) -> kiln_config::RunPlan {
    load(&common::cpu_request(sets)).unwrap().plan
}

#[derive(Default)]
struct Collect(Vec<StepRecord>, Option<kiln_train::record::RunReady>);

impl Observer for Collect {
    fn on_ready(&mut self, r: &kiln_train::record::RunReady) -> Result<(), kiln_train::TrainError> {
        assert!(self.0.is_empty(), "told before the first step");
        self.1 = Some(r.clone());
        Ok(())
    }

    fn on_log(&mut self, r: &StepRecord) -> Result<(), kiln_train::TrainError> {
        self.0.push(r.clone());
        Ok(())
    }
}

#[test]
fn a_short_mlp_run_learns_and_records_everything() {
    let out = tempfile::tempdir().unwrap();
    let plan = cpu_plan(&[
        "model.name=mlp".into(),
        "data.synthetic_samples=3000".into(),
        "data.num_workers=1".into(),
        "train.epochs=3".into(),
        "train.log_interval=10".into(),
        "train.warmup_steps=5".into(),
        "run.name=e2e".into(),
        format!("run.output_dir={}", out.path().display()),
    ]);
    let mut seen = Collect::default();
    let outcome = train(&plan, Device::Cpu, None, RunControl::default(), &mut seen).unwrap();
    let ready = seen.1.clone().unwrap();
    let (dir, data) = (ready.run_dir, ready.data);
    assert_eq!(dir, outcome.run_dir);
    assert!(data.contains("synthetic mlp data"), "{data}");

    // It learned: the first logged loss is far above the last, and validation accuracy is
    // far above chance (10 classes).
    let first = seen.0.first().unwrap().metrics.loss();
    let s = &outcome.summary;
    assert!(
        first > 1.5 * s.final_train.loss(),
        "loss {first} → {}",
        s.final_train.loss()
    );
    let val = s.final_val.get("accuracy").unwrap();
    assert!(val > 4.0 * s.chance_accuracy.unwrap(), "val accuracy {val}");
    assert_eq!(s.steps, 3 * (2700 / plan.train.batch_size));
    assert!(s.samples_per_s > 0.0 && s.mean_step_time_s > 0.0);
    assert!(s.memory.rss_peak.unwrap() > 0);

    // The run directory: runs/<name>-<timestamp>/ with its four files.
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("e2e-") && name.len() == "e2e-20261121-031528".len(),
        "{name}"
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let epochs = config
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "train.epochs")
        .unwrap();
    assert_eq!(epochs["value"], "3");
    assert_eq!(epochs["layer"], serde_json::json!(Layer::CommandLine));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["kind"], "start");
    assert_eq!(lines[0]["model"], "mlp");
    let epochs: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "epoch").collect();
    assert_eq!(epochs.len(), 3);
    assert!(epochs.iter().all(|e| e["val_accuracy"].as_f64().is_some()));
    assert_eq!(
        lines.iter().filter(|l| l["kind"] == "step").count(),
        seen.0.len()
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], s.steps);
    let png = std::fs::read(dir.join("curves.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn run_directories_are_never_reused() {
    let out = tempfile::tempdir().unwrap();
    let plan = cpu_plan(&[]);
    let a = RunDir::create(out.path(), "same", &plan).unwrap();
    let b = RunDir::create(out.path(), "same", &plan).unwrap();
    assert_ne!(a.path(), b.path());
    assert!(a.path().join("config.json").is_file() && b.path().join("config.json").is_file());
}

#[test]
fn a_missing_dataset_is_named_in_the_error() {
    let out = tempfile::tempdir().unwrap();
    let plan = cpu_plan(&[format!("run.output_dir={}", out.path().display())]);
    let missing = out.path().join("no-such-dataset");
    let err = train(
        &plan,
        Device::Cpu,
        Some(&missing),
        RunControl::default(),
        &mut Silent,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("no-such-dataset"), "{err}");
    assert_eq!(
        std::fs::read_dir(out.path()).unwrap().count(),
        0,
        "no run directory was made"
    );
}

#[test]
fn train_settings_default_to_kilns_configured_defaults() {
    // The library's `TrainSettings::default()` is what the configuration's defaults resolve to
    // (on a CPU without bf16, where no profile changes a train.* value).
    let plan = kiln_config::load(&common::cpu_request::<&str>(&[]))
        .unwrap()
        .plan;
    let from_config = kiln_train::trainer::TrainSettings::from_plan(
        &plan.train,
        plan.performance.empty_cache_interval,
    );
    assert_eq!(kiln_train::trainer::TrainSettings::default(), from_config);
}

#[derive(Default)]
struct Losses(Vec<f64>);

impl Observer for Losses {
    fn on_log(&mut self, r: &StepRecord) -> Result<(), kiln_train::TrainError> {
        self.0.push(r.metrics.loss());
        Ok(())
    }
}

/// One short MLP run logging every step, with `workers` as `data.num_workers`.
fn mlp_run(out: &std::path::Path, workers: &str) -> (kiln_train::run::RunOutcome, Vec<f64>) {
    let plan = cpu_plan(&[
        "model.name=mlp".into(),
        "model.dropout=0.2".into(),
        "data.synthetic_samples=1200".into(),
        format!("data.num_workers={workers}"),
        "train.epochs=2".into(),
        "train.log_interval=1".into(),
        format!("run.output_dir={}", out.display()),
    ]);
    let mut losses = Losses::default();
    let outcome = train(&plan, Device::Cpu, None, RunControl::default(), &mut losses).unwrap();
    (outcome, losses.0)
}

#[test]
fn automatic_workers_measure_whole_steps_and_change_nothing_learned() {
    let out = tempfile::tempdir().unwrap();
    let plan = cpu_plan(&[]);
    assert!(plan.data.num_workers_auto, "auto is the default");
    assert_eq!(
        plan.data.num_workers, 2,
        "the profile's 4, capped by the 2 cores"
    );
    let note = plan.source_of("data.num_workers").unwrap().note.clone();
    assert!(
        note.as_deref()
            .is_some_and(|n| n.contains("generic-cpu's num_workers: profile said 4; this machine")),
        "{note:?}"
    );

    let (auto, auto_losses) = mlp_run(out.path(), "auto");
    let (fixed, fixed_losses) = mlp_run(out.path(), "0");
    // The worker count changed mid-epoch (0, 1, 2, then the one kept): the same batches in
    // the same order, so the same losses to the last bit, dropout included.
    assert_eq!(auto_losses, fixed_losses);
    assert!(fixed.summary.num_workers_auto.is_none());
    let choice = auto
        .summary
        .num_workers_auto
        .clone()
        .expect("a measurement");
    let tried: Vec<usize> = choice.measured.iter().map(|m| m.0).collect();
    assert_eq!(tried[..2], [0, 1], "{choice:?}");
    assert!(tried.contains(&choice.chosen), "{choice:?}");
    assert!(choice.measured.iter().all(|m| m.1 > 0.0));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(auto.run_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["num_workers_auto"]["chosen"], choice.chosen);
    let config = std::fs::read_to_string(auto.run_dir.join("config.json")).unwrap();
    assert!(
        config.contains("auto (measures 0 to 2 on the first steps)"),
        "{config}"
    );
}

/// The 3-D U-Net on its synthetic volumes: it learns to segment (validation Dice far above what
/// a constant map scores, 0) in a few steps, reports Dice and keeps the best checkpoint by it.
#[test]
fn a_small_unet3d_run_learns_to_segment_and_keeps_the_best_by_dice() {
    let out = tempfile::tempdir().unwrap();
    let plan = cpu_plan(&[
        "model.name=unet3d".into(),
        "model.channels=8,16".into(),
        "data.synthetic_samples=192".into(),
        "data.num_workers=0".into(),
        "train.epochs=3".into(),
        "train.warmup_steps=5".into(),
        "train.lr=0.003".into(),
        format!("run.output_dir={}", out.path().display()),
    ]);
    let mut seen = Collect::default();
    let outcome = train(&plan, Device::Cpu, None, RunControl::default(), &mut seen).unwrap();
    assert!(seen.1.unwrap().data.contains("[1, 32, 32, 32]"));
    let s = &outcome.summary;
    let dice = s.final_val.get("dice").unwrap();
    assert!(dice > 0.6, "val dice {dice}");
    assert!(s.best_val.get("dice").unwrap() >= dice);
    assert!(s.final_val.get("accuracy").unwrap() > 0.9);
    let best = std::fs::read_dir(outcome.run_dir.join("checkpoints"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("checkpoint.json")).ok())
        .filter_map(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .filter_map(|meta| meta["val_metrics"]["val_dice"].as_f64())
        .fold(f64::NAN, f64::max);
    assert!(
        (best - s.best_val.get("dice").unwrap()).abs() < 1e-9,
        "{best}"
    );
}
