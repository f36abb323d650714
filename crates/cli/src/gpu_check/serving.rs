//! gpu-check steps about inference: CUDA-graph replay against eager (equal outputs, batch-1
//! latency), `kiln serve` under load, and `kiln profile-model`, on the device.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kiln_config::CudaGraphs;
use kiln_device::settings::AmpDtype;
use kiln_infer::model::{self, ModelSource};
use kiln_infer::{Engine, EngineOptions, GraphStatus};
use serde_json::Value;

use super::training::{Record, plan, plan_over, train};
use super::{Ctx, Outcome};

/// Trains the small MLP for one epoch and returns its newest checkpoint.
fn checkpoint(ctx: &Ctx) -> anyhow::Result<PathBuf> {
    let sets = [
        "model.name=mlp",
        "data.num_workers=2",
        "data.synthetic_samples=1000",
        "train.epochs=1",
    ];
    let outcome = train(
        &plan(ctx.device_key(), &ctx.dir.join("runs"), &sets)?,
        &mut Record::default(),
        kiln_train::run::RunControl::default(),
    )?;
    Ok(outcome.run_dir)
}

/// An engine over the checkpoint in `run` at fp32, with graphs on or off; the model as the
/// checkpoint's settings describe it (as `kiln infer` layers them).
fn engine(ctx: &Ctx, run: &Path, graphs: CudaGraphs) -> anyhow::Result<Engine> {
    let source = ModelSource::detect(run)?;
    let ckpt = model::open_checkpoint(run)?;
    let saved = (ckpt.dir.display().to_string(), model::model_settings(&ckpt));
    let p = plan_over(ctx.device_key(), &ctx.dir, &[], Some(saved))?;
    let loaded = model::load(&source, Some(&ckpt), &p, ctx.device, AmpDtype::None)?;
    let shape = loaded
        .sample_shape()
        .context("the checkpoint has no input shape")?
        .to_vec();
    let options = EngineOptions {
        max_batch: 64,
        cuda_graphs: graphs,
    };
    Ok(Engine::new(loaded, shape, options)?)
}

/// Median seconds of `n` runs of one batch.
fn median_latency(e: &mut Engine, input: &[f32], batch: usize, n: usize) -> anyhow::Result<f64> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        e.run(input, batch)?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[n / 2])
}

/// Graph replay equals eager at batch 1 and 8; batch-1 latency of replay over eager.
pub fn cuda_graphs(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let run = checkpoint(ctx)?;
    let mut graphed = engine(ctx, &run, CudaGraphs::On)?;
    let mut eager = engine(ctx, &run, CudaGraphs::Off)?;
    let numel: usize = graphed.sample_shape().iter().product();
    let mut max_diff = 0f32;
    for batch in [1, 8] {
        let input: Vec<f32> = (0..numel * batch)
            .map(|i| ((i % 29) as f32 - 14.0) / 7.0)
            .collect();
        let (a, _) = graphed.run(&input, batch)?;
        let (b, _) = eager.run(&input, batch)?;
        max_diff = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(max_diff, f32::max);
    }
    let captured =
        matches!(graphed.graph_status(), GraphStatus::On { captured } if !captured.is_empty());
    let one: Vec<f32> = vec![0.25; numel];
    median_latency(&mut graphed, &one, 1, 20)?;
    median_latency(&mut eager, &one, 1, 20)?;
    let g = median_latency(&mut graphed, &one, 1, 200)?;
    let e = median_latency(&mut eager, &one, 1, 200)?;
    let pass = captured && max_diff <= 1e-5;
    Ok(Outcome::new(
        pass,
        format!(
            "graphs {}; replay vs eager max |Δ| {max_diff:.1e} at batch 1 and 8; batch-1 latency \
             {:.1} µs vs {:.1} µs eager → {:.2}×",
            graphed.graph_status(),
            g * 1e6,
            e * 1e6,
            g / e
        ),
    )
    .figure("max_abs_diff", f64::from(max_diff))
    .figure("graph_batch1_us", g * 1e6)
    .figure("eager_batch1_us", e * 1e6)
    .figure("latency_ratio", g / e))
}

