//! `cargo xtask bench --suite job`: the default job end to end, `kiln train --data DIR` against
//! Lightning's `Trainer.fit` (`python/lightning_job.py`) and that script as a plain PyTorch loop,
//! every value from the plan kiln resolves: wall time, samples/s, final validation accuracy and
//! the process tree's peak memory. Goal: wall time ≤ 0.7× Lightning's, accuracy within 1 point.
//! Without the pinned peers (`KILN_BENCH_PEERS`) the Lightning rows say "not run" and why.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Subcommand;
use kiln_benches::report::{MIB, PERCENT, SAMPLES_S, SECONDS, SuiteOutput};
use kiln_benches::{MALLOC_AS_KILN, Msg, Result, SuiteArgs, alternating, datasets, median, num};
use kiln_benches::{malloc_like_kiln, peers, python_script};
use kiln_config::RunPlan;
use kiln_data::SyntheticSequences;
use kiln_device::settings::AmpDtype;
use serde_json::json;

use kiln_benches::run_cli::{Cli, Measured, exit_on_error, fresh_work_dir, kiln_train};
use kiln_benches::run_cli::{measured, plan_args, read_summary, remove_dir};

#[derive(Debug, Subcommand)]
enum Sub {
    /// The default job end to end: kiln train vs Lightning Trainer.fit and a plain loop.
    Job(SuiteArgs),
}

/// Runs the suite's command line (`args[0]` is its name, as clap takes a program name).
pub fn main(args: Vec<std::ffi::OsString>) {
    let cli = Cli::parse_with(args, "`kiln-bench job`: the job suite");
    exit_on_error(suite(&cli.command.map_or(cli.suite, |Sub::Job(a)| a)));
}

/// `kiln train`'s settings beyond its defaults: threads, where runs go, `--quick`'s smaller job.
fn job_sets(quick: bool, threads: usize, runs: &Path) -> Vec<String> {
    let mut sets = vec![
        format!("performance.intra_op_threads={threads}"),
        format!("run.output_dir={}", runs.display()),
        "run.name=job".to_owned(),
    ];
    if quick {
        let model = ["model.d_model=64", "model.layers=1", "model.ff=128"];
        let train = ["train.epochs=1", "train.warmup_steps=5"];
        sets.extend(model.into_iter().chain(train).map(str::to_owned));
    }
    sets
}

/// Samples, sequence length, features and classes of the job's data.
fn data_shape(quick: bool) -> (usize, usize, usize, usize) {
    if quick {
        (512, 16, 32, 10)
    } else {
        (8192, 64, 469, 100)
    }
}

/// kiln's synthetic sequences prepared in `dir/data`, and its split as `dir/split.json`.
fn write_data(dir: &Path, quick: bool, plan: &RunPlan) -> Result<(PathBuf, PathBuf)> {
    let (samples, seq, features, classes) = data_shape(quick);
    let seed = plan.performance.backend.seed;
    let data = SyntheticSequences::new(samples, seq, features, classes, seed).msg()?;
    let prepared = datasets::write_prepared(dir, "data", &data, Some(2048), false)?;
    let split = dir.join("split.json");
    datasets::write_split(&split, &prepared, plan.data.val_fraction, seed)?;
    Ok((dir.join("data"), split))
}

/// One `kiln train` run: the figures of its `summary.json`, with the measured wall time.
fn kiln_run(data: &Path, sets: &[String], runs: &Path, log: &Path) -> Result<Measured> {
    remove_dir(runs)?;
    let mut m = measured(kiln_train("job", data, sets)?, log)?;
    let (run_dir, s) = read_summary(runs)?;
    m.result = json!({
        "framework": "kiln", "precision": s["precision"], "steps": s["steps"],
        "samples": s["samples"], "final_val_loss": s["final_val_loss"],
        "final_val_accuracy": s["final_val_accuracy"], "fit_seconds": s["seconds"],
        "num_workers_auto": s["num_workers_auto"], "run_dir": run_dir,
    });
    Ok(m)
}

/// What the PyTorch sides run: `lightning_job.py` with the plan's values.
struct Torch<'a> {
    python: &'a str,
    plan: &'a RunPlan,
    cpu: bool,
    threads: usize,
    /// The prepared shards and the split.
    data: (&'a Path, &'a Path),
}

