//! Two `cargo xtask bench` suites over kiln's inference.
//!
//! `infer`: kiln's engine (`kiln infer`'s batches: host inputs in, host fp32 outputs out, under
//! `no_grad`) against PyTorch (`python/infer_step.py`) on the same model, batch, threads and
//! device: throughput at batch 64, latency at batch 1, at fp32 and at kiln's automatic
//! precision (bf16 weights where the hardware computes bf16 fast), each against the same
//! computation in PyTorch eager (`no_grad`, the same weights' type) and against PyTorch's
//! default (`inference_mode`, fp32); against `torch.compile` at kiln's automatic precision with
//! its compile time apart (not in `--quick`); CUDA graphs on a GPU; and with `--batch-sizes` a
//! sweep of throughput and peak memory.
//! At fp32 and batches 1 and 64 it also runs the same model exported to ONNX (once per suite
//! run, into the suite's output directory, through `kiln_infer::export::to_onnx`) in ONNX Runtime,
//! against the same PyTorch eager computation, with the libtorch engine's figure beside it and
//! the largest |Δ| between the two engines' outputs; without Python's export packages or the
//! onnxruntime library those rows are skipped with the reason.
//! `infer-probe` is the kiln side of one such measurement, in its own process (`--engine
//! onnxruntime --onnx FILE` for the ONNX Runtime side).
//!
//! `serve` (the default): kiln's inference server with dynamic batching against the same
//! server answering one request at a time (`infer.batch_size = 1`), on the same model, under the
//! same closed-loop load (`--clients` concurrent keep-alive clients each sending one `.npy`
//! sample at a time). Reports throughput and p50/p95/p99 latency of both, their ratios, and
//! writes its suite output. Goal on a CPU: at least 2× the throughput at no worse
//! p95. A third side serves with `infer.engine = auto` (libtorch and the model's ONNX export,
//! the faster per batch-size bucket, measured when the server starts) against dynamic batching
//! on libtorch.
//!
//! The model is an MLP on 784 features (1024, 1024 hidden, 10 classes, fp32, random weights):
//! at batch 1 each request reads all 4 MB of weights for a handful of multiply-adds per weight,
//! which is what batching amortises.

mod serve_peer;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use kiln_benches::args::parse_device;
use kiln_benches::report::{Better, Comparison, SWEEP_GROUP, SuiteOutput};
use kiln_benches::{
    SuiteArgs, bench_root, device_name, interleaved, median, median_of, peak_memory_mib,
};
use kiln_config::{CudaGraphs, ModelKind, ModelPlan};
use kiln_device::settings::AmpDtype;
use kiln_infer::choose::AutoEngine;
use kiln_infer::onnx::{OnnxEngine, OnnxOptions};
use kiln_infer::serve::loadgen::{self, LoadReport};
use kiln_infer::serve::{BatchRunner, RunnerFactory, ServeConfig, Server};
use kiln_infer::{Engine, EngineOptions, LoadedModel, Runner};
use kiln_train::model::InputSpec;
use kiln_train::model::Model;
use kiln_train::source::build;
use serde_json::{Value, json};
use tch::{Device, nn};

use kiln_benches::Result;

const FEATURES: usize = 784;
/// The bench model, for descriptions.
const MODEL: &str = "mlp 784-1024-1024-10";

/// `kiln-bench serve`: the serve and infer suites, and the engine's probe.
#[derive(Debug, Parser)]
#[command(name = "kiln-bench serve", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// Without a subcommand: the `serve` suite.
    #[command(flatten)]
    suite: SuiteArgs,
}

// Parsed once per process: the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Sub {
    /// Dynamic batching vs batch-size-1 serving, and vs LitServe.
    Serve(SuiteArgs),
    /// Offline inference vs PyTorch (eager, inference_mode, torch.compile; batch-size sweep).
    Infer(SuiteArgs),
    /// Times kiln's engine over batches of random host inputs; prints one JSON line.
    InferProbe(InferProbeArgs),
}

/// `infer-probe`'s options.
#[derive(Debug, Args)]
struct InferProbeArgs {
    /// fp32, bf16 or fp16.
    #[arg(long, default_value = "fp32")]
    precision: AmpDtype,
    #[arg(long, default_value_t = 64)]
    batch: usize,
    #[arg(long, default_value_t = 200)]
    batches: usize,
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// cpu, cuda or cuda:N (default: the first CUDA GPU, else the CPU).
    #[arg(long, value_parser = parse_device)]
    device: Option<Device>,
    /// CUDA graphs: on, off or auto.
    #[arg(long, default_value = "off", value_parser = parse_graphs)]
    graphs: CudaGraphs,
    /// The engine timed: kiln's libtorch engine, or ONNX Runtime over `--onnx` (fp32 only).
    #[arg(long, value_enum, default_value = "libtorch")]
    engine: ProbeEngine,
    /// The bench model exported to ONNX (for `--engine onnxruntime`).
    #[arg(long, value_name = "FILE")]
    onnx: Option<PathBuf>,
}

/// `infer-probe --engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProbeEngine {
    Libtorch,
    Onnxruntime,
}

fn parse_graphs(v: &str) -> Result<CudaGraphs> {
    match v {
        "on" => Ok(CudaGraphs::On),
        "off" => Ok(CudaGraphs::Off),
        "auto" => Ok(CudaGraphs::Auto),
        other => Err(format!("`{other}`: expected on, off or auto")),
    }
}

