//! The `Stepper`, the public hook the benchmarks measure kiln's step through: it learns, it is
//! deterministic from a seed, it times phases only when asked, and it evaluates.

mod common;

use kiln_config::{ModelKind, load};
use kiln_data::TargetSpec;
use kiln_device::settings::AmpDtype;
use kiln_train::model::InputSpec;
use kiln_train::source::build;
use kiln_train::stepper::{StepOptions, Stepper};
use tch::{Device, Kind, Tensor, nn};

/// The MLP reference model, its weights from `seed`, and one fixed batch of 64 separable
/// samples (the label is the argmax of the first 10 features).
fn mlp(
    seed: i64,
) -> (
    nn::VarStore,
    Box<dyn kiln_train::model::Model>,
    Tensor,
    Tensor,
) {
    tch::manual_seed(seed);
    let plan = load(&common::cpu_request(&["model.name=mlp"]))
        .unwrap()
        .plan;
    let (sample_shape, classes) = kiln_train::models::synthetic_shape(ModelKind::Mlp).unwrap();
    let input = InputSpec {
        sample_shape,
        classes,
        target: None,
        integer_features: false,
        arrays: vec![],
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let model = build(&plan.model, &input, &vs, false, 0).unwrap();
    let x = Tensor::randn([64, 64], (Kind::Float, Device::Cpu));
    let y = x.narrow(1, 0, 10).argmax(1, false);
    (vs, model, x, y)
}

fn losses(seed: i64, steps: usize) -> Vec<f64> {
    let (vs, model, x, y) = mlp(seed);
    let options = StepOptions::new(AmpDtype::None);
    let mut stepper = Stepper::new(model.as_ref(), "mlp", &vs, &options, Device::Cpu).unwrap();
    (0..steps).map(|_| stepper.step(&x, &y).unwrap()).collect()
}

#[test]
fn steps_learn_and_repeat_from_the_same_seed() {
    // The seed is the process's CPU generator: no other test may draw from it meanwhile.
    let _generator = kiln_torch_ext::rng::cpu_generator_lock();
    let a = losses(3, 30);
    assert!(a.iter().all(|l| l.is_finite()));
    assert!(
        a[29] < 0.5 * a[0],
        "30 steps on one batch should halve the loss: {a:?}"
    );
    assert_eq!(a, losses(3, 30), "the same seed gives the same losses");
    assert_ne!(a[0], losses(4, 1)[0], "another seed, other weights");
}

#[test]
fn phases_are_timed_only_when_asked_and_evaluation_reports_the_metrics() {
    let _generator = kiln_torch_ext::rng::cpu_generator_lock();
    let (vs, model, x, y) = mlp(5);
    let options = StepOptions {
        lr: 3e-3,
        ..StepOptions::new(AmpDtype::None)
    };
    let mut stepper = Stepper::new(model.as_ref(), "mlp", &vs, &options, Device::Cpu).unwrap();
    stepper.set_target(&TargetSpec::label(10)).unwrap();
    stepper.step(&x, &y).unwrap();
    assert!(stepper.phase_times().is_none());
    stepper.time_phases(true);
    let loss = stepper.step(&x, &y).unwrap();
    let times = stepper.phase_times().expect("timed");
    assert!(times.forward > std::time::Duration::ZERO);
    assert!(times.optimizer > std::time::Duration::ZERO);
    let halves = [
        (x.narrow(0, 0, 32), y.narrow(0, 0, 32)),
        (x.narrow(0, 32, 32), y.narrow(0, 32, 32)),
    ];
    let metrics = stepper.evaluate(halves).unwrap();
    let accuracy = metrics.get("accuracy").expect("a classifier's accuracy");
    assert!((0.0..=1.0).contains(&accuracy));
    // After two steps the held-out loss (the same batch, eval mode) is below the first step's.
    assert!(metrics.loss() < loss, "{} vs {loss}", metrics.loss());
}
