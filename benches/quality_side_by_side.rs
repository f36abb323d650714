//! `cargo xtask bench quality`: does kiln learn as well as PyTorch? The same job on both sides,
//! at the same budget, over several seeds per side: the SignTransformer-shaped reference model on
//! one synthetic dataset written as `.npy` files, which kiln reads as a dataset prepared from
//! them (`kiln data prepare`) and a plain PyTorch loop (`python/train_quality.py`) reads
//! directly; the same train/validation split (kiln's, handed to PyTorch as indices); fp32,
//! AdamW with the same decay groups, warmup then cosine, clipping, dropout, batch size and
//! epochs; the same initial weights for the same seed. kiln runs in fp32 and at the precision it
//! picks by itself (bf16 on a CPU with bf16 units); PyTorch with kiln's settings (glibc's malloc
//! thresholds as kiln sets them included) and as a user writes it by default (constant lr, no
//! warmup, no clipping). It reports the final validation
//! accuracy and loss (means and every seed) with the goal that kiln is not worse than PyTorch's
//! range: its mean accuracy within 1 point of PyTorch's worst seed or better, its mean loss at
//! most 2% above PyTorch's worst seed. Time per run is reported beside them: a faster kiln whose
//! quality rows miss is a regression. `train.lr = auto` is judged on this job and on a second
//! one of another kind, an MLP regression ([`regression`]): against the default rate and against
//! PyTorch at Lightning's `lr_find` suggestion, with its range test's share of the run's time.
//! `--filter reference` or `--filter regression` runs one job.
//!
//! `kiln-run` is the kiln side of one run, in its own process like the Python side.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, Subcommand};
use kiln_benches::report::{Better, Comparison, NATS, PERCENT, SECONDS, SuiteOutput, Unit};
use kiln_benches::run_json;
use kiln_benches::{Msg, Result, SuiteArgs, bench_root, datasets, figure, mean, peers, resolve};
use kiln_data::{ShardedDataset, SyntheticSequences};
use kiln_train::learner::Learner;
use kiln_train::record::{EpochRecord, Observer, RunStart};
use serde_json::{Value, json};

use kiln_benches::run_cli::{Cli, exit_on_error, fresh_work_dir, remove_dir};

#[path = "quality_regression.rs"]
mod regression;

/// The job: sizes of the data and the model, and the training budget.
#[derive(Debug, Clone, Copy)]
struct Job {
    samples: usize,
    seq: usize,
    features: usize,
    classes: usize,
    d_model: usize,
    layers: usize,
    ff: usize,
    epochs: usize,
    batch: usize,
    /// Linear warmup steps (kiln's default, 50, for the full job; the quick one has 28 steps).
    warmup: usize,
}

/// The job: 4096 SignTransformer-shaped samples, the default transformer, 2 epochs of
/// batch 16. `--quick` (CI) shrinks data and model to check the suite's shape only.
fn job(quick: bool) -> Job {
    let ((samples, seq, features, classes), (d_model, layers, ff), (epochs, warmup)) = if quick {
        ((512, 16, 32, 10), (64, 1, 128), (1, 5))
    } else {
        ((4096, 64, 469, 100), (256, 4, 1024), (2, 50))
    };
    Job {
        samples,
        seq,
        features,
        classes,
        d_model,
        layers,
        ff,
        epochs,
        batch: 16,
        warmup,
    }
}

const DATA_SEED: u64 = 1234;
const VAL_FRACTION: f64 = 0.1;

#[derive(Debug, Subcommand)]
enum Sub {
    /// Learning vs a PyTorch loop: same job, data, split, init; 2+ seeds.
    Quality(SuiteArgs),
    /// Only writes the job's data and splits into DIR.
    Data(DataArgs),
    /// One kiln run of the job on the prepared data; prints JSON.
    KilnRun(KilnRunArgs),
}

#[derive(Debug, Args)]
struct DataArgs {
    /// A new directory.
    dir: PathBuf,
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value_t = 2)]
    seeds: u64,
    /// The second job's data (the MLP regression) instead of the reference job's.
    #[arg(long)]
    regression: bool,
}

#[derive(Debug, Args)]
struct KilnRunArgs {
    /// The directory `data` (or the suite) wrote.
    #[arg(long)]
    data: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: usize,
    #[arg(long)]
    quick: bool,
    /// Intra-op threads (0: kiln's default).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// The precision kiln's profile picks instead of fp32.
    #[arg(long)]
    auto_precision: bool,
    /// A variant of the job, for measuring what a setting does (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// The suite's second job (the MLP regression) instead of the reference job.
    #[arg(long)]
    regression: bool,
}