/// Runs the suite's command line (`args[0]` is its name, as clap takes a program name).
pub fn main(args: Vec<std::ffi::OsString>) {
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        None => compare(&cli.suite),
        Some(Sub::Serve(a)) => compare(&a),
        Some(Sub::Infer(a)) => infer_suite(&a),
        Some(Sub::InferProbe(a)) => infer_probe(&a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// A factory for the benchmark's model behind an engine of `max_batch` on the CPU.
fn factory(max_batch: usize) -> RunnerFactory {
    Box::new(move || {
        let engine = engine(Device::Cpu, AmpDtype::None, max_batch, CudaGraphs::Off)?;
        Ok(Box::new(engine) as Box<dyn BatchRunner>)
    })
}

/// The benchmark's model, an MLP on [`FEATURES`] features (1024, 1024 hidden, 10 classes), with
/// random weights from seed 0: the engine serves it, and the serving peer gets its weights.
fn mlp(device: Device) -> Result<(nn::VarStore, Box<dyn Model>)> {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let plan = ModelPlan {
        kind: ModelKind::Mlp,
        dropout: 0.0,
        d_model: 256,
        heads: 8,
        layers: 4,
        ff: 1024,
        hidden: vec![1024, 1024],
        channels: vec![32, 64, 128],
        activation_checkpointing: false,
        script: None,
        output: None,
        freeze: None,
    };
    let input = InputSpec {
        sample_shape: vec![FEATURES],
        classes: 10,
        target: None,
        integer_features: false,
    };
    let model = build(&plan, &input, &vs, false, 0).map_err(|e| e.to_string())?;
    Ok((vs, model))
}

/// The benchmark's model (random weights, seed 0) behind an engine, warmed up at full batch.
fn engine(
    device: Device,
    precision: AmpDtype,
    max_batch: usize,
    cuda_graphs: CudaGraphs,
) -> Result<Engine> {
    let (vs, model) = mlp(device)?;
    let model = LoadedModel::from_kiln(vs, model, MODEL, vec![FEATURES], precision);
    let mut engine = Engine::new(
        model,
        vec![FEATURES],
        EngineOptions {
            max_batch,
            cuda_graphs,
        },
    )
    .map_err(|e| e.to_string())?;
    engine
        .run(&vec![0.0; FEATURES * max_batch], max_batch)
        .map_err(|e| e.to_string())?;
    Ok(engine)
}

/// The bench model exported to ONNX and checked against the libtorch engine: what the
/// onnxruntime rows and the `engine = auto` side run.
#[derive(Debug, Clone)]
struct OnnxModel {
    path: PathBuf,
    /// ONNX Runtime and its provider, e.g. "onnxruntime 1.31.1 (CPU build), CPU provider, 2
    /// threads".
    status: String,
    /// The largest |Δ| between ONNX Runtime's and the libtorch engine's fp32 outputs on one
    /// batch of `check_batch` random samples.
    max_abs: f64,
    check_batch: usize,
    /// The exporter's own check (against kiln's output at two other batch sizes).
    export_max_abs: f64,
    export_s: f64,
}

impl OnnxModel {
    /// For the rows' and the suite's details.
    fn details(&self) -> Value {
        json!({
            "file": self.path.display().to_string(),
            "runtime": self.status,
            "exported_by": "kiln_infer::export::to_onnx (traced TorchScript, PyTorch's ONNX \
                            exporter, checked in onnxruntime)",
            "export_s": self.export_s,
            "same_function": {
                "max_abs_diff_onnxruntime_vs_libtorch": self.max_abs,
                "batch": self.check_batch,
                "export_check_max_abs": self.export_max_abs,
                "tolerance": kiln_infer::export::TOLERANCE,
            },
        })
    }
}

/// Exports the bench model (fp32, on the CPU, random weights from seed 0) to
/// `<out's directory>/<suite>-mlp.onnx` (replacing an earlier run's file there), opens it in
/// ONNX Runtime on `device` with `threads` threads, and compares one batch of `batch` samples
/// with the libtorch engine's outputs. Any failure (no Python, no export packages, no
/// onnxruntime, a device the runtime cannot use) is the onnxruntime rows' reason to skip.
fn export_onnx(
    out: &Path,
    suite: &str,
    device: Device,
    threads: usize,
    batch: usize,
) -> Result<OnnxModel> {
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{suite}-mlp.onnx"));
    if path.exists() {
        std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let started = Instant::now();
    let (vs, model) = mlp(Device::Cpu)?;
    let model = LoadedModel::from_kiln(vs, model, MODEL, vec![FEATURES], AmpDtype::None);
    let exported = kiln_infer::export::to_onnx(&model, &[FEATURES], &path, &[])
        .map_err(|e| format!("exporting the bench model to ONNX failed: {e}"))?;
    let export_s = started.elapsed().as_secs_f64();
    let mut onnx = onnx_engine(&path, device, batch, threads)?;
    let mut torch = engine(device, AmpDtype::None, batch, CudaGraphs::Off)?;
    let inputs = probe_inputs(batch)?;
    let (ours, _) = onnx.run(&inputs, batch).map_err(|e| e.to_string())?;
    let max_abs = max_abs_vs(&mut torch, &inputs, batch, &ours)?;
    Ok(OnnxModel {
        path,
        status: onnx.status(),
        max_abs,
        check_batch: batch,
        export_max_abs: exported.max_abs,
        export_s,
    })
}

/// The bench model's ONNX file in ONNX Runtime, warmed up at full batch.
fn onnx_engine(
    path: &Path,
    device: Device,
    max_batch: usize,
    threads: usize,
) -> Result<OnnxEngine> {
    let options = OnnxOptions {
        max_batch,
        threads,
        device,
        input_shape: Some(vec![FEATURES]),
    };
    let mut engine = OnnxEngine::open(path, &options).map_err(|e| e.to_string())?;
    engine
        .run(&vec![0.0; FEATURES * max_batch], max_batch)
        .map_err(|e| e.to_string())?;
    Ok(engine)
}

/// `batch` samples of N(0, 1) inputs from seed 1, as host values.
fn probe_inputs(batch: usize) -> Result<Vec<f32>> {
    tch::manual_seed(1);
    Vec::<f32>::try_from(tch::Tensor::randn(
        [(batch * FEATURES) as i64],
        (tch::Kind::Float, Device::Cpu),
    ))
    .map_err(|e| e.to_string())
}

/// The largest |Δ| between `outputs` and what `reference` computes on the same inputs.
fn max_abs_vs(
    reference: &mut dyn Runner,
    inputs: &[f32],
    batch: usize,
    outputs: &[f32],
) -> Result<f64> {
    let (theirs, _) = reference.run(inputs, batch).map_err(|e| e.to_string())?;
    if theirs.len() != outputs.len() {
        return Err(format!(
            "the engines disagree on the output size: {} values against {}",
            outputs.len(),
            theirs.len()
        ));
    }
    Ok(outputs
        .iter()
        .zip(&theirs)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, |m, d| {
            if d.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(d)
            }
        }))
}

/// A factory for a server with `infer.engine = auto` over the bench model: the libtorch engine
/// and ONNX Runtime over `onnx`, each batch-size bucket measured when the server starts (not
/// cached); the choice's note goes to `note`.
fn auto_factory(
    max_batch: usize,
    onnx: PathBuf,
    threads: usize,
    note: Arc<Mutex<Option<String>>>,
) -> RunnerFactory {
    Box::new(move || {
        let torch = engine(Device::Cpu, AmpDtype::None, max_batch, CudaGraphs::Off)?;
        let onnx = onnx_engine(&onnx, Device::Cpu, max_batch, threads)?;
        let auto =
            AutoEngine::new(torch, onnx, "kiln bench mlp", None).map_err(|e| e.to_string())?;
        if let Ok(mut n) = note.lock() {
            *n = Some(auto.note().to_owned());
        }
        Ok(Box::new(auto) as Box<dyn BatchRunner>)
    })
}

/// One measured run: a fresh server built by `factory`, a warm-up, then the load.
fn measure(
    factory: RunnerFactory,
    max_batch: usize,
    max_wait: Duration,
    clients: usize,
    requests: usize,
) -> Result<LoadReport> {
    let config = ServeConfig {
        port: 0,
        max_batch,
        max_wait,
        ..ServeConfig::default()
    };
    let server = Server::start(config, factory).map_err(|e| e.to_string())?;
    server.wait_ready().map_err(|e| e.to_string())?;
    let sample: Vec<f32> = (0..FEATURES)
        .map(|i| (i % 17) as f32 / 17.0 - 0.5)
        .collect();
    let body = kiln_data::npy_f32_bytes(&[FEATURES], &sample)?;
    let addr = server.local_addr();
    loadgen::run(
        addr,
        body.clone(),
        "application/x-npy",
        clients,
        (requests / 10).max(clients),
    )
    .map_err(|e| e.to_string())?;
    let report = loadgen::run(addr, body, "application/x-npy", clients, requests)
        .map_err(|e| e.to_string())?;
    server.shutdown().map_err(|e| e.to_string())?;
    if report.errors > 0 {
        return Err(format!(
            "{} of {} requests failed: {}",
            report.errors,
            report.requests,
            report.first_error.unwrap_or_default()
        ));
    }
    Ok(report)
}

fn summary(reports: &[LoadReport]) -> Value {
    let pick = |f: fn(&LoadReport) -> f64| median(reports.iter().map(f).collect());
    json!({
        "throughput_rps": pick(|r| r.throughput_rps),
        "p50_ms": pick(|r| r.p50_ms),
        "p95_ms": pick(|r| r.p95_ms),
        "p99_ms": pick(|r| r.p99_ms),
        "runs": reports,
    })
}

fn compare(a: &SuiteArgs) -> Result<()> {
    let quick = a.quick;
    let repeats = a.repeats_or(if quick { 1 } else { 3 }).max(1);
    let clients = a.clients.unwrap_or(32).max(1);
    let requests = a
        .requests
        .unwrap_or(if quick { 2_000 } else { 6_000 })
        .max(clients);
    let max_batch = a.max_batch.unwrap_or(64).max(1);
    let max_wait_ms = a.max_wait_ms.unwrap_or(2.0);
    let threads = a.threads_or(1).max(1);
    let out_path = a.out_or("serve");
    tch::set_num_threads(i32::try_from(threads).unwrap_or(1));
    let max_wait = Duration::from_secs_f64(max_wait_ms / 1e3);

    eprintln!(
        "serve: mlp 784-1024-1024-10 fp32 on the CPU ({threads} libtorch thread(s)), {clients} \
         clients, {requests} requests of one .npy sample, {repeats} repeat(s)"
    );
    // The `engine = auto` side needs the model's ONNX export; without it that side is skipped.
    let exported = export_onnx(&out_path, "serve", Device::Cpu, threads, max_batch);
    match &exported {
        Ok(m) => eprintln!(
            "  exported {} for engine = auto ({}; max |Δ| vs libtorch at batch {}: {:.2e})",
            m.path.display(),
            m.status,
            m.check_batch,
            m.max_abs
        ),
        Err(why) => eprintln!("  engine = auto is not measured: {why}"),
    }
    let onnx = exported.as_ref().ok();
    let auto_note = Arc::new(Mutex::new(None::<String>));
    let mut sides = vec![Side::Dynamic, Side::Single];
    if onnx.is_some() {
        sides.push(Side::Auto);
    }
    let mut dynamic = vec![];
    let mut single = vec![];
    let mut auto = vec![];
    for r in 0..repeats {
        // Alternate the order so no side always runs on a warmer machine.
        let order: Vec<Side> = if r % 2 == 0 {
            sides.clone()
        } else {
            sides.iter().rev().copied().collect()
        };
        for side in order {
            let report = match (side, onnx) {
                (Side::Dynamic, _) => {
                    measure(factory(max_batch), max_batch, max_wait, clients, requests)?
                }
                (Side::Single, _) => measure(factory(1), 1, Duration::ZERO, clients, requests)?,
                (Side::Auto, Some(m)) => measure(
                    auto_factory(max_batch, m.path.clone(), threads, auto_note.clone()),
                    max_batch,
                    max_wait,
                    clients,
                    requests,
                )?,
                (Side::Auto, None) => continue,
            };
            eprintln!(
                "  {:<28} {:>8.0} req/s  p50 {:>7.2} ms  p95 {:>7.2} ms  p99 {:>7.2} ms",
                match side {
                    Side::Dynamic => format!("dynamic batching (≤{max_batch}, {max_wait_ms} ms)"),
                    Side::Single => "batch size 1".to_owned(),
                    Side::Auto => "engine = auto, dynamic batching".to_owned(),
                },
                report.throughput_rps,
                report.p50_ms,
                report.p95_ms,
                report.p99_ms
            );
            match side {
                Side::Dynamic => dynamic.push(report),
                Side::Single => single.push(report),
                Side::Auto => auto.push(report),
            }
        }
    }
    let d = summary(&dynamic);
    let s = summary(&single);
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let mut out = SuiteOutput::new(
        "serve",
        &format!(
            "kiln's HTTP server with dynamic batching (≤ {max_batch} samples, {max_wait_ms} ms) \
             against the same server one request at a time, and with infer.engine = auto \
             (libtorch or the model's ONNX export in ONNX Runtime per batch-size bucket) against \
             dynamic batching on libtorch; {clients} closed-loop clients, {requests} requests of \
             one .npy sample; mlp 784-1024-1024-10 fp32 on the CPU, {threads} libtorch (and \
             onnxruntime) thread(s)"
        ),
    );
    let baseline = "kiln serving at batch size 1";
    out.push(
        Comparison::new(
            "serve",
            "serving",
            "dynamic batching throughput",
            "req/s",
            Better::Higher,
            (f(&d, "throughput_rps"), f(&s, "throughput_rps")),
            baseline,
        )
        .at_least(2.0),
    );
    for (key, goal) in [("p50_ms", None), ("p95_ms", Some(1.0)), ("p99_ms", None)] {
        let c = Comparison::new(
            "serve",
            "serving",
            format!("dynamic batching {} latency", key.trim_end_matches("_ms")),
            "ms",
            Better::Lower,
            (f(&d, key), f(&s, key)),
            baseline,
        );
        out.push(match goal {
            Some(g) => c.at_most(g),
            None => c,
        });
    }
    let auto_note = auto_note.lock().ok().and_then(|n| n.clone());
    if let Some(note) = &auto_note {
        eprintln!("  {note}");
    }
    let auto_summary = match &exported {
        Ok(m) => {
            let x = summary(&auto);
            push_auto_rows(&mut out, &x, &d, m, auto_note.as_deref());
            x
        }
        Err(why) => {
            out.skip(AUTO_ROW, &format!("not run: {why}"));
            Value::Null
        }
    };
    // The serving peer: LitServe on the same model, limits and load (JSON requests).
    let load = serve_peer::Load {
        python: a.python.clone(),
        max_batch,
        max_wait,
        clients,
        requests,
        repeats,
        threads,
    };
    serve_peer::compare(&mut out, &load)?;
    out.details = json!({
        "model": "mlp 784-1024-1024-10 fp32, cpu",
        "threads": threads,
        "clients": clients,
        "requests": requests,
        "max_batch": max_batch,
        "max_wait_ms": max_wait_ms,
        "repeats": repeats,
        "dynamic_batching": d,
        "batch_size_1": s,
        "engine_auto": auto_summary,
        "engine_auto_note": auto_note,
        "onnx": onnx.map(OnnxModel::details),
    });
    out.write(&out_path)
}

/// One of the serve suite's measured sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Dynamic batching on the libtorch engine.
    Dynamic,
    /// One request at a time on the libtorch engine.
    Single,
    /// Dynamic batching with `infer.engine = auto` (libtorch or ONNX Runtime per bucket).
    Auto,
}

