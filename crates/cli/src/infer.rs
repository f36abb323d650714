//! `kiln infer` and `kiln serve`: load the model (a checkpoint's settings as a configuration
//! layer under the user's), apply the backend settings, and run offline or serve.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use kiln_config::{Layer, Resolution};
use kiln_device::settings::AmpDtype;
use kiln_infer::Runner;
use kiln_infer::model::{self, ModelSource};
use kiln_infer::offline::Report;
use kiln_infer::volume::WindowModel;
use kiln_train::checkpoint::Checkpoint;

use crate::args::{ExportFormat, ExportMode, Format, ModelArgs, Quantize};
use crate::commands;
use crate::engines::{self, EngineRequest};
use kiln_infer::export::ProgramFiles;
use kiln_train::program::export::ProgramMode;

/// The model's source, its checkpoint (opened and verified; for an ONNX file, the one kiln
/// exported it from, if still here), and the configuration with the checkpoint's model
/// settings layered in.
struct Setup {
    source: ModelSource,
    checkpoint: Option<Checkpoint>,
    onnx_only: Option<String>,
    resolution: Resolution,
}

fn setup(args: &ModelArgs, extra_flags: Vec<(String, String, String)>) -> anyhow::Result<Setup> {
    let source = ModelSource::detect(&args.model)?;
    let (checkpoint, onnx_only) = engines::checkpoint_of(&source)?;
    let layer = checkpoint
        .as_ref()
        .map(|c| (c.dir.display().to_string(), model::model_settings(c)));
    let mut flags = args.flags();
    flags.extend(extra_flags);
    let resolution = commands::load_layers(&args.config_args(), flags, layer)
        .context("cannot resolve the configuration")?;
    let checkpoint = match (checkpoint, resolution.plan.infer.ema) {
        (Some(c), true) => Some(c.with_ema_weights()?),
        (None, true) => anyhow::bail!(
            "infer.ema = true takes a checkpoint's EMA weights; {} is no kiln checkpoint or run \
             (and no ONNX file kiln exported from one)",
            args.model.display()
        ),
        (c, false) => c,
    };
    let r = &resolution;
    eprintln!(
        "device {} ({}): {}",
        r.selection.device, r.plan.device_request, r.selection.reason
    );
    commands::apply_backend(r);
    Ok(Setup {
        source,
        checkpoint,
        onnx_only,
        resolution,
    })
}

impl Setup {
    /// What builds the engine, in `precision`, for batches of up to `max_batch`.
    fn request(
        self,
        precision: AmpDtype,
        max_batch: usize,
        input_shape: Option<Vec<usize>>,
    ) -> EngineRequest {
        let r = self.resolution;
        EngineRequest {
            source: self.source,
            checkpoint: self.checkpoint,
            onnx_only: self.onnx_only,
            device: kiln_train::feed::tch_device(r.selection.device),
            plan: r.plan,
            precision,
            max_batch,
            input_shape,
        }
    }
}

fn source_note(r: &Resolution, key: &str) -> String {
    r.plan
        .source_of(key)
        .map_or_else(String::new, |p| format!(" ({})", p.source))
}

