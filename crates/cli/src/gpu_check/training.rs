//! gpu-check steps about training: 100 steps at bf16 and fp16 against a CPU fp32 first step,
//! checkpoint and exact resume, the automatic batch size, out-of-memory retry, activation
//! checkpointing's memory saving, and a profiler trace with the device's kernels.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use kiln_config::{ConfigRequest, Machine, RunPlan};
use kiln_train::TrainError;
use kiln_train::record::{Observer, Progress, RunStart, StepRecord, Summary};
use kiln_train::run::{Resume, RunControl, RunOutcome};
use serde_json::{Value, json};

use super::{Ctx, GIB, Outcome};

/// The small MLP job most steps train: 64 features, 10 classes, no dropout.
const MLP: &[&str] = &[
    "model.name=mlp",
    "model.dropout=0",
    "data.num_workers=2",
    "checkpoint.enabled=false",
    "train.warmup_steps=10",
];

/// The plan for `sets` on `device` (`cpu` or `cuda:0`), with runs under `out`.
pub fn plan(device: &str, out: &Path, sets: &[&str]) -> anyhow::Result<RunPlan> {
    plan_over(device, out, sets, None)
}

/// [`plan`] over a checkpoint's saved settings (`(source, [(key, value)])`), as `kiln infer`
/// layers them.
pub fn plan_over(
    device: &str,
    out: &Path,
    sets: &[&str],
    checkpoint: Option<(String, Vec<(String, String)>)>,
) -> anyhow::Result<RunPlan> {
    let mut req = ConfigRequest::new(Machine::Probed(kiln_device::probe::probe()?));
    req.checkpoint = checkpoint;
    req.sets = sets.iter().map(|s| (*s).to_owned()).collect();
    req.sets.push(format!("device.request={device}"));
    req.sets.push(format!("run.output_dir={}", out.display()));
    Ok(kiln_config::load(&req)?.plan)
}

/// Records every logged step, the start and the summary.
#[derive(Default)]
pub struct Record {
    pub start: Option<RunStart>,
    pub steps: Vec<StepRecord>,
    pub summary: Option<Summary>,
    /// Sets this flag once `stop_at` steps are done.
    pub stop: Option<(u64, Arc<AtomicBool>)>,
}

