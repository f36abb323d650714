//! The fused AdamW kernel against AdamW written out by hand, over many steps.

use kiln_torch_ext::Error;
use kiln_torch_ext::optim::{
    AdamWConfig, AdamWTensors, fused_adamw_step, fused_adamw_step_lr_tensor,
};
use tch::{Device, Kind, Tensor};

/// AdamW exactly as the paper and `torch.optim.AdamW` define it, in f64.
struct ReferenceAdamW {
    params: Vec<f64>,
    m: Vec<f64>,
    v: Vec<f64>,
    vmax: Vec<f64>,
    step: i32,
}

impl ReferenceAdamW {
    fn new(params: Vec<f64>) -> Self {
        let n = params.len();
        Self {
            params,
            m: vec![0.0; n],
            v: vec![0.0; n],
            vmax: vec![0.0; n],
            step: 0,
        }
    }

    #[allow(
        clippy::needless_range_loop,
        reason = "written like the paper's pseudo-code"
    )]
    fn step(&mut self, grads: &[f64], c: &AdamWConfig) {
        self.step += 1;
        let bc1 = 1.0 - c.beta1.powi(self.step);
        let bc2 = 1.0 - c.beta2.powi(self.step);
        for i in 0..self.params.len() {
            let g = if c.maximize { -grads[i] } else { grads[i] };
            self.params[i] *= 1.0 - c.lr * c.weight_decay;
            self.m[i] = c.beta1 * self.m[i] + (1.0 - c.beta1) * g;
            self.v[i] = c.beta2 * self.v[i] + (1.0 - c.beta2) * g * g;
            let v = if c.amsgrad {
                self.vmax[i] = self.vmax[i].max(self.v[i]);
                self.vmax[i]
            } else {
                self.v[i]
            };
            let denom = v.sqrt() / bc2.sqrt() + c.eps;
            self.params[i] -= c.lr / bc1 * self.m[i] / denom;
        }
    }
}

/// Deterministic pseudo-random values in [-1, 1) (a small LCG, so the test needs no RNG crate).
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

fn to_vec(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap()
}

struct Fused {
    params: Vec<Tensor>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    vmax: Vec<Tensor>,
    steps: Vec<Tensor>,
}

impl Fused {
    fn new(init: &[Vec<f64>], shapes: &[&[i64]], amsgrad: bool) -> Self {
        let params: Vec<Tensor> = init
            .iter()
            .zip(shapes)
            .map(|(vals, shape)| {
                Tensor::from_slice(vals)
                    .to_kind(Kind::Float)
                    .reshape(*shape)
            })
            .collect();
        let zeros = || params.iter().map(Tensor::zeros_like).collect::<Vec<_>>();
        Self {
            m: zeros(),
            v: zeros(),
            vmax: if amsgrad { zeros() } else { vec![] },
            steps: params
                .iter()
                .map(|_| Tensor::zeros([], (Kind::Float, Device::Cpu)))
                .collect(),
            params,
        }
    }

    fn step(
        &mut self,
        grads: &[Tensor],
        c: &AdamWConfig,
        scale: Option<&Tensor>,
        inf: Option<&Tensor>,
    ) {
        for s in &mut self.steps {
            let _ = s.f_add_scalar_(1.0).unwrap();
        }
        let tensors = AdamWTensors {
            params: &self.params,
            grads,
            exp_avgs: &self.m,
            exp_avg_sqs: &self.v,
            max_exp_avg_sqs: &self.vmax,
            state_steps: &self.steps,
        };
        fused_adamw_step(tensors, c, scale, inf).unwrap();
    }
}