/// Runs the suite's command line (`args[0]` is its name, as clap takes a program name).
pub fn main(args: Vec<std::ffi::OsString>) {
    let about = "`kiln-bench quality`: the quality suite, and its pieces for runs by hand";
    let cli = Cli::parse_with(args, about);
    exit_on_error(match cli.command {
        None => suite(&cli.suite),
        Some(Sub::Quality(a)) => suite(&a),
        Some(Sub::Data(a)) => data_only(&a),
        Some(Sub::KilnRun(a)) => kiln_run(&a),
    });
}

/// Writes the job's dataset as `features.npy`/`labels.npy` in `dir` (the PyTorch side reads
/// them), prepares kiln's dataset from them in `dir/kiln`, and returns it opened.
fn write_data(dir: &Path, job: &Job) -> Result<Arc<ShardedDataset>> {
    let data = SyntheticSequences::new(job.samples, job.seq, job.features, job.classes, DATA_SEED)
        .msg()?;
    datasets::write_prepared(dir, "kiln", &data, None, true)
}

/// `data DIR [--quick] [--seeds N]`: only writes the job's data and splits into DIR (for runs
/// of `kiln-run` or `python/train_quality.py` by hand, e.g. to measure a setting's effect).
fn data_only(a: &DataArgs) -> Result<()> {
    let dir = &a.dir;
    if dir.exists() {
        return Err(format!("{} exists; give a new directory", dir.display()));
    }
    std::fs::create_dir_all(dir).at(dir)?;
    let prepared = if a.regression {
        regression::write_data(dir, &regression::job(a.quick), DATA_SEED)?
    } else {
        write_data(dir, &job(a.quick))?
    };
    for seed in 0..a.seeds {
        write_split(dir, &prepared, seed)?;
    }
    Ok(())
}

/// kiln's train/validation split of `prepared` for `seed`, as `dir/split-<seed>.json`.
fn write_split(dir: &Path, prepared: &Arc<ShardedDataset>, seed: u64) -> Result<PathBuf> {
    let path = dir.join(format!("split-{seed}.json"));
    datasets::write_split(&path, prepared, VAL_FRACTION, seed)
}

/// The validation figures of each epoch, and the run's start: its learning rate (found, with
/// `train.lr = auto`) and the seconds before training began (reading the data, building the
/// model, and any range test).
struct Epochs(Vec<Value>, Instant, Option<Value>);

impl Observer for Epochs {
    fn on_start(&mut self, r: &RunStart) -> std::result::Result<(), kiln_train::TrainError> {
        self.2 = Some(json!({
            "lr": r.lr, "lr_search": r.lr_search,
            "started_after_s": self.1.elapsed().as_secs_f64(),
        }));
        Ok(())
    }
    fn on_epoch(&mut self, r: &EpochRecord) -> std::result::Result<(), kiln_train::TrainError> {
        self.0.push(json!({
            "epoch": r.epoch, "val_loss": r.val.get("loss"), "val_accuracy": r.val.get("accuracy"),
            "val_rmse": r.val.get("rmse"),
        }));
        Ok(())
    }
}

