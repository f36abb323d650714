//! The quality suite's second job, a regression: kiln's MLP and its PyTorch twin
//! (`python/train_quality.py --task regression`) fit a smooth function of noisy features with
//! mean squared error, long enough for `train.lr = auto`'s range test to run its full 100 steps.

use super::*;
use tch::{Kind, Tensor};

/// The job: samples, features, the MLP's hidden widths (as `model.hidden` takes them) and
/// epochs; batch 32 with 50 warmup steps.
#[derive(Debug, Clone, Copy)]
pub struct Job(usize, usize, &'static str, usize);

/// 16,384 samples of 32 features, an MLP 256-256, 4 epochs (1,840 steps of the 90% kept for
/// training). `--quick` (CI) checks the rows' shape only.
pub fn job(quick: bool) -> Job {
    if quick {
        Job(1024, 16, "32", 1)
    } else {
        Job(16_384, 32, "256,256", 4)
    }
}

/// The second job's runs (kiln at 1e-3 and with `lr = auto`, PyTorch at 1e-3 and at
/// Lightning's suggestion) on data it writes in `dir`, and its rows; returns what it is.
pub(super) fn run(ctx: &Ctx<'_>, dir: &Path, seeds: u64, out: &mut SuiteOutput) -> Result<String> {
    let job = job(ctx.a.quick);
    std::fs::create_dir_all(dir).at(dir)?;
    let mut torch = vec!["--task".to_owned(), "regression".to_owned()];
    torch.extend(torch_args(&job_values(&job)));
    let data = JobData {
        dir,
        prepared: write_data(dir, &job)?,
        kiln: vec!["--regression".to_owned()],
        torch,
    };
    let sides = ["kiln", "kiln_lr_auto", "pytorch", "pytorch_lr_find"];
    let runs = ctx.train_sides(&data, seeds, &sides, "regression, ")?;
    let rmse = Metric::RMSE;
    let what = ("regression: ", "kiln fp32");
    let both = (&runs["kiln"][..], &runs["pytorch"][..]);
    let row = vs_worst_seed(out, what, rmse, both, VS_TORCH, 0.0)?;
    out.push(row.at_most(1.02).detail("runs", json!(runs)));
    ctx.lr_rows(out, &runs, rmse, "regression: ")?;
    Ok(describe(&job))
}

/// Sines of this many random projections make the target.
const TERMS: i64 = 8;
/// The noise's standard deviation, before the target is standardized.
const NOISE: f64 = 0.1;

/// Writes the job's `.npy` files in `dir` (for the PyTorch side) and kiln's dataset in `dir/kiln`.
pub fn write_data(dir: &Path, job: &Job) -> Result<Arc<ShardedDataset>> {
    let (n, f, cpu) = (job.0 as i64, job.1 as i64, (Kind::Float, tch::Device::Cpu));
    tch::manual_seed(DATA_SEED as i64);
    let x = Tensor::randn([n, f], cpu);
    let w = Tensor::randn([f, TERMS], cpu) / (f as f64).sqrt();
    let a = Tensor::randn([TERMS], cpu);
    let noise = Tensor::randn([n], cpu) * NOISE;
    let y = (x.matmul(&w).sin() * a).sum_dim_intlist(1, false, Kind::Float) + noise;
    let y = (&y - y.mean(Kind::Float)) / y.std(true);
    let (features, targets) = (values(&x)?, values(&y)?);
    datasets::write_prepared_values(dir, "kiln", &features, [job.0, job.1], &targets)
}

/// A tensor's values, flattened.
fn values(t: &Tensor) -> Result<Vec<f32>> {
    Vec::<f32>::try_from(t.flatten(0, -1)).map_err(|e| format!("reading synthetic data: {e}"))
}

/// The job's values (kiln's model is the MLP; the script's with `--task regression`).
pub fn job_values(&Job(_, _, hidden, epochs): &Job) -> Vec<Both> {
    vec![
        ("model.hidden", "--hidden", hidden.to_owned()),
        ("model.dropout", "--dropout", "0".to_owned()),
        ("train.epochs", "--epochs", epochs.to_string()),
        ("train.batch_size", "--batch", "32".to_owned()),
        ("train.warmup_steps", "--warmup", "50".to_owned()),
    ]
}

/// The job as the report's title says it.
pub fn describe(&Job(samples, features, hidden, epochs): &Job) -> String {
    format!(
        "regression: MLP ({hidden}) on {samples} synthetic samples of {features} features \
         (a sum of {TERMS} sines of random projections plus noise, standardized), mean squared \
         error, {epochs} epochs of batch 32"
    )
}
