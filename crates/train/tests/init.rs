//! Initialisation as PyTorch's: every layer kiln's models build starts from the distribution of
//! PyTorch's default module of that kind (checked against the formulas here, and against
//! PyTorch itself over many seeds), and the reference models start from their PyTorch twins'
//! very weights for the same seed.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

mod common;

use kiln_config::{ModelKind, load};
use kiln_train::init;
use kiln_train::model::InputSpec;
use kiln_train::source::build;
use serde_json::Value;
use tch::{Device, Kind, Tensor, nn};

const SEEDS: i64 = 200;

/// Every tensor of one freshly built layer, by name (`weight`, `bias`, `running_mean`…).
type Draw = Vec<(String, Tensor)>;

/// The layers the initialisers build, each as PyTorch's script builds its twin.
fn layer(kind: &str) -> Draw {
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    match kind {
        "linear" => drop(init::linear(&root, 37, 50, true)),
        "conv2d" => {
            let config = nn::ConvConfig {
                groups: 2,
                ..Default::default()
            };
            drop(init::conv2d(&root, 6, 8, 3, config));
        }
        "layer_norm" => drop(init::layer_norm(&root, 20)),
        "batch_norm2d" => drop(init::batch_norm2d(&root, 9)),
        "embedding" => drop(init::embedding(&root, 30, 16)),
        other => panic!("no layer {other}"),
    }
    vs.variables().into_iter().collect()
}

const LAYERS: [&str; 5] = [
    "linear",
    "conv2d",
    "layer_norm",
    "batch_norm2d",
    "embedding",
];

/// Min, max, mean, (population) variance and count of each tensor name over `seeds`' draws.
fn stats(kind: &str, seeds: std::ops::Range<i64>) -> BTreeMap<String, [f64; 5]> {
    let mut drawn: BTreeMap<String, Vec<Tensor>> = BTreeMap::new();
    for seed in seeds {
        tch::manual_seed(seed);
        for (name, t) in layer(kind) {
            drawn
                .entry(format!("{kind}.{name}"))
                .or_default()
                .push(t.flatten(0, -1).to_kind(Kind::Double));
        }
    }
    drawn
        .into_iter()
        .map(|(name, parts)| {
            let x = Tensor::cat(&parts, 0);
            let v = |t: Tensor| t.double_value(&[]);
            let s = [
                v(x.min()),
                v(x.max()),
                v(x.mean(None)),
                v(x.var_correction(None::<&[i64]>, 0i64, false)),
                x.numel() as f64,
            ];
            (name, s)
        })
        .collect()
}

/// What PyTorch's defaults are, by formula: U(±1/√fan_in) for Linear and Conv2d weights and
/// biases, constants for the norms, N(0, 1) for embeddings. Returns (lower, upper, variance),
/// with lower = upper for a constant.
fn pytorch_default(name: &str) -> (f64, f64, f64) {
    let uniform = |fan_in: f64| {
        let b = 1.0 / fan_in.sqrt();
        (-b, b, b * b / 3.0)
    };
    match name {
        "linear.weight" | "linear.bias" => uniform(37.0),
        "conv2d.weight" | "conv2d.bias" => uniform(3.0 * 9.0),
        "layer_norm.weight" | "batch_norm2d.weight" | "batch_norm2d.running_var" => (1.0, 1.0, 0.0),
        "layer_norm.bias" | "batch_norm2d.bias" | "batch_norm2d.running_mean" => (0.0, 0.0, 0.0),
        "embedding.weight" => (f64::NEG_INFINITY, f64::INFINITY, 1.0),
        other => panic!("no formula for {other}"),
    }
}