/// One kiln run of the job on the prepared data in `--data`, seeded with `--seed`; prints JSON.
fn kiln_run(a: &KilnRunArgs) -> Result<()> {
    let start = Instant::now();
    let seed = a.seed;
    // kiln makes the directory; an earlier run's leftovers are removed.
    let runs = a.data.join(format!("runs-{seed}"));
    remove_dir(&runs)?;
    let mut sets = vec![
        "device.request=cpu".to_owned(),
        format!("data.val_fraction={VAL_FRACTION}"),
        "data.num_workers=2".to_owned(),
        format!("performance.seed={seed}"),
        format!("performance.intra_op_threads={}", a.threads),
        "checkpoint.enabled=false".to_owned(),
        format!("run.output_dir={}", runs.display()),
    ];
    let (model, values) = if a.regression {
        ("mlp", regression::job_values(&regression::job(a.quick)))
    } else {
        ("transformer", reference_values(&job(a.quick)))
    };
    sets.push(format!("model.name={model}"));
    sets.extend(values.iter().map(|(key, _, v)| format!("{key}={v}")));
    // fp32 like the PyTorch side unless `--auto-precision`: then what kiln's profile picks
    // (bf16 on a CPU with AMX-BF16 or AVX512-BF16).
    if !a.auto_precision {
        sets.push("train.amp=fp32".to_owned());
    }
    // `--set key=value` (repeatable): a variant of the job, for measuring what a setting does.
    sets.extend(a.sets.iter().cloned());
    // As `kiln train --data` runs it: the library's front door with these settings.
    let learner = Learner::builder()
        .resolution(resolve(&sets)?)
        .build()
        .msg()?;
    let mut epochs = Epochs(vec![], start, None);
    let outcome = learner
        .fit_plan(Some(&a.data.join("kiln")), &mut epochs)
        .msg()?;
    let s = &outcome.summary;
    println!(
        "{}",
        json!({
            "framework": "kiln", "seed": seed, "steps": s.steps,
            "threads": tch::get_num_threads(), "precision": s.precision,
            "final_val_loss": s.final_val.get("loss"),
            "final_val_accuracy": s.final_val.get("accuracy"),
            "final_val_rmse": s.final_val.get("rmse"),
            "final_val_ema_loss": s.final_val_ema.get("loss"),
            "final_val_ema_accuracy": s.final_val_ema.get("accuracy"),
            "epochs": epochs.0, "seconds": start.elapsed().as_secs_f64(), "start": epochs.2,
        })
    );
    Ok(())
}

/// A value of a job that both sides are given: kiln's setting, the PyTorch script's option, and
/// the value.
type Both = (&'static str, &'static str, String);

/// The reference job's values (kiln's model is the transformer, the script's default).
fn reference_values(job: &Job) -> Vec<Both> {
    vec![
        ("model.d_model", "--d-model", job.d_model.to_string()),
        ("model.layers", "--layers", job.layers.to_string()),
        ("model.ff", "--ff", job.ff.to_string()),
        ("model.dropout", "--dropout", "0.1".to_owned()),
        ("train.epochs", "--epochs", job.epochs.to_string()),
        ("train.batch_size", "--batch", job.batch.to_string()),
        ("train.warmup_steps", "--warmup", job.warmup.to_string()),
    ]
}

/// The PyTorch script's options for a job's `values`.
fn torch_args(values: &[Both]) -> Vec<String> {
    let pairs = values
        .iter()
        .map(|(_, option, v)| [option.to_string(), v.clone()]);
    pairs.flatten().collect()
}

/// `key` of each run (e.g. of each of one side's runs).
fn of<'a>(runs: impl IntoIterator<Item = &'a Value>, key: &str) -> Result<Vec<f64>> {
    runs.into_iter().map(|r| figure(r, key)).collect()
}

/// What the suite trains, each a side of one run per seed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// kiln fp32.
    Kiln,
    /// kiln at the precision it picks by itself.
    KilnAuto,
    /// kiln fp32 with `train.ema.decay` = [`EMA_DECAY`]: its raw and its EMA weights validated.
    KilnEma,
    /// kiln fp32 with `train.lr = auto` (a range test each run: an empty cache).
    KilnLrAuto,
    /// PyTorch with kiln's settings.
    Torch,
    /// PyTorch as a user writes it by default.
    TorchPlain,
    /// PyTorch at Lightning's `lr_find` suggestion (`train_quality.py --lr-find`).
    TorchLrFind,
}

impl Side {
    /// Its key in the rows' `runs`, and what the progress lines call it.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Side::Kiln => ("kiln", "kiln fp32"),
            Side::KilnAuto => ("kiln_auto", "kiln automatic precision"),
            Side::KilnEma => ("kiln_ema", "kiln fp32 with EMA"),
            Side::KilnLrAuto => ("kiln_lr_auto", "kiln fp32 with lr = auto"),
            Side::Torch => ("pytorch", "PyTorch"),
            Side::TorchPlain => ("pytorch_plain", "PyTorch plain"),
            Side::TorchLrFind => ("pytorch_lr_find", "PyTorch at Lightning's lr_find"),
        }
    }
}

/// Every side's runs, one per seed, by the side's key.
type Runs = BTreeMap<&'static str, Vec<Value>>;