impl Observer for Record {
    fn on_start(&mut self, start: &RunStart) -> Result<(), TrainError> {
        self.start = Some(start.clone());
        Ok(())
    }
    fn on_step(&mut self, p: &Progress) -> Result<(), TrainError> {
        if let Some((at, flag)) = &self.stop
            && p.step == *at
        {
            flag.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
    fn on_log(&mut self, r: &StepRecord) -> Result<(), TrainError> {
        self.steps.push(r.clone());
        Ok(())
    }
    fn on_finish(&mut self, s: &Summary) -> Result<(), TrainError> {
        self.summary = Some(s.clone());
        Ok(())
    }
}

/// Trains `plan` on its device (backend settings applied first), reporting to `record`.
pub fn train(
    plan: &RunPlan,
    record: &mut Record,
    control: RunControl,
) -> Result<RunOutcome, TrainError> {
    let device = match plan.device_request.to_string().as_str() {
        "cpu" => kiln_device::Device::Cpu,
        _ => kiln_device::Device::Cuda(0),
    };
    kiln_train::run::apply_backend(plan, device);
    kiln_train::run::train(plan, device, None, control, record)
}

/// Trains `sets` on the step's device with runs under `dir`, and returns what it recorded.
fn run_on(ctx: &Ctx, dir: &Path, sets: &[&str]) -> anyhow::Result<Record> {
    let mut r = Record::default();
    train(
        &plan(ctx.device_key(), dir, sets)?,
        &mut r,
        RunControl::default(),
    )?;
    Ok(r)
}

pub fn train_bf16(ctx: &Ctx) -> anyhow::Result<Outcome> {
    train_precision(ctx, "bf16")
}

pub fn train_fp16(ctx: &Ctx) -> anyhow::Result<Outcome> {
    train_precision(ctx, "fp16")
}

/// 100 steps of 64 samples: the loss falls, every logged loss is finite, and the first step's
/// loss is a CPU fp32 first step's within the precision's tolerance (same seed, same weights
/// — drawn on the CPU —, same batches).
fn train_precision(ctx: &Ctx, amp: &str) -> anyhow::Result<Outcome> {
    let mut sets = MLP.to_vec();
    sets.extend([
        "data.synthetic_samples=7112",
        "train.batch_size=64",
        "train.epochs=1",
        "train.log_interval=1",
    ]);
    let mut reference = Record::default();
    let cpu_plan = plan(
        "cpu",
        &ctx.dir.join("cpu"),
        &[sets.clone(), vec!["train.amp=fp32"]].concat(),
    )?;
    train(&cpu_plan, &mut reference, RunControl::default()).context("the CPU fp32 reference")?;
    let amp_set = format!("train.amp={amp}");
    sets.push(&amp_set);
    let mut run = Record::default();
    let dev_plan = plan(ctx.device_key(), &ctx.dir.join(amp), &sets)?;
    train(&dev_plan, &mut run, RunControl::default())?;
    let losses: Vec<f64> = run.steps.iter().map(|s| s.metrics.loss()).collect();
    let (Some(first), Some(first_ref)) = (
        losses.first(),
        reference.steps.first().map(|s| s.metrics.loss()),
    ) else {
        anyhow::bail!("no steps were logged");
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (head, tail) = (
        mean(&losses[..10.min(losses.len())]),
        mean(&losses[losses.len().saturating_sub(10)..]),
    );
    let finite = losses.iter().all(|l| l.is_finite());
    let tolerance = if amp == "bf16" { 0.03 } else { 0.01 } * first_ref.abs() + 0.01;
    let diff = (first - first_ref).abs();
    let summary = run.summary.as_ref().context("no summary")?;
    let optimizer = run
        .start
        .as_ref()
        .map_or(String::new(), |s| s.optimizer.clone());
    let pass = losses.len() == 100 && tail < 0.9 * head && finite && diff <= tolerance;
    Ok(Outcome::new(
        pass,
        format!(
            "{} steps {} ({optimizer}): loss {head:.3} → {tail:.3} (first/last 10){}, {} skipped; \
             first step {first:.4} vs CPU fp32 {first_ref:.4} (|Δ| {diff:.4}, tolerance {tolerance:.4})",
            losses.len(),
            summary.precision,
            if finite { "" } else { ", NON-FINITE losses" },
            summary.skipped_steps
        ),
    )
    .figure("steps", losses.len() as u64)
    .figure("first_step_loss", *first)
    .figure("cpu_fp32_first_step_loss", first_ref)
    .figure("first_step_abs_diff", diff)
    .figure("loss_first10", head)
    .figure("loss_last10", tail)
    .figure("skipped_steps", summary.skipped_steps)
    .figure("final_loss_scale", json!(run.steps.last().and_then(|s| s.loss_scale)))
    .figure("samples_per_s", summary.samples_per_s)
    .figure("optimizer", optimizer)
    .figure("feed", run.start.map_or(String::new(), |s| s.feed)))
}

/// The logged losses of a run, by step.
fn curve(r: &Record) -> Vec<(u64, f64)> {
    r.steps.iter().map(|s| (s.step, s.metrics.loss())).collect()
}

/// A run stopped at step 30 (checkpoint on stop) and resumed follows the uninterrupted run.
pub fn checkpoint_resume(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let sets = [
        "model.name=mlp",
        "data.num_workers=2",
        "data.synthetic_samples=2000",
        "train.batch_size=32",
        "train.epochs=2",
        "train.log_interval=5",
        "checkpoint.every_steps=20",
    ];
    let mut whole = Record::default();
    train(
        &plan(ctx.device_key(), &ctx.dir.join("whole"), &sets)?,
        &mut whole,
        RunControl::default(),
    )?;
    let resumed_plan = plan(ctx.device_key(), &ctx.dir.join("resumed"), &sets)?;
    let flag = Arc::new(AtomicBool::new(false));
    let mut first = Record {
        stop: Some((30, flag.clone())),
        ..Record::default()
    };
    let control = RunControl {
        stop: Some(flag),
        ..RunControl::default()
    };
    match train(&resumed_plan, &mut first, control) {
        Err(TrainError::Stopped { .. }) => {}
        Err(e) => return Err(e).context("the run to be stopped"),
        Ok(_) => anyhow::bail!("the run did not stop at step 30"),
    }
    let mut second = Record::default();
    let control = RunControl {
        resume: Some(Resume::Latest),
        ..RunControl::default()
    };
    train(&resumed_plan, &mut second, control).context("resuming")?;
    let from = second
        .start
        .as_ref()
        .and_then(|s| s.resumed_from.as_ref())
        .map(|(_, step)| *step);
    let reference: Vec<(u64, f64)> = curve(&whole);
    let after: Vec<(u64, f64)> = curve(&second);
    let matched: Vec<f64> = after
        .iter()
        .filter_map(|(step, l)| {
            reference
                .iter()
                .find(|(s, _)| s == step)
                .map(|(_, r)| (l - r).abs())
        })
        .collect();
    let max_diff = matched.iter().copied().fold(0.0, f64::max);
    let pass =
        from == Some(30) && !matched.is_empty() && matched.len() == after.len() && max_diff <= 1e-3;
    Ok(Outcome::new(
        pass,
        format!(
            "stopped at step 30, resumed from step {}: {} logged losses after it, max |Δ| vs the \
             uninterrupted run {max_diff:.2e}{}",
            from.map_or("NONE".to_owned(), |s| s.to_string()),
            matched.len(),
            if max_diff == 0.0 { " (bit-exact)" } else { "" }
        ),
    )
    .figure("resumed_from_step", json!(from))
    .figure("compared_losses", matched.len() as u64)
    .figure("max_abs_diff", max_diff)
    .figure("bit_exact", max_diff == 0.0))
}

/// `train.batch_size = auto` on the real allocator: at most 8 trials, then a whole epoch at the
/// chosen size with no out-of-memory.
pub fn batch_size_auto(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let sets = [
        "model.name=transformer",
        "model.layers=2",
        "data.num_workers=4",
        "data.synthetic_samples=20000",
        "train.batch_size=auto",
        "train.epochs=1",
        "train.log_interval=10",
        "checkpoint.enabled=false",
    ];
    let r = run_on(ctx, &ctx.dir, &sets)?;
    let start = r.start.context("no start record")?;
    let summary = r.summary.context("no summary")?;
    let search = start.batch_size_search.clone().unwrap_or_default();
    let trials = trials_in(&search);
    let pass = (1..=8).contains(&trials)
        && summary.oom_retries == 0
        && summary.final_train.loss().is_finite();
    Ok(Outcome::new(
        pass,
        format!(
            "batch size {} after {trials} trial(s) (≤ 8); an epoch of {} steps with {} out-of-memory \
             retries; peak {:.2} GiB",
            start.batch_size, summary.steps, summary.oom_retries, gib(summary.memory.gpu_peak)
        ),
    )
    .figure("batch_size", start.batch_size)
    .figure("trials", trials as u64)
    .figure("search", search)
    .figure("oom_retries", summary.oom_retries)
    .figure("peak_gib", gib(summary.memory.gpu_peak))
    .figure("samples_per_s", summary.samples_per_s))
}

/// The number of trials a fresh search ran, from its note ("auto: 7 trials (512 ✓ …) → 2048");
/// 0 for a size taken from the cache or a resumed run.
fn trials_in(search: &str) -> usize {
    let words: Vec<&str> = search.split_whitespace().collect();
    words
        .windows(3)
        .find(|w| w[1] == "trials" && w[2].starts_with('('))
        .and_then(|w| w[0].parse().ok())
        .unwrap_or(0)
}

fn gib(bytes: Option<u64>) -> f64 {
    bytes.map_or(0.0, |b| b as f64 / GIB)
}

/// A batch too big for a 1 GiB memory fraction: the trainer retries it in smaller
/// micro-batches and the run finishes.
pub fn oom_retry(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let total = kiln_torch_ext::cuda::device_properties(0)?.total_memory_bytes as f64;
    let fraction = format!("performance.memory_fraction={:.5}", GIB / total);
    let sets = [
        "model.name=transformer",
        "data.num_workers=4",
        "data.synthetic_samples=4552",
        "train.batch_size=1024",
        "train.epochs=1",
        "train.log_interval=1",
        "checkpoint.enabled=false",
        fraction.as_str(),
    ];
    let r = run_on(ctx, &ctx.dir, &sets)?;
    let summary = r.summary.context("no summary")?;
    let finite = r.steps.iter().all(|s| s.metrics.loss().is_finite());
    let pass = summary.oom_retries > 0 && finite && summary.steps > 0;
    Ok(Outcome::new(
        pass,
        format!(
            "batch 1024 under a 1 GiB memory fraction: {} steps done with {} out-of-memory \
             retries{}; peak {:.2} GiB",
            summary.steps,
            summary.oom_retries,
            if finite { "" } else { ", NON-FINITE losses" },
            gib(summary.memory.gpu_peak)
        ),
    )
    .figure("oom_retries", summary.oom_retries)
    .figure("steps", summary.steps)
    .figure("peak_gib", gib(summary.memory.gpu_peak)))
}

/// The peak memory of a few transformer steps with activation checkpointing, over without.
pub fn activation_checkpointing(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let mut peaks = vec![];
    // A first, unmeasured run pays the process's one-time costs (CUDA context, cuBLAS and
    // cuDNN handles, kernel loading): without it they land in the first measured run's steps
    // (on an H200 the step time "with checkpointing" came out at 0.32× the time without).
    for (name, on) in [("warm-up", false), ("off", false), ("on", true)] {
        let setting = format!("model.activation_checkpointing={on}");
        let sets = [
            "model.name=transformer",
            "data.num_workers=2",
            "data.synthetic_samples=900",
            "data.val_fraction=0.1",
            "train.batch_size=256",
            "train.epochs=1",
            "checkpoint.enabled=false",
            setting.as_str(),
        ];
        let r = run_on(ctx, &ctx.dir.join(name), &sets)?;
        let summary = r.summary.context("no summary")?;
        peaks.push((gib(summary.memory.gpu_peak), summary.mean_step_time_s));
        kiln_torch_ext::memory::empty_cache()?;
    }
    let (off, on) = (peaks[1], peaks[2]);
    let ratio = on.0 / off.0.max(1e-9);
    Ok(Outcome::new(
        ratio < 0.8,
        format!(
            "transformer batch 256: peak {:.2} GiB with checkpointing vs {:.2} GiB without → \
             {ratio:.2}× (goal < 0.8×); step time {:.2}×",
            on.0,
            off.0,
            on.1 / off.1.max(1e-9)
        ),
    )
    .figure("peak_gib_off", off.0)
    .figure("peak_gib_on", on.0)
    .figure("peak_ratio", ratio)
    .figure("step_time_ratio", on.1 / off.1.max(1e-9)))
}

/// A profiled run's trace holds the device's work: CUDA kernels on a GPU, CPU operators here.
pub fn profiler_trace(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let mut sets = MLP.to_vec();
    sets.extend([
        "data.synthetic_samples=1000",
        "train.batch_size=32",
        "train.epochs=1",
        "profiling.active=2",
    ]);
    let r = run_on(ctx, &ctx.dir, &sets)?;
    let traces: Vec<PathBuf> = r.summary.context("no summary")?.profiler_traces;
    let trace = traces.first().context("the run wrote no profiler trace")?;
    let text = std::fs::read_to_string(trace)
        .with_context(|| format!("cannot read {}", trace.display()))?;
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", trace.display()))?;
    let events = value["traceEvents"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let count = |cat: &str| {
        events
            .iter()
            .filter(|e| e["cat"].as_str() == Some(cat))
            .count()
    };
    let (kernels, cpu_ops) = (count("kernel"), count("cpu_op"));
    let wanted = if ctx.cuda() { kernels } else { cpu_ops };
    Ok(Outcome::new(
        wanted > 0,
        format!(
            "{} trace(s); {}: {kernels} CUDA kernels, {cpu_ops} CPU operators, {} events",
            traces.len(),
            trace.file_name().unwrap_or_default().to_string_lossy(),
            events.len()
        ),
    )
    .figure("traces", traces.len() as u64)
    .figure("cuda_kernels", kernels as u64)
    .figure("cpu_ops", cpu_ops as u64)
    .figure("trace_mib", text.len() as f64 / 1048576.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trial_count_is_read_from_the_search_note() {
        let fresh = "auto: 7 trials (512 ✓ 112118/s, 1024 ✓ 132874/s, 18000 ✓ 196335/s) → 16384";
        assert_eq!(trials_in(fresh), 7);
        assert_eq!(trials_in("auto: 1 trials (64 ✓ 10/s) → 64"), 1);
        let cached =
            "auto: 2048 (cached from 6 trials in 2026-11-26; delete the entry to measure again)";
        assert_eq!(trials_in(cached), 0);
        assert_eq!(trials_in("auto: 128, as the resumed run chose"), 0);
        assert_eq!(trials_in(""), 0);
    }
}