#[test]
fn every_initialiser_draws_pytorchs_default_distribution() {
    // The tests of this file seed and draw from libtorch's one CPU generator: one at a time.
    let _generator = kiln_torch_ext::rng::cpu_generator_lock();
    for kind in LAYERS {
        for (name, [min, max, mean, var, n]) in stats(kind, 0..SEEDS) {
            let (lo, hi, expected_var) = pytorch_default(&name);
            assert!(
                min >= lo && max <= hi,
                "{name}: [{min}, {max}] outside [{lo}, {hi}]"
            );
            if lo.is_finite() && lo < hi {
                // Thousands of draws reach within 1% of each bound.
                let reach = 0.01 * (hi - lo);
                assert!(
                    min < lo + reach && max > hi - reach,
                    "{name}: [{min}, {max}]"
                );
            }
            // Five standard errors of the mean and of the variance for n draws.
            let tolerance = 5.0 * expected_var * (2.0 / n).sqrt() + 1e-12;
            assert!(
                (var - expected_var).abs() <= tolerance,
                "{name}: variance {var}, PyTorch's {expected_var}"
            );
            let centre = (lo + hi) / 2.0;
            let centre = if centre.is_finite() { centre } else { 0.0 };
            assert!(
                (mean - centre).abs() <= 5.0 * (expected_var / n).sqrt() + 1e-12,
                "{name}: mean {mean}"
            );
        }
    }
}

#[test]
fn tch_defaults_are_not_pytorchs_which_is_why_kiln_has_its_own() {
    // The tests of this file seed and draw from libtorch's one CPU generator: one at a time.
    let _generator = kiln_torch_ext::rng::cpu_generator_lock();
    // The gap the initialisers close: tch's Linear weight is Kaiming-uniform with ReLU gain,
    // 6× PyTorch's variance, and its BatchNorm weight is U(0, 1) where PyTorch's is 1.
    let mut var = vec![];
    let mut bn = vec![];
    for seed in 0..20 {
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(Device::Cpu);
        let l = nn::linear(vs.root(), 37, 50, Default::default());
        var.push(l.ws.var(false).double_value(&[]));
        let b = nn::batch_norm2d(vs.root() / "bn", 9, Default::default());
        bn.push(b.ws.unwrap().min().double_value(&[]));
    }
    let var = var.iter().sum::<f64>() / var.len() as f64;
    let ratio = var / (1.0 / (3.0 * 37.0));
    assert!(
        (5.5..6.5).contains(&ratio),
        "tch's variance is {ratio}× PyTorch's"
    );
    assert!(bn.iter().all(|&m| m < 1.0));
}

fn reference_plan(kind: ModelKind) -> (kiln_config::ModelPlan, InputSpec) {
    let set = format!("model.name={kind}");
    let plan = load(&common::cpu_request(&[set])).unwrap().plan;
    let (sample_shape, classes) = kiln_train::models::synthetic_shape(kind).unwrap();
    // The U-Net predicts a class per voxel; the others one label per sample.
    let target = (kind == ModelKind::Unet3d).then(|| kiln_data::TargetSpec::Classes {
        classes,
        shape: sample_shape[1..].to_vec(),
    });
    (
        plan.model,
        InputSpec {
            sample_shape,
            classes,
            target,
            integer_features: false,
            arrays: vec![],
        },
    )
}