/// The `engine = auto` rows' name (throughput; the p95 row adds its metric).
const AUTO_ROW: &str = "serve engine=auto vs dynamic batching (libtorch)";

/// `engine = auto` (summary `x`) against dynamic batching on libtorch (`d`): throughput and p95,
/// with the automatic choice's note.
fn push_auto_rows(
    out: &mut SuiteOutput,
    x: &Value,
    d: &Value,
    onnx: &OnnxModel,
    note: Option<&str>,
) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let baseline = "kiln serving with dynamic batching, libtorch engine";
    let note = json!(note.unwrap_or("the server did not report its choice"));
    let both = |key: &str| json!({"auto": f(x, key), "libtorch": f(d, key)});
    out.push(
        Comparison::new(
            "serve",
            "serving",
            AUTO_ROW,
            "req/s",
            Better::Higher,
            (f(x, "throughput_rps"), f(d, "throughput_rps")),
            baseline,
        )
        .detail("engine_auto", note.clone())
        .detail("p95_ms", both("p95_ms"))
        .detail("p50_ms", both("p50_ms"))
        .detail("onnx", onnx.details()),
    );
    out.push(
        Comparison::new(
            "serve",
            "serving",
            format!("{AUTO_ROW} p95 latency"),
            "ms",
            Better::Lower,
            (f(x, "p95_ms"), f(d, "p95_ms")),
            baseline,
        )
        .detail("engine_auto", note)
        .detail("throughput_rps", both("throughput_rps")),
    );
}

