//! One batch's metric sums, as every train step computes them (`MetricSet::batch_sums`): the
//! loss and accuracy over 100-class logits, and the loss, MAE and RMSE over a 24-value horizon,
//! at batch 32 on the CPU. On the CPU the ops run as they are called, so the clock sees the
//! work itself; the figure is the per-step cost of reporting metrics beside a step's time.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kiln_train::metrics::{MetricKind, MetricSet};
use tch::{Device, Kind, Tensor};

fn bench(c: &mut Criterion) {
    tch::manual_seed(0);
    let mut group = c.benchmark_group("metric_sums");
    let cpu = (Kind::Float, Device::Cpu);
    let loss = Tensor::from(1.5f32);
    let logits = Tensor::randn([32, 100], cpu);
    let labels = Tensor::randint(100, [32], (Kind::Int64, Device::Cpu));
    let horizon = Tensor::randn([32, 24], cpu);
    let truth = Tensor::randn([32, 24], cpu);
    let cases = [
        ("accuracy", MetricKind::Accuracy, &logits, &labels),
        ("regression", MetricKind::Regression, &horizon, &truth),
        ("loss_only", MetricKind::LossOnly, &horizon, &truth),
    ];
    for (name, kind, output, target) in cases {
        let set = MetricSet::for_task(kind);
        group.bench_function(BenchmarkId::new(name, 32), |b| {
            b.iter(|| set.batch_sums(&loss, output, target).expect("metric sums"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