impl Torch<'_> {
    /// Lightning's `precision` for kiln's, and kiln's attention formulation for it here.
    fn precision(&self) -> (&'static str, &'static str) {
        let precision = match self.plan.train.amp {
            AmpDtype::None => "32-true",
            AmpDtype::Bf16 => "bf16-mixed",
            AmpDtype::Fp16 => "16-mixed",
        };
        let math = self.cpu && self.plan.train.amp != AmpDtype::None;
        (precision, if math { "math" } else { "sdpa" })
    }

    /// `who`'s run (`plain`, `lightning` or `lightning-malloc`) writing to `out`.
    fn command(&self, who: &str, out: &Path, peers_dir: Option<&Path>) -> Command {
        let (precision, attention) = self.precision();
        let mut c = python_script(self.python, "lightning_job.py");
        let trainer = if who == "plain" { "plain" } else { "lightning" };
        c.args(["--trainer", trainer, "--precision", precision]);
        c.args(["--attention", attention]);
        c.args(["--device", if self.cpu { "cpu" } else { "cuda" }]);
        c.arg("--data").arg(self.data.0);
        c.arg("--split").arg(self.data.1);
        c.arg("--out").arg(out);
        c.args(["--workers", &self.plan.data.num_workers.to_string()]);
        plan_args(&mut c, self.plan, self.threads);
        if let Some(dir) = peers_dir {
            peers::put_first_on_path(&mut c, dir);
        }
        if who == "lightning-malloc" {
            malloc_like_kiln(&mut c);
        }
        c
    }
}

/// The median over one side's runs of `f`.
fn med(runs: &[Measured], f: impl Fn(&Measured) -> f64) -> f64 {
    median(runs.iter().map(f).collect())
}

/// The median of a side's final validation accuracy, in %.
fn accuracy_of(runs: &[Measured]) -> f64 {
    100.0 * med(runs, |m| num(&m.result["final_val_accuracy"]))
}

fn suite(a: &SuiteArgs) -> Result<()> {
    let (quick, repeats, threads) = (a.quick, a.repeats_or(1).max(1), a.threads_or(2).max(1));
    let work = fresh_work_dir(a, "job")?;
    let runs = work.join("kiln-runs");
    let sets = job_sets(quick, threads, &runs);
    let resolution = kiln_benches::resolve(&sets)?;
    let plan = resolution.plan;
    eprintln!("job: preparing the data under {}", work.display());
    let (data, split) = write_data(&work, quick, &plan)?;
    let torch = Torch {
        python: &a.python,
        plan: &plan,
        cpu: resolution.selection.device == kiln_device::Device::Cpu,
        threads,
        data: (&data, &split),
    };
    let lightning = peers::dir();
    let who = ["kiln", "lightning", "plain", "lightning-malloc"];
    let sides = alternating(repeats, &who, |r, who| {
        let log = work.join(format!("{who}-{r}.log"));
        let out = work.join(format!("{who}-{r}"));
        eprintln!("job: repeat {r}: {who} (log: {})", log.display());
        Ok(Some(match (who, &lightning) {
            ("kiln", _) => kiln_run(&data, &sets, &runs, &log)?,
            ("plain", _) => measured(torch.command(who, &out, None), &log)?,
            (_, Err(_)) => return Ok(None),
            (who, Ok(dir)) => measured(torch.command(who, &out, Some(dir)), &log)?,
        }))
    })?;
    let [kiln, light, plain, light_malloc]: [Vec<Measured>; 4] = sides
        .try_into()
        .map_err(|_| "the job suite has four sides".to_owned())?;
    let mut out = report(quick, &torch, &kiln, &plain);
    match &lightning {
        Ok(_) => lightning_rows(&mut out, &kiln, &light, &light_malloc),
        Err(why) => {
            let names = LIGHTNING_ROWS.map(|name| format!("{name} vs Lightning"));
            for name in names.iter().map(String::as_str).chain([MALLOC_ROW]) {
                out.skip(name, &format!("not run: {why}"));
            }
        }
    }
    let (precision, attention) = torch.precision();
    out.details = json!({
        "quick": quick, "repeats": repeats, "threads": threads,
        "precision": precision, "attention": attention,
        "workers": plan.data.num_workers, "workers_auto": plan.data.num_workers_auto,
        "batch": plan.train.batch_size,
        "epochs": plan.train.epochs, "data_shape": data_shape(quick),
        "kiln": kiln, "lightning": light, "pytorch_loop": plain, "lightning_malloc": light_malloc,
    });
    out.write(&a.out_or("job"))?;
    remove_dir(&work)
}

