//! The train-step suites against PyTorch (`python/train_step.py`, fused AdamW) on the same model,
//! batch, threads and device: `train` (step-time ratios, MFU, breakdown, batch-size sweep,
//! torch.compile), `optimizer` (one AdamW step) and `opts` (one optimization at a time). `probe`,
//! `gemm` and `optim-probe` are kiln's side, each in its own process like the Python side.
//! This file also holds the `train` suite itself: the GEMM peaks, the cases, the sweep.

mod cases;
mod optimizer;
mod opts;
mod probe;
mod program;

use std::ffi::{OsStr, OsString};
use std::process::Command;

use clap::Subcommand;
use kiln_benches::report::{Comparison, SuiteOutput};
use kiln_benches::{Msg, Result, SuiteArgs, command, device_name, interleaved, num};
use kiln_benches::{python_script, run_json};
use kiln_config::{ModelKind, ModelPlan};
use serde_json::{Value, json};
use tch::Device;

use cases::{cases_for, planned_name, run_case};
use kiln_benches::run_cli::{Cli, exit_on_error};
use probe::ShapeArgs;
use program::{PROGRAM_ROWS, SCRIPT_ROWS, program_case, script_case};

#[derive(Debug, Subcommand)]
enum Sub {
    /// Train step vs PyTorch eager and torch.compile (MFU, step breakdown, batch-size sweep).
    Train(SuiteArgs),
    /// One AdamW step: kiln's fused kernel vs per-tensor ops and torch.optim.AdamW.
    Optimizer(SuiteArgs),
    /// One optimization at a time on kiln's own step.
    Opts(SuiteArgs),
    /// Times kiln's train step for one case; prints one JSON line.
    Probe(probe::ProbeArgs),
    /// This machine's GEMM peak through libtorch at one precision; prints one JSON line.
    Gemm(probe::GemmArgs),
    /// Times one AdamW step over the transformer's parameters; prints one JSON line.
    OptimProbe(optimizer::OptimProbeArgs),
}

/// Runs the suite's command line (`args[0]` is its name); without a subcommand, the `train` suite.
pub fn main(args: Vec<OsString>) {
    let about = "`kiln-bench train`: the train-step suites against PyTorch, and their kiln probes";
    let cli = Cli::<Sub>::parse_with(args, about);
    exit_on_error(match cli.command {
        None => train_suite(&cli.suite),
        Some(Sub::Train(a)) => train_suite(&a),
        Some(Sub::Optimizer(a)) => optimizer::optimizer_suite(&a),
        Some(Sub::Opts(a)) => opts::opts_suite(&a),
        Some(Sub::Probe(a)) => probe::probe(&a),
        Some(Sub::Gemm(a)) => probe::gemm(&a),
        Some(Sub::OptimProbe(a)) => optimizer::optim_probe(&a),
    });
}

/// The reference SignTransformer's size (over `[64, 469]` samples, 100 classes).
const REFERENCE: ShapeArgs = ShapeArgs {
    seq: 64,
    d_model: 256,
    heads: 8,
    layers: 4,
    ff: 1024,
};

/// kiln's plan for `kind`, the transformer of `shape`'s size.
fn model_plan(kind: ModelKind, dropout: f64, shape: &ShapeArgs) -> ModelPlan {
    ModelPlan {
        dropout,
        d_model: shape.d_model.into(),
        heads: shape.heads.into(),
        layers: shape.layers.into(),
        ff: shape.ff.into(),
        ..ModelPlan::builtin(kind)
    }
}

/// Common options of the suites.
struct Opts {
    quick: bool,
    repeats: usize,
    threads: String,
    device: Device,
    python: String,
    me: std::path::PathBuf,
    /// A train-step run's warm-up, timed and breakdown steps.
    steps: (usize, usize, usize),
}

impl Opts {
    fn new(a: &SuiteArgs) -> Result<Self> {
        Ok(Self {
            quick: a.quick,
            repeats: a.repeats_or(if a.quick { 1 } else { 3 }).max(1),
            threads: a.threads_or(2).max(1).to_string(),
            device: a.device(),
            python: a.python.clone(),
            me: std::env::current_exe().msg()?,
            steps: if a.quick { (2, 5, 3) } else { (5, 20, 10) },
        })
    }

    /// `kiln-bench train MODE` on the suite's threads and device, then `args`.
    fn kiln<S: AsRef<OsStr>>(&self, mode: &str, args: &[S]) -> Command {
        self.placed(command(&self.me, &["train", mode]), args)
    }

    /// `train_step.py` on the suite's threads and device, then `args`.
    fn torch<S: AsRef<OsStr>>(&self, args: &[S]) -> Command {
        self.placed(python_script(&self.python, "train_step.py"), args)
    }

    /// `c` on the suite's threads and device, then `args`.
    fn placed<S: AsRef<OsStr>>(&self, mut c: Command, args: &[S]) -> Command {
        let device = device_name(self.device);
        c.args(["--threads", &self.threads, "--device", &device]);
        c.args(args);
        c
    }

    /// A train-step run's arguments, as both sides take them: `model` at `precision`, a batch
    /// of `batch`, the suite's warm-up and timed steps, and `split` steps timed phase by phase.
    fn step_args(&self, model: &str, precision: &str, batch: usize, split: usize) -> Vec<String> {
        let (warmup, steps, _) = self.steps;
        words(&format!(
            "--model {model} --precision {precision} --batch {batch} --warmup {warmup} \
             --steps {steps} --breakdown-steps {split}"
        ))
    }
}

