//! The loader alone: one epoch of SignTransformer-shaped samples (64 × 469 floats, batch 32) from
//! the synthetic dataset, at 0, 1 and 2 workers. The per-sample work is generating the sample.
//!
//! Host-side only, on any machine: the loader's batches are plain host memory and nothing is
//! queued on a device, so there is no device to synchronise before reading the clock. The copy
//! of a batch to a CUDA device is measured, synchronised, by the `collate` bench.

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kiln_data::{Loader, LoaderConfig, SyntheticClassification};

const SAMPLES: usize = 512;

fn bench_loader(c: &mut Criterion) {
    let dataset = Arc::new(
        SyntheticClassification::new(SAMPLES, vec![64, 469], 100, 0, 0.5).expect("valid dataset"),
    );
    let mut group = c.benchmark_group("loader_epoch");
    group.throughput(Throughput::Elements(SAMPLES as u64));
    group.sample_size(10);
    for workers in [0, 1, 2] {
        let config = LoaderConfig {
            batch_size: 32,
            num_workers: workers,
            prefetch_factor: 2,
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(Arc::clone(&dataset), config).expect("loader starts");
        let mut epoch = 0;
        group.bench_function(BenchmarkId::new("workers", workers), |b| {
            b.iter(|| {
                epoch += 1;
                loader
                    .epoch(epoch)
                    .map(|batch| batch.expect("batch").indices.len())
                    .sum::<usize>()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_loader);
criterion_main!(benches);
