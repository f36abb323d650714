//! The `infer` ([`infer`], [`sliding`], [`int8`]) and `serve` ([`dynamic`], [`peer`]) suites on
//! an MLP (784-1024-1024-10, fp32, random weights), and `infer-probe`, kiln's side of one probe.

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

use clap::{Args, Subcommand};
use kiln_benches::args::Place;
use kiln_benches::report::{Better, Comparison, MS, SuiteOutput, Unit};
use kiln_benches::run_cli::{Cli, exit_on_error};
use kiln_benches::{
    Msg, Result, SuiteArgs, alternating, bench_root, command, compile_env, device_name,
    in_temp_dir, median, median_of, num, peak_memory_mib, run_json,
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
    /// Times ONNX Runtime over the bench model exported to FILE (fp32 only), not libtorch.
    #[arg(long, value_name = "FILE")]
    onnx: Option<PathBuf>,
}

/// `kiln infer`'s report (fp32, CPU): `model` over `inputs` with `extra`, `sets`, `threads`.
fn kiln_infer(
    kiln: &Path,
    (model, inputs): (&Path, &Path),
    extra: &[&std::ffi::OsStr],
    sets: &[String],
    threads: &str,
) -> Result<Value> {
    let mut c = command(kiln, &["infer", "--format", "json", "--device", "cpu"]);
    c.args(["--precision", "fp32", "--model"]).arg(model);
    c.arg("--inputs").arg(inputs).args(extra);
    c.args(sets.iter().flat_map(|set| ["--set", set]));
    c.args(["--set", &format!("performance.intra_op_threads={threads}")]);
    let (output, _) = kiln_benches::run_cli::run(c)?;
    serde_json::from_slice(&output.stdout).map_err(|e| format!("kiln infer printed no report: {e}"))
}

/// Runs the group's command line (`args[0]`: its name); without a subcommand, the `serve` suite.
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
    Box::new(move || Ok(Box::new(engine(Device::Cpu, max_batch, FP32)?) as Box<dyn BatchRunner>))
}

/// The benchmark's model (see the module's docs) with random weights from seed 0.
fn mlp(device: Device) -> Result<(nn::VarStore, Box<dyn Model>)> {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let mut plan = ModelPlan::builtin(ModelKind::Mlp);
    plan.hidden = vec![1024, 1024];
    let input = InputSpec::of(&[FEATURES], &kiln_data::TargetSpec::label(10));
    let model = build(&plan, &input, &vs, false, 0).msg()?;
    Ok((vs, model))
}

/// fp32 without CUDA graphs: the engine the others are checked against.
const FP32: (AmpDtype, CudaGraphs) = (AmpDtype::None, CudaGraphs::Off);

/// The benchmark's model (random weights, seed 0) behind an engine, warmed up at full batch.
fn engine(device: Device, batch: usize, (amp, graphs): (AmpDtype, CudaGraphs)) -> Result<Engine> {
    let (vs, model) = mlp(device)?;
    let model = LoadedModel::from_kiln(vs, model, MODEL, vec![FEATURES], amp);
    let options = EngineOptions {
        max_batch: batch,
        cuda_graphs: graphs,
    };
    warm_up(Engine::new(model, vec![FEATURES], options).msg()?, batch)
}

/// The bench model's ONNX file in ONNX Runtime, warmed up at full batch.
fn onnx_engine(path: &Path, device: Device, batch: usize, threads: usize) -> Result<OnnxEngine> {
    let options = OnnxOptions {
        max_batch: batch,
        threads,
        device,
        input_shape: Some(vec![FEATURES]),
    };
    warm_up(OnnxEngine::open(path, &options).msg()?, batch)
}

/// `runner` after one batch of `batch` zero samples.
fn warm_up<R: Runner>(mut runner: R, batch: usize) -> Result<R> {
    runner.run(&vec![0.0; FEATURES * batch], batch).msg()?;
    Ok(runner)
}

/// The bench model exported to ONNX: the file, and the export's details for the report.
#[derive(Debug, Clone)]
struct OnnxModel {
    path: PathBuf,
    details: Value,
}