/// Each side's runs as one JSON object, by the side's name.
fn by_name<'a>(sides: impl IntoIterator<Item = (&'a str, &'a Vec<Value>)>) -> Value {
    let entries = sides.into_iter().map(|(n, r)| (n.to_owned(), json!(r)));
    Value::Object(entries.collect())
}

/// `c` with the goal `ratio <= goal`, where there is one.
fn at_most(c: Comparison, goal: Option<f64>) -> Comparison {
    goal.into_iter().fold(c, Comparison::at_most)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The words of `line`, arguments without spaces in them, as owned strings.
fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

/// The GEMM peaks the train steps are measured against (TF32 and fp16 only on a GPU).
fn peaks(o: &Opts) -> Result<Value> {
    let precisions: &[&str] = if o.device.is_cuda() {
        &["fp32", "tf32", "bf16", "fp16"]
    } else {
        &["fp32", "bf16"]
    };
    let mut peaks = serde_json::Map::new();
    for p in precisions {
        let v = run_json(o.kiln("gemm", &["--precision", p]))?;
        let (gflops, on) = (num(&v["gemm_gflops"]), device_name(o.device));
        eprintln!("{p} GEMM peak through libtorch on {on}: {gflops:.0} GFLOP/s");
        peaks.insert(format!("{p}_gemm_gflops"), v["gemm_gflops"].clone());
    }
    Ok(Value::Object(peaks))
}

/// The peak a step at `precision` (with fp32 matmuls in TF32 or not) is measured against.
fn peak_for(peaks: &Value, precision: &str, tf32: bool) -> (f64, String) {
    let tf32 = precision == "fp32" && tf32;
    let key = if tf32 { "tf32" } else { precision };
    let peak = num(&peaks[format!("{key}_gemm_gflops")]);
    (peak, format!("{key} GEMM"))
}

pub fn train_suite(a: &SuiteArgs) -> Result<()> {
    let o = Opts::new(a)?;
    let what = format!(
        "train step (forward, cross-entropy, backward, fused AdamW, loss read) on one fixed batch \
         (32 unless the row says) on {}, {} threads: kiln against PyTorch eager and \
         torch.compile; MFU against this machine's measured GEMM peak",
        device_name(o.device),
        o.threads
    );
    let mut out = SuiteOutput::new("train", &what);
    out.peaks = peaks(&o)?;
    let mut runs = vec![];
    for (i, case) in cases_for(o.device).iter().enumerate() {
        // The row's name (which resolves the configuration) only where a filter reads it.
        let filtered = a.filter.is_some() && !a.selects(&planned_name(&o, case)?);
        if (case.compile && o.quick) || filtered {
            continue;
        }
        runs.push(run_case(&o, &mut out, (i, case))?);
    }
    if o.quick {
        let why = "left out of --quick: compiling takes minutes";
        out.skip("torch.compile rows", why);
    }
    if a.selects(SCRIPT_ROWS) {
        runs.push(script_case(&o, &mut out)?);
    }
    if a.selects(PROGRAM_ROWS) {
        runs.push(program_case(&o, &mut out)?);
    }
    for &b in a.batch_sizes() {
        runs.push(sweep_rows(&o, &mut out, b)?);
    }
    let (warmup, steps, breakdown) = o.steps;
    out.details = json!({"repeats": o.repeats, "warmup_steps": warmup, "timed_steps": steps,
                         "breakdown_steps": breakdown, "runs": runs});
    out.write(&a.out_or("train"))
}

/// The batch-size sweep's rows at batch `b` (throughput, peak memory); returns their runs.
fn sweep_rows(o: &Opts, out: &mut SuiteOutput, b: usize) -> Result<Value> {
    let precision = if o.device.is_cuda() { "bf16" } else { "fp32" };
    let args = o.step_args("transformer", precision, b, 0);
    let sides = interleaved(o.repeats, 2, |i| match i {
        0 => o.kiln("probe", &args),
        _ => o.torch(&args),
    })?;
    let (k, t) = (&sides[0], &sides[1]);
    let base = format!("PyTorch eager {precision}");
    out.push_sweep(&format!("transformer {precision}"), b, (k, t), &base);
    Ok(json!({"sweep_batch": b, "kiln": k, "torch": t}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    fn parse(line: &str) -> std::result::Result<Cli<Sub>, String> {
        Cli::try_parse_from(line.split_whitespace()).msg()
    }

    #[test]
    fn the_command_lines_xtask_and_the_suites_use_parse() {
        Cli::<Sub>::command().debug_assert();
        let cli =
            parse("kiln-bench-train train --quick --device cuda:0 --out F --python PY").unwrap();
        let Some(Sub::Train(a)) = cli.command else {
            panic!("not the train suite: {cli:?}");
        };
        assert_eq!(
            (a.quick, a.device(), a.python.as_str()),
            (true, Device::Cuda(0), "PY")
        );
        let cli = parse("kiln-bench-train --quick --batch-sizes 1,2,4").unwrap();
        assert!(cli.command.is_none() && cli.suite.batch_sizes() == [1, 2, 4]);
        assert!(matches!(
            parse("kiln-bench-train probe --model mlp --precision auto --tf32 on --channels-last")
                .unwrap()
                .command,
            Some(Sub::Probe(_))
        ));
        assert!(matches!(
            parse("kiln-bench-train optim-probe --impl unfused --warmup 3 --steps 10")
                .unwrap()
                .command,
            Some(Sub::OptimProbe(_))
        ));
        let err = parse("kiln-bench-train optimizer --quick --frobnicate").unwrap_err();
        assert!(err.contains("--frobnicate"), "{err}");
        let err = parse("kiln-bench-train probe --tf32 maybe").unwrap_err();
        assert!(err.contains("expected on or off"), "{err}");
    }
}
