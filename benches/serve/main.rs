//! Two `cargo xtask bench` suites over kiln's inference, on one model: an MLP on 784 features
//! (1024, 1024 hidden, 10 classes, fp32, random weights). At batch 1 each request reads all 4 MB
//! of weights for a handful of multiply-adds per weight, which is what batching amortises.
//!
//! `infer` ([`infer`]): kiln's engine against PyTorch (`python/infer_step.py`) on the same model,
//! batch, threads and device, at fp32 and at kiln's automatic precision, against the same
//! computation and against PyTorch's default; `torch.compile` (not in `--quick`), CUDA graphs,
//! the `--batch-sizes` sweep, and the model exported to ONNX (once per run, beside the suite's
//! output) in ONNX Runtime, skipped with the reason where Python's export packages or the
//! onnxruntime library are missing. `infer-probe` is the kiln side of one measurement, in its
//! own process. [`sliding`] and [`int8`] add rows on models of their own.
//!
//! `serve` (the default, [`dynamic`]): kiln's server with dynamic batching against the same
//! server one request at a time and with `infer.engine = auto`, under one closed-loop load;
//! [`peer`] adds LitServe.

mod dynamic;
mod infer;
mod int8;
mod peer;
mod sliding;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use kiln_benches::args::Place;
use kiln_benches::report::{Better, Comparison, MS, SuiteOutput, Unit};
use kiln_benches::run_cli::{Cli, exit_on_error};
use kiln_benches::{
    Msg, Result, SuiteArgs, alternating, bench_root, compile_env, device_name, in_temp_dir, median,
    median_of, num, peak_memory_mib, run_json,
};
use kiln_config::{CudaGraphs, ModelKind, ModelPlan};
use kiln_device::settings::AmpDtype;
use kiln_infer::choose::AutoEngine;
use kiln_infer::onnx::{OnnxEngine, OnnxOptions};
use kiln_infer::serve::loadgen::{self, LoadReport};
use kiln_infer::serve::{BatchRunner, RunnerFactory, ServeConfig, Server};
use kiln_infer::{Engine, EngineOptions, LoadedModel, Runner};
use kiln_train::model::{InputSpec, Model};
use kiln_train::source::build;
use serde_json::{Value, json};
use tch::{Device, nn};

const FEATURES: usize = 784;
/// The bench model, for descriptions.
const MODEL: &str = "mlp 784-1024-1024-10";

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
    #[command(flatten)]
    place: Place,
    /// CUDA graphs: on, off or auto.
    #[arg(long, default_value = "off")]
    graphs: CudaGraphs,
    /// The engine timed: kiln's libtorch engine, or ONNX Runtime over `--onnx` (fp32 only).
    #[arg(long, value_enum, default_value = "libtorch")]
    engine: ProbeEngine,
    /// The bench model exported to ONNX (for `--engine onnxruntime`).
    #[arg(long, value_name = "FILE")]
    onnx: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProbeEngine {
    Libtorch,
    Onnxruntime,
}

/// `kiln infer --format json` at fp32 on the CPU: `model` over `inputs`, with `extra`
/// arguments and `sets` (`key=value`); its report.
fn kiln_infer(
    kiln: &Path,
    (model, inputs): (&Path, &Path),
    extra: &[&std::ffi::OsStr],
    sets: &[String],
) -> Result<Value> {
    let mut c = Command::new(kiln);
    c.args(["infer", "--format", "json", "--device", "cpu"]);
    c.args(["--precision", "fp32", "--model"]).arg(model);
    c.arg("--inputs").arg(inputs).args(extra);
    for set in sets {
        c.args(["--set", set]);
    }
    let (output, _) = kiln_benches::run_cli::run(c)?;
    serde_json::from_slice(&output.stdout).map_err(|e| format!("kiln infer printed no report: {e}"))
}

/// Runs the suite's command line (`args[0]` is its name, as clap takes a program name); without
/// a subcommand, the `serve` suite.
pub fn main(args: Vec<std::ffi::OsString>) {
    let about = "`kiln-bench serve`: the serve and infer suites, and the engine's probe";
    let cli = Cli::<Sub>::parse_with(args, about);
    exit_on_error(match cli.command {
        None => dynamic::compare(&cli.suite),
        Some(Sub::Serve(a)) => dynamic::compare(&a),
        Some(Sub::Infer(a)) => infer::infer_suite(&a),
        Some(Sub::InferProbe(a)) => infer::infer_probe(&a),
    });
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
        hidden: vec![1024, 1024],
        ..ModelPlan::builtin(ModelKind::Mlp)
    };
    let input = InputSpec {
        sample_shape: vec![FEATURES],
        classes: 10,
        target: None,
        integer_features: false,
        arrays: vec![],
    };
    let model = build(&plan, &input, &vs, false, 0).msg()?;
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
    let options = EngineOptions {
        max_batch,
        cuda_graphs,
    };
    let engine = Engine::new(model, vec![FEATURES], options).msg()?;
    warm_up(engine, max_batch)
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
    let engine = OnnxEngine::open(path, &options).msg()?;
    warm_up(engine, max_batch)
}

