//! `train.lr = "auto"`: the range test on a problem whose answer is known (linear least
//! squares, plain SGD: gradient descent diverges above 2/λ, λ the Hessian's largest
//! eigenvalue), and end to end: the rate reaches the run, the curve its directory, and a
//! later run takes the answer from the cache.

use std::path::Path;
use std::sync::Arc;

mod common;

use kiln_config::load;
use kiln_device::Device;
use kiln_train::lr_find::resolve_auto;
use kiln_train::model::ModelRecipe;
use kiln_train::prelude::*;
use kiln_train::run::{RunControl, train};

const SAMPLES: usize = 256;
const FEATURES: usize = 4;

/// Features of different scales (a spread of curvatures), a linear target plus a little
/// deterministic noise.
fn least_squares() -> (Vec<f32>, Vec<f32>) {
    let scale = [0.5f32, 1.0, 2.0, 3.0];
    let xs: Vec<f32> = (0..SAMPLES * FEATURES)
        .map(|i| {
            let u = ((i * 7919 + 13) % 1009) as f32 / 1009.0 - 0.5;
            u * 2.0 * scale[i % FEATURES]
        })
        .collect();
    let w = [1.5f32, -2.0, 0.7, 0.3];
    let ys = xs
        .chunks(FEATURES)
        .enumerate()
        .map(|(n, x)| {
            let noise = ((n * 31 % 17) as f32 / 17.0 - 0.5) * 0.1;
            x.iter().zip(w).map(|(a, b)| a * b).sum::<f32>() + 0.25 + noise
        })
        .collect();
    (xs, ys)
}

/// The largest eigenvalue of the mean squared error's Hessian in (weights, bias):
/// `(2/n)·AᵀA` with `A = [X 1]`.
fn largest_eigenvalue(xs: &[f32]) -> f64 {
    let x = Tensor::from_slice(xs)
        .reshape([SAMPLES as i64, FEATURES as i64])
        .to_kind(Kind::Double);
    let a = Tensor::cat(
        &[
            x,
            Tensor::ones([SAMPLES as i64, 1], (Kind::Double, tch::Device::Cpu)),
        ],
        1,
    );
    let h = a.tr().matmul(&a) * (2.0 / SAMPLES as f64);
    h.linalg_eigvalsh("L").max().double_value(&[])
}

fn linear(vs: &nn::VarStore, _input: &InputSpec) -> Result<Box<dyn Model>, TrainError> {
    let net = nn::linear(vs.root() / "fc", FEATURES as i64, 1, Default::default());
    Ok(Box::new(TchModule(net)))
}