/// Exports the bench model beside `out`, checks ONNX Runtime's outputs against libtorch's, logs.
fn export_onnx(out: &Path, suite: &str, on: (Device, usize), batch: usize) -> Result<OnnxModel> {
    let (device, threads) = on;
    let path = out.with_file_name(format!("{suite}-mlp.onnx"));
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).at(dir)?;
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
    let inputs = probe_inputs(batch)?;
    let (ours, _) = onnx.run(&inputs, batch).msg()?;
    let max_abs = max_abs_vs(&mut engine(device, batch, FP32)?, &inputs, &ours)?;
    // e.g. "onnxruntime 1.31.1 (CPU build), CPU provider, 2 threads"
    let shown = path.display();
    let status = onnx.status();
    eprintln!(
        "{suite}: exported {shown} in {export_s:.1} s ({status}; max |Δ| vs libtorch at batch \
         {batch}: {max_abs:.2e})"
    );
    let details = json!({
        "file": shown.to_string(), "runtime": status,
        "exported_by": "kiln_infer::export::to_onnx (traced TorchScript, PyTorch's ONNX \
                        exporter, checked in onnxruntime)",
        "export_s": export_s,
        // The exporter's own check is against kiln's output at two other batch sizes.
        "same_function": {"max_abs_diff_onnxruntime_vs_libtorch": max_abs, "batch": batch,
                          "export_check_max_abs": exported.max_abs,
                          "tolerance": kiln_infer::export::TOLERANCE},
    });
    Ok(OnnxModel { path, details })
}

/// `batch` samples of N(0, 1) inputs from seed 1, as host values.
fn probe_inputs(batch: usize) -> Result<Vec<f32>> {
    tch::manual_seed(1);
    let shape = [(batch * FEATURES) as i64];
    Vec::<f32>::try_from(tch::Tensor::randn(shape, (tch::Kind::Float, Device::Cpu))).msg()
}

/// The largest |Δ| between `outputs` and what `reference` computes on the same inputs.
fn max_abs_vs(reference: &mut dyn Runner, inputs: &[f32], outputs: &[f32]) -> Result<f64> {
    let (theirs, _) = reference.run(inputs, inputs.len() / FEATURES).msg()?;
    let (n, m) = (outputs.len(), theirs.len());
    if n != m {
        let why = "the engines disagree on the output size";
        return Err(format!("{why}: {n} values against {m}"));
    }
    let diffs = outputs.iter().zip(&theirs);
    Ok(nan_max(diffs.map(|(a, b)| f64::from((a - b).abs()))))
}

/// The largest of `diffs` (0 for none), NaN where one is NaN (`total_cmp` puts it above all).
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
        let probe = |line: &str| match parse(line).unwrap().command {
            Some(Sub::InferProbe(p)) => p,
            other => panic!("not the probe: {other:?}"),
        };
        let cli = parse("kiln-bench-serve infer --quick --device cpu --out F --threads 3").unwrap();
        let Some(Sub::Infer(a)) = cli.command else {
            panic!("not the infer suite: {cli:?}");
        };
        assert_eq!((a.device(), a.threads_or(2)), (Device::Cpu, 3));
        let p = probe("kiln-bench-serve infer-probe --graphs on --batch 1 --device cuda");
        let expected = (CudaGraphs::On, 1, Device::Cuda(0));
        assert_eq!((p.graphs, p.batch, p.place.device()), expected);
        assert_eq!(p.onnx, None);
        let p = probe("kiln-bench-serve infer-probe --onnx m.onnx");
        assert_eq!(p.onnx.as_deref(), Some(Path::new("m.onnx")));
        assert!(parse("kiln-bench-serve infer-probe --onnx").is_err());
        let cli = parse("kiln-bench-serve --clients 8 --max-wait-ms 1.5").unwrap();
        let serve = (cli.suite.clients, cli.suite.max_wait_ms);
        assert_eq!(serve, (Some(8), Some(1.5)));
        let err = parse("kiln-bench-serve serve --clint 8").unwrap_err();
        assert!(err.to_string().contains("--clint"), "{err}");
    }
}