fn run_against_reference(config: AdamWConfig, steps: u64) -> f64 {
    let shapes: [&[i64]; 3] = [&[8, 5], &[5], &[3, 2, 2]];
    let init: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| values(100 + i as u64, s.iter().product::<i64>() as usize))
        .collect();
    let mut fused = Fused::new(&init, &shapes, config.amsgrad);
    let mut reference: Vec<ReferenceAdamW> =
        init.iter().cloned().map(ReferenceAdamW::new).collect();
    let mut worst: f64 = 0.0;
    for step in 0..steps {
        let grads: Vec<Vec<f64>> = init
            .iter()
            .enumerate()
            .map(|(i, p)| values(step * 31 + i as u64, p.len()))
            .collect();
        let grad_tensors: Vec<Tensor> = grads
            .iter()
            .zip(&shapes)
            .map(|(g, s)| Tensor::from_slice(g).to_kind(Kind::Float).reshape(*s))
            .collect();
        fused.step(&grad_tensors, &config, None, None);
        for (r, g) in reference.iter_mut().zip(&grads) {
            r.step(g, &config);
        }
        for (p, r) in fused.params.iter().zip(&reference) {
            for (a, b) in to_vec(p).iter().zip(&r.params) {
                worst = worst.max((a - b).abs());
            }
        }
    }
    worst
}

#[test]
fn fused_adamw_matches_reference_over_many_steps() {
    let config = AdamWConfig {
        lr: 1e-2,
        weight_decay: 0.1,
        ..AdamWConfig::default()
    };
    let worst = run_against_reference(config, 200);
    assert!(
        worst < 2e-5,
        "fused AdamW drifted {worst} from the reference"
    );
}

#[test]
fn fused_adamw_amsgrad_and_maximize_match_reference() {
    for (amsgrad, maximize) in [(true, false), (false, true), (true, true)] {
        let config = AdamWConfig {
            lr: 5e-3,
            amsgrad,
            maximize,
            ..AdamWConfig::default()
        };
        let worst = run_against_reference(config, 100);
        assert!(
            worst < 2e-5,
            "amsgrad={amsgrad} maximize={maximize}: drift {worst}"
        );
    }
}

#[test]
fn reference_really_moves_the_parameters() {
    // Guards the comparison above against a kernel that does nothing and a reference that
    // does nothing: after 50 steps the parameters are far from where they started.
    let init = values(7, 10);
    let mut r = ReferenceAdamW::new(init.clone());
    let c = AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    };
    for s in 0..50 {
        r.step(&values(s, 10), &c);
    }
    let moved: f64 = r.params.iter().zip(&init).map(|(a, b)| (a - b).abs()).sum();
    assert!(moved > 0.05, "moved only {moved}");
}

#[test]
fn grad_scale_is_folded_in_and_found_inf_skips_the_step() {
    let config = AdamWConfig::default();
    let init = vec![values(1, 6)];
    let shapes: [&[i64]; 1] = [&[6]];
    let grads = Tensor::from_slice(&values(2, 6)).to_kind(Kind::Float);

    let mut plain = Fused::new(&init, &shapes, false);
    plain.step(std::slice::from_ref(&grads), &config, None, None);

    // Gradients scaled by 1024 and unscaled inside the kernel give the same update.
    let mut scaled = Fused::new(&init, &shapes, false);
    let scale = Tensor::from(1024f32);
    let no_inf = Tensor::from(0f32);
    scaled.step(&[&grads * 1024.0], &config, Some(&scale), Some(&no_inf));
    let diff = (&plain.params[0] - &scaled.params[0])
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < 1e-6, "scaled update differs by {diff}");

    // found_inf set: the parameters do not move.
    let mut skipped = Fused::new(&init, &shapes, false);
    let before = skipped.params[0].copy();
    let inf = Tensor::from(1f32);
    skipped.step(&[&grads * 1024.0], &config, Some(&scale), Some(&inf));
    assert!(
        skipped.params[0].equal(&before),
        "a found_inf step must not update"
    );
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let p = [Tensor::zeros([3], (Kind::Float, Device::Cpu))];
    let g = [Tensor::zeros([3], (Kind::Float, Device::Cpu))];
    let s = [Tensor::zeros([], (Kind::Float, Device::Cpu))];
    let good = AdamWTensors {
        params: &p,
        grads: &g,
        exp_avgs: &g,
        exp_avg_sqs: &g,
        max_exp_avg_sqs: &[],
        state_steps: &s,
    };

    let missing = AdamWTensors { grads: &[], ..good };
    let err = fused_adamw_step(missing, &AdamWConfig::default(), None, None).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("1 params but 0 grads"), "{err}");

    let bad_beta = AdamWConfig {
        beta2: 1.0,
        ..AdamWConfig::default()
    };
    let err = fused_adamw_step(good, &bad_beta, None, None).unwrap_err();
    assert!(
        err.to_string().contains("beta2 must be in [0, 1), got 1"),
        "{err}"
    );

    let amsgrad = AdamWConfig {
        amsgrad: true,
        ..AdamWConfig::default()
    };
    let err = fused_adamw_step(good, &amsgrad, None, None).unwrap_err();
    assert!(
        err.to_string().contains("max_exp_avg_sqs must hold 1"),
        "{err}"
    );

    // libtorch's CPU kernel does not check shapes itself; the wrapper must.
    let wrong = [Tensor::zeros([4], (Kind::Float, Device::Cpu))];
    let mismatched = AdamWTensors {
        grads: &wrong,
        ..good
    };
    let err = fused_adamw_step(mismatched, &AdamWConfig::default(), None, None).unwrap_err();
    assert!(
        err.to_string()
            .contains("param 0 has shape [3] but its grad has shape [4]"),
        "{err}"
    );

    // Integer parameters are rejected inside libtorch: its C++ exception must come back as an
    // error naming the operation, not as an abort.
    let ints = [Tensor::zeros([3], (Kind::Int64, Device::Cpu))];
    let int_params = AdamWTensors {
        params: &ints,
        grads: &ints,
        exp_avgs: &ints,
        exp_avg_sqs: &ints,
        ..good
    };
    let err = fused_adamw_step(int_params, &AdamWConfig::default(), None, None).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Torch {
                op: "fused AdamW",
                ..
            }
        ),
        "{err}"
    );
    eprintln!("libtorch's own error came back as: {err}");
}

