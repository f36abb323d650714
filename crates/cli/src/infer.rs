//! `kiln infer` and `kiln serve`: load the model (a checkpoint's settings as a configuration
//! layer under the user's), apply the backend settings, and run offline or serve.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kiln_config::Resolution;
use kiln_device::settings::AmpDtype;
use kiln_infer::model::{self, ModelSource};
use kiln_infer::offline::Report;
use kiln_infer::{Engine, EngineOptions, LoadedModel};
use kiln_train::checkpoint::Checkpoint;

use crate::args::{Format, ModelArgs};
use crate::commands;

/// The model's source, its checkpoint (opened and verified), and the configuration with the
/// checkpoint's model settings layered in.
struct Setup {
    source: ModelSource,
    checkpoint: Option<Checkpoint>,
    resolution: Resolution,
}

fn setup(args: &ModelArgs, extra_flags: Vec<(String, String, String)>) -> anyhow::Result<Setup> {
    let source = ModelSource::detect(&args.model)?;
    let checkpoint = match &source {
        ModelSource::Checkpoint(path) => Some(model::open_checkpoint(path)?),
        ModelSource::TorchScript(_) => None,
    };
    let layer = checkpoint
        .as_ref()
        .map(|c| (c.dir.display().to_string(), model::model_settings(c)));
    let mut flags = args.flags();
    flags.extend(extra_flags);
    let resolution = commands::load_layers(&args.config_args(), flags, layer)
        .context("cannot resolve the configuration")?;
    let r = &resolution;
    eprintln!(
        "device {} ({}): {}",
        r.selection.device, r.plan.device_request, r.selection.reason
    );
    commands::apply_backend(r);
    Ok(Setup {
        source,
        checkpoint,
        resolution,
    })
}

fn source_note(r: &Resolution, key: &str) -> String {
    r.plan
        .source_of(key)
        .map_or_else(String::new, |p| format!(" ({})", p.source))
}

fn load_model(setup: &Setup, precision: AmpDtype) -> anyhow::Result<LoadedModel> {
    let r = &setup.resolution;
    Ok(model::load(
        &setup.source,
        setup.checkpoint.as_ref(),
        &r.plan,
        kiln_train::feed::tch_device(r.selection.device),
        precision,
    )?)
}

