//! `model.attention` on the reference transformer: PyTorch's fused kernel and the explicit
//! product compute the same forward and the same gradients (to fp32 rounding), in training and
//! in evaluation, and the key parses from the words a user writes.

use kiln_config::{AttentionKernel, ModelKind, ModelPlan};
use kiln_train::loss::Loss;
use kiln_train::model::{InputSpec, Model};
use kiln_train::source::build;
use tch::{Device, Kind, Tensor, nn};

fn transformer(attention: AttentionKernel) -> (nn::VarStore, Box<dyn Model>) {
    let plan = ModelPlan {
        d_model: 64,
        heads: 4,
        layers: 2,
        ff: 128,
        attention,
        ..ModelPlan::builtin(ModelKind::Transformer)
    };
    let input = InputSpec {
        sample_shape: vec![16, 12],
        classes: 5,
        target: None,
        integer_features: false,
        arrays: vec![],
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let model = build(&plan, &input, &vs, false, 3).unwrap();
    (vs, model)
}

/// ‖a − b‖ / ‖b‖.
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let diff = (a - b).norm().double_value(&[]);
    diff / b.norm().double_value(&[]).max(1e-12)
}

/// The loss and each parameter's gradient of one train-mode step, by name.
fn step(vs: &nn::VarStore, model: &dyn Model, x: &Tensor, y: &Tensor) -> Vec<(String, Tensor)> {
    let out = model.forward(x, true).unwrap();
    Loss::CrossEntropy
        .compute(model, &out, y, None)
        .unwrap()
        .backward();
    let mut grads: Vec<_> = vs
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(name, t)| (name, t.grad().copy()))
        .collect();
    grads.sort_by(|a, b| a.0.cmp(&b.0));
    grads
}

#[test]
fn fused_and_explicit_attention_give_the_same_outputs_and_gradients() {
    let (fused_vs, fused) = transformer(AttentionKernel::Fused);
    let (math_vs, math) = transformer(AttentionKernel::Math);
    {
        let source = fused_vs.variables();
        let _guard = tch::no_grad_guard();
        for (name, mut target) in math_vs.variables() {
            target.copy_(&source[&name]);
        }
    }
    let x = Tensor::randn([6, 16, 12], (Kind::Float, Device::Cpu));
    let y = Tensor::arange(6, (Kind::Int64, Device::Cpu)).remainder(5);
    {
        let _guard = tch::no_grad_guard();
        let (a, b) = (
            fused.forward(&x, false).unwrap(),
            math.forward(&x, false).unwrap(),
        );
        assert!(
            relative(&b, &a) < 1e-5,
            "outputs differ by {}",
            relative(&b, &a)
        );
    }
    let want = step(&fused_vs, fused.as_ref(), &x, &y);
    let got = step(&math_vs, math.as_ref(), &x, &y);
    assert_eq!(want.len(), got.len());
    for ((name, a), (_, b)) in want.iter().zip(&got) {
        assert!(a.defined() && b.defined(), "{name} has no gradient");
        let err = relative(b, a);
        assert!(err < 1e-4, "{name}: gradients differ by {err:e} (relative)");
    }
}

#[test]
fn the_attention_key_takes_its_words_and_names_the_valid_ones() {
    for (word, kernel) in [
        ("auto", AttentionKernel::Auto),
        ("fused", AttentionKernel::Fused),
        ("sdpa", AttentionKernel::Fused),
        ("math", AttentionKernel::Math),
    ] {
        assert_eq!(word.parse::<AttentionKernel>().unwrap(), kernel);
    }
    let err = "flashy".parse::<AttentionKernel>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "`flashy` is not an attention kernel: use auto, fused or math"
    );
}