/// The learning rate read from a tensor (what a step captured in a CUDA graph uses) updates
/// exactly as the rate passed as a number, at every step of a changing schedule.
#[test]
fn a_learning_rate_tensor_updates_as_the_number_does() {
    let shapes: [&[i64]; 2] = [&[6, 4], &[4]];
    let init: Vec<Vec<f64>> = (0..2)
        .map(|i| values(i, 24 / (i as usize * 5 + 1)))
        .collect();
    let mut by_number = Fused::new(&init, &shapes, false);
    let mut by_tensor = Fused::new(&init, &shapes, false);
    let lr = Tensor::zeros([], (Kind::Float, Device::Cpu));
    for step in 0..5u64 {
        let grads: Vec<Tensor> = by_number
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                Tensor::from_slice(&values(100 + step * 7 + i as u64, p.numel()))
                    .to_kind(Kind::Float)
                    .reshape(p.size())
            })
            .collect();
        let rate = 1e-2 / (step + 1) as f64;
        let config = AdamWConfig {
            lr: rate,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        };
        by_number.step(&grads, &config, None, None);
        let _ = lr.shallow_clone().fill_(rate as f32 as f64);
        for s in &mut by_tensor.steps {
            let _ = s.f_add_scalar_(1.0).unwrap();
        }
        let tensors = AdamWTensors {
            params: &by_tensor.params,
            grads: &grads,
            exp_avgs: &by_tensor.m,
            exp_avg_sqs: &by_tensor.v,
            max_exp_avg_sqs: &[],
            state_steps: &by_tensor.steps,
        };
        let wrong = AdamWConfig {
            lr: 123.0,
            ..config
        };
        fused_adamw_step_lr_tensor(tensors, &wrong, &lr, None, None).unwrap();
        for (a, b) in by_number.params.iter().zip(&by_tensor.params) {
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(
                diff <= 1e-7,
                "step {step}: the tensor rate moved the weights differently by {diff}"
            );
        }
    }
    let tensors = AdamWTensors {
        params: &by_tensor.params,
        grads: &by_tensor.params,
        exp_avgs: &by_tensor.m,
        exp_avg_sqs: &by_tensor.v,
        max_exp_avg_sqs: &[],
        state_steps: &by_tensor.steps,
    };
    let two = Tensor::zeros([2], (Kind::Float, Device::Cpu));
    let err = fused_adamw_step_lr_tensor(tensors, &AdamWConfig::default(), &two, None, None);
    assert!(err.unwrap_err().to_string().contains("one float32 value"));
}
