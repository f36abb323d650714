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

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, Subcommand};
use kiln_benches::report::{Better, Comparison, NATS, PERCENT, SECONDS, SuiteOutput, Unit};
use kiln_benches::{Msg, Result, SuiteArgs, bench_root, datasets, figure, mean, resolve, run_json};
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
    if a.regression {
        sets.extend(regression::kiln_sets(&regression::job(a.quick)));
    } else {
        sets.extend(reference_sets(&job(a.quick)));
    }
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

/// kiln's settings for the reference job (beside the suite's common ones).
fn reference_sets(job: &Job) -> Vec<String> {
    vec![
        "model.name=transformer".to_owned(),
        format!("model.d_model={}", job.d_model),
        format!("model.layers={}", job.layers),
        format!("model.ff={}", job.ff),
        "model.dropout=0.1".to_owned(),
        format!("train.epochs={}", job.epochs),
        format!("train.batch_size={}", job.batch),
        format!("train.warmup_steps={}", job.warmup),
    ]
}

/// `key` of each of one side's runs.
fn of(runs: &[Value], key: &str) -> Result<Vec<f64>> {
    runs.iter().map(|r| figure(r, key)).collect()
}

/// Everything one suite run trains, one run per seed a side: kiln in fp32 and at the precision
/// it picks by itself, and PyTorch with kiln's settings and as a user writes it by default.
#[derive(Default)]
struct Sides {
    kiln: Vec<Value>,
    kiln_auto: Vec<Value>,
    /// kiln fp32 with `train.ema.decay` = [`EMA_DECAY`]: its raw and its EMA weights validated.
    kiln_ema: Vec<Value>,
    /// kiln fp32 with `train.lr = auto` (a range test each run: an empty cache).
    kiln_lr_auto: Vec<Value>,
    /// PyTorch at Lightning's `lr_find` suggestion (`train_quality.py --lr-find`).
    torch_lr_find: Vec<Value>,
    torch: Vec<Value>,
    torch_plain: Vec<Value>,
}

fn suite(a: &SuiteArgs) -> Result<()> {
    let seeds = a.seeds.unwrap_or(2).max(2) as u64;
    // Two threads a side by default, as in the other suites.
    let threads = a.threads_or(2);
    let work = fresh_work_dir(a, "quality")?;
    // Lightning, for its lr_find: from the pinned peers `cargo xtask bench` installs.
    let lightning = kiln_benches::peers::dir();
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
        what.push(regression::run(
            &ctx,
            &work.join("regression"),
            seeds,
            &mut out,
        )?);
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

/// One seed's runs of one job: kiln's `kiln-run` and the PyTorch script, on the job's data.
struct Seed<'a> {
    ctx: &'a Ctx<'a>,
    data: PathBuf,
    split: PathBuf,
    seed: String,
    /// The seed's learning-rate cache, emptied at the start.
    lr_cache: PathBuf,
    /// `kiln-run`'s options naming the job, and the script's.
    kiln_job: Vec<String>,
    torch_job: Vec<String>,
}

impl<'a> Seed<'a> {
    /// Writes the split of `prepared` for `seed` in `data` and empties the seed's lr cache.
    fn new(
        ctx: &'a Ctx<'a>,
        (data, prepared): (&Path, &Arc<ShardedDataset>),
        seed: u64,
        (kiln_job, torch_job): (Vec<String>, Vec<String>),
    ) -> Result<Self> {
        let split = write_split(data, prepared, seed)?;
        let lr_cache = data.join(format!("lr-cache-{seed}"));
        remove_dir(&lr_cache)?;
        Ok(Self {
            ctx,
            data: data.to_owned(),
            split,
            seed: seed.to_string(),
            lr_cache,
            kiln_job,
            torch_job,
        })
    }

    /// A kiln run (`extra`: `kiln-run`'s options for a variant).
    fn kiln(&self, extra: &[&str]) -> Result<Value> {
        let (a, threads) = (self.ctx.a, self.ctx.threads.to_string());
        let mut k = Command::new(&self.ctx.exe);
        k.args(["quality", "kiln-run", "--data"]).arg(&self.data);
        k.args(["--seed", &self.seed, "--threads", &threads]);
        k.args(&self.kiln_job).args(extra);
        k.args(a.quick.then_some("--quick"));
        // A cache of its own, empty: `train.lr = auto` runs its range test every time.
        k.env("KILN_CACHE_DIR", &self.lr_cache);
        run_json(k)
    }

    /// PyTorch with kiln's settings, and with glibc's malloc thresholds as kiln sets them for
    /// its own runs (`performance.malloc_tuning`).
    fn torch_like_kiln(&self) -> Result<Value> {
        let mut t = self.torch_command(&[], false);
        kiln_benches::malloc_like_kiln(&mut t);
        run_json(t)
    }

