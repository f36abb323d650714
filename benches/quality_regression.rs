//! The quality suite's second job, of another kind than the reference classifier: a regression.
//! kiln's MLP and its PyTorch twin (`python/train_quality.py --task regression`) fit a smooth
//! function of 32 features (a sum of sines of random projections, plus noise, standardized),
//! with mean squared error, on the same `.npy` files and split. It is long enough (about 1,800
//! optimizer steps) for `train.lr = auto`'s range test to run its full 100 steps, so its rows
//! judge the found rate on a model and a loss the reference job does not have.

use std::path::Path;
use std::sync::Arc;

use kiln_benches::{Msg, Result, datasets};
use kiln_data::ShardedDataset;
use serde_json::json;
use tch::{Kind, Tensor};

use super::{Ctx, DATA_SEED, Metric, Seed, Sides, SuiteOutput, lr_rows, vs_worst_seed};

/// The job: sizes of the data and the model, and the training budget.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub samples: usize,
    pub features: usize,
    /// The MLP's hidden widths, as `model.hidden` takes them.
    pub hidden: &'static str,
    pub epochs: usize,
    pub batch: usize,
    pub warmup: usize,
}

/// 16,384 samples of 32 features, an MLP 256-256, 4 epochs of batch 32 (1,840 steps of the
/// 90% kept for training). `--quick` (CI) checks the rows' shape only.
pub fn job(quick: bool) -> Job {
    let (samples, features, hidden, epochs) = if quick {
        (1024, 16, "32", 1)
    } else {
        (16_384, 32, "256,256", 4)
    };
    Job {
        samples,
        features,
        hidden,
        epochs,
        batch: 32,
        warmup: 50,
    }
}

/// The second job's runs (kiln at 1e-3 and with `lr = auto`, PyTorch at 1e-3 and at
/// Lightning's suggestion) on data it writes in `dir`, and its rows; returns what it is.
pub(super) fn run(ctx: &Ctx<'_>, dir: &Path, seeds: u64, out: &mut SuiteOutput) -> Result<String> {
    let job = job(ctx.a.quick);
    std::fs::create_dir_all(dir).at(dir)?;
    let prepared = write_data(dir, &job, DATA_SEED)?;
    let mut sides = Sides::default();
    for seed in 0..seeds {
        let jobs = (vec!["--regression".to_owned()], torch_args(&job));
        let run = Seed::new(ctx, (dir, &prepared), seed, jobs)?;
        eprintln!(
            "quality: regression, seed {seed}: kiln fp32, kiln fp32 with lr = auto, PyTorch, \
             PyTorch at Lightning's lr_find"
        );
        sides.kiln.push(run.kiln(&[])?);
        sides
            .kiln_lr_auto
            .push(run.kiln(&["--set", "train.lr=auto"])?);
        sides.torch.push(run.torch_like_kiln()?);
        run.torch_lr_find(&mut sides.torch_lr_find)?;
    }
    let rmse = Metric::RMSE;
    let name = "regression: val RMSE: kiln fp32 mean vs PyTorch worst seed".to_owned();
    let row = vs_worst_seed(out, name, rmse, (&sides.kiln, &sides.torch), 0.0)?;
    let runs = json!({"kiln": sides.kiln, "kiln_lr_auto": sides.kiln_lr_auto,
                      "pytorch": sides.torch, "pytorch_lr_find": sides.torch_lr_find});
    out.push(row.at_most(1.02).detail("runs", runs));
    lr_rows(ctx, out, &sides, (rmse, "regression: "))?;
    Ok(describe(&job))
}

/// Sines of this many random projections make the target.
const TERMS: i64 = 8;
/// The noise's standard deviation, before the target is standardized.
const NOISE: f64 = 0.1;

/// Writes the job's features and targets as `.npy` files in `dir` (the PyTorch side reads them)
/// and kiln's dataset prepared from them in `dir/kiln`; returns it opened.
pub fn write_data(dir: &Path, job: &Job, seed: u64) -> Result<Arc<ShardedDataset>> {
    let (n, f) = (job.samples as i64, job.features as i64);
    tch::manual_seed(seed as i64);
    let x = Tensor::randn([n, f], (Kind::Float, tch::Device::Cpu));
    let w = Tensor::randn([f, TERMS], (Kind::Float, tch::Device::Cpu)) / (f as f64).sqrt();
    let a = Tensor::randn([TERMS], (Kind::Float, tch::Device::Cpu));
    let noise = Tensor::randn([n], (Kind::Float, tch::Device::Cpu)) * NOISE;
    let y = (x.matmul(&w).sin() * a).sum_dim_intlist(1, false, Kind::Float) + noise;
    let y = (&y - y.mean(Kind::Float)) / y.std(true);
    let (features, targets) = (values(&x)?, values(&y)?);
    let shape = [job.samples, job.features];
    datasets::write_prepared_values(dir, "kiln", &features, shape, &targets)
}

/// A tensor's values, flattened.
fn values(t: &Tensor) -> Result<Vec<f32>> {
    Vec::<f32>::try_from(t.flatten(0, -1)).map_err(|e| format!("reading synthetic data: {e}"))
}

/// kiln's settings for the job (beside the suite's common ones).
pub fn kiln_sets(job: &Job) -> Vec<String> {
    vec![
        "model.name=mlp".to_owned(),
        format!("model.hidden={}", job.hidden),
        "model.dropout=0".to_owned(),
        format!("train.epochs={}", job.epochs),
        format!("train.batch_size={}", job.batch),
        format!("train.warmup_steps={}", job.warmup),
    ]
}

/// The PyTorch side's options for the job.
pub fn torch_args(job: &Job) -> Vec<String> {
    let mut args = vec![
        "--task",
        "regression",
        "--hidden",
        job.hidden,
        "--dropout",
        "0",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect::<Vec<_>>();
    for (name, v) in [
        ("--epochs", job.epochs),
        ("--batch", job.batch),
        ("--warmup", job.warmup),
    ] {
        args.extend([name.to_owned(), v.to_string()]);
    }
    args
}

/// The job as the report's title says it.
pub fn describe(job: &Job) -> String {
    let Job {
        samples,
        features,
        hidden,
        epochs,
        batch,
        ..
    } = *job;
    format!(
        "regression: MLP ({hidden}) on {samples} synthetic samples of {features} features \
         (a sum of {TERMS} sines of random projections plus noise, standardized), mean squared \
         error, {epochs} epochs of batch {batch}"
    )
}
