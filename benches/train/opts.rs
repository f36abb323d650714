//! The `opts` suite: one optimization toggled at a time on kiln's own runs (precision, TF32,
//! cuDNN benchmark, channels-last, fused AdamW, loader workers, CUDA graphs), each one's speedup
//! as the ratio on / off.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use kiln_benches::report::{Better, Comparison, SuiteOutput};
use kiln_benches::{SuiteArgs, device_name, median, median_of};
use kiln_data::{Loader, LoaderConfig, SyntheticClassification};
use serde_json::{Value, json};

use super::{Opts, Result};

const NO_GPU: &str = "needs a CUDA GPU; this machine has none";

/// One epoch of kiln's loader over synthetic SignTransformer-shaped samples (generating each
/// sample is the per-sample work) at `workers` workers; seconds.
fn loader_epoch_s(workers: usize, samples: usize) -> Result<f64> {
    let dataset = Arc::new(
        SyntheticClassification::new(samples, vec![64, 469], 100, 0, 0.5)
            .map_err(|e| e.to_string())?,
    );
    let config = LoaderConfig {
        batch_size: 32,
        num_workers: workers,
        prefetch_factor: 2,
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(dataset, config).map_err(|e| e.to_string())?;
    // A first epoch starts the workers; the second is timed.
    let mut count = 0;
    for epoch in 0..2 {
        let start = Instant::now();
        for batch in loader.epoch(epoch) {
            count += batch.map_err(|e| e.to_string())?.indices.len();
        }
        if epoch == 1 {
            return Ok(start.elapsed().as_secs_f64());
        }
    }
    Err(format!("the loader produced {count} samples"))
}

pub fn opts_suite(a: &SuiteArgs) -> Result<()> {
    let o = &Opts::new(a)?;
    let (warmup, steps) = if o.quick { (2, 5) } else { (5, 20) };
    let mut out = SuiteOutput::new(
        "opts",
        &format!(
            "kiln's own train step (and loader, optimizer and inference) on {} with one \
             optimization on against the same run with it off; the ratio is on / off (below 1: \
             the optimization pays)",
            device_name(o.device)
        ),
    );
    let mut runs = step_toggles(o, &mut out, (warmup, steps))?;
    runs.push(fused_adamw(o, &mut out)?);
    runs.push(loader_workers(o, &mut out)?);
    if o.device.is_cuda() {
        runs.push(cuda_graphs(o, &mut out)?);
    } else {
        out.skip("CUDA graphs", NO_GPU);
    }
    out.details = json!({"repeats": o.repeats, "warmup_steps": warmup, "timed_steps": steps,
                         "runs": runs});
    out.write(&a.out_or("opts"))
}

/// An optimization's row: kiln with it (`on`) against kiln without it (`off`).
fn row(
    name: &str,
    unit: &str,
    better: Better,
    (on, off): (f64, f64),
    baseline: &str,
) -> Comparison {
    let speedup = match better {
        Better::Lower => off / on,
        Better::Higher => on / off,
    };
    Comparison::new(
        "opts",
        "optimization",
        name,
        unit,
        better,
        (on, off),
        baseline,
    )
    .detail("speedup", json!(speedup))
}

/// The train-step toggles: precision, TF32 and cuDNN benchmark (on a GPU), channels-last.
fn step_toggles(
    o: &Opts,
    out: &mut SuiteOutput,
    (warmup, steps): (usize, usize),
) -> Result<Vec<Value>> {
    let (warm, timed) = (warmup.to_string(), steps.to_string());
    let cuda = o.device.is_cuda();
    let step_cmd = |model: &'static str, extra: Vec<&'static str>| {
        let (warm, timed) = (&warm, &timed);
        move || {
            let mut c = o.kiln("probe");
            c.args(["--model", model, "--batch", "32"])
                .args(["--warmup", warm, "--steps", timed])
                .args(&extra);
            c
        }
    };
    let mut runs = vec![];
    let mut toggle = |name: &str,
                      model: &'static str,
                      on: Vec<&'static str>,
                      off: Vec<&'static str>|
     -> Result<()> {
        let (a, b) = (step_cmd(model, on), step_cmd(model, off));
        let r = o.interleaved(&[&a, &b])?;
        let ms = |i: usize| median_of(&r[i], "step_s_median") * 1e3;
        let baseline = format!("kiln {model} step without it");
        out.push(row(
            name,
            "ms/step",
            Better::Lower,
            (ms(0), ms(1)),
            &baseline,
        ));
        runs.push(json!({"toggle": name, "on": r[0], "off": r[1]}));
        Ok(())
    };
    let mixed = if cuda { "bf16" } else { "auto" };
    toggle(
        &format!(
            "precision: {} instead of fp32 (transformer)",
            if cuda { "bf16" } else { "automatic" }
        ),
        "transformer",
        vec!["--precision", mixed],
        vec!["--precision", "fp32"],
    )?;
    if cuda {
        toggle(
            "TF32 matmuls (transformer fp32)",
            "transformer",
            vec!["--precision", "fp32", "--tf32", "on"],
            vec!["--precision", "fp32", "--tf32", "off"],
        )?;
        toggle(
            "cuDNN benchmark (convnet)",
            "convnet",
            vec!["--cudnn-benchmark", "on"],
            vec!["--cudnn-benchmark", "off"],
        )?;
    }
    toggle(
        "channels-last (convnet)",
        "convnet",
        vec!["--channels-last"],
        vec![],
    )?;
    if !cuda {
        out.skip("TF32 matmuls", NO_GPU);
        out.skip("cuDNN benchmark", NO_GPU);
    }
    Ok(runs)
}

/// Fused AdamW: the optimizer step alone.
fn fused_adamw(o: &Opts, out: &mut SuiteOutput) -> Result<Value> {
    let (warm_o, timed_o) = if o.quick { ("3", "10") } else { ("10", "100") };
    let optim = |imp: &'static str| {
        move || {
            let mut c = o.kiln("optim-probe");
            c.args(["--impl", imp, "--warmup", warm_o, "--steps", timed_o]);
            c
        }
    };
    let (fa, fb) = (optim("fused"), optim("unfused"));
    let r = o.interleaved(&[&fa, &fb])?;
    let ms = |i: usize| median_of(&r[i], "step_s_median") * 1e3;
    out.push(row(
        "fused AdamW (optimizer step)",
        "ms/step",
        Better::Lower,
        (ms(0), ms(1)),
        "kiln AdamW as per-tensor ops",
    ));
    Ok(json!({"toggle": "fused AdamW", "on": r[0], "off": r[1]}))
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
    let (w, wo) = (
        samples as f64 / median(with.clone()),
        samples as f64 / median(without.clone()),
    );
    out.push(row(
        &format!("loader workers: {workers} instead of 0"),
        "samples/s",
        Better::Higher,
        (w, wo),
        "kiln loader in the training thread",
    ));
    Ok(json!({"toggle": "workers", "on_s": with, "off_s": without}))
}

/// CUDA graphs: inference latency at batch 1, from the serve benchmark's binary.
fn cuda_graphs(o: &Opts, out: &mut SuiteOutput) -> Result<Value> {
    let serve = o.me.clone();
    let graphs = |mode: &'static str| {
        let serve = &serve;
        move || {
            let mut c = Command::new(serve);
            c.args(["serve", "infer-probe", "--graphs", mode, "--batch", "1"])
                .args(["--device", &device_name(o.device)]);
            c
        }
    };
    let (ga, gb) = (graphs("on"), graphs("off"));
    let r = o.interleaved(&[&ga, &gb])?;
    let (on_ms, off_ms) = (median_of(&r[0], "p50_ms"), median_of(&r[1], "p50_ms"));
    out.push(row(
        "CUDA graphs (inference, batch 1, p50)",
        "ms",
        Better::Lower,
        (on_ms, off_ms),
        "kiln inference without graphs",
    ));
    Ok(json!({"toggle": "cuda graphs", "on": r[0], "off": r[1]}))
}
