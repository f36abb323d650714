//! One AdamW step over an 868k-parameter model: the native fused kernel against the same
//! update written as separate tensor ops (what `torch.optim.AdamW(foreach=False)` does).
//!
//! Runs on the first CUDA device when there is one, else on the CPU (it says which on stderr).
//! Each measured iteration ends with a device synchronisation, so the clock sees the finished
//! step rather than the launch of its kernels (a no-op on the CPU).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kiln_benches::unfused::UnfusedAdamW;
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

fn state(device: Device) -> State {
    tch::manual_seed(0);
    let opts = (Kind::Float, device);
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

/// Waits for all work queued on `device` (nothing to wait for on the CPU).
fn synchronize(device: Device) {
    kiln_torch_ext::cuda::synchronize(device).expect("device synchronize");
}

fn bench_adamw(crit: &mut Criterion) {
    let device = Device::cuda_if_available();
    eprintln!(
        "optimizer: running on {device:?}{}",
        if device == Device::Cpu {
            " (no CUDA device)"
        } else {
            ""
        }
    );
    let config = AdamWConfig::default();
    let n: i64 = SHAPES.iter().map(|s| s.iter().product::<i64>()).sum();
    let mut group = crit.benchmark_group("adamw_step");
    group.throughput(criterion::Throughput::Elements(n as u64));
    let on = if device == Device::Cpu { "cpu" } else { "cuda" };
    let mut fused = state(device);
    group.bench_function(BenchmarkId::new(format!("fused/{on}"), n), |b| {
        b.iter(|| {
            fused_step(&mut fused, &config);
            synchronize(device);
        })
    });
    let plain = state(device);
    let decay = vec![config.weight_decay; plain.params.len()];
    let mut unfused = UnfusedAdamW::new(&plain.params, decay, config.lr).expect("unfused state");
    group.bench_function(BenchmarkId::new(format!("unfused/{on}"), n), |b| {
        b.iter(|| {
            unfused
                .step(&plain.params, &plain.grads)
                .expect("unfused AdamW step");
            synchronize(device);
        })
    });
    group.finish();
}

criterion_group!(benches, bench_adamw);
criterion_main!(benches);
