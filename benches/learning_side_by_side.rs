//! `cargo xtask bench learning`: do kiln and PyTorch learn the same thing? Each reference model's
//! seeded initial weights and data, written by kiln as safetensors, trained on both sides in the
//! same batch order with the train suite's settings (the twins: `python/same_learning.py`).
//! Goals: fp32, every step's loss within [`FP32_STEP_TOLERANCE`]; bf16 autocast, the final loss
//! and held-out accuracy within [`BF16_LOSS_TOLERANCE`] and [`BF16_ACCURACY_TOLERANCE`].

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use kiln_benches::report::{Better, Comparison, NATS, SuiteOutput};
use kiln_benches::{Msg, Result, SuiteArgs, command, figure, mean, python_script, run_json};
use kiln_config::ModelKind::{self, ConvNet, Transformer, Unet3d};
use kiln_config::ModelPlan;
use kiln_data::{
    DataError, Dataset, SyntheticClassification, SyntheticImages, SyntheticSequences,
    SyntheticVolumes, TargetSlot, TargetSpec,
};
use kiln_device::settings::AmpDtype;
use kiln_train::model::{InputSpec, Model};
use kiln_train::source::build;
use kiln_train::stepper::{StepOptions, Stepper};
use serde_json::{Value, json};
use tch::{Device, Tensor, nn};

use kiln_benches::run_cli::{Cli, exit_on_error, fresh_work_dir, remove_dir};

/// Largest allowed |kiln − PyTorch| of any step's fp32 training loss, in nats.
pub const FP32_STEP_TOLERANCE: f64 = 1e-4;
/// Largest allowed |kiln − PyTorch| of the bf16 final loss (mean of the last steps), in nats.
pub const BF16_LOSS_TOLERANCE: f64 = 0.02;
/// Largest allowed |kiln − PyTorch| of the bf16 held-out accuracy, in percentage points.
pub const BF16_ACCURACY_TOLERANCE: f64 = 2.0;

/// The seed kiln builds every model with (its initial weights are then written out).
const MODEL_SEED: i64 = 0;
/// The seed of the synthetic data (train pool and held-out set come from one dataset).
const DATA_SEED: u64 = 2024;
const LR: f64 = 1e-3;
/// Held-out samples per evaluation batch (both sides).
const EVAL_BATCH: usize = 64;
const WEIGHT_DECAY: f64 = 0.01;
/// Every model's classes (the train suite's transformer's 100 learn too little in 100 steps).
const CLASSES: usize = 10;
const PRECISIONS: [AmpDtype; 2] = [AmpDtype::None, AmpDtype::Bf16];

#[derive(Debug, Subcommand)]
enum Sub {
    /// The same learning as PyTorch from kiln's initial weights: fp32 per step, bf16 final.
    Learning(LearningArgs),
    /// One kiln run from the initial weights and data the suite wrote; prints JSON.
    KilnRun(KilnRunArgs),
}

#[derive(Debug, Args)]
struct LearningArgs {
    #[command(flatten)]
    suite: SuiteArgs,
    /// The models, e.g. transformer,mlp (for runs by hand; default: all four).
    #[arg(long, value_delimiter = ',')]
    models: Vec<ModelKind>,
}

