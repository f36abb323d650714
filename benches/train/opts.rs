//! The `opts` suite: one optimization toggled at a time on kiln's own runs (precision, TF32,
//! cuDNN benchmark, channels-last, fused AdamW, loader workers, CUDA graphs), each one's speedup
//! as the ratio on / off.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use kiln_benches::report::{Better, Comparison, SAMPLES_S, SuiteOutput, Unit};
use kiln_benches::{Msg, SuiteArgs, command, device_name, interleaved, median, median_of};
use kiln_data::{Loader, LoaderConfig, SyntheticClassification};
use serde_json::{Value, json};

use super::optimizer::optim_args;
use super::{Opts, Result, words};

const NO_GPU: &str = "needs a CUDA GPU; this machine has none";

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

pub fn opts_suite(a: &SuiteArgs) -> Result<()> {
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
    let optim = ["fused", "unfused"].map(|imp| optim_args(o, ("--impl", imp)));
    let fused = ("fused AdamW", "fused AdamW (optimizer step)", STEP_MS);
    let base = "kiln AdamW as per-tensor ops";
    runs.push(toggle(
        (o, &mut out),
        fused,
        |i| o.kiln("optim-probe", &optim[i]),
        base,
    )?);
    runs.push(loader_workers(o, &mut out)?);
    if o.device.is_cuda() {
        // CUDA graphs: inference latency at batch 1, from the serve benchmark's binary.
        let device = device_name(o.device);
        let serve = |i: usize| {
            let graphs = ["on", "off"][i];
            let args = ["serve", "infer-probe", "--batch", "1", "--device", &device];
            let mut c = command(&o.me, &args);
            c.args(["--graphs", graphs]);
            c
        };
        let graphs = (
            "cuda graphs",
            "CUDA graphs (inference, batch 1, p50)",
            P50_MS,
        );
        let base = "kiln inference without graphs";
        runs.push(toggle((o, &mut out), graphs, serve, base)?);
    } else {
        out.skip("CUDA graphs", NO_GPU);
    }
    let (warmup, steps, _) = o.steps;
    out.details = json!({"repeats": o.repeats, "warmup_steps": warmup, "timed_steps": steps,
                         "runs": runs});
    out.write(&a.out_or("opts"))
}

/// An optimization's row: kiln with it (`on`) against kiln without it (`off`).
fn row(name: &str, unit: Unit, (on, off): (f64, f64), baseline: &str) -> Comparison {
    let speedup = match unit.1 {
        Better::Lower => off / on,
        Better::Higher => on / off,
    };
    let row = Comparison::new("opts", "optimization", name, unit, (on, off), baseline);
    row.detail("speedup", json!(speedup))
}

/// A run's figure: the JSON key, the factor to the row's unit, the unit.
type Figure = (&'static str, f64, &'static str);

const STEP_MS: Figure = ("step_s_median", 1e3, "ms/step");
const P50_MS: Figure = ("p50_ms", 1.0, "ms");

/// Runs `cmd(0)` (on) and `cmd(1)` (off) alternating; adds the row `name` of the medians of
/// `figure` and returns their runs, as `toggle`.
fn toggle(
    (o, out): (&Opts, &mut SuiteOutput),
    (toggle, name, (key, scale, unit)): (&str, &str, Figure),
    cmd: impl Fn(usize) -> Command,
    baseline: &str,
) -> Result<Value> {
    let r = interleaved(o.repeats, 2, cmd)?;
    let (on, off) = (median_of(&r[0], key) * scale, median_of(&r[1], key) * scale);
    out.push(row(name, (unit, Better::Lower), (on, off), baseline));
    Ok(json!({"toggle": toggle, "on": r[0], "off": r[1]}))
}

/// The train-step toggles: precision, TF32 and cuDNN benchmark (on a GPU), channels-last.
fn step_toggles(o: &Opts, out: &mut SuiteOutput) -> Result<Vec<Value>> {
    let cuda = o.device.is_cuda();
    let mut runs = vec![];
    // A toggle: its row, model, and each side's (on, then off) precision and further arguments.
    let mut run = |name: &str, model: &str, p: [&str; 2], extra: [&str; 2]| {
        // The U-Net's samples are volumes: a few make a batch.
        let batch = if model == "unet3d" { 2 } else { 32 };
        let args = |i: usize| [o.step_args(model, p[i], batch, 0), words(extra[i])].concat();
        let args = [args(0), args(1)];
        let baseline = format!("kiln {model} step without it");
        let probe = |i: usize| o.kiln("probe", &args[i]);
        runs.push(toggle((o, out), (name, name, STEP_MS), probe, &baseline)?);
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
    out.push(row(&name, SAMPLES_S, figures, baseline));
    Ok(json!({"toggle": "workers", "on_s": with, "off_s": without}))
}