/// Runs the PyTorch side of these tests: `init_twins.py WHAT OUT SEEDS…`.
fn pytorch(what: &str, out: &Path, seeds: impl Iterator<Item = i64>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/init_twins.py");
    let o = Command::new(common::python_with_torch())
        .arg(script)
        .arg(what)
        .arg(out)
        .args(seeds.map(|s| s.to_string()))
        .output()
        .expect("Python runs");
    assert!(
        o.status.success(),
        "init_twins.py {what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON); `cargo xtask test` runs it"]
fn initialisers_match_pytorchs_modules_over_many_seeds_with_python_torch() {
    // The tests of this file seed and draw from libtorch's one CPU generator: one at a time.
    let _generator = kiln_torch_ext::rng::cpu_generator_lock();
    let tmp = tempfile::tempdir().unwrap();
    // Other seeds than kiln's draws below: the distributions are compared, not the same draws.
    pytorch("layers", tmp.path(), 10_000..10_000 + SEEDS);
    let theirs: Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("layers.json")).unwrap()).unwrap();
    let mut compared = 0;
    for kind in LAYERS {
        for (name, [min, max, mean, var, n]) in stats(kind, 0..SEEDS) {
            let t = &theirs[&name];
            let f = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{name}.{k}: {t}"));
            let spread = (f("max") - f("min")).max(f("var").sqrt()).max(1e-12);
            for (what, ours, pt) in [("min", min, f("min")), ("max", max, f("max"))] {
                let within = if name == "embedding.weight" {
                    0.1
                } else {
                    0.01
                };
                assert!(
                    (ours - pt).abs() <= within * spread,
                    "{name} {what}: kiln {ours}, PyTorch {pt}"
                );
            }
            // Two samples of n draws each: within five standard errors of their difference.
            assert!(
                (var - f("var")).abs() <= 5.0 * f("var") * (4.0 / n).sqrt() + 1e-12,
                "{name} variance: kiln {var}, PyTorch {}",
                f("var")
            );
            assert!(
                (mean - f("mean")).abs() <= 5.0 * (2.0 * f("var") / n).sqrt() + 1e-12,
                "{name} mean: kiln {mean}, PyTorch {}",
                f("mean")
            );
            assert_eq!(n, f("count"), "{name}");
            compared += 1;
        }
    }
    assert_eq!(compared, theirs.as_object().unwrap().len(), "{theirs}");
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON); `cargo xtask test` runs it"]
fn reference_models_start_from_their_pytorch_twins_weights_with_python_torch() {
    // The tests of this file seed and draw from libtorch's one CPU generator: one at a time.
    let _generator = kiln_torch_ext::rng::cpu_generator_lock();
    let tmp = tempfile::tempdir().unwrap();
    let seeds = [0i64, 1, 7];
    pytorch("models", tmp.path(), seeds.into_iter());
    for kind in ModelKind::ALL {
        let (plan, input) = reference_plan(kind);
        for seed in seeds {
            tch::manual_seed(seed);
            let vs = nn::VarStore::new(Device::Cpu);
            build(&plan, &input, &vs, false, seed as u64).unwrap();
            let file = tmp.path().join(format!("{kind}-{seed}.safetensors"));
            let bytes = std::fs::read(&file).unwrap();
            let theirs: BTreeMap<String, Tensor> =
                kiln_train::weights::from_safetensors(&bytes, &file)
                    .unwrap()
                    .into_iter()
                    .collect();
            let ours: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
            assert_eq!(
                ours.keys().collect::<Vec<_>>(),
                theirs.keys().collect::<Vec<_>>(),
                "{kind}"
            );
            for (name, t) in &ours {
                assert!(
                    t.equal(&theirs[name]),
                    "{kind} seed {seed}: `{name}` differs from PyTorch's"
                );
            }
        }
    }
}

#[test]
fn a_traced_reference_model_takes_any_batch_size() {
    // The tests of this file seed and draw from libtorch's one CPU generator: one at a time.
    let _generator = kiln_torch_ext::rng::cpu_generator_lock();
    // Export (TorchScript, then ONNX) traces the model at one batch size; the trace must not
    // keep it. The transformer's attention reshapes are where it would.
    for kind in [ModelKind::Mlp, ModelKind::Transformer, ModelKind::ConvNet] {
        let (plan, input) = reference_plan(kind);
        tch::manual_seed(3);
        let mut vs = nn::VarStore::new(Device::Cpu);
        let model = build(&plan, &input, &vs, false, 3).unwrap();
        vs.freeze();
        let sample: Vec<i64> = input.sample_shape.iter().map(|&d| d as i64).collect();
        let batch =
            |n: i64| Tensor::randn([&[n][..], &sample].concat(), (Kind::Float, Device::Cpu));
        let traced = tch::CModule::create_by_tracing("m", "forward", &[batch(2)], &mut |xs| {
            vec![model.forward(&xs[0], false).unwrap()]
        })
        .unwrap();
        let x = batch(5);
        let eager = tch::no_grad(|| model.forward(&x, false).unwrap());
        let replay = traced.forward_ts(&[x]).unwrap();
        assert_eq!(replay.size(), eager.size(), "{kind}");
        let gap = (replay - eager).abs().max().double_value(&[]);
        assert!(
            gap < 1e-5,
            "{kind}: traced at batch 2, run at 5: max |Δ| {gap}"
        );
    }
}
