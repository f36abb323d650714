//! `cargo xtask bench` suites over the train step, each side by side with PyTorch eager Python
//! (`python/train_step.py`, fused AdamW on) on the same reference model, batch, thread count,
//! device and fixed random batch:
//!
//! - `train` (the default): step-time ratios (kiln / PyTorch; below 1 means kiln is faster),
//!   each step's model FLOP utilization against this machine's measured GEMM peak, the step
//!   breakdown (data wait, forward, backward, optimizer) of both sides, and with
//!   `--batch-sizes 1,2,4…` a sweep of throughput and peak memory over batch sizes. Besides
//!   PyTorch eager, the transformer rows run against `torch.compile(model)` (default mode; not
//!   in `--quick`), its compile time (the first step, from an empty inductor cache) a row apart.
//! - `optimizer`: one AdamW step over the transformer's parameters: kiln's fused kernel against
//!   the per-tensor update and against `torch.optim.AdamW` fused, foreach and single-tensor.
//! - `opts`: one optimization toggled at a time on kiln's own step (precision, fused AdamW,
//!   TF32, cuDNN benchmark, channels-last, loader workers, CUDA graphs), each one's speedup.
//!
//! `probe`, `gemm` and `optim-probe` are the kiln side of one measurement, each in its own
//! process like the Python side, so neither inherits the other's threads, caches or flags.

mod cases;
mod optimizer;
mod opts;
mod probe;
mod program;
mod suite;

use std::ffi::{OsStr, OsString};
use std::process::Command;

use clap::Subcommand;
use kiln_benches::python_script;
use kiln_benches::report::Comparison;
use kiln_benches::{Msg, Result, SuiteArgs, device_name};
use kiln_config::{ModelKind, ModelPlan};
use serde_json::{Value, json};
use tch::Device;

use kiln_benches::run_cli::{Cli, exit_on_error};
use probe::ShapeArgs;

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

/// Runs the suite's command line (`args[0]` is its name, as clap takes a program name); without
/// a subcommand, the `train` suite.
pub fn main(args: Vec<OsString>) {
    let about = "`kiln-bench train`: the train-step suites against PyTorch, and their kiln probes";
    let cli = Cli::<Sub>::parse_with(args, about);
    exit_on_error(match cli.command {
        None => suite::train_suite(&cli.suite),
        Some(Sub::Train(a)) => suite::train_suite(&a),
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
        let mut c = Command::new(&self.me);
        c.args(["train", mode, "--threads", &self.threads])
            .args(["--device", &device_name(self.device)])
            .args(args);
        c
    }

    /// `train_step.py` on the suite's threads and device, then `args`.
    fn torch<S: AsRef<OsStr>>(&self, args: &[S]) -> Command {
        let mut c = python_script(&self.python, "train_step.py");
        c.args(["--threads", &self.threads])
            .args(["--device", &device_name(self.device)])
            .args(args);
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
