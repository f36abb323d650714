//! The sliding window's stitch on the CPU: the eight 64³ windows of a 96³ volume (overlap 0.25,
//! two output channels, four a batch, Gaussian weights) added into fresh running sums and
//! divided by the summed weights. One pass a batch, each row divided after its last window
//! (`kiln_torch_ext::blend`, what `kiln infer --sliding-window` runs on the CPU) against window
//! by window with `addcmul_` and a division at the end (what it ran before, and runs on other
//! devices), for outputs laid out channels-last (as a model whose weights are channels-last-3d
//! gives them) and contiguous.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kiln_config::BlendMode;
use kiln_infer::sliding::importance_map;
use kiln_torch_ext::blend::{Rows, blend_windows};
use tch::{Device, Kind, Tensor};

const SIZE: i64 = 96;
const ROI: i64 = 64;

fn buffer(channels: i64, zeroed: bool) -> Tensor {
    let shape = [1, channels, SIZE, SIZE, SIZE];
    match zeroed {
        true => Tensor::zeros(shape, (Kind::Float, Device::Cpu)),
        false => Tensor::empty(shape, (Kind::Float, Device::Cpu)),
    }
}

fn one_pass(batches: &[(Tensor, &[Vec<i64>])], weight: &Tensor) -> Tensor {
    let (sum, count) = (buffer(2, false), buffer(1, false));
    let starts: Vec<Vec<i64>> = batches.iter().flat_map(|(_, s)| s.to_vec()).collect();
    let mut rows = Rows::new(&[SIZE; 3], &[ROI; 3], &starts).expect("a plan");
    for (outs, starts) in batches {
        blend_windows(&sum, &count, outs, weight, starts, &mut rows).expect("blend");
    }
    rows.finish_the_rest(&sum, &count).expect("finish");
    sum
}

fn window_by_window(batches: &[(Tensor, &[Vec<i64>])], weight: &Tensor) -> Tensor {
    let (mut sum, count) = (buffer(2, true), buffer(1, true));
    let crop = |t: &Tensor, at: &[i64]| {
        (0..3).fold(t.shallow_clone(), |v, d| {
            v.narrow(2 + d, at[d as usize], ROI)
        })
    };
    for (outs, starts) in batches {
        for (i, at) in starts.iter().enumerate() {
            let _ = crop(&sum, at).addcmul_(&outs.narrow(0, i as i64, 1), weight);
            let _ = crop(&count, at).g_add_(weight);
        }
    }
    sum.g_div_(&count)
}

fn bench(c: &mut Criterion) {
    tch::manual_seed(0);
    let starts: Vec<Vec<i64>> = (0..8)
        .map(|k| {
            (0..3)
                .map(|d| ((k >> (2 - d)) & 1) * (SIZE - ROI))
                .collect()
        })
        .collect();
    let weight =
        importance_map(&[ROI; 3], BlendMode::Gaussian, 0.125, Device::Cpu).expect("importance map");
    let outs = Tensor::randn([4, 2, ROI, ROI, ROI], (Kind::Float, Device::Cpu));
    let laid_out = kiln_torch_ext::layout::to_channels_last(&outs).expect("channels-last");
    let mut group = c.benchmark_group("sliding_stitch");
    group.sample_size(30);
    for (layout, outs) in [("channels_last", &laid_out), ("contiguous", &outs)] {
        let batches: Vec<(Tensor, &[Vec<i64>])> = starts
            .chunks(4)
            .map(|b| (outs.shallow_clone(), b))
            .collect();
        let (a, b) = (
            one_pass(&batches, &weight),
            window_by_window(&batches, &weight),
        );
        let diff = f64::try_from((a - b).abs().max()).expect("a number");
        assert!(diff < 1e-5, "the two stitches differ by {diff}");
        group.bench_function(BenchmarkId::new("one_pass", layout), |bench| {
            bench.iter(|| one_pass(&batches, &weight))
        });
        group.bench_function(BenchmarkId::new("window_by_window", layout), |bench| {
            bench.iter(|| window_by_window(&batches, &weight))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