#[test]
fn lr_auto_with_sgd_on_least_squares_lands_below_divergence_and_not_absurdly_small() {
    let (xs, ys) = least_squares();
    let lambda = largest_eigenvalue(&xs);
    let data = Arc::new(
        InMemory::with_targets(
            xs,
            vec![FEATURES],
            TargetSpec::Values { shape: vec![] },
            Targets::Values(ys),
        )
        .unwrap(),
    );
    let plan = load(&common::cpu_request(&[
        "train.lr=auto",
        "train.optimizer=sgd",
        "train.momentum=0",
        "train.weight_decay=0",
        "train.clip_grad_norm=0",
        "train.amp=fp32",
        &format!("train.batch_size={SAMPLES}"),
        // A run of 1,000 optimizer steps: long enough for the full 100-step test.
        "train.epochs=1000",
        "data.num_workers=0",
    ]))
    .unwrap()
    .plan;
    assert!(plan.train.lr_auto);
    let recipe = ModelRecipe {
        name: "linear".to_owned(),
        identity: "linear least squares".to_owned(),
        build: &linear,
        warmup_steps: 1,
        init_on_cpu: true,
    };
    let input = InputSpec::of(&[FEATURES], &data.target());
    let found = resolve_auto(&plan, &recipe, &input, data, tch::Device::Cpu, None).unwrap();
    let curve = found.curve.as_ref().unwrap();
    println!(
        "λ = {lambda:.4}, 2/λ = {:.4e}, 1/(10λ) = {:.4e}, found {:.4e} after {} steps (diverged: {}); {}",
        2.0 / lambda,
        1.0 / (10.0 * lambda),
        found.lr,
        curve.lrs.len(),
        curve.diverged,
        found.note
    );
    assert!(
        found.lr > 1.0 / (10.0 * lambda) && found.lr < 2.0 / lambda,
        "λ = {lambda}: {} is outside (1/(10λ), 2/λ) = ({}, {})",
        found.lr,
        1.0 / (10.0 * lambda),
        2.0 / lambda
    );
    let (first, best) = (
        curve.losses[0],
        curve.losses.iter().copied().fold(f64::INFINITY, f64::min),
    );
    assert!(best < 0.1 * first, "the sweep trains: {first} → {best}");
    assert!(found.note.contains("range test"), "{}", found.note);
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn lr_auto_trains_at_the_found_rate_writes_the_curve_and_caches_the_answer() {
    let out = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let plan = load(&common::run_request(
        out.path(),
        &[
            "model.name=mlp",
            "data.synthetic_samples=1024",
            "data.num_workers=0",
            // 921 training samples, 28 steps an epoch, 1,008 in all: long enough for the full
            // 100-step test.
            "train.batch_size=32",
            "train.epochs=36",
            "checkpoint.enabled=false",
        ],
        &["train.lr=auto"],
    ))
    .unwrap()
    .plan;
    let control = || RunControl {
        cache_dir: Some(cache.path().to_owned()),
        ..RunControl::default()
    };
    let first = train(&plan, Device::Cpu, None, control(), &mut Silent).unwrap();
    let curve = read_json(&first.run_dir.join("lr_find.json"));
    assert!(first.run_dir.join("lr_find.png").is_file());
    let lrs = curve["lr"].as_array().unwrap();
    assert!((12..=100).contains(&lrs.len()), "{}", lrs.len());
    assert_eq!(curve["loss"].as_array().unwrap().len(), lrs.len());
    let suggested = curve["suggestion"].as_f64().unwrap();
    assert!((1e-8..=1.0).contains(&suggested));
    // The run trained at the rate found: its recorded configuration says so.
    let config = read_json(&first.run_dir.join("config.json"));
    let shown = config.to_string();
    assert!(
        shown.contains(&suggested.to_string()) || !shown.contains("\"auto"),
        "{shown}"
    );
    let cached = read_json(&cache.path().join("lr-find.json"));
    let entries = cached.as_object().unwrap();
    assert_eq!(entries.len(), 1);
    let (key, answer) = entries.iter().next().unwrap();
    assert!(key.contains("mlp") && key.contains("batch 32"), "{key}");
    assert!(!key.contains("sweep"), "a full test's key: {key}");
    assert_eq!(answer["lr"].as_f64(), Some(suggested));

    // The same question again: the cache answers, no test runs and no curve is written.
    let second = train(&plan, Device::Cpu, None, control(), &mut Silent).unwrap();
    assert!(!second.run_dir.join("lr_find.json").exists());
    assert_eq!(read_json(&cache.path().join("lr-find.json")), cached);
}

/// The start of every run it watches.
#[derive(Default)]
struct Starts(Vec<kiln_train::record::RunStart>);

impl Observer for Starts {
    fn on_start(&mut self, start: &kiln_train::record::RunStart) -> Result<(), TrainError> {
        self.0.push(start.clone());
        Ok(())
    }
}

#[test]
fn a_resumed_run_keeps_the_rate_its_checkpoint_records_and_tests_none() {
    let out = tempfile::tempdir().unwrap();
    let plan_for = |epochs: &str| {
        load(&common::run_request(
            out.path(),
            &[
                "model.name=mlp",
                "data.synthetic_samples=256",
                "data.num_workers=0",
                // 28 steps an epoch: 308 in the first run, a range test of 30 steps.
                "train.batch_size=8",
                epochs,
                "checkpoint.every_steps=40",
            ],
            &["train.lr=auto"],
        ))
        .unwrap()
        .plan
    };
    // No cache: a new run tests, and a resumed one would test again if it did not keep its rate.
    let mut starts = Starts::default();
    let first = train(
        &plan_for("train.epochs=11"),
        Device::Cpu,
        None,
        RunControl::default(),
        &mut starts,
    )
    .unwrap();
    assert!(first.run_dir.join("lr_find.json").is_file());
    let latest = std::fs::read_dir(first.run_dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("step-")
        })
        .max()
        .expect("a checkpoint");
    let meta = read_json(&latest.join("checkpoint.json"));
    let found = starts.0[0].lr;
    assert_eq!(meta["lr"].as_f64(), Some(found), "{meta}");
    assert!(starts.0[0].lr_search.as_ref().unwrap().contains("auto"));
    std::fs::remove_file(first.run_dir.join("lr_find.json")).unwrap();
    let control = RunControl {
        resume: Some(Resume::Latest),
        ..RunControl::default()
    };
    train(
        &plan_for("train.epochs=12"),
        Device::Cpu,
        None,
        control,
        &mut starts,
    )
    .unwrap();
    let resumed = &starts.0[1];
    assert_eq!(resumed.lr, found);
    let note = resumed.lr_search.as_ref().unwrap();
    assert!(note.contains("as the resumed run found"), "{note}");
    assert!(
        !first.run_dir.join("lr_find.json").exists(),
        "the resumed run ran a range test"
    );
}

#[test]
fn a_run_too_short_for_a_range_test_keeps_its_rate_and_says_why() {
    let out = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let plan = load(&common::run_request(
        out.path(),
        &[
            "model.name=mlp",
            "data.synthetic_samples=256",
            "data.num_workers=0",
            "train.batch_size=32",
            "train.epochs=3",
            "checkpoint.enabled=false",
        ],
        &["train.lr=auto"],
    ))
    .unwrap()
    .plan;
    // 230 training samples: 7 steps an epoch, 21 in all; a test of 30 steps would be more
    // than 10 % of them.
    let mut starts = Starts::default();
    let control = RunControl {
        cache_dir: Some(cache.path().to_owned()),
        ..RunControl::default()
    };
    let run = train(&plan, Device::Cpu, None, control, &mut starts).unwrap();
    assert!(!run.run_dir.join("lr_find.json").exists());
    assert!(!cache.path().join("lr-find.json").exists());
    assert_eq!(starts.0[0].lr, plan.train.lr);
    let note = starts.0[0].lr_search.as_ref().unwrap();
    assert!(
        note.contains("21 optimizer steps are too few for a range test")
            && note.contains("lr-find"),
        "{note}"
    );
}
