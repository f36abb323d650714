//! `cargo xtask bench learning`: do kiln and PyTorch learn the same thing? For each reference
//! model (the transformer as the train suite builds it, the MLP and the conv net), kiln builds
//! the model with a fixed seed and writes its initial weights as safetensors; the PyTorch twin
//! (`python/same_learning.py`, the modules of `python/train_step.py`) loads them under an
//! explicit name map. Both sides then train on the same fixed data (kiln's synthetic dataset
//! for the model, written once as safetensors), in the same batch order, with the train suite's
//! settings: fused AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on tensors of
//! rank ≥ 2), constant lr, no clipping, dropout 0, the same thread count.
//!
//! - fp32: every step's loss must agree within [`FP32_STEP_TOLERANCE`].
//! - bf16 (kiln's CPU bf16 autocast against `torch.autocast("cpu", torch.bfloat16)` with kiln's
//!   attention formulation): the final loss (mean of the last steps) within
//!   [`BF16_LOSS_TOLERANCE`] and the held-out accuracy within [`BF16_ACCURACY_TOLERANCE`].
//!
//! Each row's kiln figure is the largest difference found and its baseline the tolerance, so
//! the goal is a ratio of at most 1; details hold both loss curves (plotted by the report).
//! `kiln-run` is the kiln side of one run, in its own process like the Python side.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{Args, Parser, Subcommand};
use kiln_benches::report::{Better, Comparison, SuiteOutput};
use kiln_benches::{SuiteArgs, bench_root, figure, run_json};
use kiln_config::{ModelKind, ModelPlan};
use kiln_data::{
    Dataset, SyntheticClassification, SyntheticImages, SyntheticSequences, TargetSpec,
};
use kiln_device::settings::AmpDtype;
use kiln_train::model::InputSpec;
use kiln_train::source::build;
use kiln_train::stepper::{StepOptions, Stepper};
use serde_json::{Value, json};
use tch::{Device, Tensor, nn};

use kiln_benches::Result;

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
const MODELS: [ModelKind; 3] = [ModelKind::Transformer, ModelKind::Mlp, ModelKind::ConvNet];
const PRECISIONS: [AmpDtype; 2] = [AmpDtype::None, AmpDtype::Bf16];

/// `kiln-bench learning`: the learning suite, and its kiln runs.
#[derive(Debug, Parser)]
#[command(name = "kiln-bench learning", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// Without a subcommand: the `learning` suite.
    #[command(flatten)]
    suite: LearningArgs,
}

// Parsed once per process: the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Sub {
    /// The same learning as PyTorch from kiln's initial weights: fp32 per step, bf16 final.
    Learning(LearningArgs),
    /// One kiln run from the initial weights and data the suite wrote; prints JSON.
    KilnRun(KilnRunArgs),
}

/// The suite's options.
#[derive(Debug, Args)]
struct LearningArgs {
    #[command(flatten)]
    suite: SuiteArgs,
    /// The models, e.g. transformer,mlp (for runs by hand; default: all three).
    #[arg(long, value_delimiter = ',')]
    models: Vec<ModelKind>,
}