pub fn infer(
    args: &ModelArgs,
    inputs: &Path,
    output: Option<&Path>,
    no_compare: bool,
    format: Format,
) -> anyhow::Result<ExitCode> {
    if kiln_data::Windows::is_windows_dir(inputs) {
        return forecast(args, inputs, output, format);
    }
    if let Some(output) = output {
        kiln_infer::io::check_output(output)?;
    }
    let setup = setup(args, vec![])?;
    let r = &setup.resolution;
    let plan = r.plan.clone();
    let inputs = kiln_infer::io::read_inputs(inputs)?;
    let precision_note = source_note(r, "infer.precision");
    let batch_note = source_note(r, "infer.batch_size");
    let max_batch = usize::try_from(plan.infer.batch_size).unwrap_or(usize::MAX);
    let request = setup.request(
        plan.infer.precision,
        max_batch,
        Some(inputs.sample_shape.clone()),
    );
    let built = request.build()?;
    if let Some(note) = &built.note {
        eprintln!("{note}");
    }
    let precision = built.precision;
    let mut engine = built.runner;
    eprintln!(
        "model: {}; engine {}; precision {}{}, batch size {}{}",
        engine.description(),
        engine.engine(),
        precision.as_str(),
        if precision == plan.infer.precision {
            precision_note
        } else {
            String::new()
        },
        plan.infer.batch_size,
        batch_note,
    );
    let mut reference = if precision != AmpDtype::None && !no_compare {
        let mut fp32 = request;
        fp32.plan.infer.cuda_graphs = kiln_config::CudaGraphs::Off;
        Some(fp32.libtorch_engine(AmpDtype::None)?)
    } else {
        None
    };
    let outcome = kiln_infer::offline::run(
        &mut engine,
        reference.as_mut().map(|e| e as &mut dyn Runner),
        &inputs,
        precision.as_str(),
    )?;
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

/// `kiln infer` of a windowed time-series dataset: the forecasts of its windows after each
/// series' cutoff (`data.val_steps`), judged per horizon step, written as CSV with `--output`.
fn forecast(
    args: &ModelArgs,
    inputs: &Path,
    output: Option<&Path>,
    format: Format,
) -> anyhow::Result<ExitCode> {
    if let Some(output) = output {
        let csv = output
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
        anyhow::ensure!(
            csv,
            "{}: forecasts are written as CSV (a row per window and horizon step); name a .csv \
             file",
            output.display()
        );
        kiln_infer::io::check_output(output)?;
    }
    let setup = setup(args, vec![])?;
    let plan = &setup.resolution.plan;
    let windows = kiln_data::Windows::open(inputs)?;
    let val_steps = plan
        .data
        .val_steps
        .map_or(windows.manifest().horizon, |n| n as usize);
    let data = kiln_infer::forecast::forecast_windows(&windows, val_steps)?;
    let device = kiln_train::feed::tch_device(setup.resolution.selection.device);
    let precision = plan.infer.precision;
    let model = model::load(
        &setup.source,
        setup.checkpoint.as_ref(),
        plan,
        device,
        precision,
    )?;
    let batch = usize::try_from(plan.infer.batch_size).unwrap_or(usize::MAX);
    let levels = plan.model.quantiles.clone();
    let forecasts = kiln_infer::forecast::forecast(&model, &data, levels, batch)?;
    if let Some(output) = output {
        forecasts.write_csv(&data, output)?;
    }
    let r = &forecasts.report;
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(r)?),
        Format::Text => print!("{}", forecast_text(r, precision)),
    }
    if let Some(output) = output {
        eprintln!("wrote {} forecasts to {}", r.windows, output.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `kiln infer --sliding-window`: one input `[C, *spatial]` through the model by windows.
pub fn sliding(
    args: &ModelArgs,
    input: &Path,
    output: Option<&Path>,
    values: kiln_infer::volume::VolumeValues,
    format: Format,
) -> anyhow::Result<ExitCode> {
    if let Some(output) = output {
        let known = output
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| {
                ["npy", "tif", "tiff"]
                    .iter()
                    .any(|k| e.eq_ignore_ascii_case(k))
            });
        anyhow::ensure!(
            known,
            "{}: a sliding window's output is written as .npy or a TIFF stack; name a .npy, .tif \
             or .tiff file",
            output.display()
        );
        kiln_infer::io::check_new_file(output)?;
    }
    let setup = setup(args, vec![])?;
    let r = &setup.resolution;
    let plan = r.plan.clone();
    let onnx = matches!(setup.source, ModelSource::Onnx(_));
    // ONNX Runtime takes host arrays in the standard layout.
    let mut settings = kiln_infer::sliding::SlidingWindow::from_plan(
        &plan.infer.sliding_window,
        plan.performance.channels_last && !onnx,
    );
    if !onnx {
        settings.layout = window_layout(&setup)?;
    }
    let device_memory = match r.selection.device {
        kiln_device::Device::Cuda(n) => r
            .facts
            .gpus
            .iter()
            .find(|g| g.cuda_index == Some(n))
            .map(|g| g.total_memory_bytes),
        _ => None,
    };
    let (mut model, precision) = window_model(setup, input, &settings)?;
    let out = kiln_infer::volume::VolumeOutput {
        path: output,
        device: plan.infer.sliding_window.output_device,
        device_memory,
        values,
    };
    let report = kiln_infer::volume::infer_volume(model.as_mut(), input, &settings, out)?;
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Text => println!(
            "model: {}\ninput: {} {:?}\n{} windows of {:?} ({} blending, {} per batch, \
             precision {}, {}{}), stitched on {}: {:.2} s\noutput: {:?} {}",
            report.model,
            report.input,
            report.input_shape,
            report.windows,
            report.roi,
            report.mode,
            report.batch_size,
            precision.as_str(),
            report.layout,
            layout_note(report.layout_measured),
            report.output_device,
            report.seconds,
            report.output_shape,
            report.output_dtype
        ),
    }
    if let Some(output) = output {
        eprintln!("wrote {}", output.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// How a libtorch model's windows are laid out: as the user set `performance.channels_last`, or
/// measured on the trial window (the answer cached by the model's identity).
fn window_layout(setup: &Setup) -> anyhow::Result<kiln_infer::sliding::Layout> {
    let key = kiln_config::keys::performance::channels_last;
    let layer = setup.resolution.plan.source_of(key).map(|p| p.layer);
    if !matches!(layer, None | Some(Layer::Default | Layer::Profile)) {
        return Ok(kiln_infer::sliding::Layout::AsSet);
    }
    let cache = kiln_device::measured::cache_dir().zip(layout_identity(setup)?);
    Ok(kiln_infer::sliding::Layout::Measured {
        cache: cache.map(|(dir, model)| kiln_infer::sliding::LayoutCache { dir, model }),
    })
}

/// What identifies the model for the layout cache: its TorchScript file's digest or its
/// checkpoint's weights'; None for a model without either (nothing cached).
fn layout_identity(setup: &Setup) -> anyhow::Result<Option<String>> {
    Ok(match (&setup.source, setup.checkpoint.as_ref()) {
        (ModelSource::TorchScript(path), _) => Some(format!(
            "torchscript {}",
            kiln_infer::onnx::file_digest(path)?
        )),
        (_, Some(ckpt)) => kiln_infer::onnx::weights_digest(ckpt).map(|d| format!("weights {d}")),
        _ => None,
    })
}

/// How kiln chose the layout, where it measured: a batch of windows' forward in each.
fn layout_note(measured: Option<kiln_infer::volume::LayoutTimes>) -> String {
    measured.map_or_else(String::new, |t| {
        format!(
            ", {}: {:.1} ms a batch channels-last vs {:.1} ms contiguous",
            if t.cached {
                "measured before"
            } else {
                "measured"
            },
            t.channels_last_ms,
            t.contiguous_ms
        )
    })
}

/// The model `--sliding-window` runs and the precision it runs in: an ONNX file in ONNX Runtime
/// (fp32, taking windows of the shape the input and `infer.sliding_window.roi` give), anything
/// else through libtorch.
fn window_model(
    setup: Setup,
    input: &Path,
    settings: &kiln_infer::sliding::SlidingWindow,
) -> anyhow::Result<(Box<dyn WindowModel>, AmpDtype)> {
    let plan = &setup.resolution.plan;
    let precision = plan.infer.precision;
    if let ModelSource::Onnx(path) = &setup.source {
        let path = path.clone();
        let window = kiln_infer::volume::window_shape(input, settings)?;
        let request = setup.request(precision, settings.batch_size, Some(window.clone()));
        let (engine, note) = request.open_onnx(&path).map_err(|e| match e {
            kiln_infer::InferError::Model { .. } => anyhow::anyhow!(
                "infer.sliding_window.roi gives windows {window:?} ([channels, *roi]) over {}: {e}",
                input.display()
            ),
            e => e.into(),
        })?;
        if let Some(note) = note {
            eprintln!("{note}");
        }
        return Ok((Box::new(engine), AmpDtype::None));
    }
    let device = kiln_train::feed::tch_device(setup.resolution.selection.device);
    let model = model::load(
        &setup.source,
        setup.checkpoint.as_ref(),
        plan,
        device,
        precision,
    )?;
    Ok((Box::new(model), precision))
}

fn forecast_text(r: &kiln_infer::forecast::ForecastReport, precision: AmpDtype) -> String {
    let mut s = format!(
        "model: {}
inputs: {}
{} windows of horizon {} ({}): {:.0} windows/s
",
        r.model,
        r.inputs,
        r.windows,
        r.horizon,
        precision.as_str(),
        r.samples_per_second
    );
    let m = &r.metrics;
    let over: Vec<String> = ["mae", "rmse", "quantile_loss"]
        .iter()
        .filter_map(|n| m.get(n).map(|v| format!("{n} {v:.4}")))
        .collect();
    s.push_str(&format!(
        "over the horizon: {}
",
        over.join(", ")
    ));
    for h in 1..=r.horizon {
        let step: Vec<String> = ["mae", "rmse", "quantile_loss"]
            .iter()
            .filter_map(|n| m.get(&format!("{n}_h{h}")).map(|v| format!("{n} {v:.4}")))
            .collect();
        s.push_str(&format!("step {h}: {}\n", step.join(", ")));
    }
    s
}

fn report_text(r: &Report) -> String {
    let l = &r.batch_latency_ms;
    let mut s = format!(
        "inputs: {}\n{} samples in {} batches of up to {} ({}, {}, CUDA graphs {}): {:.0} \
         samples/s\n\
         batch latency: p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n",
        r.inputs,
        r.samples,
        r.batches,
        r.batch_size,
        r.precision,
        r.engine,
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
    let mut config = kiln_infer::serve::ServeConfig::from_plan(&plan);
    if let ModelSource::Onnx(path) = &setup.source {
        // A model with a fixed batch size caps the server's batches (and requests) at it.
        let options = kiln_infer::onnx::OnnxOptions {
            max_batch: config.max_batch,
            threads: 1,
            device: tch::Device::Cpu,
            input_shape: input_shape.map(<[usize]>::to_vec),
        };
        let probe = kiln_infer::onnx::OnnxEngine::open(path, &options)?;
        if let Some(fixed) = probe.fixed_batch()
            && fixed < config.max_batch
        {
            eprintln!(
                "{} takes batches of exactly {fixed}: serving batches (and requests) of up to \
                 {fixed}, padded to it",
                path.display()
            );
            config.max_batch = fixed;
        }
    }
    eprintln!(
        "serving {}; batches of up to {}{} waiting at most {:.1} ms{}, precision {}{}, engine {}{}",
        args.model.display(),
        config.max_batch,
        source_note(r, "infer.batch_size"),
        plan.serve.max_wait.as_secs_f64() * 1e3,
        source_note(r, "serve.max_wait_ms"),
        precision.as_str(),
        source_note(r, "infer.precision"),
        plan.infer.engine,
        source_note(r, "infer.engine"),
    );
    if matches!(setup.source, ModelSource::TorchScript(_)) && input_shape.is_none() {
        anyhow::bail!(
            "--input-shape is needed to serve a TorchScript module (the shape of one sample, e.g. \
             --input-shape 784 or --input-shape 64,469)"
        );
    }
    if let (Some(ckpt), Some(given)) = (&setup.checkpoint, input_shape)
        && let Some(known) = ckpt.meta.input.as_ref().map(|i| &i.sample_shape)
        && known.as_slice() != given
    {
        anyhow::bail!(
            "--input-shape {given:?} contradicts the checkpoint's input shape {known:?} ({})",
            ckpt.dir.display()
        );
    }
    let request = setup.request(
        precision,
        config.max_batch,
        input_shape.map(<[usize]>::to_vec),
    );
    // The engine is built on the server's worker thread, which owns it from then on.
    let factory: kiln_infer::serve::RunnerFactory = Box::new(move || {
        let built = request.build().map_err(|e| e.to_string())?;
        if let Some(note) = &built.note {
            eprintln!("{note}");
        }
        let mut engine = built.runner;
        // Warm up (and capture the largest CUDA graph bucket) before reporting ready.
        let numel: usize = engine.sample_shape().iter().product();
        let max = engine.max_batch();
        engine
            .run(&vec![0.0; numel * max], max)
            .map_err(|e| format!("warm-up batch failed: {e}"))?;
        tracing::info!(
            "engine {}; CUDA graphs {}",
            engine.engine(),
            engine.cuda_graphs()
        );
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

/// What `kiln export` was asked.
#[derive(Debug, Clone)]
pub struct ExportArgs {
    pub model: PathBuf,
    pub out: PathBuf,
    pub format: Option<ExportFormat>,
    pub mode: ExportMode,
    pub input_shape: Option<Vec<usize>>,
    pub quantize: Option<Quantize>,
    pub check_data: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub sets: Vec<String>,
}

/// The format `--format` names, else the one `--out`'s extension does.
fn export_format(given: Option<ExportFormat>, out: &Path) -> anyhow::Result<ExportFormat> {
    if let Some(format) = given {
        return Ok(format);
    }
    let ext = out
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("onnx") => Ok(ExportFormat::Onnx),
        Some("pt") => Ok(ExportFormat::Torchscript),
        Some("pt2") => Ok(ExportFormat::Program),
        _ => anyhow::bail!(
            "--out {}: give --format onnx, torchscript or program (or name the file .onnx, .pt \
             or .pt2)",
            out.display()
        ),
    }
}

/// `kiln export`: the checkpoint's model (or a TorchScript module) as ONNX or TorchScript,
/// checked against kiln's own output before it is written (fp32, on the CPU).
pub fn export(a: &ExportArgs) -> anyhow::Result<ExitCode> {
    kiln_infer::export::check_target(&a.out)?;
    let format = export_format(a.format, &a.out)?;
    if a.quantize.is_some() {
        return export_int8(a, format);
    }
    if !a.model.exists()
        || a.model
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
    {
        anyhow::bail!(
            "--model {}: export takes a kiln checkpoint or run directory, or a TorchScript .pt \
             file{}",
            a.model.display(),
            if a.model.exists() {
                " (this file already is ONNX)"
            } else {
                " (no such file or directory)"
            }
        );
    }
    let args = ModelArgs {
        model: a.model.clone(),
        batch_size: None,
        precision: None,
        cuda_graphs: None,
        engine: None,
        config: a.config.clone(),
        sets: a.sets.clone(),
        device: Some("cpu".to_owned()),
        profile: None,
    };
    let setup = setup(&args, vec![])?;
    if export_program(a, &setup, format)?.is_some() {
        return Ok(ExitCode::SUCCESS);
    }
    let loaded = model::load(
        &setup.source,
        setup.checkpoint.as_ref(),
        &setup.resolution.plan,
        tch::Device::Cpu,
        AmpDtype::None,
    )?;
    let shape = match (loaded.sample_shape(), &a.input_shape) {
        (Some(known), Some(given)) if known != given.as_slice() => anyhow::bail!(
            "--input-shape {given:?} contradicts the checkpoint's input shape {known:?}"
        ),
        (Some(known), _) => known.to_vec(),
        (None, Some(given)) => given.clone(),
        (None, None) => anyhow::bail!(
            "--input-shape is needed to export a TorchScript module (the shape of one sample, \
             e.g. --input-shape 784 or --input-shape 64,469)"
        ),
    };
    let e = match format {
        ExportFormat::Torchscript => kiln_infer::export::to_torchscript(&loaded, &shape, &a.out)?,
        ExportFormat::Onnx => {
            let meta = export_metadata(setup.checkpoint.as_ref(), &shape);
            kiln_infer::export::to_onnx(&loaded, &shape, &a.out, &meta)?
        }
        ExportFormat::Program => anyhow::bail!("--format program takes an exported program's run"),
    };
    report_export(&e);
    Ok(ExitCode::SUCCESS)
}

/// `kiln export --quantize int8`: the fp32 ONNX export into a temporary file beside `--out`,
/// then its int8 version, compared with it on `--check-data` and published if it passes.
fn export_int8(a: &ExportArgs, format: ExportFormat) -> anyhow::Result<ExitCode> {
    if format != ExportFormat::Onnx {
        anyhow::bail!(
            "--quantize int8 writes ONNX (int8 weights run in ONNX Runtime): give --format onnx \
             or an --out ending in .onnx"
        );
    }
    let Some(dir) = &a.check_data else {
        anyhow::bail!(
            "--quantize int8 needs --check-data DIR: a prepared dataset (kiln data prepare) to \
             run the int8 model beside the fp32 one on before it is written"
        );
    };
    let data = kiln_data::ShardedDataset::open(dir)
        .with_context(|| format!("--check-data {}", dir.display()))?;
    let mut name = a.out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".fp32-{}.onnx", std::process::id()));
    let fp32 = a.out.with_file_name(name);
    let inner = ExportArgs {
        out: fp32.clone(),
        quantize: None,
        ..a.clone()
    };
    let result = export(&inner).and_then(|_| {
        let shape = kiln_data::Dataset::sample_shape(&data).to_vec();
        let c = kiln_infer::quantize::to_int8(
            &fp32,
            &a.out,
            &shape,
            &data,
            &dir.display().to_string(),
        )?;
        let bytes = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        eprintln!(
            "wrote {} (ONNX, int8 Linear/MatMul weights, {} bytes; fp32 {} bytes); on {} samples \
             of {} its {} is {:.4} against fp32's {:.4} ({})",
            a.out.display(),
            bytes(&a.out),
            bytes(&fp32),
            c.samples,
            dir.display(),
            c.metric.name(),
            c.int8,
            c.fp32,
            c.metric.limit()
        );
        Ok(ExitCode::SUCCESS)
    });
    let _ = std::fs::remove_file(&fp32);
    result
}

/// The line `kiln export` ends with: what it wrote and how it was checked.
fn report_export(e: &kiln_infer::export::Exported) {
    eprintln!(
        "wrote {} ({}, {} bytes, input [batch, {}]); checked in {} against kiln on {} samples \
         at batch 3 and 1: max |Δ| {:.1e} (tolerance {:e})",
        e.path.display(),
        e.format,
        e.bytes,
        e.sample_shape
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        e.checked_in,
        e.samples_checked,
        e.max_abs,
        kiln_infer::export::TOLERANCE
    );
}

/// What an ONNX export records about where it came from: the checkpoint (absolute) and its
/// weights' digest, so that `infer.engine = auto` can run the checkpoint beside it.
/// `kiln export` of an exported program's run: the program with its trained weights, as a
/// `.pt2` or as ONNX; `None` for any other model, for which `format` must not be
/// [`ExportFormat::Program`] (nor `--mode train` asked).
fn export_program(
    a: &ExportArgs,
    setup: &Setup,
    format: ExportFormat,
) -> anyhow::Result<Option<()>> {
    let found = setup
        .checkpoint
        .as_ref()
        .and_then(|c| Some((c, c.program()?)));
    let Some((ckpt, program)) = found else {
        return match (format, a.mode) {
            (ExportFormat::Program, _) => anyhow::bail!(
                "--format program: {} is not the run of an exported program (a .pt2 given to \
                 `kiln train`); {}",
                a.model.display(),
                if matches!(setup.source, ModelSource::Program(_)) {
                    "this file already is one"
                } else {
                    "export this model as torchscript or onnx"
                }
            ),
            (_, ExportMode::Train) => {
                anyhow::bail!("--mode train is for an exported program's run written as a program")
            }
            _ => Ok(None),
        };
    };
    let weights = ckpt.dir.join(kiln_train::checkpoint::MODEL_FILE);
    let files = ProgramFiles {
        program: &program,
        weights: &weights,
    };
    match format {
        ExportFormat::Program => {
            let mode = match a.mode {
                ExportMode::Eval => ProgramMode::Eval,
                ExportMode::Train => ProgramMode::Train,
            };
            let n = kiln_infer::export::to_program(files, mode, &a.out)?;
            eprintln!(
                "wrote {} (an ExportedProgram in {} mode with the weights of step {}: {n} \
                 tensors, read back and equal bit for bit); in Python: \
                 torch.export.load(\"{}\").module()",
                a.out.display(),
                if mode == ProgramMode::Eval {
                    "eval"
                } else {
                    "train"
                },
                ckpt.meta.step,
                a.out.display()
            );
        }
        ExportFormat::Onnx => {
            anyhow::ensure!(
                a.mode == ExportMode::Eval,
                "--mode train: ONNX is written in eval mode only"
            );
            let loaded = model::load(
                &setup.source,
                Some(ckpt),
                &setup.resolution.plan,
                tch::Device::Cpu,
                AmpDtype::None,
            )?;
            let shape = loaded
                .sample_shape()
                .map(<[usize]>::to_vec)
                .unwrap_or_default();
            let meta = export_metadata(Some(ckpt), &shape);
            let e = kiln_infer::export::program_to_onnx(&loaded, files, &shape, &a.out, &meta)?;
            report_export(&e);
        }
        ExportFormat::Torchscript => anyhow::bail!(
            "--model {}: an exported program's run is written as a program (--format program, \
             or --out NAME.pt2) or as ONNX, not as TorchScript",
            a.model.display()
        ),
    }
    Ok(Some(()))
}

fn export_metadata(checkpoint: Option<&Checkpoint>, shape: &[usize]) -> Vec<(String, String)> {
    let mut meta = vec![
        (
            "kiln.version".to_owned(),
            env!("CARGO_PKG_VERSION").to_owned(),
        ),
        (
            "kiln.sample_shape".to_owned(),
            shape
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
    ];
    if let Some(ckpt) = checkpoint {
        let dir = std::fs::canonicalize(&ckpt.dir).unwrap_or_else(|_| ckpt.dir.clone());
        meta.push(("kiln.source".to_owned(), dir.display().to_string()));
        if let Some(digest) = kiln_infer::onnx::weights_digest(ckpt) {
            meta.push(("kiln.weights_sha256".to_owned(), digest));
        }
    }
    meta
}