/// A child process whose stderr lines arrive on a channel (and go to the step's log).
fn spawn_reading(cmd: &mut Command) -> anyhow::Result<(Child, mpsc::Receiver<String>)> {
    let mut child = cmd.stdin(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let stderr = child.stderr.take().context("no stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("  | {line}");
            let _ = tx.send(line);
        }
    });
    Ok((child, rx))
}

/// Waits for a line containing `needle` (or, with `exact`, that is `needle`), returning it.
fn wait_for(
    rx: &mpsc::Receiver<String>,
    needle: &str,
    exact: bool,
    within: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(needle) && (!exact || line.trim() == needle) => {
                return Ok(line);
            }
            Ok(_) => {}
            Err(_) => anyhow::bail!("no `{needle}` from the server within {within:?}"),
        }
    }
}

/// `kiln serve` on the device: 400 requests from 8 clients, every one answered.
pub fn serve(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let run = checkpoint(ctx)?;
    let (mut child, rx) = spawn_reading(
        Command::new(&ctx.exe)
            .args(["serve", "--port", "0", "--model"])
            .arg(&run)
            .args(["--set", &format!("device.request={}", ctx.device_key())]),
    )?;
    let result = load_server(&rx);
    let _ = child.kill();
    let _ = child.wait();
    let (report, device_line) = result?;
    let pass = report.errors == 0;
    Ok(Outcome::new(
        pass,
        format!(
            "{} requests, {} errors; {:.0} req/s, p50 {:.2} ms, p95 {:.2} ms ({device_line})",
            report.requests, report.errors, report.throughput_rps, report.p50_ms, report.p95_ms
        ),
    )
    .figure("requests", report.requests as u64)
    .figure("errors", report.errors as u64)
    .figure("throughput_rps", report.throughput_rps)
    .figure("p50_ms", report.p50_ms)
    .figure("p95_ms", report.p95_ms)
    .figure("first_error", report.first_error.unwrap_or_default()))
}

fn load_server(
    rx: &mpsc::Receiver<String>,
) -> anyhow::Result<(kiln_infer::serve::loadgen::LoadReport, String)> {
    let device_line = wait_for(rx, "device ", false, Duration::from_secs(60))?;
    let line = wait_for(rx, "listening on http://", false, Duration::from_secs(60))?;
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .context("no address in the server's line")?
        .parse()
        .context("the server's address")?;
    wait_for(rx, "ready", true, Duration::from_secs(60))?;
    let sample: Vec<String> = (0..64)
        .map(|i| format!("{:.3}", (i % 7) as f32 / 7.0))
        .collect();
    let body = format!("{{\"inputs\": [[{}]]}}", sample.join(","));
    let report =
        kiln_infer::serve::loadgen::run(addr, body.into_bytes(), "application/json", 8, 400)?;
    Ok((report, device_line.trim().to_owned()))
}