/// `kiln-run`'s options.
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
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        None => suite(&cli.suite),
        Some(Sub::Learning(a)) => suite(&a),
        Some(Sub::KilnRun(a)) => kiln_run(&a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// One model's check: the model, its data and the training budget.
#[derive(Debug, Clone)]
struct Job {
    plan: ModelPlan,
    sample_shape: Vec<usize>,
    classes: usize,
    batch: usize,
    steps: usize,
    /// Samples in the train pool (batches are taken from it in order, cycling).
    pool: usize,
    held_out: usize,
    /// The final loss is the mean of the last `tail` steps' losses.
    tail: usize,
}

fn plan(kind: ModelKind, d_model: u64, heads: u64, layers: u64, ff: u64) -> ModelPlan {
    ModelPlan {
        kind,
        dropout: 0.0,
        d_model,
        heads,
        layers,
        ff,
        hidden: vec![256, 256],
        channels: vec![32, 64, 128],
        activation_checkpointing: false,
        script: None,
        output: None,
        freeze: None,
    }
}

/// The full check: the train suite's models and data shapes, 100+ steps. `--quick` (CI) keeps
/// the suite's shape with a smaller transformer, smaller images and 20 steps.
fn job(kind: ModelKind, quick: bool) -> Job {
    let steps = if quick { 20 } else { 100 };
    let (plan, sample_shape, classes, batch) = match (kind, quick) {
        // The train suite's transformer with a 10-class head (its 100 classes learn too little
        // in 100 steps for the held-out accuracy to say anything).
        (ModelKind::Transformer, false) => (plan(kind, 256, 8, 4, 1024), vec![64, 469], 10, 8),
        (ModelKind::Transformer, true) => (plan(kind, 64, 4, 1, 128), vec![16, 32], 10, 8),
        // 16×16 images rather than the train suite's 32×32: bf16 convolutions are slow on a
        // CPU without bf16 units, and the check is about agreement, not size.
        (ModelKind::ConvNet, false) => (plan(kind, 0, 0, 0, 0), vec![3, 16, 16], 10, 16),
        (ModelKind::ConvNet, true) => (plan(kind, 0, 0, 0, 0), vec![3, 8, 8], 10, 8),
        _ => (plan(kind, 0, 0, 0, 0), vec![64], 10, 32),
    };
    Job {
        plan,
        sample_shape,
        classes,
        batch,
        steps,
        pool: batch * steps.div_ceil(2),
        held_out: if quick { 64 } else { 256 },
        tail: if quick { 5 } else { 10 },
    }
}

/// kiln's synthetic dataset for the job's model, `len` samples.
fn dataset(kind: ModelKind, job: &Job, len: usize) -> Result<Box<dyn Dataset>> {
    let (s, c) = (&job.sample_shape, job.classes);
    let data: Box<dyn Dataset> = match kind {
        ModelKind::Transformer => Box::new(
            SyntheticSequences::new(len, s[0], s[1], c, DATA_SEED).map_err(|e| e.to_string())?,
        ),
        ModelKind::ConvNet => Box::new(
            SyntheticImages::new(len, s[0], s[1], c, DATA_SEED).map_err(|e| e.to_string())?,
        ),
        _ => Box::new(
            SyntheticClassification::new(len, s.clone(), c, DATA_SEED, 3.0)
                .map_err(|e| e.to_string())?,
        ),
    };
    Ok(data)
}

/// Samples `range` of `data` as a features tensor `[n, shape…]` and a labels tensor `[n]`.
fn tensors(data: &dyn Dataset, range: std::ops::Range<usize>) -> Result<(Tensor, Tensor)> {
    let numel = data.sample_numel();
    let mut features = vec![0f32; range.len() * numel];
    let mut labels = Vec::with_capacity(range.len());
    for (i, out) in range.clone().zip(features.chunks_exact_mut(numel)) {
        labels.push(data.read(i, out).map_err(|e| e.to_string())?);
    }
    let mut dims = vec![range.len() as i64];
    dims.extend(data.sample_shape().iter().map(|&d| d as i64));
    let features = Tensor::f_from_slice(&features)
        .and_then(|t| t.f_view(dims.as_slice()))
        .map_err(|e| e.to_string())?;
    let labels = Tensor::f_from_slice(&labels).map_err(|e| e.to_string())?;
    Ok((features, labels))
}

fn init_path(dir: &Path, kind: ModelKind) -> PathBuf {
    dir.join(format!("{kind}-init.safetensors"))
}

fn data_path(dir: &Path, kind: ModelKind) -> PathBuf {
    dir.join(format!("{kind}-data.safetensors"))
}

/// kiln's model for the job, built with [`MODEL_SEED`] on the CPU.
fn model(
    kind: ModelKind,
    job: &Job,
    vs: &nn::VarStore,
) -> Result<Box<dyn kiln_train::model::Model>> {
    tch::manual_seed(MODEL_SEED);
    let input = InputSpec {
        sample_shape: job.sample_shape.clone(),
        classes: job.classes,
        target: None,
        integer_features: false,
    };
    let mut plan = job.plan.clone();
    plan.kind = kind;
    build(&plan, &input, vs, false, 0).map_err(|e| e.to_string())
}

/// Writes the job's initial weights, data (`train_x`, `train_y`, `held_x`, `held_y`) and
/// `<model>-job.json` (what the PyTorch side needs to build and train the twin) into `dir`;
/// returns the job file.
fn prepare(dir: &Path, kind: ModelKind, job: &Job) -> Result<PathBuf> {
    let vs = nn::VarStore::new(Device::Cpu);
    model(kind, job, &vs)?;
    let init = init_path(dir, kind);
    vs.save(&init)
        .map_err(|e| format!("{}: {e}", init.display()))?;
    let data = dataset(kind, job, job.pool + job.held_out)?;
    let (train_x, train_y) = tensors(data.as_ref(), 0..job.pool)?;
    let (held_x, held_y) = tensors(data.as_ref(), job.pool..job.pool + job.held_out)?;
    let path = data_path(dir, kind);
    let named = [
        ("train_x", train_x),
        ("train_y", train_y),
        ("held_x", held_x),
        ("held_y", held_y),
    ];
    Tensor::write_safetensors(&named, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    let twin = match kind {
        ModelKind::Transformer => json!({
            "seq": job.sample_shape[0], "features": job.sample_shape[1],
            "d_model": job.plan.d_model, "heads": job.plan.heads, "layers": job.plan.layers,
            "ff": job.plan.ff, "classes": job.classes}),
        ModelKind::ConvNet => json!({
            "in_channels": job.sample_shape[0], "channels": job.plan.channels,
            "classes": job.classes}),
        _ => json!({"features": job.sample_shape[0], "hidden": job.plan.hidden,
                    "classes": job.classes}),
    };
    let text = json!({
        "model": kind.as_str(), "twin": twin, "init": init, "data": path,
        "steps": job.steps, "batch": job.batch, "eval_batch": EVAL_BATCH,
        "lr": LR, "weight_decay": WEIGHT_DECAY, "betas": [0.9, 0.999], "eps": 1e-8,
    });
    let job_path = dir.join(format!("{kind}-job.json"));
    std::fs::write(&job_path, text.to_string())
        .map_err(|e| format!("{}: {e}", job_path.display()))?;
    Ok(job_path)
}

/// The train suite's step (fused AdamW, constant lr, no clipping) at `precision`.
fn options(precision: AmpDtype) -> StepOptions {
    StepOptions {
        lr: LR,
        weight_decay: WEIGHT_DECAY,
        ..StepOptions::new(precision)
    }
}

fn named<'a>(data: &'a [(String, Tensor)], name: &str, path: &Path) -> Result<&'a Tensor> {
    data.iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .ok_or_else(|| format!("{} has no tensor `{name}`", path.display()))
}