/// The suite's description and the rows against the plain PyTorch loop.
fn report(quick: bool, torch: &Torch<'_>, kiln: &[Measured], plain: &[Measured]) -> SuiteOutput {
    let (samples, seq, features, classes) = data_shape(quick);
    let (m, t) = (&torch.plan.model, &torch.plan.train);
    let (d_model, layers, dropout) = (m.d_model, m.layers, m.dropout);
    let (epochs, batch, warmup, clip) = (t.epochs, t.batch_size, t.warmup_steps, t.clip_grad_norm);
    let ((precision, attention), threads) = (torch.precision(), torch.threads);
    let n = torch.plan.data.num_workers;
    // kiln's `data.num_workers` as it resolves (by default `auto`, measuring up to the
    // profile's count), and the PyTorch sides' fixed count, that ceiling.
    let workers = if torch.plan.data.num_workers_auto {
        format!("data workers: kiln's default auto (measured, 0 to {n}), PyTorch's DataLoader {n}")
    } else {
        format!("{n} data workers")
    };
    let quick = quick.then_some("QUICK (a tiny job, shape check only): ");
    let what = format!(
        "{}the default job end to end: `kiln train --data` against PyTorch Lightning \
         Trainer.fit and a plain PyTorch loop on the same prepared shards ({samples} samples of \
         {seq}×{features}, {classes} classes, read through a torch Dataset), split, transformer \
         (d_model {d_model}, {layers} layers, dropout {dropout}) and initial weights; {epochs} \
         epochs of batch {batch}, {precision} ({attention} attention), fused AdamW, warmup \
         {warmup} + cosine, clipping {clip}, validation and a checkpoint every epoch, {workers}, \
         {threads} threads; wall time is process start to exit",
        quick.unwrap_or_default()
    );
    let mut out = SuiteOutput::new("job", &what);
    let base = "plain PyTorch loop, same job (no Lightning)";
    let name = "default job wall time vs a plain PyTorch loop";
    let seconds = (med(kiln, |m| m.seconds), med(plain, |m| m.seconds));
    out.push(out.row("end to end", name, SECONDS, seconds, base));
    let name = "final val accuracy vs a plain PyTorch loop";
    let accuracy = (accuracy_of(kiln), accuracy_of(plain));
    out.push(out.row("end to end", name, PERCENT, accuracy, base));
    out
}

/// The rows against Lightning; where it did not run, each is skipped as "… vs Lightning".
const LIGHTNING_ROWS: [&str; 6] = [
    "default job wall time",
    "default job samples/s (training samples / wall time)",
    "final val accuracy",
    "final val accuracy vs Lightning − 1 point",
    "peak memory, PSS of the process tree",
    "peak RSS of the process tree (shared pages once per process)",
];

/// The wall-time row against Lightning with kiln's malloc thresholds (no goal).
const MALLOC_ROW: &str = "default job wall time vs Lightning with kiln's malloc thresholds";

fn lightning_rows(
    out: &mut SuiteOutput,
    kiln: &[Measured],
    light: &[Measured],
    light_malloc: &[Measured],
) {
    let version = &light[0].result["lightning_version"];
    let version = version.as_str().unwrap_or("?");
    let base = format!("PyTorch Lightning Trainer.fit, same job (lightning {version})");
    let row = |name: &str, unit, figures| out.row("end to end", name, unit, figures, &base);
    let [wall, samples, accuracy, accuracy_goal, pss, rss] = LIGHTNING_ROWS;
    let both = |f: fn(&Measured) -> f64| (med(kiln, f), med(light, f));
    let (kf, lf) = both(|m| num(&m.result["fit_seconds"]));
    let fit = json!({"kiln": kf, "lightning": lf});
    let rate = |m: &Measured| num(&m.result["samples"]) / m.seconds;
    let (ka, la) = (accuracy_of(kiln), accuracy_of(light));
    let rows = [
        row(wall, SECONDS, both(|m| m.seconds))
            .at_most(0.7)
            .detail("fit_seconds", fit),
        row(samples, SAMPLES_S, both(rate)),
        row(accuracy, PERCENT, (ka, la)).detail("difference_points", json!(ka - la)),
        row(accuracy_goal, PERCENT, (ka, la - 1.0)).at_least(1.0),
        row(pss, MIB, both(|m| m.peak_pss_mib)),
        row(rss, MIB, both(|m| m.peak_rss_mib)),
    ];
    rows.into_iter().for_each(|r| out.push(r));
    let base = format!("{base}, with {MALLOC_AS_KILN}");
    let seconds = (med(kiln, |m| m.seconds), med(light_malloc, |m| m.seconds));
    out.push(out.row("end to end", MALLOC_ROW, SECONDS, seconds, base));
}