fn suite(a: &SuiteArgs) -> Result<()> {
    let seeds = a.seeds.unwrap_or(2).max(2) as u64;
    // Two threads a side by default, as in the other suites.
    let threads = a.threads_or(2);
    let work = fresh_work_dir(a, "quality")?;
    // Lightning, for its lr_find: from the pinned peers `cargo xtask bench` installs.
    let lightning = peers::dir();
    let ctx = Ctx {
        a,
        exe: std::env::current_exe().msg()?,
        threads,
        lightning: &lightning,
    };
    let mut out = SuiteOutput::new("quality", "");
    let mut what = vec![];
    // `--filter reference` or `--filter regression` runs one job only.
    if a.selects("reference") {
        what.push(reference_job(&ctx, &work, seeds, &mut out)?);
    }
    if a.selects("regression") {
        let dir = work.join("regression");
        what.push(regression::run(&ctx, &dir, seeds, &mut out)?);
    }
    out.what = format!(
        "{}; {threads} threads, {seeds} seeds per side",
        what.join("; and ")
    );
    out.write(&a.out_or("quality"))?;
    remove_dir(&work)
}

/// What every run of the suite shares.
struct Ctx<'a> {
    a: &'a SuiteArgs,
    /// This binary, for `quality kiln-run`.
    exe: PathBuf,
    threads: usize,
    /// Lightning's pinned peers, or why they are not installed.
    lightning: &'a Result<PathBuf>,
}

/// A job's data, as both sides run on it: the directory holding its `.npy` files and kiln's
/// dataset prepared from them, and the options naming the job to `kiln-run` and to the script.
struct JobData<'a> {
    dir: &'a Path,
    prepared: Arc<ShardedDataset>,
    kiln: Vec<String>,
    torch: Vec<String>,
}

impl Ctx<'_> {
    /// Every side's runs of a job, one per seed, the sides in turn each seed; `title` begins the
    /// progress lines.
    fn train_sides(
        &self,
        job: &JobData<'_>,
        seeds: u64,
        sides: &[Side],
        title: &str,
    ) -> Result<Runs> {
        let mut runs: Runs = sides.iter().map(|side| (side.names().0, vec![])).collect();
        let names: Vec<&str> = sides.iter().map(|side| side.names().1).collect();
        for seed in 0..seeds {
            let split = write_split(job.dir, &job.prepared, seed)?;
            let lr_cache = job.dir.join(format!("lr-cache-{seed}"));
            remove_dir(&lr_cache)?;
            eprintln!("quality: {title}seed {seed}: {}", names.join(", "));
            for &side in sides {
                let seed = (seed.to_string(), split.as_path(), lr_cache.as_path());
                if let Some(cmd) = self.command(job, seed, side) {
                    runs.entry(side.names().0).or_default().push(run_json(cmd)?);
                }
            }
        }
        Ok(runs)
    }

    /// The command of a side's run for a seed (with its split and learning-rate cache); none for
    /// PyTorch at Lightning's suggestion where Lightning is not installed.
    fn command(
        &self,
        job: &JobData<'_>,
        (seed, split, lr_cache): (String, &Path, &Path),
        side: Side,
    ) -> Option<Command> {
        let threads = self.threads.to_string();
        let ema = format!("train.ema.decay={EMA_DECAY}");
        let variant: &[&str] = match side {
            Side::Kiln | Side::Torch => &[],
            Side::KilnAuto => &["--auto-precision"],
            Side::KilnEma => &["--set", &ema],
            Side::KilnLrAuto => &["--set", "train.lr=auto"],
            Side::TorchPlain => &["--schedule", "constant", "--warmup", "0", "--clip", "0"],
            Side::TorchLrFind => &["--lr-find"],
        };
        if matches!(
            side,
            Side::Kiln | Side::KilnAuto | Side::KilnEma | Side::KilnLrAuto
        ) {
            let mut k = Command::new(&self.exe);
            k.args(["quality", "kiln-run", "--data"]).arg(job.dir);
            k.args(["--seed", &seed, "--threads", &threads]);
            k.args(&job.kiln).args(variant);
            k.args(self.a.quick.then_some("--quick"));
            // A cache of its own, empty: `train.lr = auto` runs its range test every time.
            k.env("KILN_CACHE_DIR", lr_cache);
            return Some(k);
        }
        let mut t = Command::new(&self.a.python);
        if side == Side::TorchLrFind {
            peers::put_first_on_path(&mut t, self.lightning.as_ref().ok()?);
        }
        if side == Side::Torch {
            // glibc's malloc thresholds as kiln sets them for its own runs
            // (`performance.malloc_tuning`).
            kiln_benches::malloc_like_kiln(&mut t);
        }
        t.arg(bench_root().join("python/train_quality.py"));
        t.arg("--data").arg(job.dir).arg("--split").arg(split);
        t.args(["--seed", &seed, "--threads", &threads]);
        // Last, so that a variant's options win.
        t.args(&job.torch).args(variant);
        Some(t)
    }
}

