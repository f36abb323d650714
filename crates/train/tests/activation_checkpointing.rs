//! Activation checkpointing of the reference transformer: the same gradients (dropout masks
//! included) as without it, step after step, and less memory held for backward.

use kiln_config::{ModelKind, ModelPlan};
use kiln_torch_ext::profiler::{self, ProfilerOptions};
use kiln_train::model::InputSpec;
use kiln_train::model::Model;
use kiln_train::source::build;
use tch::{Device, Kind, Tensor, nn};

fn plan(checkpointing: bool, layers: u64, dropout: f64) -> ModelPlan {
    ModelPlan {
        dropout,
        d_model: 64,
        heads: 4,
        layers,
        ff: 256,
        hidden: vec![16],
        channels: vec![8],
        activation_checkpointing: checkpointing,
        ..ModelPlan::builtin(ModelKind::Transformer)
    }
}

fn spec() -> InputSpec {
    InputSpec {
        sample_shape: vec![32, 24],
        classes: 5,
        target: None,
        integer_features: false,
        arrays: vec![],
    }
}

/// Two transformers with identical weights, one of them checkpointed.
fn twins(layers: u64, dropout: f64) -> [(nn::VarStore, Box<dyn Model>); 2] {
    let make = |checkpointing| {
        let vs = nn::VarStore::new(Device::Cpu);
        let model = build(
            &plan(checkpointing, layers, dropout),
            &spec(),
            &vs,
            false,
            11,
        )
        .unwrap();
        (vs, model)
    };
    let (plain, ckpt) = (make(false), make(true));
    let source = plain.0.variables();
    let _guard = tch::no_grad_guard();
    for (name, mut target) in ckpt.0.variables() {
        target.copy_(&source[&name]);
    }
    drop(_guard);
    [plain, ckpt]
}

fn batch(seed: f64) -> (Tensor, Tensor) {
    let x = Tensor::arange(8 * 32 * 24, (Kind::Float, Device::Cpu))
        .f_mul_scalar(0.013)
        .unwrap()
        .f_add_scalar(seed)
        .unwrap()
        .sin()
        .reshape([8, 32, 24]);
    let y = Tensor::arange(8, (Kind::Int64, Device::Cpu)).remainder(5);
    (x, y)
}

fn grads(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, t)| (n, t.grad().copy()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn step(vs: &nn::VarStore, model: &dyn Model, x: &Tensor, y: &Tensor) -> Tensor {
    for t in vs.trainable_variables() {
        let mut g = t.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    let out = model.forward(x, true).unwrap();
    let loss = kiln_train::loss::Loss::CrossEntropy
        .compute(model, &out, y, None)
        .unwrap();
    loss.backward();
    loss
}

#[test]
fn checkpointed_transformer_gets_the_same_gradients_with_dropout() {
    let [(plain_vs, plain), (ckpt_vs, ckpt)] = twins(3, 0.2);
    for s in 0..3 {
        let (x, y) = batch(s as f64);
        let a = step(&plain_vs, plain.as_ref(), &x, &y);
        let b = step(&ckpt_vs, ckpt.as_ref(), &x, &y);
        assert!(a.equal(&b), "step {s}: losses differ");
        for ((name, ga), (_, gb)) in grads(&plain_vs).iter().zip(grads(&ckpt_vs)) {
            assert!(ga.defined() && gb.defined(), "{name} has no gradient");
            assert!(ga.equal(&gb), "step {s}: gradient of {name} differs");
        }
        // The recompute replayed the masks and left every generator where the forward did.
        assert_eq!(plain.rng_state(), ckpt.rng_state(), "step {s}");
    }
    // Evaluation (no training, no graph) is unaffected.
    let (x, _) = batch(9.0);
    let _guard = tch::no_grad_guard();
    assert!(
        plain
            .forward(&x, false)
            .unwrap()
            .equal(&ckpt.forward(&x, false).unwrap())
    );
}

#[test]
fn checkpointed_transformer_holds_less_memory_in_a_train_step() {
    let [(plain_vs, plain), (ckpt_vs, ckpt)] = twins(6, 0.1);
    let (x, y) = batch(0.5);
    let peak = |vs: &nn::VarStore, model: &dyn Model| {
        // Gradients exist before measuring, so both peaks count the same parameter memory.
        let _ = step(vs, model, &x, &y);
        let (_, bytes) = profiler::peak_allocated_during(ProfilerOptions::default(), || {
            let _ = step(vs, model, &x, &y);
        })
        .unwrap();
        bytes
    };
    let plain_peak = peak(&plain_vs, plain.as_ref());
    let ckpt_peak = peak(&ckpt_vs, ckpt.as_ref());
    eprintln!("train-step peak: plain {plain_peak} B, checkpointed {ckpt_peak} B");
    assert!(
        (ckpt_peak as f64) < 0.7 * plain_peak as f64,
        "checkpointed {ckpt_peak} B vs plain {plain_peak} B"
    );
}
