//! `cargo xtask bench quality`: does kiln learn as well as PyTorch? One job at the same budget,
//! several seeds a side: kiln (fp32, automatic precision, EMA weights, `train.lr = auto`) against
//! a PyTorch loop (`python/train_quality.py`) with the same data, split, initial weights and
//! settings, as a user writes it by default, and at Lightning's `lr_find` suggestion. Goal: mean
//! accuracy within 1 point of PyTorch's worst seed, mean loss at most 2% above; time per run too.
//! Also an MLP regression ([`regression`]); `--filter reference|regression` runs one job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, Subcommand};
use kiln_benches::report::{Better, Comparison, NATS, PERCENT, SECONDS, SuiteOutput, Unit};
use kiln_benches::{MALLOC_AS_KILN, command, malloc_like_kiln, python_script, run_json};
use kiln_benches::{Msg, Result, SuiteArgs, datasets, figure, mean, peers, resolve};
use kiln_data::{ShardedDataset, SyntheticSequences};
use kiln_train::learner::Learner;
use kiln_train::record::{EpochRecord, Observer, RunStart};
use serde_json::{Value, json};

use kiln_benches::run_cli::{Cli, exit_on_error, fresh_work_dir, remove_dir};

#[path = "quality_regression.rs"]
mod regression;

/// The reference job: its data (samples, sequence, features, classes), transformer (d_model,
/// layers, ff), epochs and linear warmup steps; the batch is [`BATCH`].
#[derive(Debug, Clone, Copy)]
struct Job([usize; 4], [usize; 3], usize, usize);

const BATCH: usize = 16;