/// The reference job's runs on data it writes in `work`, and its rows; returns what it is: kiln
/// in fp32, at the precision it picks by itself, with EMA weights and with `train.lr = auto`,
/// and PyTorch with kiln's settings, as a user writes it by default and at Lightning's
/// `lr_find` suggestion.
fn reference_job(ctx: &Ctx<'_>, work: &Path, seeds: u64, out: &mut SuiteOutput) -> Result<String> {
    use Side::*;
    let job = job(ctx.a.quick);
    let data = JobData {
        dir: work,
        prepared: write_data(work, &job)?,
        kiln: vec![],
        torch: torch_args(&reference_values(&job)),
    };
    let sides = [
        Kiln,
        KilnAuto,
        KilnEma,
        KilnLrAuto,
        Torch,
        TorchPlain,
        TorchLrFind,
    ];
    let runs = ctx.train_sides(&data, seeds, &sides, "")?;
    report(ctx, out, &runs)?;
    Ok(describe(&job))
}

const BASELINE: &str = "PyTorch loop, same job";
/// PyTorch as a user writes it by default.
const PLAIN: &str = "PyTorch loop with constant lr, no warmup, no clipping (otherwise the same)";
/// The EMA variant's decay (warmed up as timm's is: early steps average less).
const EMA_DECAY: f64 = 0.999;
const ACCURACY: &str = "final_val_accuracy";

/// `c` with both sides' figures per seed and PyTorch's mean.
fn per_seed(c: Comparison, kiln: &[f64], torch: &[f64]) -> Comparison {
    c.detail("kiln_per_seed", json!(kiln))
        .detail("pytorch_per_seed", json!(torch))
        .detail("pytorch_mean", json!(mean(torch)))
}

/// Two rows with goals: `side`'s mean accuracy against PyTorch's worst seed less 1 point, and
/// its mean loss against PyTorch's worst seed.
fn against_range(out: &mut SuiteOutput, what: &str, side: &[Value], torch: &[Value]) -> Result<()> {
    let name = format!("val accuracy: {what} mean vs PyTorch worst seed − 1 point");
    let accuracy = vs_worst_seed(out, name, Metric::ACCURACY, (side, torch), 1.0)?;
    out.push(accuracy.at_least(1.0));
    let name = format!("val loss: {what} mean vs PyTorch worst seed");
    let loss = vs_worst_seed(out, name, Metric::LOSS, (side, torch), 0.0)?;
    out.push(loss.at_most(1.02));
    Ok(())
}

/// A row of `side`'s mean `metric` against PyTorch's worst seed, `less` taken off the latter
/// (in the report's units), with both sides' figures per seed; the caller sets its goal.
fn vs_worst_seed(
    out: &SuiteOutput,
    name: String,
    metric: Metric,
    (side, torch): (&[Value], &[Value]),
    less: f64,
) -> Result<Comparison> {
    let (k, t) = (of(side, metric.key)?, of(torch, metric.key)?);
    let ((worst, word), x) = (metric.worst(&t), metric.scale);
    let figures = (x * mean(&k), x * worst - less);
    let less_note = if less > 0.0 { ", less 1 point" } else { "" };
    let base = format!("{BASELINE} ({word} of {} seeds{less_note})", t.len());
    let row = out.row("learning", name, metric.unit, figures, base);
    Ok(per_seed(row, &k, &t))
}

/// The time per run of `side` against PyTorch's (`torch`: which PyTorch side, how it ran,
/// and its runs).
fn time_row(
    out: &mut SuiteOutput,
    what: &str,
    side: &[Value],
    (vs, how, torch): (&str, &str, &[Value]),
) -> Result<()> {
    let (ks, ts) = (of(side, "seconds")?, of(torch, "seconds")?);
    let name = format!("{what}{vs}: reading the data, training, validating");
    let base = format!(
        "{how} (mean of {} seeds; in-process on both sides, so Python's start and `import \
         torch` are not counted)",
        ts.len()
    );
    out.push(out.row("time per run", name, SECONDS, (mean(&ks), mean(&ts)), base));
    Ok(())
}

