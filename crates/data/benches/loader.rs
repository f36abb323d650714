//! The loader alone: one epoch of SignTransformer-shaped samples (64 × 469 floats, batch 32) from
//! the synthetic dataset, at 0, 1 and 2 workers (the per-sample work is generating the sample);
//! and one shuffled epoch of the `data` suite's shards (1024 samples of 64 × 128 f32, batch 64,
//! normalized) without workers, read by 1 or 2 inline threads, through positioned reads or the
//! map.
//!
//! Host-side only, on any machine: the loader's batches are plain host memory and nothing is
//! queued on a device, so there is no device to synchronise before reading the clock. The copy
//! of a batch to a CUDA device is measured, synchronised, by the `collate` bench.

use std::sync::Arc;

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use kiln_data::{
    DType, Dataset, Loader, LoaderConfig, Normalize, PrepareOptions, PrepareSource, SamplerConfig,
    ShardedDataset, SyntheticClassification, Transformed, prepare, write_npy,
};

const SAMPLES: usize = 512;

/// Times whole epochs of `loader`, a new epoch each iteration.
fn bench_epochs<D: Dataset>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: BenchmarkId,
    mut loader: Loader<D>,
) {
    let mut epoch = 0;
    group.bench_function(id, |b| {
        b.iter(|| {
            epoch += 1;
            loader
                .epoch(epoch)
                .map(|batch| batch.expect("batch").indices.len())
                .sum::<usize>()
        })
    });
}

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
        let loader = Loader::new(Arc::clone(&dataset), config).expect("loader starts");
        bench_epochs(&mut group, BenchmarkId::new("workers", workers), loader);
    }
    group.finish();
}

/// The data suite's shards in `dir`: 1024 samples of `[64, 128]` f32, labels in 0..10.
fn shards(dir: &std::path::Path) -> std::path::PathBuf {
    let (n, numel) = (1024usize, 64 * 128);
    let features: Vec<u8> = (0..n * numel)
        .flat_map(|i| ((i % 977) as f32 * 0.01).to_le_bytes())
        .collect();
    let labels: Vec<u8> = (0..n as i64).flat_map(|i| (i % 10).to_le_bytes()).collect();
    let (f, l) = (dir.join("f.npy"), dir.join("l.npy"));
    write_npy(&f, DType::F32, &[n, 64, 128], &features).expect("features written");
    write_npy(&l, DType::I64, &[n], &labels).expect("labels written");
    let out = dir.join("ds");
    let source = PrepareSource::Npy {
        features: f,
        labels: l,
    };
    prepare(&source, &out, &PrepareOptions::default()).expect("shards prepared");
    out
}

fn bench_shards(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let dir = shards(tmp.path());
    let mut group = c.benchmark_group("shards_epoch");
    group.throughput(Throughput::Elements(1024));
    group.sample_size(10);
    for (release, inline_threads) in [(true, 1), (true, 2), (false, 1), (false, 2)] {
        let ds = ShardedDataset::open(&dir)
            .expect("shards open")
            .with_release_pages(release);
        let norm = Normalize::new(vec![4.0; 128], vec![2.5; 128]).expect("statistics");
        let config = LoaderConfig {
            batch_size: 64,
            sampler: SamplerConfig {
                shuffle: true,
                ..SamplerConfig::default()
            },
            inline_threads,
            ..LoaderConfig::default()
        };
        let loader =
            Loader::new(Arc::new(Transformed::new(ds, norm)), config).expect("loader starts");
        let reads = if release { "pread" } else { "mapped" };
        let id = BenchmarkId::new(reads, format!("{inline_threads} inline threads"));
        bench_epochs(&mut group, id, loader);
    }
    group.finish();
}

criterion_group!(benches, bench_loader, bench_shards);
criterion_main!(benches);