    /// A PyTorch run as written (`extra`: the script's options for a variant); with
    /// `lightning`, Lightning on the path.
    fn torch(&self, extra: &[&str], lightning: bool) -> Result<Value> {
        run_json(self.torch_command(extra, lightning))
    }

    /// The command of a PyTorch run (see [`Seed::torch`]).
    fn torch_command(&self, extra: &[&str], lightning: bool) -> Command {
        let mut t = Command::new(&self.ctx.a.python);
        if let Some(dir) = self.ctx.lightning.as_ref().ok().filter(|_| lightning) {
            kiln_benches::peers::put_first_on_path(&mut t, dir);
        }
        t.arg(bench_root().join("python/train_quality.py"));
        t.arg("--data")
            .arg(&self.data)
            .arg("--split")
            .arg(&self.split);
        let threads = self.ctx.threads.to_string();
        t.args(["--seed", &self.seed, "--threads", &threads]);
        // Last, so that a variant's options win.
        t.args(&self.torch_job).args(extra);
        t
    }

    /// PyTorch at Lightning's `lr_find` suggestion, where Lightning is installed.
    fn torch_lr_find(&self, runs: &mut Vec<Value>) -> Result<()> {
        if self.ctx.lightning.is_ok() {
            runs.push(self.torch(&["--lr-find"], true)?);
        }
        Ok(())
    }
}

/// The reference job's runs on data it writes in `work`, and its rows; returns what it is.
fn reference_job(ctx: &Ctx<'_>, work: &Path, seeds: u64, out: &mut SuiteOutput) -> Result<String> {
    let job = job(ctx.a.quick);
    let prepared = write_data(work, &job)?;
    let mut sides = Sides::default();
    for seed in 0..seeds {
        let jobs = (vec![], reference_torch_args(&job));
        let run = Seed::new(ctx, (work, &prepared), seed, jobs)?;
        eprintln!(
            "quality: seed {seed}: kiln fp32, kiln automatic precision, kiln fp32 with EMA, \
             kiln fp32 with lr = auto, PyTorch, PyTorch plain, PyTorch at Lightning's lr_find"
        );
        sides.kiln.push(run.kiln(&[])?);
        sides.kiln_auto.push(run.kiln(&["--auto-precision"])?);
        let ema = format!("train.ema.decay={EMA_DECAY}");
        sides.kiln_ema.push(run.kiln(&["--set", &ema])?);
        sides
            .kiln_lr_auto
            .push(run.kiln(&["--set", "train.lr=auto"])?);
        sides.torch.push(run.torch_like_kiln()?);
        let plain = ["--schedule", "constant", "--warmup", "0", "--clip", "0"];
        sides.torch_plain.push(run.torch(&plain, false)?);
        run.torch_lr_find(&mut sides.torch_lr_find)?;
    }
    report(ctx, out, &sides)?;
    Ok(describe(&job))
}

/// The PyTorch script's options for the reference job.
fn reference_torch_args(job: &Job) -> Vec<String> {
    let mut args = vec![];
    for (name, v) in [
        ("--epochs", job.epochs),
        ("--batch", job.batch),
        ("--d-model", job.d_model),
        ("--layers", job.layers),
        ("--ff", job.ff),
        ("--warmup", job.warmup),
    ] {
        args.extend([name.to_owned(), v.to_string()]);
    }
    args
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
    let x = metric.scale;
    let figures = (x * mean(&k), x * metric.worst(&t) - less);
    let less_note = if less > 0.0 { ", less 1 point" } else { "" };
    let base = format!(
        "{BASELINE} ({} of {} seeds{less_note})",
        metric.worst_word(),
        t.len()
    );
    Ok(per_seed(
        out.row("learning", name, metric.unit, figures, base),
        &k,
        &t,
    ))
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
    let Job {
        d_model,
        layers,
        samples,
        seq,
        features,
        classes,
        epochs,
        batch,
        ..
    } = *job;
    format!(
        "learning at the same budget: transformer (d_model {d_model}, {layers} layers) on \
         {samples} synthetic {seq}×{features} samples, {classes} classes, {epochs} epochs of \
         batch {batch}; kiln against a plain PyTorch fp32 loop with the same data, split, \
         initial weights and settings (AdamW, warmup + cosine, clipping 1.0, dropout)"
    )
}

