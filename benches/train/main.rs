//! The train-step suites against PyTorch (`python/train_step.py`): `train` (GEMM peaks, the
//! cases of `cases.rs`, the sweep), `optimizer` (one AdamW step) and `opts` (one optimization at a
//! time on kiln's runs); `probe.rs` holds kiln's sides (`probe`, `gemm`, `optim-probe`).

mod cases;
mod probe;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use clap::Subcommand;
use kiln_benches::report::{Better, Comparison, MS, MS_STEP, SAMPLES_S, SuiteOutput, Unit};
use kiln_benches::{Msg, Result, SuiteArgs, command, device_name, interleaved, median, num};
use kiln_benches::{compile_env, median_of, python_script, run_json};
use kiln_data::{Loader, LoaderConfig, SyntheticClassification};
use serde_json::{Value, json};
use tch::{Device, Tensor};

use cases::{
    PROGRAM_ROWS, SCRIPT_ROWS, cases_for, planned_name, program_case, run_case, script_case,
};
use kiln_benches::run_cli::{Cli, exit_on_error};
use probe::optimizer_store;

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
    OptimProbe(probe::OptimProbeArgs),
}

/// Runs the suite's command line (`args[0]` is its name); without a subcommand, the `train` suite.
pub fn main(args: Vec<OsString>) {
    let about = "`kiln-bench train`: the train-step suites against PyTorch, and their kiln probes";
    let cli = Cli::<Sub>::parse_with(args, about);
    exit_on_error(match cli.command {
        None => train_suite(&cli.suite),
        Some(Sub::Train(a)) => train_suite(&a),
        Some(Sub::Optimizer(a)) => optimizer_suite(&a),
        Some(Sub::Opts(a)) => opts_suite(&a),
        Some(Sub::Probe(a)) => probe::probe(&a),
        Some(Sub::Gemm(a)) => probe::gemm(&a),
        Some(Sub::OptimProbe(a)) => probe::optim_probe(&a),
    });
}

/// Common options of the suites.
struct Opts {
    quick: bool,
    repeats: usize,
    threads: String,
    device: Device,
    python: String,
    me: PathBuf,
    /// A train-step run's warm-up, timed and breakdown steps.
    steps: (usize, usize, usize),
    /// An optimizer run's warm-up and timed steps.
    optim_steps: (usize, usize),
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
            optim_steps: if a.quick { (3, 10) } else { (10, 100) },
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

    /// `train_step.py --compile`, as [`Opts::torch`], with inductor's caches under `cache`.
    fn compiling<S: AsRef<OsStr>>(&self, args: &[S], cache: &Path) -> Command {
        let mut c = self.torch(args);
        compile_env(&mut c, cache);
        c
    }

    /// `c` on the suite's threads and device, then `args`.
    fn placed<S: AsRef<OsStr>>(&self, mut c: Command, args: &[S]) -> Command {
        let device = device_name(self.device);
        c.args(["--threads", &self.threads, "--device", &device]);
        c.args(args);
        c
    }

    /// A train-step run's arguments, as both sides take them, with `split` breakdown steps.
    fn step_args(&self, model: &str, precision: &str, batch: usize, split: usize) -> Vec<String> {
        let (warmup, steps, _) = self.steps;
        words(&format!(
            "--model {model} --precision {precision} --batch {batch} --warmup {warmup} \
             --steps {steps} --breakdown-steps {split}"
        ))
    }

