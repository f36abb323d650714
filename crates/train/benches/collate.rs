//! Collating one batch of SignTransformer-shaped samples (64 × 469 `f32`) at batch sizes 32 and
//! 128: the loader reading the samples of an in-memory dataset into one contiguous buffer, inline
//! (no workers), so the measured work is the copy into the batch plus the loader's bookkeeping.
//!
//! On a machine with CUDA, also the host→device copy of the collated batch as training does it
//! (staged in pinned memory, copied on a side stream), each iteration ending with a device
//! synchronisation so the clock sees the finished copy. Without CUDA that group is skipped, and
//! the bench says so on stderr.

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kiln_data::{Batch, InMemory, Loader, LoaderConfig};
use kiln_torch_ext::transfer;
use tch::{Device, Tensor};

/// One SignTransformer sample: 64 frames of 469 features.
const SAMPLE_SHAPE: [usize; 2] = [64, 469];
const BATCH_SIZES: [usize; 2] = [32, 128];

/// An in-memory dataset of exactly `batch` samples, so that one epoch is one batch.
fn dataset(batch: usize) -> Arc<InMemory> {
    let numel: usize = SAMPLE_SHAPE.iter().product();
    let features = (0..batch * numel)
        .map(|i| (i % 1009) as f32 * 1e-3)
        .collect();
    let labels = (0..batch as i64).map(|i| i % 100).collect();
    Arc::new(InMemory::new(features, labels, SAMPLE_SHAPE.to_vec()).expect("valid dataset"))
}

fn loader(batch: usize) -> Loader<InMemory> {
    let config = LoaderConfig {
        batch_size: batch,
        num_workers: 0,
        ..LoaderConfig::default()
    };
    Loader::new(dataset(batch), config).expect("loader starts")
}

/// The one batch of epoch `epoch`.
fn collate(loader: &mut Loader<InMemory>, epoch: u64) -> Batch {
    loader
        .epoch(epoch)
        .next()
        .expect("one batch per epoch")
        .expect("batch")
}

/// Waits for all work queued on `device` (nothing to wait for on the CPU).
fn synchronize(device: Device) {
    kiln_torch_ext::cuda::synchronize(device).expect("device synchronize");
}

fn bench_collate(c: &mut Criterion) {
    let mut group = c.benchmark_group("collate");
    for batch in BATCH_SIZES {
        group.throughput(Throughput::Elements(batch as u64));
        let mut loader = loader(batch);
        let mut epoch = 0;
        group.bench_function(BenchmarkId::new("samples", batch), |b| {
            b.iter(|| {
                epoch += 1;
                collate(&mut loader, epoch)
            })
        });
    }
    group.finish();
}

fn bench_to_device(c: &mut Criterion) {
    let device = Device::cuda_if_available();
    if device == Device::Cpu {
        eprintln!("collate: no CUDA device, so the host→device copy was not measured");
        return;
    }
    eprintln!("collate: host→device copies to {device:?}");
    let mut group = c.benchmark_group("collate_to_device");
    for batch in BATCH_SIZES {
        let mut loader = loader(batch);
        let host = collate(&mut loader, 1);
        let shape: Vec<i64> = host.shape.iter().map(|&d| d as i64).collect();
        group.throughput(Throughput::Bytes(
            std::mem::size_of_val(&*host.features) as u64
        ));
        // The copy alone, from a batch already in pinned memory.
        let pinned = transfer::host_tensor_f32(&host.features, &shape, true).expect("pinned batch");
        group.bench_function(BenchmarkId::new("copy_pinned", batch), |b| {
            b.iter(|| {
                let t: Tensor = transfer::copy_to_device(&pinned, device)
                    .and_then(transfer::PendingCopy::finish)
                    .expect("copy");
                synchronize(device);
                t
            })
        });
        // What training pays per batch: staging into pinned memory, then the copy.
        group.bench_function(BenchmarkId::new("stage_and_copy", batch), |b| {
            b.iter(|| {
                let t = transfer::host_tensor_f32(&host.features, &shape, true)
                    .and_then(|staged| transfer::copy_to_device(&staged, device))
                    .and_then(transfer::PendingCopy::finish)
                    .expect("stage and copy");
                synchronize(device);
                t
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_collate, bench_to_device);
criterion_main!(benches);