/// The reference job as the report's title says it.
fn describe(job: &Job) -> String {
    let (d_model, layers, samples, seq) = (job.d_model, job.layers, job.samples, job.seq);
    let (features, classes, epochs, batch) = (job.features, job.classes, job.epochs, job.batch);
    format!(
        "learning at the same budget: transformer (d_model {d_model}, {layers} layers) on \
         {samples} synthetic {seq}×{features} samples, {classes} classes, {epochs} epochs of \
         batch {batch}; kiln against a plain PyTorch fp32 loop with the same data, split, \
         initial weights and settings (AdamW, warmup + cosine, clipping 1.0, dropout)"
    )
}

/// The reference job's rows from all sides' runs.
fn report(ctx: &Ctx<'_>, out: &mut SuiteOutput, runs: &Runs) -> Result<()> {
    let (kiln, kiln_auto, torch) = (&runs["kiln"], &runs["kiln_auto"], &runs["pytorch"]);
    let precision = kiln_auto[0]["precision"].as_str().unwrap_or("?");
    let auto = format!("kiln automatic precision ({precision})");
    against_range(out, "kiln fp32", kiln, torch)?;
    against_range(out, &auto, kiln_auto, torch)?;
    let (ka, ta) = (of(kiln, ACCURACY)?, of(torch, ACCURACY)?);
    let name = "val accuracy, means: kiln fp32 vs PyTorch";
    let base = format!("{BASELINE} (mean of {} seeds)", ta.len());
    let figures = (100.0 * mean(&ka), 100.0 * mean(&ta));
    let row = out.row("learning", name, PERCENT, figures, base);
    out.push(row.detail("runs", json!(runs)));
    let plain = of(&runs["pytorch_plain"], ACCURACY)?;
    let name = "val accuracy, means: kiln fp32 vs PyTorch as written by default";
    let figures = (100.0 * mean(&ka), 100.0 * mean(&plain));
    out.push(out.row("learning", name, PERCENT, figures, PLAIN));
    ema_row(out, &runs["kiln_ema"])?;
    lr_rows(ctx, out, runs, (Metric::ACCURACY, ""))?;
    let like_kiln = format!("{BASELINE}, with {}", kiln_benches::MALLOC_AS_KILN);
    let like_kiln = ("", like_kiln.as_str(), torch.as_slice());
    time_row(out, "kiln fp32", kiln, like_kiln)?;
    time_row(out, &auto, kiln_auto, like_kiln)?;
    let vs = " vs PyTorch as written by default";
    time_row(out, "kiln fp32", kiln, (vs, PLAIN, &runs["pytorch_plain"]))?;
    Ok(())
}

/// What `train.ema` does to the job: the EMA weights' validation accuracy against the raw
/// weights' of the same runs (training is the same either way: the average only watches it).
fn ema_row(out: &mut SuiteOutput, runs: &[Value]) -> Result<()> {
    let (ema, raw) = (of(runs, "final_val_ema_accuracy")?, of(runs, ACCURACY)?);
    let (ema_loss, raw_loss) = (of(runs, "final_val_ema_loss")?, of(runs, "final_val_loss")?);
    let name =
        format!("val accuracy, means: kiln fp32 EMA weights (train.ema.decay = {EMA_DECAY})");
    let base = format!("the same runs' raw weights (mean of {} seeds)", raw.len());
    let figures = (100.0 * mean(&ema), 100.0 * mean(&raw));
    let row = out.row("learning", name, PERCENT, figures, base);
    let row = row.detail("ema_per_seed", json!(ema));
    let row = row.detail("raw_per_seed", json!(raw));
    let row = row.detail("ema_val_loss_per_seed", json!(ema_loss));
    out.push(row.detail("raw_val_loss_per_seed", json!(raw_loss)));
    Ok(())
}

/// The row of kiln's `train.lr = auto` against Lightning's `lr_find` (after the job's prefix).
const LR_FIND_ROW: &str = "kiln fp32 lr = auto vs PyTorch at Lightning's lr_find";

/// The validation figure a job's `lr = auto` rows judge.
#[derive(Clone, Copy)]
struct Metric {
    /// Its key in a run's JSON.
    key: &'static str,
    /// As row names say it.
    name: &'static str,
    unit: Unit,
    /// Report figures are the run's times this (100 for a fraction shown in %).
    scale: f64,
}

