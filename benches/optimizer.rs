//! One AdamW step over an 868k-parameter model: the native fused kernel against the same
//! update written as separate tensor ops (what `torch.optim.AdamW(foreach=False)` does).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kiln_torch_ext::optim::{AdamWConfig, AdamWTensors, fused_adamw_step};
use tch::{Device, Kind, Tensor};

/// Parameter shapes of a small MLP-ish model (weights and biases).
const SHAPES: [&[i64]; 6] = [
    &[512, 469],
    &[512],
    &[1024, 512],
    &[1024],
    &[100, 1024],
    &[100],
];

struct State {
    params: Vec<Tensor>,
    grads: Vec<Tensor>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    steps: Vec<Tensor>,
}

fn state() -> State {
    tch::manual_seed(0);
    let opts = (Kind::Float, Device::Cpu);
    let params: Vec<Tensor> = SHAPES.iter().map(|s| Tensor::randn(*s, opts)).collect();
    let zeros = || params.iter().map(Tensor::zeros_like).collect::<Vec<_>>();
    State {
        grads: SHAPES.iter().map(|s| Tensor::randn(*s, opts)).collect(),
        m: zeros(),
        v: zeros(),
        steps: params.iter().map(|_| Tensor::zeros([], opts)).collect(),
        params,
    }
}

fn fused_step(s: &mut State, c: &AdamWConfig) {
    for step in &mut s.steps {
        let _ = step.f_add_scalar_(1.0).expect("step increment");
    }
    let t = AdamWTensors {
        params: &s.params,
        grads: &s.grads,
        exp_avgs: &s.m,
        exp_avg_sqs: &s.v,
        max_exp_avg_sqs: &[],
        state_steps: &s.steps,
    };
    fused_adamw_step(t, c, None, None).expect("fused AdamW step");
}

fn unfused_step(s: &mut State, c: &AdamWConfig, step: i32) {
    let _guard = tch::no_grad_guard();
    let bc1 = 1.0 - c.beta1.powi(step);
    let bc2 = 1.0 - c.beta2.powi(step);
    for i in 0..s.params.len() {
        let g = &s.grads[i];
        let _ = s.params[i]
            .f_mul_scalar_(1.0 - c.lr * c.weight_decay)
            .unwrap();
        let _ = s.m[i].f_mul_scalar_(c.beta1).unwrap();
        let _ = s.m[i].f_add_(&(g * (1.0 - c.beta1))).unwrap();
        let _ = s.v[i].f_mul_scalar_(c.beta2).unwrap();
        let _ = s.v[i].f_add_(&(g * g * (1.0 - c.beta2))).unwrap();
        let denom = (s.v[i].sqrt() / bc2.sqrt()) + c.eps;
        let _ = s.params[i]
            .f_sub_(&(&s.m[i] / denom * (c.lr / bc1)))
            .unwrap();
    }
}

fn bench_adamw(crit: &mut Criterion) {
    let config = AdamWConfig::default();
    let n: i64 = SHAPES.iter().map(|s| s.iter().product::<i64>()).sum();
    let mut group = crit.benchmark_group("adamw_step");
    group.throughput(criterion::Throughput::Elements(n as u64));
    let mut fused = state();
    group.bench_function(BenchmarkId::new("fused", n), |b| {
        b.iter(|| fused_step(&mut fused, &config))
    });
    let mut plain = state();
    let mut step = 0;
    group.bench_function(BenchmarkId::new("unfused", n), |b| {
        b.iter(|| {
            step += 1;
            unfused_step(&mut plain, &config, step)
        })
    });
    group.finish();
}

criterion_group!(benches, bench_adamw);
criterion_main!(benches);