/// `runner` after one batch of `batch` zero samples.
fn warm_up<R: Runner>(mut runner: R, batch: usize) -> Result<R> {
    runner.run(&vec![0.0; FEATURES * batch], batch).msg()?;
    Ok(runner)
}

/// The bench model exported to ONNX and checked against the libtorch engine: what the
/// onnxruntime rows and the `engine = auto` side run.
#[derive(Debug, Clone)]
struct OnnxModel {
    path: PathBuf,
    export_s: f64,
    /// ONNX Runtime, its provider and the check against the libtorch engine, for the log.
    check: String,
    /// The export and the checks, for the rows' and the suite's details.
    details: Value,
}

/// Exports the bench model (fp32, on the CPU, random weights from seed 0) to
/// `<out's directory>/<suite>-mlp.onnx` (replacing an earlier run's file there), opens it in
/// ONNX Runtime on `device` with `threads` threads, and compares one batch of `batch` random
/// samples with the libtorch engine's outputs. Any failure (no Python, no export packages, no
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
    std::fs::create_dir_all(dir).at(dir)?;
    let path = dir.join(format!("{suite}-mlp.onnx"));
    if path.exists() {
        std::fs::remove_file(&path).at(&path)?;
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
    let (ours, _) = onnx.run(&inputs, batch).msg()?;
    let max_abs = max_abs_vs(&mut torch, &inputs, batch, &ours)?;
    // e.g. "onnxruntime 1.31.1 (CPU build), CPU provider, 2 threads"
    let status = onnx.status();
    let check = format!("{status}; max |Δ| vs libtorch at batch {batch}: {max_abs:.2e}");
    let details = json!({
        "file": path.display().to_string(),
        "runtime": status,
        "exported_by": "kiln_infer::export::to_onnx (traced TorchScript, PyTorch's ONNX \
                        exporter, checked in onnxruntime)",
        "export_s": export_s,
        "same_function": {
            "max_abs_diff_onnxruntime_vs_libtorch": max_abs,
            "batch": batch,
            // The exporter's own check (against kiln's output at two other batch sizes).
            "export_check_max_abs": exported.max_abs,
            "tolerance": kiln_infer::export::TOLERANCE,
        },
    });
    Ok(OnnxModel {
        path,
        export_s,
        check,
        details,
    })
}

/// `batch` samples of N(0, 1) inputs from seed 1, as host values.
fn probe_inputs(batch: usize) -> Result<Vec<f32>> {
    tch::manual_seed(1);
    let shape = [(batch * FEATURES) as i64];
    Vec::<f32>::try_from(tch::Tensor::randn(shape, (tch::Kind::Float, Device::Cpu))).msg()
}

/// The largest |Δ| between `outputs` and what `reference` computes on the same inputs.
fn max_abs_vs(
    reference: &mut dyn Runner,
    inputs: &[f32],
    batch: usize,
    outputs: &[f32],
) -> Result<f64> {
    let (theirs, _) = reference.run(inputs, batch).msg()?;
    if theirs.len() != outputs.len() {
        return Err(format!(
            "the engines disagree on the output size: {} values against {}",
            outputs.len(),
            theirs.len()
        ));
    }
    let diffs = outputs.iter().zip(&theirs);
    Ok(nan_max(diffs.map(|(a, b)| f64::from((a - b).abs()))))
}

/// The largest of `diffs` (0 for none), NaN where one is NaN: |Δ| ≥ 0, and a positive NaN is
/// above every number in `total_cmp`'s order.
fn nan_max(diffs: impl Iterator<Item = f64>) -> f64 {
    diffs.fold(0.0, |m, d| std::cmp::max_by(m, d, f64::total_cmp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_command_lines_xtask_and_the_opts_suite_use_parse() {
        Cli::<Sub>::command().debug_assert();
        let parse = |line: &str| Cli::<Sub>::try_parse_from(line.split_whitespace());
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
        assert_eq!(
            (p.graphs, p.batch, p.place.device()),
            (CudaGraphs::On, 1, Device::Cuda(0))
        );
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