impl Metric {
    const ACCURACY: Self = Self {
        key: ACCURACY,
        name: "val accuracy",
        unit: PERCENT,
        scale: 100.0,
    };
    const LOSS: Self = Self {
        key: "final_val_loss",
        name: "val loss",
        unit: NATS,
        scale: 1.0,
    };
    const RMSE: Self = Self {
        key: "final_val_rmse",
        name: "val RMSE",
        unit: ("RMSE", Better::Lower),
        scale: 1.0,
    };

    /// The worst of `runs`' figures (unscaled), and how the report says the worst of several
    /// seeds.
    fn worst(self, v: &[f64]) -> (f64, &'static str) {
        let fold = |f: fn(f64, f64) -> f64, start| v.iter().copied().fold(start, f);
        match self.unit.1 {
            Better::Higher => (fold(f64::min, f64::INFINITY), "lowest"),
            Better::Lower => (fold(f64::max, f64::NEG_INFINITY), "highest"),
        }
    }

    /// `row` with the goal "at least as good as its baseline".
    fn as_good(self, row: Comparison) -> Comparison {
        match self.unit.1 {
            Better::Higher => row.at_least(1.0),
            Better::Lower => row.at_most(1.0),
        }
    }
}

/// `train.lr = auto` on a job (row names begin with `prefix`): its validation `metric` against
/// the default rate's (1e-3) seed range (goal: its mean at least as good as the default's worst
/// seed), against PyTorch at Lightning's `lr_find` suggestion, and its range test's share of the
/// run's time (goal: under 10%: the seconds before training began, less the same seed's fp32
/// run's at 1e-3).
fn lr_rows(
    ctx: &Ctx<'_>,
    out: &mut SuiteOutput,
    runs: &Runs,
    (metric, prefix): (Metric, &str),
) -> Result<()> {
    let (auto, default) = (&runs["kiln_lr_auto"], &runs["kiln"]);
    let (aa, da) = (of(auto, metric.key)?, of(default, metric.key)?);
    let start = |runs: &[Value], key| of(runs.iter().map(|r| &r["start"]), key);
    let found = start(auto, "lr")?;
    let (m, x) = (metric.name, metric.scale);
    let name = format!("{prefix}{m}: kiln fp32 lr = auto mean vs kiln lr = 1e-3 worst seed");
    let (worst, word) = metric.worst(&da);
    let base = format!(
        "kiln fp32 at the default lr 1e-3 ({word} of {} seeds)",
        da.len()
    );
    let row = out.row(
        "learning",
        name,
        metric.unit,
        (x * mean(&aa), x * worst),
        base,
    );
    let row = metric.as_good(row);
    out.push(per_seed(
        row.detail("lr_found_per_seed", json!(found)),
        &aa,
        &da,
    ));
    let lr_find_row = format!("{prefix}{m}, means: {LR_FIND_ROW}");
    if let Err(why) = ctx.lightning {
        out.skip(&lr_find_row, why);
    } else {
        let lf = of(&runs["pytorch_lr_find"], metric.key)?;
        let suggested = of(&runs["pytorch_lr_find"], "lr")?;
        let base = "PyTorch loop, same job, at Tuner.lr_find's suggestion (its defaults)";
        let figures = (x * mean(&aa), x * mean(&lf));
        let row = out.row("learning", lr_find_row, metric.unit, figures, base);
        let row = row.detail("lr_found_per_seed", json!(found));
        let row = row.detail("lightning_suggestion_per_seed", json!(suggested));
        out.push(per_seed(row, &aa, &lf));
    }
    let started = |runs| start(runs, "started_after_s");
    let search: Vec<f64> = (started(auto)?.iter().zip(started(default)?))
        .map(|(a, d)| (a - d).max(0.0))
        .collect();
    let seconds = of(auto, "seconds")?;
    let name = format!("{prefix}lr = auto's range test: seconds per run");
    let base = "the whole run's seconds (reading, range test, training, validating)";
    let figures = (mean(&search), mean(&seconds));
    let row = out.row("time per run", name, SECONDS, figures, base);
    let lightning = of(&runs["pytorch_lr_find"], "lr_find_seconds")?;
    let row = row
        .at_most(0.10)
        .detail("search_seconds_per_seed", json!(search));
    out.push(row.detail("lightning_lr_find_seconds_per_seed", json!(lightning)));
    Ok(())
}