#[derive(Debug, Args)]
struct KilnRunArgs {
    #[arg(long)]
    model: ModelKind,
    /// The directory the suite prepared.
    #[arg(long)]
    dir: PathBuf,
    /// fp32 or bf16.
    #[arg(long, default_value = "fp32")]
    precision: AmpDtype,
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

/// Runs the suite's command line (`args[0]` is its name, as clap takes a program name).
pub fn main(args: Vec<std::ffi::OsString>) {
    let about = "`kiln-bench learning`: the learning suite, and its kiln runs";
    let cli = Cli::parse_with(args, about);
    exit_on_error(match cli.command {
        None => suite(&cli.suite, &[]),
        Some(Sub::Learning(a)) => suite(&a.suite, &a.models),
        Some(Sub::KilnRun(a)) => kiln_run(&a),
    });
}

/// One model's check: the model, its data and the training budget.
#[derive(Debug, Clone)]
struct Job {
    plan: ModelPlan,
    sample_shape: Vec<usize>,
    batch: usize,
    steps: usize,
    /// Samples in the train pool (batches are taken from it in order, cycling).
    pool: usize,
    held_out: usize,
    /// The final loss is the mean of the last `tail` steps' losses.
    tail: usize,
}

/// The full check (the train suite's models and data shapes, 100 steps), or CI's (20 steps).
fn job(kind: ModelKind, quick: bool) -> Job {
    let steps = if quick { 20 } else { 100 };
    let (sizes, sample_shape, batch) = match (kind, quick) {
        // The train suite's transformer, with a head of [`CLASSES`].
        (Transformer, false) => ((256, 8, 4, 1024), vec![64, 469], 8),
        (Transformer, true) => ((64, 4, 1, 128), vec![16, 32], 8),
        // 16×16 images rather than the train suite's 32×32: bf16 convolutions are slow on a
        // CPU without bf16 units, and the check is about agreement, not size.
        (ConvNet, false) => ((0, 0, 0, 0), vec![3, 16, 16], 16),
        (ConvNet, true) => ((0, 0, 0, 0), vec![3, 8, 8], 8),
        // Volumes smaller than the default job's 32³, for the same reason.
        (Unet3d, false) => ((0, 0, 0, 0), vec![1, 24, 24, 24], 4),
        (Unet3d, true) => ((0, 0, 0, 0), vec![1, 16, 16, 16], 4),
        _ => ((0, 0, 0, 0), vec![64], 32),
    };
    let mut plan = ModelPlan::builtin(kind);
    (plan.d_model, plan.heads, plan.layers, plan.ff) = sizes;
    if kind == Unet3d {
        plan.channels = if quick { vec![4, 8] } else { vec![16, 32, 64] };
    }
    Job {
        plan,
        sample_shape,
        batch,
        steps,
        pool: batch * steps.div_ceil(2),
        held_out: if quick { 64 } else { 256 },
        tail: if quick { 5 } else { 10 },
    }
}

/// What the job's model predicts: one of [`CLASSES`], or the U-Net's class per voxel.
fn target_of(job: &Job) -> TargetSpec {
    if job.plan.kind != Unet3d {
        return TargetSpec::label(CLASSES);
    }
    let shape = job.sample_shape[1..].to_vec();
    TargetSpec::Classes { classes: 2, shape }
}

/// Every sample of `data` (kiln's synthetic dataset for a model) as a features tensor
/// `[n, shape…]` and a class tensor `[n, target shape…]`.
fn tensors(data: std::result::Result<impl Dataset, DataError>) -> Result<(Tensor, Tensor)> {
    let data = data.msg()?;
    let (n, target) = (data.len(), data.target());
    let mut features = vec![0f32; n * data.sample_numel()];
    let mut classes = vec![0i64; n * target.numel()];
    let all: Vec<usize> = (0..n).collect();
    let slot = TargetSlot::Classes(&mut classes);
    data.read_batch(&all, &mut features, slot).msg()?;
    // `t` viewed as `[n, shape…]`.
    let view = |t: Tensor, shape: &[usize]| {
        let mut dims = vec![n as i64];
        dims.extend(shape.iter().map(|&d| d as i64));
        t.f_view(dims.as_slice()).msg()
    };
    let x = view(Tensor::f_from_slice(&features).msg()?, data.sample_shape())?;
    let y = view(Tensor::f_from_slice(&classes).msg()?, target.shape())?;
    Ok((x, y))
}

/// `dir/<model>-<what>.safetensors`: the initial weights (`init`) or the data (`data`).
fn file(dir: &Path, kind: ModelKind, what: &str) -> PathBuf {
    dir.join(format!("{kind}-{what}.safetensors"))
}

/// kiln's model for the job, built with [`MODEL_SEED`] on the CPU.
fn model(job: &Job, vs: &nn::VarStore) -> Result<Box<dyn Model>> {
    tch::manual_seed(MODEL_SEED);
    let input = InputSpec::of(&job.sample_shape, &target_of(job));
    build(&job.plan, &input, vs, false, 0).msg()
}

/// Writes the job's initial weights, data (`train_x`, `train_y`, `held_x`, `held_y`) and
/// `<model>-job.json` (all the PyTorch side needs) into `dir`; returns the job file.
fn prepare(dir: &Path, job: &Job) -> Result<PathBuf> {
    let kind = job.plan.kind;
    let vs = nn::VarStore::new(Device::Cpu);
    model(job, &vs)?;
    let init = file(dir, kind, "init");
    vs.save(&init).at(&init)?;
    // The train pool, then the held-out set, from one dataset.
    let (s, c, seed) = (&job.sample_shape, CLASSES, DATA_SEED);
    let len = job.pool + job.held_out;
    let (x, y) = match kind {
        Transformer => tensors(SyntheticSequences::new(len, s[0], s[1], c, seed)),
        ConvNet => tensors(SyntheticImages::new(len, s[0], s[1], c, seed)),
        Unet3d => tensors(SyntheticVolumes::new(len, s[1], seed)),
        _ => tensors(SyntheticClassification::new(len, s.clone(), c, seed, 3.0)),
    }?;
    let (pool, held) = (job.pool as i64, job.held_out as i64);
    let path = file(dir, kind, "data");
    let named = [
        ("train_x", x.narrow(0, 0, pool)),
        ("train_y", y.narrow(0, 0, pool)),
        ("held_x", x.narrow(0, pool, held)),
        ("held_y", y.narrow(0, pool, held)),
    ];
    Tensor::write_safetensors(&named, &path).at(&path)?;
    let p = &job.plan;
    let twin = match kind {
        Transformer => json!({
            "seq": s[0], "features": s[1], "d_model": p.d_model, "heads": p.heads,
            "layers": p.layers, "ff": p.ff, "classes": CLASSES}),
        ConvNet => json!({"in_channels": s[0], "channels": p.channels, "classes": CLASSES}),
        Unet3d => json!({"in_channels": s[0], "channels": p.channels, "classes": 2}),
        _ => json!({"features": s[0], "hidden": p.hidden, "classes": CLASSES}),
    };
    let text = json!({
        "model": kind.as_str(), "twin": twin, "init": init, "data": path,
        "steps": job.steps, "batch": job.batch, "eval_batch": EVAL_BATCH,
        "lr": LR, "weight_decay": WEIGHT_DECAY, "betas": [0.9, 0.999], "eps": 1e-8,
    });
    let job_path = dir.join(format!("{kind}-job.json"));
    std::fs::write(&job_path, text.to_string()).at(&job_path)?;
    Ok(job_path)
}

/// One kiln run from what `prepare` wrote into `--dir`, at `--precision`; prints JSON.
fn kiln_run(a: &KilnRunArgs) -> Result<()> {
    let start = std::time::Instant::now();
    let (kind, job) = (a.model, job(a.model, a.quick));
    kiln_torch_ext::memory::set_num_threads(a.threads.max(1)).msg()?;
    let mut vs = nn::VarStore::new(Device::Cpu);
    let model = model(&job, &vs)?;
    let init = file(&a.dir, kind, "init");
    vs.load(&init).at(&init)?;
    let path = file(&a.dir, kind, "data");
    let data = Tensor::read_safetensors(&path).at(&path)?;
    let named = |name: &str| {
        let found = data.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        found.ok_or_else(|| format!("{} has no tensor `{name}`", path.display()))
    };
    // The rows of the tensors `x` and `y` in batches of `size`, in order.
    let batches = |(x, y): (&str, &str), size: usize| -> Result<Vec<(Tensor, Tensor)>> {
        let split = |name| -> Result<Vec<Tensor>> { named(name)?.f_split(size as i64, 0).msg() };
        Ok(split(x)?.into_iter().zip(split(y)?).collect())
    };
    // The pool is whole batches, taken in order, cycling.
    let train = batches(("train_x", "train_y"), job.batch)?;
    let mut options = StepOptions::new(a.precision);
    (options.lr, options.weight_decay) = (LR, WEIGHT_DECAY);
    let mut stepper =
        Stepper::new(model.as_ref(), kind.as_str(), &vs, &options, Device::Cpu).msg()?;
    stepper.set_target(&target_of(&job)).msg()?;
    let mut losses = Vec::with_capacity(job.steps);
    for (step, (bx, by)) in train.iter().cycle().take(job.steps).enumerate() {
        let loss = stepper.step(bx, by).msg()?;
        if !loss.is_finite() {
            let why = format!("{kind}: non-finite loss at step {step}: {losses:?}");
            return Err(why);
        }
        losses.push(loss);
    }
    let held = batches(("held_x", "held_y"), EVAL_BATCH)?;
    let eval = stepper.evaluate(held).msg()?;
    let result = json!({
        "framework": "kiln", "model": kind.as_str(), "precision": a.precision.as_str(),
        "threads": tch::get_num_threads(), "losses": losses,
        "held_out_loss": eval.loss(), "held_out_accuracy": eval.get("accuracy"),
        "seconds": start.elapsed().as_secs_f64(),
    });
    println!("{result}");
    Ok(())
}

/// Both sides' runs of one model at one precision.
struct Pair {
    precision: AmpDtype,
    job: Job,
    kiln: Value,
    torch: Value,
}

/// The suite, over `models` (`--models a,b`, for runs by hand; none: all built-in ones).
fn suite(a: &SuiteArgs, models: &[ModelKind]) -> Result<()> {
    // Two threads a side by default, as in the other suites.
    let threads = a.threads_or(2).max(1).to_string();
    let work = fresh_work_dir(a, "learning")?;
    let exe = std::env::current_exe().msg()?;
    let all = ModelKind::ALL;
    let models = if models.is_empty() { &all[..] } else { models };
    let mut pairs = vec![];
    for &kind in models {
        let job = job(kind, a.quick);
        let job_file = prepare(&work, &job)?;
        for precision in PRECISIONS {
            let (name, steps) = (precision.as_str(), job.steps);
            eprintln!("learning: {kind} {name}, {steps} steps: kiln, then PyTorch");
            let both = ["--precision", name, "--threads", &threads];
            let mut k = command(&exe, &["learning", "kiln-run", "--model", kind.as_str()]);
            k.arg("--dir").arg(&work).args(both);
            k.args(a.quick.then_some("--quick"));
            let mut t = python_script(&a.python, "same_learning.py");
            t.arg("--job").arg(&job_file).args(both);
            pairs.push(Pair {
                precision,
                job: job.clone(),
                kiln: run_json(k)?,
                torch: run_json(t)?,
            });
        }
    }
    report(a.quick, &threads, &pairs)?.write(&a.out_or("learning"))?;
    remove_dir(&work)
}

fn losses(run: &Value) -> Result<Vec<f64>> {
    run["losses"]
        .as_array()
        .and_then(|l| l.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
        .filter(|l| !l.is_empty() && l.iter().all(|v| v.is_finite()))
        .ok_or_else(|| format!("a run reported no finite per-step losses: {run}"))
}

/// The step with the largest |a − b| and that difference (NaN-free inputs of equal length).
fn largest_difference(a: &[f64], b: &[f64]) -> (usize, f64) {
    let differences = a.iter().zip(b).map(|(x, y)| (x - y).abs());
    let larger = |best: (usize, f64), (i, d)| if d > best.1 { (i, d) } else { best };
    differences.enumerate().fold((0, 0.0), larger)
}

fn tail_mean(v: &[f64], tail: usize) -> f64 {
    mean(&v[v.len().saturating_sub(tail)..])
}

/// What the PyTorch side runs, for the rows' baseline names and the plots.
fn twin_text(kind: ModelKind, precision: AmpDtype) -> &'static str {
    match (precision, kind == Transformer) {
        (AmpDtype::None, true) => "PyTorch twin fp32 (SDPA, as kiln in fp32)",
        (AmpDtype::None, false) => "PyTorch twin fp32",
        (_, true) => "PyTorch twin, torch.autocast(cpu, bf16), kiln's matmul-softmax attention",
        (_, false) => "PyTorch twin, torch.autocast(cpu, bf16)",
    }
}

/// The rows of one model at one precision (fp32: the largest per-step difference; bf16: the final
/// loss, and the held-out accuracy without the loss curves), each against its tolerance.
fn rows(p: &Pair, quick: bool) -> Result<Vec<Comparison>> {
    let (j, kind, precision) = (&p.job, p.job.plan.kind, p.precision.as_str());
    let (kiln, torch) = (losses(&p.kiln)?, losses(&p.torch)?);
    let (steps, t) = (kiln.len(), torch.len());
    if steps != t {
        let why = format!("{kind} {precision}: kiln ran {steps} steps, PyTorch {t}");
        return Err(why);
    }
    let accuracy = |run: &Value| figure(run, "held_out_accuracy").map(|a| 100.0 * a);
    let (ka, ta) = (accuracy(&p.kiln)?, accuracy(&p.torch)?);
    let (kf, tf) = (tail_mean(&kiln, j.tail), tail_mean(&torch, j.tail));
    let (step, largest) = largest_difference(&kiln, &torch);
    let twin = twin_text(kind, p.precision);
    let details = json!({
        "model": kind.as_str(), "precision": precision,
        "steps": steps, "batch_size": j.batch, "pool": j.pool,
        "sample_shape": j.sample_shape, "classes": target_of(j).classes(),
        "held_out": j.held_out, "tail": j.tail,
        "largest_step_difference": largest, "largest_at_step": step,
        "kiln_final_loss": kf, "pytorch_final_loss": tf,
        "kiln_held_out_accuracy": ka, "pytorch_held_out_accuracy": ta,
        "kiln_held_out_loss": p.kiln["held_out_loss"],
        "pytorch_held_out_loss": p.torch["held_out_loss"],
        "loss_curves": {"kiln": kiln, "baseline": torch, "baseline_name": twin},
        "seconds": {"kiln": p.kiln["seconds"], "pytorch": p.torch["seconds"]},
    });
    let quick_note = quick.then_some(" (quick: not the 100-step check)");
    let what = format!("{kind} {precision}, {steps} steps of batch {}", j.batch);
    let what = what + quick_note.unwrap_or_default();
    let row = |name: &str, unit, figures, base: String| {
        let name = format!("{what}: {name}");
        let c = Comparison::new("learning", "same learning", name, unit, figures, base);
        let mut c = c.at_most(1.0);
        c.details = details.clone();
        c
    };
    if p.precision == AmpDtype::None {
        let at = match largest {
            0.0 => "identical at every step".to_owned(),
            _ => format!("largest at step {step}"),
        };
        let baseline = format!(
            "tolerance {FP32_STEP_TOLERANCE:e} nats ({twin}; {at}; final loss kiln {kf:.4}, \
             PyTorch {tf:.4})"
        );
        let figures = (largest, FP32_STEP_TOLERANCE);
        let fp32 = row("largest per-step |Δloss|", NATS, figures, baseline);
        return Ok(vec![fp32]);
    }
    let name = format!("final loss |Δ| (mean of last {} steps)", j.tail);
    let figures = ((kf - tf).abs(), BF16_LOSS_TOLERANCE);
    let base =
        format!("tolerance {BF16_LOSS_TOLERANCE} nats ({twin}; kiln {kf:.4}, PyTorch {tf:.4})");
    let loss = row(&name, NATS, figures, base);
    let figures = ((ka - ta).abs(), BF16_ACCURACY_TOLERANCE);
    let base = format!(
        "tolerance {BF16_ACCURACY_TOLERANCE} points ({twin}; {} held-out samples; kiln \
         {ka:.1}%, PyTorch {ta:.1}%)",
        j.held_out
    );
    let points = ("points", Better::Lower);
    let accuracy = row("held-out accuracy |Δ|", points, figures, base);
    Ok(vec![loss, accuracy.detail("loss_curves", Value::Null)])
}

fn report(quick: bool, threads: &str, pairs: &[Pair]) -> Result<SuiteOutput> {
    let quick_note =
        quick.then_some(". QUICK RUN: 20 steps on smaller models, not the 100-step check");
    let what = format!(
        "same learning on the CPU: kiln against its PyTorch twin (transformer, MLP, conv net) \
         from kiln's initial weights (written as safetensors, loaded by name), on the same fixed \
         synthetic data in the same batch order, fused AdamW (lr {LR}, betas 0.9/0.999, eps \
         1e-8, weight decay {WEIGHT_DECAY} on rank ≥ 2), constant lr, no clipping, dropout 0, \
         {threads} threads a side; fp32: every step's loss within {FP32_STEP_TOLERANCE:e} nats; \
         bf16 autocast (PyTorch with kiln's attention): final loss within \
         {BF16_LOSS_TOLERANCE} nats and held-out accuracy within {BF16_ACCURACY_TOLERANCE} \
         points{}",
        quick_note.unwrap_or_default()
    );
    let mut out = SuiteOutput::new("learning", &what);
    for p in pairs {
        rows(p, quick)?.into_iter().for_each(|c| out.push(c));
    }
    out.details = json!({
        "tolerances": {"fp32_step_nats": FP32_STEP_TOLERANCE,
                       "bf16_final_loss_nats": BF16_LOSS_TOLERANCE,
                       "bf16_held_out_accuracy_points": BF16_ACCURACY_TOLERANCE},
        "quick": quick,
        "runs": pairs.iter().map(|p| json!({"model": p.job.plan.kind.as_str(),
            "precision": p.precision.as_str(), "kiln": p.kiln, "pytorch": p.torch}))
            .collect::<Vec<_>>(),
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of a transformer pair with these losses and held-out accuracies.
    fn rows_of(
        precision: AmpDtype,
        (kiln, torch): (&[f64], &[f64]),
        accuracy: (f64, f64),
        quick: bool,
    ) -> Result<Vec<Comparison>> {
        let run = |losses: &[f64], acc: f64| {
            json!({"losses": losses, "held_out_accuracy": acc, "held_out_loss": 1.0,
                   "seconds": 1.0})
        };
        let pair = Pair {
            precision,
            job: job(Transformer, false),
            kiln: run(kiln, accuracy.0),
            torch: run(torch, accuracy.1),
        };
        rows(&pair, quick)
    }

    #[test]
    fn the_largest_difference_and_its_step() {
        let difference = largest_difference(&[1.0, 2.0, 3.0], &[1.0, 2.5, 2.9]);
        assert_eq!(difference, (1, 0.5));
        assert_eq!(largest_difference(&[1.0, 2.0], &[1.0, 2.0]), (0, 0.0));
        assert_eq!(tail_mean(&[5.0, 1.0, 2.0, 3.0], 3), 2.0);
        assert_eq!(tail_mean(&[4.0], 10), 4.0);
    }

    #[test]
    fn fp32_fails_past_the_tolerance_at_any_step() {
        let losses = [2.3, 2.0];
        let same = rows_of(AmpDtype::None, (&losses, &losses), (0.5, 0.5), false).unwrap();
        assert_eq!(same.len(), 1);
        assert_eq!(same[0].meets_goal, Some(true));
        assert!(same[0].baseline_name.contains("identical at every step"));
        assert_eq!(same[0].details["model"], "transformer");
        let apart = [2.3, 2.0 + 2.0 * FP32_STEP_TOLERANCE];
        let off = rows_of(AmpDtype::None, (&losses, &apart), (0.5, 0.5), true).unwrap();
        assert_eq!(off[0].meets_goal, Some(false));
        assert!(off[0].name.contains("quick: not the 100-step check"));
        assert!(off[0].baseline_name.contains("largest at step 1"));
    }

    #[test]
    fn bf16_judges_the_final_loss_and_the_held_out_accuracy() {
        let bf16 = |kiln: &[f64], torch: &[f64], accuracy| {
            rows_of(AmpDtype::Bf16, (kiln, torch), accuracy, false)
        };
        let mut kiln = vec![3.0; 20];
        let torch = kiln.clone();
        // Early steps may differ; the last 10 decide.
        kiln[0] = 2.0;
        let r = bf16(&kiln, &torch, (0.80, 0.79)).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].meets_goal, Some(true));
        assert!(r[0].details["loss_curves"]["kiln"].is_array());
        assert_eq!(r[1].meets_goal, Some(true));
        assert!((r[1].kiln - 1.0).abs() < 1e-9, "{}", r[1].kiln);
        assert!(r[1].details["loss_curves"].is_null());
        let r = bf16(&kiln, &torch, (0.80, 0.70)).unwrap();
        assert_eq!(r[1].meets_goal, Some(false));
        let lower: Vec<f64> = torch
            .iter()
            .map(|l| l - 2.0 * BF16_LOSS_TOLERANCE)
            .collect();
        let r = bf16(&lower, &torch, (0.8, 0.8)).unwrap();
        assert_eq!(r[0].meets_goal, Some(false));
        assert!(bf16(&[1.0], &[1.0, 2.0], (0.8, 0.8)).is_err());
    }
}