/// The reference job's rows from all sides' runs.
fn report(ctx: &Ctx<'_>, out: &mut SuiteOutput, sides: &Sides) -> Result<()> {
    let precision = sides.kiln_auto[0]["precision"].as_str().unwrap_or("?");
    let auto = format!("kiln automatic precision ({precision})");
    against_range(out, "kiln fp32", &sides.kiln, &sides.torch)?;
    against_range(out, &auto, &sides.kiln_auto, &sides.torch)?;
    let (ka, ta) = (of(&sides.kiln, ACCURACY)?, of(&sides.torch, ACCURACY)?);
    let runs = json!({
        "kiln": sides.kiln, "kiln_auto": sides.kiln_auto, "kiln_ema": sides.kiln_ema,
        "kiln_lr_auto": sides.kiln_lr_auto, "pytorch_lr_find": sides.torch_lr_find,
        "pytorch": sides.torch, "pytorch_plain": sides.torch_plain,
    });
    let name = "val accuracy, means: kiln fp32 vs PyTorch";
    let base = format!("{BASELINE} (mean of {} seeds)", ta.len());
    let figures = (100.0 * mean(&ka), 100.0 * mean(&ta));
    let row = out.row("learning", name, PERCENT, figures, base);
    out.push(row.detail("runs", runs));
    let plain = of(&sides.torch_plain, ACCURACY)?;
    let name = "val accuracy, means: kiln fp32 vs PyTorch as written by default";
    let figures = (100.0 * mean(&ka), 100.0 * mean(&plain));
    out.push(out.row("learning", name, PERCENT, figures, PLAIN));
    ema_row(out, &sides.kiln_ema)?;
    lr_rows(ctx, out, sides, (Metric::ACCURACY, ""))?;
    let like_kiln = format!("{BASELINE}, with {}", kiln_benches::MALLOC_AS_KILN);
    let like_kiln = ("", like_kiln.as_str(), sides.torch.as_slice());
    time_row(out, "kiln fp32", &sides.kiln, like_kiln)?;
    time_row(out, &auto, &sides.kiln_auto, like_kiln)?;
    let plain = (
        " vs PyTorch as written by default",
        PLAIN,
        sides.torch_plain.as_slice(),
    );
    time_row(out, "kiln fp32", &sides.kiln, plain)?;
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

    /// The worst of `runs`' figures (unscaled).
    fn worst(self, v: &[f64]) -> f64 {
        let fold = |f: fn(f64, f64) -> f64, start| v.iter().copied().fold(start, f);
        match self.unit.1 {
            Better::Higher => fold(f64::min, f64::INFINITY),
            Better::Lower => fold(f64::max, f64::NEG_INFINITY),
        }
    }

    /// How the report says the worst of several seeds.
    fn worst_word(self) -> &'static str {
        match self.unit.1 {
            Better::Higher => "lowest",
            Better::Lower => "highest",
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
    sides: &Sides,
    (metric, prefix): (Metric, &str),
) -> Result<()> {
    let (auto, default) = (&sides.kiln_lr_auto, &sides.kiln);
    let (aa, da) = (of(auto, metric.key)?, of(default, metric.key)?);
    let found: Vec<f64> = auto
        .iter()
        .map(|r| figure(&r["start"], "lr"))
        .collect::<Result<_>>()?;
    let (m, x) = (metric.name, metric.scale);
    let name = format!("{prefix}{m}: kiln fp32 lr = auto mean vs kiln lr = 1e-3 worst seed");
    let worst = metric.worst_word();
    let base = format!(
        "kiln fp32 at the default lr 1e-3 ({worst} of {} seeds)",
        da.len()
    );
    let figures = (x * mean(&aa), x * metric.worst(&da));
    let row = out.row("learning", name, metric.unit, figures, base);
    let row = metric
        .as_good(row)
        .detail("lr_found_per_seed", json!(found));
    out.push(per_seed(row, &aa, &da));
    let lr_find_row = format!("{prefix}{m}, means: {LR_FIND_ROW}");
    if let Err(why) = ctx.lightning {
        out.skip(&lr_find_row, why);
    } else {
        let lf = of(&sides.torch_lr_find, metric.key)?;
        let suggested = of(&sides.torch_lr_find, "lr")?;
        let base = "PyTorch loop, same job, at Tuner.lr_find's suggestion (its defaults)";
        let row = out.row(
            "learning",
            lr_find_row,
            metric.unit,
            (x * mean(&aa), x * mean(&lf)),
            base,
        );
        let row = row.detail("lr_found_per_seed", json!(found));
        let row = row.detail("lightning_suggestion_per_seed", json!(suggested));
        out.push(per_seed(row, &aa, &lf));
    }
    let started = |runs: &[Value]| -> Result<Vec<f64>> {
        runs.iter()
            .map(|r| figure(&r["start"], "started_after_s"))
            .collect()
    };
    let search: Vec<f64> = (started(auto)?.iter().zip(started(default)?))
        .map(|(a, d)| (a - d).max(0.0))
        .collect();
    let seconds = of(auto, "seconds")?;
    let name = format!("{prefix}lr = auto's range test: seconds per run");
    let base = "the whole run's seconds (reading, range test, training, validating)";
    let row = out.row(
        "time per run",
        name,
        SECONDS,
        (mean(&search), mean(&seconds)),
        base,
    );
    let lightning = of(&sides.torch_lr_find, "lr_find_seconds")?;
    let row = row
        .at_most(0.10)
        .detail("search_seconds_per_seed", json!(search));
    out.push(row.detail("lightning_lr_find_seconds_per_seed", json!(lightning)));
    Ok(())
}
