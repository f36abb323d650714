//! Your own tch module, your own in-memory data, one call: a small network learns a noisy
//! sine-and-product target through `kiln_train::prelude`, with kiln's hardware profile, AMP,
//! fused AdamW, checkpoints and run directory, reporting a metric of its own beside MAE and RMSE. Exits non-zero if it did not learn; `cargo test`
//! runs it too (`tests/examples.rs`).
//!
//!     cargo run -p kiln-examples --example regression [-- OUTPUT_DIR]

use std::sync::Arc;

use kiln_train::prelude::*;

/// Two inputs in [-2, 2] → y = sin(x₀) + 0.5·x₀·x₁ + noise, as features [N, 2] and targets [N].
fn dataset(samples: usize) -> Result<InMemory, TrainError> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f32 / (1u64 << 53) as f32
    };
    let (mut xs, mut ys) = (Vec::with_capacity(2 * samples), Vec::with_capacity(samples));
    for _ in 0..samples {
        let (a, b) = (4.0 * uniform() - 2.0, 4.0 * uniform() - 2.0);
        xs.extend([a, b]);
        ys.push(a.sin() + 0.5 * a * b + 0.05 * (uniform() - 0.5));
    }
    Ok(InMemory::with_targets(
        xs,
        vec![2],
        TargetSpec::Values { shape: vec![] },
        Targets::Values(ys),
    )?)
}

/// The user's model: any tch module; `TchModule` adapts it.
fn network(vs: &nn::VarStore, _input: &InputSpec) -> Result<Box<dyn Model>, TrainError> {
    let root = vs.root();
    let net = nn::seq()
        .add(nn::linear(&root / "fc1", 2, 64, Default::default()))
        .add_fn(|x| x.gelu("none"))
        .add(nn::linear(&root / "fc2", 64, 64, Default::default()))
        .add_fn(|x| x.gelu("none"))
        .add(nn::linear(&root / "out", 64, 1, Default::default()));
    Ok(Box::new(TchModule(net)))
}

/// A metric of one's own: the share of predictions within `0.1` of the target. Sums per batch
/// on the device (no host synchronisation), a value from the sums when the run reports.
#[derive(Debug)]
struct WithinTenth;

impl Metric for WithinTenth {
    fn name(&self) -> &'static str {
        "within_0.1"
    }
    fn higher_is_better(&self) -> bool {
        true
    }
    fn sums(&self) -> &'static [&'static str] {
        &["close", "judged"]
    }
    fn batch(&self, batch: &BatchOutput<'_>) -> Result<Vec<Tensor>, TrainError> {
        let Some(error) = batch.error()? else {
            return Ok(vec![batch.constant(0.0)?, batch.constant(0.0)?]);
        };
        let close = error.f_abs()?.f_le(0.1)?.f_sum(Kind::Float)?;
        Ok(vec![close, batch.constant(error.numel() as f64)?])
    }
    fn value(&self, sums: &[f64], _samples: u64) -> Option<f64> {
        (sums[1] > 0.0).then(|| sums[0] / sums[1])
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let output = std::env::args().nth(1).unwrap_or_else(|| "runs".to_owned());
    train(&output)?;
    Ok(())
}

/// Trains the example under `output`; an error unless it learned. (`tests/examples.rs` runs it
/// in `cargo test`.)
pub fn train(output: &str) -> Result<RunOutcome, Box<dyn std::error::Error>> {
    let learner = Learner::builder()
        .set("train.epochs", 12)
        .set("train.lr", 3e-3)
        .set("train.batch_size", 64)
        .set("train.warmup_steps", 20)
        .set("run.name", "regression-example")
        .output_dir(output)
        // Under torchrun (or any launcher's RANK/WORLD_SIZE/MASTER_*), data-parallel.
        .join_launched_ranks(true)
        .metric(Arc::new(WithinTenth))
        .build()?;
    let (device, why) = learner.device();
    println!("training on {device}: {why}");
    let outcome = learner.fit("sine-mlp", network, dataset(4000)?)?;
    let s = &outcome.summary;
    let mse = s.final_val.get("loss").unwrap_or(f64::NAN);
    println!(
        "{} steps in {:.1} s ({}, loss {}): val MSE {mse:.4}, MAE {:.4}, RMSE {:.4}, within 0.1: \
         {:.1} %; run directory {}",
        s.steps,
        s.seconds,
        s.task,
        s.loss,
        s.final_val.get("mae").unwrap_or(f64::NAN),
        s.final_val.get("rmse").unwrap_or(f64::NAN),
        100.0 * s.final_val.get("within_0.1").unwrap_or(f64::NAN),
        outcome.run_dir.display()
    );
    // The target's variance is about 1.1; predicting its mean would give an MSE near that.
    if mse.is_nan() || mse > 0.05 {
        return Err(format!("the model did not learn: val MSE {mse}").into());
    }
    Ok(outcome)
}