/// Times kiln's engine over `--batches` batches of random host inputs; prints one JSON line.
fn infer_probe(a: &InferProbeArgs) -> Result<()> {
    let device = a.device.unwrap_or_else(Device::cuda_if_available);
    let precision = a.precision;
    let batch = a.batch.max(1);
    let batches = a.batches.max(1);
    let warmup = a.warmup;
    let threads = a.threads.max(1);
    let graphs = a.graphs;
    kiln_torch_ext::memory::set_num_threads(threads).map_err(|e| e.to_string())?;
    // The engine is ready once it has run its first (warm-up) batch.
    let start = Instant::now();
    let (mut runner, graphs): (Box<dyn Runner>, String) = match a.engine {
        ProbeEngine::Libtorch => {
            let engine = engine(device, precision, batch, graphs)?;
            let graphs = format!("{:?}", engine.graph_status());
            (Box::new(engine), graphs)
        }
        ProbeEngine::Onnxruntime => {
            if precision != AmpDtype::None {
                return Err("--engine onnxruntime runs the ONNX file in fp32 only".to_owned());
            }
            let path = a
                .onnx
                .as_deref()
                .ok_or("--engine onnxruntime needs --onnx FILE")?;
            let engine = onnx_engine(path, device, batch, threads)?;
            let graphs = engine.cuda_graphs();
            (Box::new(engine), graphs)
        }
    };
    let first_batch = start.elapsed().as_secs_f64();
    let inputs = probe_inputs(batch)?;
    let mut times = vec![];
    let mut last = vec![];
    for i in 0..warmup + batches {
        let start = Instant::now();
        // `run` returns host outputs, so it has waited for the device.
        let (outputs, shape) =
            Runner::run(&mut runner, &inputs, batch).map_err(|e| e.to_string())?;
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64());
        }
        if shape != [10] || outputs.len() != batch * 10 || outputs.iter().any(|v| !v.is_finite()) {
            return Err(format!(
                "unexpected outputs: {} values of sample shape {shape:?} for {batch} samples",
                outputs.len()
            ));
        }
        last = outputs;
    }
    let total: f64 = times.iter().sum();
    let mut ordered = times.clone();
    ordered.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        let rank = ((q / 100.0 * ordered.len() as f64).ceil() as usize).clamp(1, ordered.len());
        ordered[rank - 1] * 1e3
    };
    let (memory, memory_kind) = peak_memory_mib(device);
    // ONNX Runtime's outputs against the libtorch engine's on the same batch (after the
    // timing and the memory figure): both compute the same function.
    let max_abs = match a.engine {
        ProbeEngine::Libtorch => Value::Null,
        ProbeEngine::Onnxruntime => {
            let mut torch = engine(device, AmpDtype::None, batch, CudaGraphs::Off)?;
            json!(max_abs_vs(&mut torch, &inputs, batch, &last)?)
        }
    };
    println!(
        "{}",
        json!({
            "framework": "kiln",
            "engine": runner.engine(),
            "max_abs_vs_libtorch": max_abs,
            "device": device_name(device),
            "precision": kiln_train::trainer::precision_name(precision),
            "batch": batch,
            "batches": batches,
            "threads": threads,
            "graphs": graphs,
            "first_batch_s": first_batch,
            "samples_per_s": (batch * batches) as f64 / total,
            "p50_ms": median(times.clone()) * 1e3,
            "p95_ms": pct(95.0),
            "p99_ms": pct(99.0),
            "peak_memory_mib": memory,
            "peak_memory_kind": memory_kind,
        })
    );
    Ok(())
}