pub fn infer(
    args: &ModelArgs,
    inputs: &Path,
    output: Option<&Path>,
    no_compare: bool,
    format: Format,
) -> anyhow::Result<ExitCode> {
    if let Some(output) = output {
        kiln_infer::io::check_output(output)?;
    }
    let setup = setup(args, vec![])?;
    let r = &setup.resolution;
    let plan = &r.plan;
    let inputs = kiln_infer::io::read_inputs(inputs)?;
    let precision = plan.infer.precision;
    let model = load_model(&setup, precision)?;
    let sample_shape = model
        .sample_shape()
        .map_or_else(|| inputs.sample_shape.clone(), <[usize]>::to_vec);
    let options = EngineOptions {
        max_batch: usize::try_from(plan.infer.batch_size).unwrap_or(usize::MAX),
        cuda_graphs: plan.infer.cuda_graphs,
    };
    eprintln!(
        "model: {}; precision {}{}, batch size {}{}",
        model.description(),
        precision.as_str(),
        source_note(r, "infer.precision"),
        plan.infer.batch_size,
        source_note(r, "infer.batch_size"),
    );
    let mut engine = Engine::new(model, sample_shape.clone(), options)?;
    let mut reference = if precision != AmpDtype::None && !no_compare {
        let fp32 = load_model(&setup, AmpDtype::None)?;
        Some(Engine::new(
            fp32,
            sample_shape,
            EngineOptions {
                cuda_graphs: kiln_config::CudaGraphs::Off,
                ..options
            },
        )?)
    } else {
        None
    };
    let outcome =
        kiln_infer::offline::run(&mut engine, reference.as_mut(), &inputs, precision.as_str())?;
    if let Some(output) = output {
        kiln_infer::io::write_outputs(output, &outcome.shape, &outcome.outputs)?;
    }
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&outcome.report)?),
        Format::Text => print!("{}", report_text(&outcome.report)),
    }
    if let Some(output) = output {
        eprintln!("wrote outputs {:?} to {}", outcome.shape, output.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn report_text(r: &Report) -> String {
    let l = &r.batch_latency_ms;
    let mut s = format!(
        "inputs: {}\n{} samples in {} batches of up to {} ({}, CUDA graphs {}): {:.0} samples/s\n\
         batch latency: p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n",
        r.inputs,
        r.samples,
        r.batches,
        r.batch_size,
        r.precision,
        r.cuda_graphs,
        r.samples_per_second,
        l.p50,
        l.p95,
        l.p99,
        l.max
    );
    if let Some(a) = r.accuracy {
        s.push_str(&format!("accuracy: {:.2} %\n", a * 100.0));
    }
    if let (Some(mae), Some(rmse)) = (r.mae, r.rmse) {
        s.push_str(&format!("MAE: {mae:.4}, RMSE: {rmse:.4}\n"));
    }
    if let Some(d) = &r.deviation_from_fp32 {
        s.push_str(&format!(
            "deviation from fp32: max |Δ| {:.3e} (outputs up to {:.3}), arg-max agreement {:.2} %\n",
            d.max_abs,
            d.max_reference,
            d.argmax_agreement * 100.0
        ));
    }
    s
}

pub fn serve(
    args: &ModelArgs,
    input_shape: Option<&[usize]>,
    serve_flags: Vec<(String, String, String)>,
) -> anyhow::Result<ExitCode> {
    let setup = setup(args, serve_flags)?;
    let r = &setup.resolution;
    let plan = r.plan.clone();
    let precision = plan.infer.precision;
    let config = kiln_infer::serve::ServeConfig::from_plan(&plan);
    eprintln!(
        "serving {}; batches of up to {}{} waiting at most {:.1} ms{}, precision {}{}",
        args.model.display(),
        plan.infer.batch_size,
        source_note(r, "infer.batch_size"),
        plan.serve.max_wait.as_secs_f64() * 1e3,
        source_note(r, "serve.max_wait_ms"),
        precision.as_str(),
        source_note(r, "infer.precision"),
    );
    if matches!(setup.source, ModelSource::TorchScript(_)) && input_shape.is_none() {
        anyhow::bail!(
            "--input-shape is needed to serve a TorchScript module (the shape of one sample, e.g. \
             --input-shape 784 or --input-shape 64,469)"
        );
    }
    let input_shape = input_shape.map(<[usize]>::to_vec);
    let options = EngineOptions {
        max_batch: config.max_batch,
        cuda_graphs: plan.infer.cuda_graphs,
    };
    // The model is loaded on the server's worker thread, which owns it from then on.
    let Setup {
        source, checkpoint, ..
    } = setup;
    let device = kiln_train::feed::tch_device(r.selection.device);
    let factory: kiln_infer::serve::RunnerFactory = Box::new(move || {
        let model = model::load(&source, checkpoint.as_ref(), &plan, device, precision)
            .map_err(|e| e.to_string())?;
        let shape = match (model.sample_shape(), input_shape) {
            (Some(known), Some(given)) if known != given.as_slice() => {
                return Err(format!(
                    "--input-shape {given:?} contradicts the checkpoint's input shape {known:?}"
                ));
            }
            (Some(known), _) => known.to_vec(),
            (None, Some(given)) => given,
            (None, None) => return Err("no input shape".to_owned()),
        };
        let mut engine = Engine::new(model, shape, options).map_err(|e| e.to_string())?;
        // Warm up (and capture the largest CUDA graph bucket) before reporting ready.
        let numel: usize = engine.sample_shape().iter().product();
        let max = engine.max_batch();
        engine
            .run(&vec![0.0; numel * max], max)
            .map_err(|e| format!("warm-up batch failed: {e}"))?;
        if let kiln_infer::GraphStatus::On { captured } = engine.graph_status() {
            tracing::info!("CUDA graphs on: captured batch buckets {captured:?}");
        }
        Ok(Box::new(engine) as Box<dyn kiln_infer::serve::BatchRunner>)
    });
    let server = kiln_infer::serve::Server::start(config, factory)?;
    server.shutdown_on_signals();
    eprintln!(
        "listening on http://{} (POST /v1/predict with JSON or .npy; GET /health, /ready, \
         /metrics); Ctrl-C stops after answering what is in flight",
        server.local_addr()
    );
    server.wait_ready().context("the model did not load")?;
    eprintln!("ready");
    server.wait()?;
    Ok(ExitCode::SUCCESS)
}

/// `kiln export`: the checkpoint's model as a TorchScript file, checked against kiln's own
/// output before it is written (fp32, on the CPU).
pub fn export(
    model: &Path,
    out: &Path,
    config: Option<&Path>,
    sets: &[String],
) -> anyhow::Result<ExitCode> {
    kiln_infer::export::check_target(out)?;
    if !model.is_dir() {
        anyhow::bail!(
            "--model {}: export takes a kiln checkpoint or run directory{}",
            model.display(),
            if model.is_file() {
                " (this file already is a model file; TorchScript needs no export)"
            } else {
                " (no such directory)"
            }
        );
    }
    let args = ModelArgs {
        model: model.to_owned(),
        batch_size: None,
        precision: None,
        cuda_graphs: None,
        config: config.map(Path::to_owned),
        sets: sets.to_vec(),
        device: Some("cpu".to_owned()),
        profile: None,
    };
    let setup = setup(&args, vec![])?;
    let loaded = load_model(&setup, AmpDtype::None)?;
    let shape = loaded
        .sample_shape()
        .context("the checkpoint does not record its input shape")?
        .to_vec();
    let e = kiln_infer::export::to_torchscript(&loaded, &shape, out)?;
    eprintln!(
        "wrote {} (TorchScript, {} bytes, input [batch, {}]); checked against kiln on {} \
         samples at batch 3 and 1: max |Δ| {:.1e} (tolerance {:e})",
        e.path.display(),
        e.bytes,
        shape
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        e.samples_checked,
        e.max_abs,
        kiln_infer::export::TOLERANCE
    );
    Ok(ExitCode::SUCCESS)
}