/// `kiln profile-model` on the device: a train step of the reference transformer.
pub fn profile_model(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let output = Command::new(&ctx.exe)
        .args([
            "profile-model",
            "--model",
            "transformer",
            "--mode",
            "train",
            "--batch-size",
            "32",
        ])
        .args([
            "--iterations",
            "10",
            "--device",
            ctx.device_key(),
            "--format",
            "json",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run kiln profile-model")?;
    anyhow::ensure!(
        output.status.success(),
        "kiln profile-model ended with {}",
        output.status
    );
    let v: Value = serde_json::from_slice(&output.stdout).context("profile-model's JSON")?;
    let ms = v["mean_ms"].as_f64().unwrap_or(f64::NAN);
    let pass = ms.is_finite() && ms > 0.0;
    Ok(Outcome::new(
        pass,
        format!("transformer train step, batch 32: {ms:.2} ms mean"),
    )
    .figure("report", v))
}

/// The ONNX fixture of `kiln-infer`'s tests (an MLP 4 → 8 → 3 exported by PyTorch) and its
/// inputs and PyTorch's outputs, built in so that the step needs no Python.
const TINY_ONNX: &[u8] = include_bytes!("../../../infer/tests/data/tiny_mlp.onnx");
const TINY_IO: &str = include_str!("../../../infer/tests/data/tiny_mlp_io.json");

/// An ONNX model in ONNX Runtime on the device (the CUDA execution provider on a GPU) gives
/// PyTorch's outputs.
/// Why this machine cannot check ONNX Runtime on the step's device: no onnxruntime 1.31 to
/// load (a GPU machine with only Python's onnxruntime, say), or a CPU build where the device
/// is CUDA. A library that loads and then fails is not this: the step runs and fails.
fn onnxruntime_unusable(ctx: &Ctx) -> Option<String> {
    let provider = if ctx.cuda() {
        "the CUDA execution provider was not checked"
    } else {
        "the CPU execution provider was not checked"
    };
    match kiln_infer::onnx::runtime() {
        Err(e) => Some(format!("{provider}: {e}")),
        Ok(rt) if ctx.cuda() && !rt.has_cuda => Some(format!(
            "{provider}: {} at {} has no CUDA execution provider (onnxruntime-gpu {} has)",
            rt.describe(),
            rt.library.display(),
            kiln_infer::onnx::ORT_VERSION
        )),
        Ok(_) => None,
    }
}

pub fn onnxruntime(ctx: &Ctx) -> anyhow::Result<Outcome> {
    if let Some(why) = onnxruntime_unusable(ctx) {
        return Ok(Outcome::not_run(why));
    }
    let path = ctx.dir.join("tiny_mlp.onnx");
    super::write_new(&path, TINY_ONNX)?;
    let io: Value = serde_json::from_str(TINY_IO)?;
    let flat = |key: &str| -> Vec<f32> {
        io[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(Value::as_f64)
            .map(|x| x as f32)
            .collect()
    };
    let (inputs, expected) = (flat("inputs"), flat("outputs"));
    let options = kiln_infer::onnx::OnnxOptions {
        max_batch: 3,
        threads: 1,
        device: ctx.device,
        input_shape: None,
    };
    let mut engine = kiln_infer::onnx::OnnxEngine::open(&path, &options)?;
    let (outputs, _) = engine.run(&inputs, 3)?;
    let max_abs = outputs
        .iter()
        .zip(&expected)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, f64::max);
    let pass = outputs.len() == expected.len() && max_abs < 1e-4;
    Ok(Outcome::new(
        pass,
        format!(
            "{}: max |Δ| {max_abs:.1e} against PyTorch's outputs",
            engine.status()
        ),
    )
    .figure("max_abs", max_abs)
    .figure("engine", engine.status()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cuda-graphs step's engines on the CPU (graphs off): the checkpoint's own model (an
    /// MLP, where kiln's default model is the transformer) is rebuilt and runs a batch.
    #[test]
    fn the_graph_steps_engine_rebuilds_the_checkpoints_model() {
        let tmp = tempfile::tempdir().unwrap();
        let ctx = Ctx {
            dir: tmp.path().to_owned(),
            device: tch::Device::Cpu,
            exe: PathBuf::from("kiln"),
            bench_dir: None,
        };
        let run = checkpoint(&ctx).unwrap();
        let mut eager = engine(&ctx, &run, CudaGraphs::Off).unwrap();
        assert_eq!(eager.sample_shape(), [64]);
        let (out, _) = eager.run(&vec![0.5; 64 * 2], 2).unwrap();
        assert_eq!(out.len(), 2 * 10, "two rows of the MLP's 10 classes");
    }
}