    /// An optimizer run's arguments: `FLAG IMP`, the implementation it times, and the steps.
    fn optim_args(&self, flag: &str, imp: &str) -> Vec<String> {
        let (warmup, steps) = self.optim_steps;
        words(&format!("{flag} {imp} --warmup {warmup} --steps {steps}"))
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

/// `args` as owned strings.
fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The words of `line`, arguments without spaces in them, as owned strings.
fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

/// The GEMM peaks the train steps are measured against (TF32 and fp16 only on a GPU).
fn peaks(o: &Opts) -> Result<Value> {
    let all = ["fp32", "tf32", "bf16", "fp16"];
    let cuda = o.device.is_cuda();
    let precisions = if cuda { &all[..] } else { &["fp32", "bf16"] };
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

/// The train suite: the GEMM peaks, the cases, the own-model rows, the batch-size sweep.
fn train_suite(a: &SuiteArgs) -> Result<()> {
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
    // The batch-size sweep's rows (throughput, peak memory).
    let precision = if o.device.is_cuda() { "bf16" } else { "fp32" };
    for &b in a.batch_sizes() {
        let args = o.step_args("transformer", precision, b, 0);
        let sides = interleaved(o.repeats, 2, |i| match i {
            0 => o.kiln("probe", &args),
            _ => o.torch(&args),
        })?;
        let (k, t) = (&sides[0], &sides[1]);
        let base = format!("PyTorch eager {precision}");
        out.push_sweep(&format!("transformer {precision}"), b, (k, t), &base);
        runs.push(json!({"sweep_batch": b, "kiln": k, "torch": t}));
    }
    let (warmup, steps, breakdown) = o.steps;
    out.details = json!({"repeats": o.repeats, "warmup_steps": warmup, "timed_steps": steps,
                         "breakdown_steps": breakdown, "runs": runs});
    out.write(&a.out_or("train"))
}

/// The optimizer suite's sides: the name in its runs, the `--impl`/`--optimizer` it times, and
/// what it is.
const SIDES: [(&str, &str, &str); 5] = [
    ("kiln_fused", "fused", "kiln's fused AdamW"),
    ("kiln_unfused", "unfused", "kiln AdamW as per-tensor ops"),
    ("torch_fused", "fused", "torch.optim.AdamW(fused=True)"),
    (
        "torch_foreach",
        "foreach",
        "torch.optim.AdamW() (foreach, its default)",
    ),
    ("torch_single", "single", "torch.optim.AdamW(foreach=False)"),
];

/// The optimizer suite's rows: what kiln's fused step is set against, that side, the goal if any.
const ROWS: [(&str, usize, Option<f64>); 4] = [
    ("PyTorch fused (the same kernel)", 2, Some(1.05)),
    ("PyTorch default (foreach)", 3, Some(0.6)),
    ("kiln unfused", 1, None),
    ("PyTorch single-tensor", 4, None),
];

/// The optimizer suite: its five sides alternating, kiln's fused step against each of the others.
fn optimizer_suite(a: &SuiteArgs) -> Result<()> {
    let o = &Opts::new(a)?;
    // The transformer's parameter shapes, in name order, as `train_step.py --shapes` takes them.
    let vars = BTreeMap::from_iter(optimizer_store(Device::Cpu)?.variables());
    let dims = |t: &Tensor| t.size().iter().map(i64::to_string).collect::<Vec<_>>();
    let shapes: Vec<String> = vars.values().map(|t| dims(t).join("x")).collect();
    let shapes = ["--shapes".to_owned(), shapes.join(",")];
    let runs = interleaved(o.repeats, SIDES.len(), |i| match SIDES[i] {
        (side, imp, _) if side.starts_with("kiln") => {
            o.kiln("optim-probe", &o.optim_args("--impl", imp))
        }
        (_, imp, _) => o.torch(&[o.optim_args("--optimizer", imp), shapes.to_vec()].concat()),
    })?;
    let (kiln, torch) = (&runs[0][0], &runs[2][0]);
    if kiln["params"] != torch["params"] {
        return Err(format!(
            "the two sides updated different parameter counts ({} vs {})",
            kiln["params"], torch["params"]
        ));
    }
    let what = format!(
        "one AdamW step over the reference transformer's {} parameters in {} tensors on {}: \
         kiln's fused kernel against the per-tensor update and torch.optim.AdamW",
        kiln["params"],
        kiln["tensors"],
        device_name(o.device)
    );
    let mut out = SuiteOutput::new("optimizer", &what);
    let ms = |i: usize| median_of(&runs[i], "step_s_median") * 1e3;
    for (vs, other, goal) in ROWS {
        let ablation = if goal.is_none() { "ablation: " } else { "" };
        let name = format!("{ablation}AdamW kiln fused vs {vs}");
        let figures = (ms(0), ms(other));
        let row = out.row("optimizer step", name, MS_STEP, figures, SIDES[other].2);
        out.push(speedup_row(row, goal));
    }
    let (warmup, steps) = o.optim_steps;
    let runs = by_name(SIDES.iter().map(|s| s.0).zip(&runs));
    out.details = json!({"warmup_steps": warmup, "timed_steps": steps, "repeats": o.repeats,
                         "runs": runs});
    out.write(&a.out_or("optimizer"))
}

const NO_GPU: &str = "needs a CUDA GPU; this machine has none";

/// The opts rows' group.
const GROUP: &str = "optimization";

/// A run's figure: the JSON key, the factor to the row's unit, the unit.
type Figure = (&'static str, f64, Unit);

const STEP_MS: Figure = ("step_s_median", 1e3, MS_STEP);
const P50_MS: Figure = ("p50_ms", 1.0, MS);

/// One optimization toggled: its key in the runs, its row's name and baseline, the figure.
struct Toggle<'a> {
    key: &'a str,
    name: &'a str,
    baseline: &'a str,
    figure: Figure,
}

/// The opts suite: kiln with each optimization on against the same run with it off.
fn opts_suite(a: &SuiteArgs) -> Result<()> {
    let o = &Opts::new(a)?;
    let what = format!(
        "kiln's own train step (and loader, optimizer and inference) on {} with one optimization \
         on against the same run with it off; the ratio is on / off (below 1: the optimization \
         pays)",
        device_name(o.device)
    );
    let mut out = SuiteOutput::new("opts", &what);
    let mut runs = step_toggles(o, &mut out)?;
    // Fused AdamW: the optimizer step alone.
    let optim = ["fused", "unfused"].map(|imp| o.optim_args("--impl", imp));
    let fused = Toggle {
        key: "fused AdamW",
        name: "fused AdamW (optimizer step)",
        baseline: "kiln AdamW as per-tensor ops",
        figure: STEP_MS,
    };
    let probe = |i: usize| o.kiln("optim-probe", &optim[i]);
    runs.push(toggle((o, &mut out), fused, probe)?);
    runs.push(loader_workers(o, &mut out)?);
    if o.device.is_cuda() {
        // CUDA graphs: inference latency at batch 1, from the serve benchmark's binary.
        let device = device_name(o.device);
        let serve = |i: usize| {
            let args = ["serve", "infer-probe", "--batch", "1", "--device", &device];
            let mut c = command(&o.me, &args);
            c.args(["--graphs", ["on", "off"][i]]);
            c
        };
        let graphs = Toggle {
            key: "cuda graphs",
            name: "CUDA graphs (inference, batch 1, p50)",
            baseline: "kiln inference without graphs",
            figure: P50_MS,
        };
        runs.push(toggle((o, &mut out), graphs, serve)?);
    } else {
        out.skip("CUDA graphs", NO_GPU);
    }
    let (warmup, steps, _) = o.steps;
    out.details = json!({"repeats": o.repeats, "warmup_steps": warmup, "timed_steps": steps,
                         "runs": runs});
    out.write(&a.out_or("opts"))
}

/// `c` with its speedup (how many times better kiln's figure is) and the goal `ratio <= goal`.
fn speedup_row(c: Comparison, goal: Option<f64>) -> Comparison {
    let speedup = match c.better {
        Better::Lower => c.baseline / c.kiln,
        Better::Higher => c.kiln / c.baseline,
    };
    at_most(c.detail("speedup", json!(speedup)), goal)
}

/// Runs `cmd(0)` (on) and `cmd(1)` (off) alternating, adds `t`'s row; returns the runs by key.
fn toggle(
    (o, out): (&Opts, &mut SuiteOutput),
    t: Toggle<'_>,
    cmd: impl Fn(usize) -> Command,
) -> Result<Value> {
    let r = interleaved(o.repeats, 2, cmd)?;
    let (figure, scale, unit) = t.figure;
    let [on, off] = [&r[0], &r[1]].map(|runs| median_of(runs, figure) * scale);
    let row = out.row(GROUP, t.name, unit, (on, off), t.baseline);
    out.push(speedup_row(row, None));
    Ok(json!({"toggle": t.key, "on": r[0], "off": r[1]}))
}

/// The train-step toggles: precision, TF32 and cuDNN benchmark (on a GPU), channels-last.
fn step_toggles(o: &Opts, out: &mut SuiteOutput) -> Result<Vec<Value>> {
    let cuda = o.device.is_cuda();
    let mut runs = vec![];
    // A toggle: its row, model, and each side's (on, then off) precision and further arguments.
    let mut run = |name: &str, model: &str, p: [&str; 2], extra: [&str; 2]| {
        // The U-Net's samples are volumes: a few make a batch.
        let batch = if model == "unet3d" { 2 } else { 32 };
        let args = [0, 1].map(|i| [o.step_args(model, p[i], batch, 0), words(extra[i])].concat());
        let base = format!("kiln {model} step without it");
        let probe = |i: usize| o.kiln("probe", &args[i]);
        let step = Toggle {
            key: name,
            name,
            baseline: &base,
            figure: STEP_MS,
        };
        runs.push(toggle((o, out), step, probe)?);
        Ok::<_, String>(())
    };
    let mixed = if cuda { "bf16" } else { "auto" };
    let what = if cuda { "bf16" } else { "automatic" };
    let precision = format!("precision: {what} instead of fp32 (transformer)");
    run(&precision, "transformer", [mixed, "fp32"], ["", ""])?;
    let fp32 = ["fp32"; 2];
    if cuda {
        let tf32 = ["--tf32 on", "--tf32 off"];
        run("TF32 matmuls (transformer fp32)", "transformer", fp32, tf32)?;
        let benchmark = ["--cudnn-benchmark on", "--cudnn-benchmark off"];
        run("cuDNN benchmark (convnet)", "convnet", fp32, benchmark)?;
    }
    let channels_last = ["--channels-last", ""];
    run("channels-last (convnet)", "convnet", fp32, channels_last)?;
    let unet = "channels-last-3d (unet3d, batch 2)";
    run(unet, "unet3d", fp32, channels_last)?;
    if !cuda {
        out.skip("TF32 matmuls", NO_GPU);
        out.skip("cuDNN benchmark", NO_GPU);
    }
    Ok(runs)
}

/// Loader workers: in this process, interleaved.
fn loader_workers(o: &Opts, out: &mut SuiteOutput) -> Result<Value> {
    let samples = if o.quick { 256 } else { 2048 };
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 8);
    let (mut with, mut without) = (vec![], vec![]);
    for _ in 0..o.repeats {
        with.push(loader_epoch_s(workers, samples)?);
        without.push(loader_epoch_s(0, samples)?);
    }
    let rate = |epochs: &[f64]| samples as f64 / median(epochs.to_vec());
    let name = format!("loader workers: {workers} instead of 0");
    let baseline = "kiln loader in the training thread";
    let figures = (rate(&with), rate(&without));
    let row = out.row(GROUP, name, SAMPLES_S, figures, baseline);
    out.push(speedup_row(row, None));
    Ok(json!({"toggle": "workers", "on_s": with, "off_s": without}))
}

/// Seconds of one epoch of kiln's loader at `workers` over synthetic SignTransformer samples.
fn loader_epoch_s(workers: usize, samples: usize) -> Result<f64> {
    let dataset =
        Arc::new(SyntheticClassification::new(samples, vec![64, 469], 100, 0, 0.5).msg()?);
    let config = LoaderConfig {
        batch_size: 32,
        num_workers: workers,
        prefetch_factor: 2,
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(dataset, config).msg()?;
    // A first epoch starts the workers; the second is timed.
    let mut start = Instant::now();
    for epoch in 0..2 {
        start = Instant::now();
        for batch in loader.epoch(epoch) {
            batch.msg()?;
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    fn parse(line: &str) -> std::result::Result<Cli<Sub>, String> {
        Cli::try_parse_from(line.split_whitespace()).msg()
    }

    /// The subcommand of `line`, which must parse.
    fn sub(line: &str) -> Option<Sub> {
        parse(line).unwrap().command
    }

    #[test]
    fn the_command_lines_xtask_and_the_suites_use_parse() {
        Cli::<Sub>::command().debug_assert();
        let Some(Sub::Train(a)) =
            sub("kiln-bench-train train --quick --device cuda:0 --out F --python PY")
        else {
            panic!("not the train suite");
        };
        let parsed = (a.quick, a.device(), a.python.as_str());
        assert_eq!(parsed, (true, Device::Cuda(0), "PY"));
        let cli = parse("kiln-bench-train --quick --batch-sizes 1,2,4").unwrap();
        assert!(cli.command.is_none() && cli.suite.batch_sizes() == [1, 2, 4]);
        let probe = "kiln-bench-train probe --model mlp --precision auto --tf32 on --channels-last";
        assert!(matches!(sub(probe), Some(Sub::Probe(_))));
        let optim = "kiln-bench-train optim-probe --impl unfused --warmup 3 --steps 10";
        assert!(matches!(sub(optim), Some(Sub::OptimProbe(_))));
        let err = parse("kiln-bench-train optimizer --quick --frobnicate").unwrap_err();
        assert!(err.contains("--frobnicate"), "{err}");
        let err = parse("kiln-bench-train probe --tf32 maybe").unwrap_err();
        assert!(err.contains("expected on or off"), "{err}");
    }
}