/// The job (4096 SignTransformer-shaped samples, the default transformer), or CI's.
fn job(quick: bool) -> Job {
    if quick {
        Job([512, 16, 32, 10], [64, 1, 128], 1, 5)
    } else {
        Job([4096, 64, 469, 100], [256, 4, 1024], 2, 50)
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

/// Writes the job's `.npy` files in `dir` and kiln's dataset prepared from them in `dir/kiln`.
fn write_data(dir: &Path, job: &Job) -> Result<Arc<ShardedDataset>> {
    let [samples, seq, features, classes] = job.0;
    let data = SyntheticSequences::new(samples, seq, features, classes, DATA_SEED).msg()?;
    datasets::write_prepared(dir, "kiln", &data, None, true)
}

/// `data DIR`: only writes the job's data and splits into DIR (for runs by hand).
fn data_only(a: &DataArgs) -> Result<()> {
    let dir = &a.dir;
    if dir.exists() {
        return Err(format!("{} exists; give a new directory", dir.display()));
    }
    std::fs::create_dir_all(dir).at(dir)?;
    let prepared = if a.regression {
        regression::write_data(dir, &regression::job(a.quick))?
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
/// `train.lr = auto`) and the seconds before training began (data, model, any range test).
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

/// One kiln run of the job on the data in `--data`, as `kiln train --data` runs it; prints JSON.
fn kiln_run(a: &KilnRunArgs) -> Result<()> {
    let (start, seed) = (Instant::now(), a.seed);
    // kiln makes the directory; an earlier run's leftovers are removed.
    let runs = a.data.join(format!("runs-{seed}"));
    remove_dir(&runs)?;
    let (model, values) = if a.regression {
        ("mlp", regression::job_values(&regression::job(a.quick)))
    } else {
        ("transformer", reference_values(&job(a.quick)))
    };
    let mut sets = vec![
        "device.request=cpu".to_owned(),
        format!("data.val_fraction={VAL_FRACTION}"),
        "data.num_workers=2".to_owned(),
        format!("performance.seed={seed}"),
        format!("performance.intra_op_threads={}", a.threads),
        "checkpoint.enabled=false".to_owned(),
        format!("run.output_dir={}", runs.display()),
        format!("model.name={model}"),
    ];
    sets.extend(values.iter().map(|(key, _, v)| format!("{key}={v}")));
    // fp32 like the PyTorch side, unless `--auto-precision`: then what kiln's profile picks.
    if !a.auto_precision {
        sets.push("train.amp=fp32".to_owned());
    }
    sets.extend(a.sets.iter().cloned());
    let resolution = resolve(&sets)?;
    let learner = Learner::builder().resolution(resolution).build().msg()?;
    let (mut epochs, prepared) = (Epochs(vec![], start, None), a.data.join("kiln"));
    let outcome = learner.fit_plan(Some(&prepared), &mut epochs).msg()?;
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

/// A value both sides of a job are given: kiln's setting, the PyTorch script's option, the value.
type Both = (&'static str, &'static str, String);

/// The reference job's values (kiln's model is the transformer, the script's default).
fn reference_values(&Job(_, [d_model, layers, ff], epochs, warmup): &Job) -> Vec<Both> {
    vec![
        ("model.d_model", "--d-model", d_model.to_string()),
        ("model.layers", "--layers", layers.to_string()),
        ("model.ff", "--ff", ff.to_string()),
        ("model.dropout", "--dropout", "0.1".to_owned()),
        ("train.epochs", "--epochs", epochs.to_string()),
        ("train.batch_size", "--batch", BATCH.to_string()),
        ("train.warmup_steps", "--warmup", warmup.to_string()),
    ]
}

/// The PyTorch script's options for a job's `values`.
fn torch_args(values: &[Both]) -> Vec<String> {
    let pair = |(_, option, v): &Both| [option.to_string(), v.clone()];
    values.iter().flat_map(pair).collect()
}

/// `key` of each run (e.g. of each of one side's runs).
fn of<'a>(runs: impl IntoIterator<Item = &'a Value>, key: &str) -> Result<Vec<f64>> {
    runs.into_iter().map(|r| figure(r, key)).collect()
}

/// A side, one run per seed: its key in the rows' `runs` and its name in the progress lines.
type Side = (&'static str, &'static str);

/// Every side; its options beyond the job's are in [`Ctx::command`].
const SIDES: [Side; 7] = [
    ("kiln", "kiln fp32"),
    ("kiln_auto", "kiln automatic precision"),
    ("kiln_ema", "kiln fp32 with EMA"),
    ("kiln_lr_auto", "kiln fp32 with lr = auto"),
    ("pytorch", "PyTorch"),
    ("pytorch_plain", "PyTorch plain"),
    ("pytorch_lr_find", "PyTorch at Lightning's lr_find"),
];

/// The EMA variant's decay (warmed up as timm's is: early steps average less).
const EMA_DECAY: f64 = 0.999;

/// Every side's runs, one per seed, by the side's key.
type Runs = BTreeMap<&'static str, Vec<Value>>;

fn suite(a: &SuiteArgs) -> Result<()> {
    let seeds = a.seeds.unwrap_or(2).max(2) as u64;
    let threads = a.threads_or(THREADS);
    let work = fresh_work_dir(a, "quality")?;
    // Lightning, for its lr_find: from the pinned peers `cargo xtask bench` installs.
    let lightning = peers::dir();
    let exe = std::env::current_exe().msg()?;
    let ctx = Ctx { a, exe, lightning };
    let mut out = SuiteOutput::new("quality", "");
    let mut what = vec![];
    if a.selects("reference") {
        what.push(reference_job(&ctx, &work, seeds, &mut out)?);
    }
    if a.selects("regression") {
        let dir = work.join("regression");
        what.push(regression::run(&ctx, &dir, seeds, &mut out)?);
    }
    let what = what.join("; and ");
    out.what = format!("{what}; {threads} threads, {seeds} seeds per side");
    out.write(&a.out_or("quality"))?;
    remove_dir(&work)
}

/// What every run of the suite shares.
struct Ctx<'a> {
    a: &'a SuiteArgs,
    /// This binary, for `quality kiln-run`.
    exe: PathBuf,
    /// Lightning's pinned peers, or why they are not installed.
    lightning: Result<PathBuf>,
}

/// Threads a side by default, as in the other suites.
const THREADS: usize = 2;

/// A job's data (the `.npy` files' directory and kiln's dataset) and the options naming the job
/// to `kiln-run` and to the script.
struct JobData<'a> {
    dir: &'a Path,
    prepared: Arc<ShardedDataset>,
    kiln: Vec<String>,
    torch: Vec<String>,
}

impl Ctx<'_> {
    /// The runs of the sides named in `keys`, one per seed, the sides in turn each seed;
    /// `title` begins the progress lines.
    fn train_sides(
        &self,
        job: &JobData<'_>,
        seeds: u64,
        keys: &[&str],
        title: &str,
    ) -> Result<Runs> {
        let sides: Vec<Side> = SIDES.into_iter().filter(|s| keys.contains(&s.0)).collect();
        let mut runs: Runs = sides.iter().map(|side| (side.0, vec![])).collect();
        let names: Vec<&str> = sides.iter().map(|side| side.1).collect();
        for seed in 0..seeds {
            let split = write_split(job.dir, &job.prepared, seed)?;
            let lr_cache = job.dir.join(format!("lr-cache-{seed}"));
            remove_dir(&lr_cache)?;
            eprintln!("quality: {title}seed {seed}: {}", names.join(", "));
            for side in &sides {
                if let Some(cmd) = self.command(job, (seed, &split, &lr_cache), side) {
                    runs.entry(side.0).or_default().push(run_json(cmd)?);
                }
            }
        }
        Ok(runs)
    }

    /// The command of a side's run for a seed (with its split and learning-rate cache); none for
    /// PyTorch at Lightning's suggestion where Lightning is not installed.
    fn command(&self, job: &JobData<'_>, run: (u64, &Path, &Path), side: &Side) -> Option<Command> {
        let ((seed, split, lr_cache), (key, _)) = (run, side);
        let ema = format!("train.ema.decay={EMA_DECAY}");
        let variant: &[&str] = match *key {
            "kiln_auto" => &["--auto-precision"],
            // Its raw and its EMA weights validated.
            "kiln_ema" => &["--set", &ema],
            // A range test each run (an empty cache).
            "kiln_lr_auto" => &["--set", "train.lr=auto"],
            "pytorch_plain" => &["--schedule", "constant", "--warmup", "0", "--clip", "0"],
            "pytorch_lr_find" => &["--lr-find"],
            _ => &[],
        };
        let kiln = key.starts_with("kiln");
        let mut c = if kiln {
            let mut k = command(&self.exe, &["quality", "kiln-run"]);
            // A cache of its own, empty: `train.lr = auto` runs its range test every time.
            k.env("KILN_CACHE_DIR", lr_cache).arg("--data").arg(job.dir);
            k
        } else {
            let mut t = python_script(&self.a.python, "train_quality.py");
            if *key == "pytorch_lr_find" {
                peers::put_first_on_path(&mut t, self.lightning.as_ref().ok()?);
            } else if *key == "pytorch" {
                // glibc's malloc thresholds as kiln sets them (`performance.malloc_tuning`).
                malloc_like_kiln(&mut t);
            }
            t.arg("--data").arg(job.dir).arg("--split").arg(split);
            t
        };
        let (seed, threads) = (seed.to_string(), self.a.threads_or(THREADS).to_string());
        c.args(["--seed", &seed, "--threads", &threads]);
        // Last, so that a variant's options win.
        c.args(if kiln { &job.kiln } else { &job.torch });
        c.args(variant);
        c.args((kiln && self.a.quick).then_some("--quick"));
        Some(c)
    }

    /// `train.lr = auto` on a job (rows named after `prefix`): its metric `by` against the
    /// default rate's worst seed and Lightning's `lr_find`, and its range test's share of the
    /// run's time (goal < 10%: the seconds before training began, less the same seed's at 1e-3).
    fn lr_rows(&self, out: &mut SuiteOutput, runs: &Runs, by: Metric, prefix: &str) -> Result<()> {
        let keys = ["kiln_lr_auto", "kiln", "pytorch_lr_find"];
        let [auto, default, lr_find] = keys.map(|key| runs[key].as_slice());
        let (key, unit, m, x) = (by.key, by.unit, by.name, by.scale);
        let start = |runs: &[Value], key| of(runs.iter().map(|r| &r["start"]), key);
        let found = json!(start(auto, "lr")?);
        let what = (prefix, "kiln fp32 lr = auto");
        let vs = ("kiln lr = 1e-3", "kiln fp32 at the default lr 1e-3");
        let row = vs_worst_seed(out, what, by, (auto, default), vs, 0.0)?;
        // Goal: at least as good as the default rate's worst seed.
        let row = match unit.1 {
            Better::Higher => row.at_least(1.0),
            Better::Lower => row.at_most(1.0),
        };
        out.push(row.detail("lr_found_per_seed", found.clone()));
        let lr_find_row =
            format!("{prefix}{m}, means: kiln fp32 lr = auto vs PyTorch at Lightning's lr_find");
        if let Err(why) = &self.lightning {
            out.skip(&lr_find_row, why);
        } else {
            let (aa, lf) = (of(auto, key)?, of(lr_find, key)?);
            let suggested = of(lr_find, "lr")?;
            let base = "PyTorch loop, same job, at Tuner.lr_find's suggestion (its defaults)";
            let figures = (x * mean(&aa), x * mean(&lf));
            let row = out.row("learning", lr_find_row, unit, figures, base);
            let row = row.detail("lr_found_per_seed", found);
            let row = row.detail("lightning_suggestion_per_seed", json!(suggested));
            out.push(per_seed(row, &aa, &lf));
        }
        let started = |runs| start(runs, "started_after_s");
        let search: Vec<f64> = (started(auto)?.iter().zip(started(default)?))
            .map(|(a, d)| (a - d).max(0.0))
            .collect();
        let name = format!("{prefix}lr = auto's range test: seconds per run");
        let base = "the whole run's seconds (reading, range test, training, validating)";
        let figures = (mean(&search), mean(&of(auto, "seconds")?));
        let row = out.row("time per run", name, SECONDS, figures, base);
        let row = row
            .at_most(0.10)
            .detail("search_seconds_per_seed", json!(search));
        let lightning = of(lr_find, "lr_find_seconds")?;
        out.push(row.detail("lightning_lr_find_seconds_per_seed", json!(lightning)));
        Ok(())
    }
}

/// The reference job: every side's runs on data it writes in `work`, its rows and what it is.
fn reference_job(ctx: &Ctx<'_>, work: &Path, seeds: u64, out: &mut SuiteOutput) -> Result<String> {
    let job = job(ctx.a.quick);
    let data = JobData {
        dir: work,
        prepared: write_data(work, &job)?,
        kiln: vec![],
        torch: torch_args(&reference_values(&job)),
    };
    let runs = ctx.train_sides(&data, seeds, &SIDES.map(|s| s.0), "")?;
    let keys = ["kiln", "kiln_auto", "pytorch", "pytorch_plain"];
    let [kiln, kiln_auto, torch, plain] = keys.map(|key| runs[key].as_slice());
    let precision = kiln_auto[0]["precision"].as_str().unwrap_or("?");
    let auto = format!("kiln automatic precision ({precision})");
    // Goals: the mean accuracy at least PyTorch's worst seed less 1 point, the mean loss at most
    // 2% above PyTorch's worst seed.
    for (what, side) in [("kiln fp32", kiln), (auto.as_str(), kiln_auto)] {
        let both = (side, torch);
        let accuracy = vs_worst_seed(out, ("", what), Metric::ACCURACY, both, VS_TORCH, 1.0)?;
        out.push(accuracy.at_least(1.0));
        let loss = vs_worst_seed(out, ("", what), Metric::LOSS, both, VS_TORCH, 0.0)?;
        out.push(loss.at_most(1.02));
    }
    let (ka, ta) = (of(kiln, ACCURACY)?, of(torch, ACCURACY)?);
    let name = "val accuracy, means: kiln fp32 vs PyTorch";
    let base = format!("{BASELINE} (mean of {} seeds)", ta.len());
    let row = out.row("learning", name, PERCENT, means(&ka, &ta), base);
    out.push(row.detail("runs", json!(runs)));
    let name = "val accuracy, means: kiln fp32 vs PyTorch as written by default";
    let figures = means(&ka, &of(plain, ACCURACY)?);
    out.push(out.row("learning", name, PERCENT, figures, PLAIN));
    ema_row(out, &runs["kiln_ema"])?;
    ctx.lr_rows(out, &runs, Metric::ACCURACY, "")?;
    let like_kiln = format!("{BASELINE}, with {MALLOC_AS_KILN}");
    let vs = " vs PyTorch as written by default";
    // The time per run of a kiln side against a PyTorch side's, and how that one ran.
    for (what, side, vs, how, t) in [
        ("kiln fp32", kiln, "", like_kiln.as_str(), torch),
        (&auto, kiln_auto, "", &like_kiln, torch),
        ("kiln fp32", kiln, vs, PLAIN, plain),
    ] {
        let (ks, ts) = (of(side, "seconds")?, of(t, "seconds")?);
        let name = format!("{what}{vs}: reading the data, training, validating");
        let base = format!(
            "{how} (mean of {} seeds; in-process on both sides, so Python's start and `import \
             torch` are not counted)",
            ts.len()
        );
        out.push(out.row("time per run", name, SECONDS, (mean(&ks), mean(&ts)), base));
    }
    Ok(describe(&job))
}

const BASELINE: &str = "PyTorch loop, same job";
/// PyTorch as a user writes it by default.
const PLAIN: &str = "PyTorch loop with constant lr, no warmup, no clipping (otherwise the same)";
const ACCURACY: &str = "final_val_accuracy";
/// The baseline of the rows against PyTorch: its name in the rows and in their baseline names.
const VS_TORCH: (&str, &str) = ("PyTorch", BASELINE);

/// `c` with both sides' figures per seed and the baseline's mean.
fn per_seed(c: Comparison, kiln: &[f64], torch: &[f64]) -> Comparison {
    c.detail("kiln_per_seed", json!(kiln))
        .detail("pytorch_per_seed", json!(torch))
        .detail("pytorch_mean", json!(mean(torch)))
}

/// A row of `side`'s mean `metric` against the worst seed of `base` (named by `vs`), `less` taken
/// off the latter (in the report's units), with both figures per seed; `what` names the side.
fn vs_worst_seed(
    out: &SuiteOutput,
    (prefix, what): (&str, &str),
    metric: Metric,
    (side, base): (&[Value], &[Value]),
    (who, how): (&str, &str),
    less: f64,
) -> Result<Comparison> {
    let (key, unit, m, x) = (metric.key, metric.unit, metric.name, metric.scale);
    let (k, t) = (of(side, key)?, of(base, key)?);
    // The worst seed's figure (unscaled), and how the report says it.
    let seeds = t.iter().copied();
    let (worst, word) = match unit.1 {
        Better::Higher => (seeds.fold(f64::INFINITY, f64::min), "lowest"),
        Better::Lower => (seeds.fold(f64::NEG_INFINITY, f64::max), "highest"),
    };
    let (less_name, less_note) = if less > 0.0 {
        (" − 1 point", ", less 1 point")
    } else {
        ("", "")
    };
    let name = format!("{prefix}{m}: {what} mean vs {who} worst seed{less_name}");
    let base = format!("{how} ({word} of {} seeds{less_note})", t.len());
    let figures = (x * mean(&k), x * worst - less);
    let row = out.row("learning", name, unit, figures, base);
    Ok(per_seed(row, &k, &t))
}

/// The reference job as the report's title says it.
fn describe(job: &Job) -> String {
    let Job([samples, seq, features, classes], [d_model, layers, _], epochs, _) = *job;
    format!(
        "learning at the same budget: transformer (d_model {d_model}, {layers} layers) on \
         {samples} synthetic {seq}×{features} samples, {classes} classes, {epochs} epochs of \
         batch {BATCH}; kiln against a plain PyTorch fp32 loop with the same data, split, \
         initial weights and settings (AdamW, warmup + cosine, clipping 1.0, dropout)"
    )
}

/// The means of two sides' accuracies, in %.
fn means(k: &[f64], t: &[f64]) -> (f64, f64) {
    (100.0 * mean(k), 100.0 * mean(t))
}

/// What `train.ema` does: the EMA weights' validation accuracy against the same runs' raw weights'.
fn ema_row(out: &mut SuiteOutput, runs: &[Value]) -> Result<()> {
    let (ema, raw) = (of(runs, "final_val_ema_accuracy")?, of(runs, ACCURACY)?);
    let (ema_loss, raw_loss) = (of(runs, "final_val_ema_loss")?, of(runs, "final_val_loss")?);
    let name =
        format!("val accuracy, means: kiln fp32 EMA weights (train.ema.decay = {EMA_DECAY})");
    let base = format!("the same runs' raw weights (mean of {} seeds)", raw.len());
    let row = out.row("learning", name, PERCENT, means(&ema, &raw), base);
    let row = row.detail("ema_per_seed", json!(ema));
    let row = row.detail("raw_per_seed", json!(raw));
    let row = row.detail("ema_val_loss_per_seed", json!(ema_loss));
    out.push(row.detail("raw_val_loss_per_seed", json!(raw_loss)));
    Ok(())
}

/// A validation figure the rows judge: its key in a run's JSON, its name in the rows, its unit,
/// and the factor from a run's figure to the report's (100 for a %).
#[derive(Clone, Copy)]
struct Metric {
    key: &'static str,
    name: &'static str,
    unit: Unit,
    scale: f64,
}

impl Metric {
    const ACCURACY: Self = Self::new(ACCURACY, "val accuracy", PERCENT, 100.0);
    const LOSS: Self = Self::new("final_val_loss", "val loss", NATS, 1.0);
    const RMSE: Self = Self::new("final_val_rmse", "val RMSE", ("RMSE", Better::Lower), 1.0);

    const fn new(key: &'static str, name: &'static str, unit: Unit, scale: f64) -> Self {
        Self {
            key,
            name,
            unit,
            scale,
        }
    }
}