/// kiln's inference precision on `device` when the user sets none (`infer.precision` from the
/// hardware profile: bf16 where the CPU or GPU computes it fast, fp32 elsewhere).
fn auto_precision(device: Device) -> Result<AmpDtype> {
    let mut req = kiln_config::ConfigRequest::new(kiln_config::Machine::Probed(
        kiln_device::probe::probe().map_err(|e| e.to_string())?,
    ));
    req.sets = vec![format!(
        "device.request={}",
        if device.is_cuda() { "cuda" } else { "cpu" }
    )];
    Ok(kiln_config::load(&req)
        .map_err(|e| e.to_string())?
        .plan
        .infer
        .precision)
}

/// The infer suite's settings, as the probes' command-line values.
struct InferOpts {
    quick: bool,
    repeats: usize,
    threads: String,
    dev: String,
    python: String,
    me: std::path::PathBuf,
    warmup: &'static str,
    batches: &'static str,
    graphs: &'static str,
    /// The bench model's ONNX export, where it could be made and run here.
    onnx: Option<OnnxModel>,
}

/// One PyTorch configuration of an infer row: precision, grad mode, eager or compiled.
#[derive(Clone, Copy)]
struct TorchSide {
    precision: &'static str,
    no_grad: bool,
    compile: bool,
}

impl TorchSide {
    /// What it runs, for the row's baseline name.
    fn describe(self) -> String {
        let weights = if self.precision == "fp32" {
            "fp32".to_owned()
        } else {
            format!("{} weights (model.to, no autocast)", self.precision)
        };
        format!(
            "{} {weights}, {}",
            if self.compile {
                "torch.compile(model), default mode,"
            } else {
                "PyTorch eager"
            },
            if self.no_grad {
                "no_grad"
            } else {
                "inference_mode"
            }
        )
    }
}

impl InferOpts {
    fn kiln(&self, precision: &str, batch: usize) -> Command {
        let mut c = Command::new(&self.me);
        c.args(["serve", "infer-probe"])
            .args(["--precision", precision, "--batch", &batch.to_string()])
            .args(["--warmup", self.warmup, "--batches", self.batches])
            .args(["--threads", &self.threads, "--device", &self.dev])
            .args(["--graphs", self.graphs]);
        c
    }

    /// The ONNX Runtime probe: the same timing as [`InferOpts::kiln`] at fp32 over `onnx`.
    fn onnxruntime(&self, onnx: &Path, batch: usize) -> Command {
        let mut c = Command::new(&self.me);
        c.args(["serve", "infer-probe"])
            .args(["--engine", "onnxruntime", "--onnx"])
            .arg(onnx)
            .args(["--precision", "fp32", "--batch", &batch.to_string()])
            .args(["--warmup", self.warmup, "--batches", self.batches])
            .args(["--threads", &self.threads, "--device", &self.dev]);
        c
    }

    fn torch(&self, side: TorchSide, batch: usize, cache: &std::path::Path) -> Command {
        let mut c = Command::new(&self.python);
        c.arg(bench_root().join("python/infer_step.py"))
            .args(["--precision", side.precision, "--batch", &batch.to_string()])
            .args(["--warmup", self.warmup, "--batches", self.batches])
            .args(["--threads", &self.threads, "--device", &self.dev]);
        if side.no_grad {
            c.args(["--grad-mode", "no_grad"]);
        }
        if side.compile {
            // Inductor's cache directory, and TMPDIR for the headers it precompiles once.
            c.arg("--compile")
                .env("TORCHINDUCTOR_CACHE_DIR", cache.join("inductor"))
                .env("TMPDIR", cache.join("tmp"));
        }
        c
    }