fn batch(x: &Tensor, y: &Tensor, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
    let (s, n) = (start as i64, len as i64);
    Ok((
        x.f_narrow(0, s, n).map_err(|e| e.to_string())?,
        y.f_narrow(0, s, n).map_err(|e| e.to_string())?,
    ))
}

/// One kiln run: loads the initial weights and data `prepare` wrote into `--dir`, trains
/// `steps` steps at `--precision`, evaluates the held-out set; prints JSON.
fn kiln_run(a: &KilnRunArgs) -> Result<()> {
    let start = std::time::Instant::now();
    let kind = a.model;
    let job = job(kind, a.quick);
    let dir = &a.dir;
    let precision = a.precision;
    let threads = a.threads.max(1);
    kiln_torch_ext::memory::set_num_threads(threads).map_err(|e| e.to_string())?;
    let mut vs = nn::VarStore::new(Device::Cpu);
    let model = model(kind, &job, &vs)?;
    let init = init_path(dir, kind);
    vs.load(&init)
        .map_err(|e| format!("{}: {e}", init.display()))?;
    let path = data_path(dir, kind);
    let data = Tensor::read_safetensors(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (x, y) = (
        named(&data, "train_x", &path)?,
        named(&data, "train_y", &path)?,
    );
    let mut stepper = Stepper::new(
        model.as_ref(),
        kind.as_str(),
        &vs,
        &options(precision),
        Device::Cpu,
    )
    .map_err(|e| e.to_string())?;
    stepper
        .set_target(&TargetSpec::label(job.classes))
        .map_err(|e| e.to_string())?;
    let mut losses = Vec::with_capacity(job.steps);
    for step in 0..job.steps {
        let first = step * job.batch % job.pool;
        let (bx, by) = batch(x, y, first, job.batch)?;
        let loss = stepper.step(&bx, &by).map_err(|e| e.to_string())?;
        if !loss.is_finite() {
            return Err(format!(
                "{kind}: non-finite loss at step {step}: {losses:?}"
            ));
        }
        losses.push(loss);
    }
    let (hx, hy) = (
        named(&data, "held_x", &path)?,
        named(&data, "held_y", &path)?,
    );
    let batches = (0..job.held_out)
        .step_by(EVAL_BATCH)
        .map(|s| batch(hx, hy, s, EVAL_BATCH.min(job.held_out - s)))
        .collect::<Result<Vec<_>>>()?;
    let eval = stepper.evaluate(batches).map_err(|e| e.to_string())?;
    println!(
        "{}",
        json!({
            "framework": "kiln",
            "model": kind.as_str(),
            "precision": precision.as_str(),
            "threads": tch::get_num_threads(),
            "losses": losses,
            "held_out_loss": eval.loss(),
            "held_out_accuracy": eval.get("accuracy"),
            "seconds": start.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}

/// `path`, created empty (an earlier run's leftovers are removed: it is the bench's own scratch).
fn fresh_dir(path: &Path) -> Result<PathBuf> {
    if path.exists() {
        std::fs::remove_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    std::fs::create_dir_all(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path.to_owned())
}

/// Both sides' runs of one model at one precision.
struct Pair {
    kind: ModelKind,
    precision: AmpDtype,
    job: Job,
    kiln: Value,
    torch: Value,
}

fn suite(args: &LearningArgs) -> Result<()> {
    let a = &args.suite;
    let quick = a.quick;
    // Two threads a side by default, as in the other suites.
    let threads = a.threads_or(2).max(1).to_string();
    // The bench's own scratch directory, removed at the end.
    let work = a.work_dir.as_ref().map_or_else(
        || std::env::temp_dir().join(format!("kiln-bench-learning-{}", std::process::id())),
        |dir| dir.join("learning"),
    );
    let work = fresh_dir(&work)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // `--models a,b` (for runs by hand), else [`MODELS`].
    let models = if args.models.is_empty() {
        MODELS.to_vec()
    } else {
        args.models.clone()
    };
    let mut pairs = vec![];
    for kind in models {
        let job = job(kind, quick);
        let job_file = prepare(&work, kind, &job)?;
        for precision in PRECISIONS {
            let name = precision.as_str();
            eprintln!(
                "learning: {kind} {name}, {} steps: kiln, then PyTorch",
                job.steps
            );
            let mut k = Command::new(&exe);
            k.args(["learning", "kiln-run", "--model", kind.as_str()])
                .args(["--precision", name])
                .arg("--dir")
                .arg(&work)
                .args(["--threads", &threads]);
            if quick {
                k.arg("--quick");
            }
            let mut t = Command::new(&a.python);
            t.arg(bench_root().join("python/same_learning.py"))
                .arg("--job")
                .arg(&job_file)
                .args(["--precision", name, "--threads", &threads]);
            let (kiln, torch) = (run_json(k)?, run_json(t)?);
            pairs.push(Pair {
                kind,
                precision,
                job: job.clone(),
                kiln,
                torch,
            });
        }
    }
    let out = report(quick, &threads, &pairs)?;
    out.write(&a.out_or("learning"))?;
    std::fs::remove_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))
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
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .enumerate()
        .fold(
            (0, 0.0),
            |best, (i, d)| if d > best.1 { (i, d) } else { best },
        )
}

fn tail_mean(v: &[f64], tail: usize) -> f64 {
    let tail = &v[v.len().saturating_sub(tail)..];
    tail.iter().sum::<f64>() / tail.len().max(1) as f64
}

/// What the PyTorch side runs, for the rows' baseline names and the plots.
fn twin_text(kind: ModelKind, precision: AmpDtype) -> String {
    let attention = kind == ModelKind::Transformer;
    match precision {
        AmpDtype::None if attention => "PyTorch twin fp32 (SDPA, as kiln in fp32)".to_owned(),
        AmpDtype::None => "PyTorch twin fp32".to_owned(),
        _ if attention => {
            "PyTorch twin, torch.autocast(cpu, bf16), kiln's matmul-softmax attention".to_owned()
        }
        _ => "PyTorch twin, torch.autocast(cpu, bf16)".to_owned(),
    }
}

/// One row: `kiln` is the largest difference found, the baseline the tolerance (goal ≤ 1).
fn row(name: String, unit: &str, difference: f64, tolerance: f64, baseline: String) -> Comparison {
    Comparison::new(
        "learning",
        "same learning",
        name,
        unit,
        Better::Lower,
        (difference, tolerance),
        baseline,
    )
    .at_most(1.0)
}

/// What one pair of runs shows.
struct Measured {
    kiln: Vec<f64>,
    torch: Vec<f64>,
    /// The step with the largest |Δloss|, and that difference.
    step: usize,
    largest: f64,
    /// Held-out accuracy in percent.
    kiln_accuracy: f64,
    torch_accuracy: f64,
    /// Mean loss of the last `tail` steps.
    kiln_final: f64,
    torch_final: f64,
}

fn measure(p: &Pair) -> Result<Measured> {
    let (kiln, torch) = (losses(&p.kiln)?, losses(&p.torch)?);
    if kiln.len() != torch.len() {
        return Err(format!(
            "{} {}: kiln ran {} steps, PyTorch {}",
            p.kind,
            p.precision.as_str(),
            kiln.len(),
            torch.len()
        ));
    }
    let (step, largest) = largest_difference(&kiln, &torch);
    Ok(Measured {
        step,
        largest,
        kiln_accuracy: 100.0 * figure(&p.kiln, "held_out_accuracy")?,
        torch_accuracy: 100.0 * figure(&p.torch, "held_out_accuracy")?,
        kiln_final: tail_mean(&kiln, p.job.tail),
        torch_final: tail_mean(&torch, p.job.tail),
        kiln,
        torch,
    })
}

/// Every row's details: the job, both sides' figures and loss curves.
fn details(p: &Pair, m: &Measured) -> Value {
    json!({
        "model": p.kind.as_str(),
        "precision": p.precision.as_str(),
        "steps": m.kiln.len(), "batch_size": p.job.batch, "pool": p.job.pool,
        "sample_shape": p.job.sample_shape, "classes": p.job.classes,
        "held_out": p.job.held_out, "tail": p.job.tail,
        "largest_step_difference": m.largest, "largest_at_step": m.step,
        "kiln_final_loss": m.kiln_final, "pytorch_final_loss": m.torch_final,
        "kiln_held_out_accuracy": m.kiln_accuracy,
        "pytorch_held_out_accuracy": m.torch_accuracy,
        "kiln_held_out_loss": p.kiln["held_out_loss"],
        "pytorch_held_out_loss": p.torch["held_out_loss"],
        "loss_curves": {"kiln": m.kiln, "baseline": m.torch,
                        "baseline_name": twin_text(p.kind, p.precision)},
        "seconds": {"kiln": p.kiln["seconds"], "pytorch": p.torch["seconds"]},
    })
}

/// The rows of one model at one precision: fp32, the largest per-step difference; bf16, the
/// final loss and the held-out accuracy (the loss curves on the first row only).
fn rows(p: &Pair, quick: bool) -> Result<Vec<Comparison>> {
    let m = measure(p)?;
    let details = details(p, &m);
    let with = |c: Comparison| {
        details
            .as_object()
            .into_iter()
            .flatten()
            .fold(c, |c, (key, v)| c.detail(key, v.clone()))
    };
    let quick_note = if quick {
        " (quick: not the 100-step check)"
    } else {
        ""
    };
    let what = format!(
        "{} {}, {} steps of batch {}{quick_note}",
        p.kind,
        p.precision.as_str(),
        m.kiln.len(),
        p.job.batch
    );
    let twin = twin_text(p.kind, p.precision);
    let (kf, tf) = (m.kiln_final, m.torch_final);
    if p.precision == AmpDtype::None {
        let at = if m.largest == 0.0 {
            "identical at every step".to_owned()
        } else {
            format!("largest at step {}", m.step)
        };
        let baseline = format!(
            "tolerance {FP32_STEP_TOLERANCE:e} nats ({twin}; {at}; final loss kiln {kf:.4}, \
             PyTorch {tf:.4})"
        );
        let name = format!("{what}: largest per-step |Δloss|");
        let fp32 = row(name, "nats", m.largest, FP32_STEP_TOLERANCE, baseline);
        return Ok(vec![with(fp32)]);
    }
    let (ka, ta) = (m.kiln_accuracy, m.torch_accuracy);
    let loss = row(
        format!("{what}: final loss |Δ| (mean of last {} steps)", p.job.tail),
        "nats",
        (kf - tf).abs(),
        BF16_LOSS_TOLERANCE,
        format!("tolerance {BF16_LOSS_TOLERANCE} nats ({twin}; kiln {kf:.4}, PyTorch {tf:.4})"),
    );
    let accuracy = row(
        format!("{what}: held-out accuracy |Δ|"),
        "points",
        (ka - ta).abs(),
        BF16_ACCURACY_TOLERANCE,
        format!(
            "tolerance {BF16_ACCURACY_TOLERANCE} points ({twin}; {} held-out samples; kiln \
             {ka:.1}%, PyTorch {ta:.1}%)",
            p.job.held_out
        ),
    );
    Ok(vec![
        with(loss),
        with(accuracy).detail("loss_curves", Value::Null),
    ])
}

fn report(quick: bool, threads: &str, pairs: &[Pair]) -> Result<SuiteOutput> {
    let mut out = SuiteOutput::new(
        "learning",
        &format!(
            "same learning on the CPU: kiln against its PyTorch twin (transformer, MLP, conv \
             net) from kiln's initial weights (written as safetensors, loaded by name), on the \
             same fixed synthetic data in the same batch order, fused AdamW (lr {LR}, betas \
             0.9/0.999, eps 1e-8, weight decay {WEIGHT_DECAY} on rank ≥ 2), constant lr, no \
             clipping, dropout 0, {threads} threads a side; fp32: every step's loss within \
             {FP32_STEP_TOLERANCE:e} nats; \
             bf16 autocast (PyTorch with kiln's attention): final loss within \
             {BF16_LOSS_TOLERANCE} nats and held-out accuracy within \
             {BF16_ACCURACY_TOLERANCE} points{}",
            if quick {
                ". QUICK RUN: 20 steps on smaller models, not the 100-step check"
            } else {
                ""
            }
        ),
    );
    for p in pairs {
        for c in rows(p, quick)? {
            out.push(c);
        }
    }
    out.details = json!({
        "tolerances": {"fp32_step_nats": FP32_STEP_TOLERANCE,
                       "bf16_final_loss_nats": BF16_LOSS_TOLERANCE,
                       "bf16_held_out_accuracy_points": BF16_ACCURACY_TOLERANCE},
        "quick": quick,
        "runs": pairs.iter().map(|p| json!({"model": p.kind.as_str(),
            "precision": p.precision.as_str(), "kiln": p.kiln, "pytorch": p.torch}))
            .collect::<Vec<_>>(),
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(precision: AmpDtype, kiln: &[f64], torch: &[f64], accuracy: (f64, f64)) -> Pair {
        let run = |losses: &[f64], acc: f64| {
            json!({"losses": losses, "held_out_accuracy": acc, "held_out_loss": 1.0,
                   "seconds": 1.0})
        };
        Pair {
            kind: ModelKind::Transformer,
            precision,
            job: job(ModelKind::Transformer, false),
            kiln: run(kiln, accuracy.0),
            torch: run(torch, accuracy.1),
        }
    }

    #[test]
    fn the_largest_difference_and_its_step() {
        assert_eq!(
            largest_difference(&[1.0, 2.0, 3.0], &[1.0, 2.5, 2.9]),
            (1, 0.5)
        );
        assert_eq!(largest_difference(&[1.0, 2.0], &[1.0, 2.0]), (0, 0.0));
        assert_eq!(tail_mean(&[5.0, 1.0, 2.0, 3.0], 3), 2.0);
        assert_eq!(tail_mean(&[4.0], 10), 4.0);
    }

    #[test]
    fn fp32_fails_past_the_tolerance_at_any_step() {
        let same = rows(
            &pair(AmpDtype::None, &[2.3, 2.0], &[2.3, 2.0], (0.5, 0.5)),
            false,
        );
        let same = same.unwrap();
        assert_eq!(same.len(), 1);
        assert_eq!(same[0].meets_goal, Some(true));
        assert!(same[0].baseline_name.contains("identical at every step"));
        assert_eq!(same[0].details["model"], "transformer");
        let apart = [2.3, 2.0 + 2.0 * FP32_STEP_TOLERANCE];
        let off = rows(&pair(AmpDtype::None, &[2.3, 2.0], &apart, (0.5, 0.5)), true).unwrap();
        assert_eq!(off[0].meets_goal, Some(false));
        assert!(off[0].name.contains("quick: not the 100-step check"));
        assert!(off[0].baseline_name.contains("largest at step 1"));
    }

    #[test]
    fn bf16_judges_the_final_loss_and_the_held_out_accuracy() {
        let mut kiln = vec![3.0; 20];
        let torch = kiln.clone();
        // Early steps may differ; the last 10 decide.
        kiln[0] = 2.0;
        let r = rows(&pair(AmpDtype::Bf16, &kiln, &torch, (0.80, 0.79)), false).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].meets_goal, Some(true));
        assert!(r[0].details["loss_curves"]["kiln"].is_array());
        assert_eq!(r[1].meets_goal, Some(true));
        assert!((r[1].kiln - 1.0).abs() < 1e-9, "{}", r[1].kiln);
        assert!(r[1].details["loss_curves"].is_null());
        let r = rows(&pair(AmpDtype::Bf16, &kiln, &torch, (0.80, 0.70)), false).unwrap();
        assert_eq!(r[1].meets_goal, Some(false));
        let lower: Vec<f64> = torch
            .iter()
            .map(|l| l - 2.0 * BF16_LOSS_TOLERANCE)
            .collect();
        let r = rows(&pair(AmpDtype::Bf16, &lower, &torch, (0.8, 0.8)), false).unwrap();
        assert_eq!(r[0].meets_goal, Some(false));
        assert!(
            rows(
                &pair(AmpDtype::Bf16, &[1.0], &[1.0, 2.0], (0.8, 0.8)),
                false
            )
            .is_err()
        );
    }
}
