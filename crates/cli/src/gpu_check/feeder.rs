//! gpu-check step: the pinned-memory feeder's side-stream copies overlap compute, measured as
//! copy-only, compute-only and both-together times over the same batches.

use kiln_data::{Batch, DataError, Targets};
use kiln_train::feed::DeviceFeeder;
use tch::{Device, Kind, Tensor};

use super::{Ctx, Outcome, timed};

/// Batches of 32 MiB of features each.
const BATCH: usize = 256;
const FEATURES: usize = 32768;
const BATCHES: usize = 24;

fn batches() -> impl Iterator<Item = Result<Batch, DataError>> {
    (0..BATCHES).map(|number| {
        Ok(Batch {
            shape: vec![BATCH, FEATURES],
            features: vec![0.5; BATCH * FEATURES].into(),
            arrays: vec![],
            integer_features: false,
            targets: Targets::Classes(vec![1; BATCH]),
            target_shape: vec![BATCH],
            indices: (0..BATCH).collect(),
            number,
        })
    })
}

/// Compute on one batch long enough to hide its copy: `rounds` matmuls of the batch's
/// features (viewed as [2048, 4096]) with a square matrix.
fn compute(x: &Tensor, w: &Tensor, rounds: usize) -> anyhow::Result<Tensor> {
    let mut y = x.f_view([2048, 4096])?;
    for _ in 0..rounds {
        y = y.f_matmul(w)?.f_tanh()?;
    }
    Ok(y)
}

/// Feeds every batch; with `rounds > 0` computes on each.
fn feed(device: Device, w: &Tensor, rounds: usize) -> anyhow::Result<bool> {
    let mut feeder = DeviceFeeder::new(batches(), device);
    let mut keep = vec![];
    for batch in feeder.by_ref() {
        let b = batch?;
        if rounds > 0 {
            keep.push(compute(b.inputs.single()?, w, rounds)?.f_sum(Kind::Float)?);
        }
    }
    Ok(feeder.pinned())
}

/// Copy-only, compute-only and together: overlap = (copy + compute − together) / the shorter.
pub fn pinned_feeder(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let device = ctx.device;
    let w = Tensor::f_randn([4096, 4096], (Kind::Float, device))?.f_div_scalar(64.0)?;
    // Warm up the allocator, cuBLAS and the pinned host pool.
    feed(device, &w, 1)?;
    let (pinned, copy_s) = timed(device, || feed(device, &w, 0))?;
    let x = Tensor::f_ones([BATCH as i64, FEATURES as i64], (Kind::Float, device))?;
    let per_copy = copy_s / BATCHES as f64;
    let (_, one) = timed(device, || compute(&x, &w, 1).map(|_| ()))?;
    let rounds = ((per_copy / one.max(1e-6)).ceil() as usize).clamp(1, 64);
    let (_, compute_s) = timed(device, || {
        let mut keep = vec![];
        for _ in 0..BATCHES {
            keep.push(compute(&x, &w, rounds)?.f_sum(Kind::Float)?);
        }
        Ok(())
    })?;
    let (_, both_s) = timed(device, || feed(device, &w, rounds))?;
    let hidden = (copy_s + compute_s - both_s) / copy_s.min(compute_s);
    let gib_s = (BATCHES * BATCH * FEATURES * 4) as f64 / copy_s / 1073741824.0;
    let pass = pinned && hidden >= 0.5;
    Ok(Outcome::new(
        pass,
        format!(
            "{BATCHES} batches of 32 MiB, {}: copy {copy_s:.3} s ({gib_s:.1} GiB/s), compute \
             {compute_s:.3} s, both {both_s:.3} s → {:.0}% of the shorter hidden (goal ≥ 50%)",
            if pinned { "pinned" } else { "NOT pinned" },
            hidden * 100.0
        ),
    )
    .figure("pinned", pinned)
    .figure("copy_s", copy_s)
    .figure("copy_gib_per_s", gib_s)
    .figure("compute_s", compute_s)
    .figure("together_s", both_s)
    .figure("overlap", hidden)
    .figure("matmuls_per_batch", rounds as u64))
}