    /// kiln at `precision`, each PyTorch side at `batch` and, with `onnx`, the ONNX Runtime
    /// probe, alternating; the runs of each, kiln's first and ONNX Runtime's last. A compiled
    /// side gets an inductor cache of its own, empty at its first run.
    fn runs(
        &self,
        precision: &str,
        batch: usize,
        sides: &[TorchSide],
        onnx: Option<&Path>,
    ) -> Result<Vec<Vec<Value>>> {
        let cache = std::env::temp_dir().join(format!(
            "kiln-bench-inductor-infer-{}-{precision}-{batch}",
            std::process::id()
        ));
        if sides.iter().any(|s| s.compile) {
            std::fs::create_dir_all(cache.join("tmp"))
                .map_err(|e| format!("{}: {e}", cache.display()))?;
        }
        let kiln = || self.kiln(precision, batch);
        let torch: Vec<Box<dyn Fn() -> Command + '_>> = sides
            .iter()
            .map(|&s| {
                let cache = cache.clone();
                Box::new(move || self.torch(s, batch, &cache)) as Box<dyn Fn() -> Command>
            })
            .collect();
        let ort = onnx.map(|path| move || self.onnxruntime(path, batch));
        let mut cmds: Vec<&dyn Fn() -> Command> = vec![&kiln];
        cmds.extend(torch.iter().map(|c| c.as_ref() as &dyn Fn() -> Command));
        if let Some(ort) = &ort {
            cmds.push(ort);
        }
        let runs = interleaved(self.repeats, &cmds);
        let _ = std::fs::remove_dir_all(&cache);
        runs
    }
}

/// The headline figure at `batch`: latency at batch 1, throughput otherwise.
fn headline(batch: usize) -> (&'static str, &'static str, &'static str, Better) {
    if batch == 1 {
        ("p50 latency", "p50_ms", "ms", Better::Lower)
    } else {
        ("throughput", "samples_per_s", "samples/s", Better::Higher)
    }
}

/// One infer row: kiln's runs `k` against PyTorch's `t`, each side's settings in details.
fn infer_row(
    name: String,
    batch: usize,
    (k, t): (&[Value], &[Value]),
    side: TorchSide,
    what: &str,
) -> Comparison {
    let (_, key, unit, better) = headline(batch);
    let other = if key == "p50_ms" {
        "samples_per_s"
    } else {
        "p50_ms"
    };
    Comparison::new(
        "infer",
        "inference",
        name,
        unit,
        better,
        (median_of(k, key), median_of(t, key)),
        format!("{} ({what})", side.describe()),
    )
    .detail("batch_size", json!(batch))
    .detail(
        "kiln",
        json!({"precision": k[0]["precision"], "path": kiln_path(&k[0]),
               "grad_mode": "no_grad", "threads": k[0]["threads"], "graphs": k[0]["graphs"]}),
    )
    .detail(
        "baseline",
        json!({"runs": side.describe(), "precision": side.precision,
               "grad_mode": t[0]["grad_mode"], "threads": t[0]["threads"]}),
    )
    .detail(
        other,
        json!({"kiln": median_of(k, other), "baseline": median_of(t, other)}),
    )
    .detail(
        "p95_ms",
        json!({"kiln": median_of(k, "p95_ms"), "baseline": median_of(t, "p95_ms")}),
    )
}

/// How kiln's engine computes at the precision of probe run `k`.
fn kiln_path(k: &Value) -> String {
    match k["precision"].as_str() {
        Some("fp32") | None => "fp32 weights and inputs".to_owned(),
        Some(p) => format!("weights converted to {p} once, inputs cast, no autocast"),
    }
}

/// kiln's first batch (building the engine: model, weights in precision, one warm-up batch)
/// against `torch.compile`'s (compiling the forward), from an empty inductor cache.
fn compile_time_row(name: &str, batch: usize, (k, t): (&[Value], &[Value])) -> Comparison {
    let cold: Vec<f64> = t
        .iter()
        .filter(|r| r["compile"]["inductor_cache"] == "cold")
        .filter_map(|r| r["compile"]["first_batch_s"].as_f64())
        .collect();
    let warm: Vec<f64> = t
        .iter()
        .filter(|r| r["compile"]["inductor_cache"] == "warm")
        .filter_map(|r| r["compile"]["first_batch_s"].as_f64())
        .collect();
    let first = if cold.is_empty() {
        median_of(t, "first_batch_s")
    } else {
        median(cold.clone())
    };
    Comparison::new(
        "infer",
        "compile time",
        name.replacen(headline(batch).0, "first batch (compile time)", 1),
        "s",
        Better::Lower,
        (median_of(k, "first_batch_s"), first),
        format!(
            "torch.compile first batch, {}",
            if cold.is_empty() {
                "inductor's caches warm"
            } else {
                "inductor's caches empty (a user's first compile here)"
            }
        ),
    )
    .detail("batch_size", json!(batch))
    .detail(
        "compile",
        json!({"mode": "default", "cold_first_batch_s": cold, "warm_first_batch_s": warm,
               "compile_s": t.iter().map(|r| r["compile"]["compile_s"].clone())
                   .collect::<Vec<_>>(),
               "kiln_first_batch": "building the engine (model, weights, a warm-up batch)"}),
    )
}

/// The `torch.compile` rows of `label` at `batch` (its step row and its compile-time row), or
/// why compile could not run here.
fn push_compile_rows(
    out: &mut SuiteOutput,
    label: &str,
    batch: usize,
    (k, t): (&[Value], &[Value]),
    side: TorchSide,
) {
    let name = format!(
        "{label} vs torch.compile {}, same computation",
        side.precision
    );
    if let Some(reason) = t.iter().find_map(|r| r["not_run"].as_str()) {
        out.skip(&name, &format!("not run: {reason}"));
        return;
    }
    out.push(infer_row(
        name.clone(),
        batch,
        (k, t),
        side,
        "kiln's precision and no_grad",
    ));
    out.push(compile_time_row(&name, batch, (k, t)));
}

fn infer_suite(a: &SuiteArgs) -> Result<()> {
    let quick = a.quick;
    let device = a.device();
    let out_path = a.out_or("infer");
    let threads = a.threads_or(2).max(1);
    let mut o = InferOpts {
        quick,
        repeats: a.repeats_or(if quick { 1 } else { 3 }).max(1),
        threads: threads.to_string(),
        dev: device_name(device),
        python: a.python.clone(),
        me: std::env::current_exe().map_err(|e| e.to_string())?,
        warmup: if quick { "5" } else { "20" },
        batches: if quick { "30" } else { "200" },
        graphs: if device.is_cuda() { "on" } else { "off" },
        onnx: None,
    };
    let auto = kiln_train::trainer::precision_name(auto_precision(device)?);
    let mut out = SuiteOutput::new(
        "infer",
        &format!(
            "offline inference of mlp 784-1024-1024-10 (random weights) on {}, {} threads: \
             kiln's engine (host batches in, fp32 host outputs out, no_grad; at fp32 and at its \
             automatic precision, {auto} here) against PyTorch doing the same in eager mode \
             (no_grad: the same computation; inference_mode and fp32: PyTorch's default) and \
             under torch.compile; and the same model exported to ONNX in ONNX Runtime (fp32, \
             batches 1 and 64) against PyTorch eager no_grad, kiln's libtorch figure beside it",
            o.dev, o.threads
        ),
    );
    // The onnxruntime rows' model: exported once, before the batches.
    match export_onnx(&out_path, "infer", device, threads, 64) {
        Ok(m) => {
            eprintln!(
                "infer: exported {} in {:.1} s ({}; max |Δ| vs libtorch at batch {}: {:.2e})",
                m.path.display(),
                m.export_s,
                m.status,
                m.check_batch,
                m.max_abs
            );
            o.onnx = Some(m);
        }
        Err(why) => out.skip("onnxruntime rows", &format!("not run: {why}")),
    }
    let mut runs = vec![];
    for batch in [64, 1] {
        runs.extend(infer_batch(&o, &mut out, auto, batch)?);
    }
    if !device.is_cuda() {
        out.skip(
            "CUDA-graph latency",
            "needs a CUDA GPU; this machine has none",
        );
    }
    if quick {
        out.skip(
            "torch.compile rows",
            "left out of --quick: compiling takes minutes",
        );
    }
    runs.extend(infer_sweep(&o, &mut out, a.batch_sizes())?);
    out.details = json!({"repeats": o.repeats, "warmup_batches": o.warmup,
                         "timed_batches": o.batches, "auto_precision": auto, "runs": runs,
                         "onnx": o.onnx.as_ref().map(OnnxModel::details)});
    out.write(&out_path)
}

/// The rows at one batch size: kiln fp32 and kiln at its automatic precision `auto`, each
/// against the same computation in PyTorch, PyTorch's default, and (not `--quick`)
/// `torch.compile` at kiln's automatic precision.
fn infer_batch(
    o: &InferOpts,
    out: &mut SuiteOutput,
    auto: &'static str,
    batch: usize,
) -> Result<Vec<Value>> {
    let (metric, ..) = headline(batch);
    let graphs = if o.graphs == "on" {
        ", CUDA graphs"
    } else {
        ""
    };
    let same = "the same computation as kiln's engine";
    let eager = |precision, no_grad| TorchSide {
        precision,
        no_grad,
        compile: false,
    };
    let compiled = TorchSide {
        compile: true,
        ..eager(auto, true)
    };
    let fp32_default = eager("fp32", false);
    let mut fp32_sides = vec![eager("fp32", true), fp32_default];
    if auto == "fp32" && !o.quick {
        fp32_sides.push(compiled);
    }
    let onnx = o.onnx.as_ref().filter(|_| ONNX_BATCHES.contains(&batch));
    let mut r = o.runs("fp32", batch, &fp32_sides, onnx.map(|m| m.path.as_path()))?;
    let ort = if onnx.is_some() { r.pop() } else { None };
    let fp32 = format!("mlp fp32 b={batch} {metric}{graphs}");
    out.push(infer_row(
        format!("{fp32}, same computation"),
        batch,
        (&r[0], &r[1]),
        fp32_sides[0],
        same,
    ));
    if let (Some(m), Some(ort)) = (onnx, &ort) {
        out.push(onnx_row(batch, (ort, &r[0], &r[1]), fp32_sides[0], m));
    }
    out.push(infer_row(
        format!("{fp32} (PyTorch default: inference_mode)"),
        batch,
        (&r[0], &r[2]),
        fp32_default,
        "PyTorch default",
    ));
    if auto == "fp32" {
        if let Some(t) = r.get(3) {
            push_compile_rows(out, &fp32, batch, (&r[0], t), compiled);
        }
        return Ok(vec![
            json!({"precision": "fp32", "batch": batch, "kiln": r[0], "torch": &r[1..],
                   "onnxruntime": ort}),
        ]);
    }
    let mut auto_sides = vec![eager(auto, true)];
    if !o.quick {
        auto_sides.push(compiled);
    }
    let a = o.runs(auto, batch, &auto_sides, None)?;
    let label = format!("mlp auto ({auto}) b={batch} {metric}{graphs}");
    out.push(infer_row(
        format!("{label} vs PyTorch {auto}, same computation"),
        batch,
        (&a[0], &a[1]),
        auto_sides[0],
        same,
    ));
    out.push(infer_row(
        format!("{label} vs PyTorch fp32 (PyTorch default: fp32, inference_mode)"),
        batch,
        (&a[0], &r[2]),
        fp32_default,
        "PyTorch default: fp32 unless the user converts the model",
    ));
    if let Some(t) = a.get(2) {
        push_compile_rows(out, &label, batch, (&a[0], t), compiled);
    }
    Ok(vec![
        json!({"precision": "fp32", "batch": batch, "kiln": r[0], "torch": &r[1..],
               "onnxruntime": ort}),
        json!({"precision": auto, "batch": batch, "kiln": a[0], "torch": &a[1..]}),
    ])
}

/// The batch sizes with an onnxruntime row.
const ONNX_BATCHES: [usize; 2] = [1, 64];

/// The onnxruntime row at `batch`: ONNX Runtime's probe runs `ort` against PyTorch eager's `t`
/// (the same computation), with the libtorch engine's runs `k` and the two engines' largest
/// output difference in details.
fn onnx_row(
    batch: usize,
    (ort, k, t): (&[Value], &[Value], &[Value]),
    side: TorchSide,
    onnx: &OnnxModel,
) -> Comparison {
    let (metric, key, ..) = headline(batch);
    let libtorch = median_of(k, key);
    let max_abs = ort
        .iter()
        .map(|r| r["max_abs_vs_libtorch"].as_f64().unwrap_or(f64::NAN))
        .fold(0.0_f64, |m, d| {
            if d.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(d)
            }
        });
    let row = infer_row(
        format!("mlp fp32 b={batch} {metric}, onnxruntime"),
        batch,
        (ort, t),
        side,
        "the same computation as the ONNX model",
    )
    .detail(
        "kiln",
        json!({"engine": ort[0]["engine"], "precision": "fp32",
               "path": "kiln's MLP exported to ONNX (opset 17), run by kiln's ONNX engine",
               "threads": ort[0]["threads"], "graphs": ort[0]["graphs"]}),
    )
    .detail(
        "libtorch",
        json!({key: libtorch, "onnxruntime_over_libtorch": median_of(ort, key) / libtorch,
               "runs": "kiln's libtorch engine, fp32, the same batches (its own row above)"}),
    )
    .detail(
        "same_function",
        json!({"max_abs_diff_vs_libtorch": max_abs, "batch": batch,
               "what": "ONNX Runtime's outputs against kiln's libtorch engine on the timed \
                        batch (the same weights); PyTorch eager runs the same MLP architecture \
                        in fp32 under no_grad"}),
    )
    .detail("onnx", onnx.details());
    eprintln!(
        "  onnxruntime b={batch}: libtorch {} {libtorch:.4}, onnxruntime/libtorch {:.2}×, \
         max |Δ| vs libtorch {max_abs:.2e}",
        key,
        median_of(ort, key) / libtorch
    );
    row
}

/// `--batch-sizes`: kiln fp32 against PyTorch's default (eager fp32, inference_mode).
fn infer_sweep(o: &InferOpts, out: &mut SuiteOutput, sizes: &[usize]) -> Result<Vec<Value>> {
    let side = TorchSide {
        precision: "fp32",
        no_grad: false,
        compile: false,
    };
    let mut runs = vec![];
    for &b in sizes {
        let r = o.runs("fp32", b, &[side], None)?;
        let (k, t) = (&r[0], &r[1]);
        let baseline = side.describe();
        out.push(
            Comparison::new(
                "infer",
                SWEEP_GROUP,
                format!("mlp fp32 b={b} throughput"),
                "samples/s",
                Better::Higher,
                (median_of(k, "samples_per_s"), median_of(t, "samples_per_s")),
                baseline.clone(),
            )
            .detail("batch_size", json!(b)),
        );
        out.push(
            Comparison::new(
                "infer",
                SWEEP_GROUP,
                format!("mlp fp32 b={b} peak memory"),
                "MiB",
                Better::Lower,
                (
                    median_of(k, "peak_memory_mib"),
                    median_of(t, "peak_memory_mib"),
                ),
                baseline,
            )
            .detail("batch_size", json!(b))
            .detail("memory", k[0]["peak_memory_kind"].clone()),
        );
        runs.push(json!({"sweep_batch": b, "kiln": k, "torch": t}));
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_lines_xtask_and_the_opts_suite_use_parse() {
        Cli::command().debug_assert();
        let parse = |line: &str| Cli::try_parse_from(line.split_whitespace());
        let cli = parse("kiln-bench-serve infer --quick --device cpu --out F --threads 3").unwrap();
        let Some(Sub::Infer(a)) = cli.command else {
            panic!("not the infer suite: {cli:?}");
        };
        assert_eq!((a.device(), a.threads_or(2)), (Device::Cpu, 3));
        let cli =
            parse("kiln-bench-serve infer-probe --graphs on --batch 1 --device cuda").unwrap();
        let Some(Sub::InferProbe(p)) = cli.command else {
            panic!("not the probe: {cli:?}");
        };
        assert_eq!((p.graphs, p.batch), (CudaGraphs::On, 1));
        assert_eq!((p.engine, p.onnx), (ProbeEngine::Libtorch, None));
        let cli = parse("kiln-bench-serve infer-probe --engine onnxruntime --onnx m.onnx").unwrap();
        let Some(Sub::InferProbe(p)) = cli.command else {
            panic!("not the probe: {cli:?}");
        };
        assert_eq!(p.engine, ProbeEngine::Onnxruntime);
        assert_eq!(p.onnx.as_deref(), Some(Path::new("m.onnx")));
        assert!(parse("kiln-bench-serve infer-probe --engine tensorrt").is_err());
        let cli = parse("kiln-bench-serve --clients 8 --max-wait-ms 1.5").unwrap();
        assert_eq!(
            (cli.suite.clients, cli.suite.max_wait_ms),
            (Some(8), Some(1.5))
        );
        let err = parse("kiln-bench-serve serve --clint 8")
            .unwrap_err()
            .to_string();
        assert!(err.contains("--clint"), "{err}");
    }
}
