//! `kiln profile-model`: time a built-in model, a kiln checkpoint or a TorchScript module on a
//! random batch on this machine's device (forward pass or whole train step), at the resolved
//! precision, and report time per iteration, throughput and peak memory.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kiln_config::{ModelKind, Resolution, RunPlan};
use kiln_device::settings::AmpDtype;
use kiln_infer::InferError;
use kiln_infer::model::{self, ModelSource};
use kiln_infer::profile::{self, Iterations, Measurement, Mode, Report, TrainableModel};
use kiln_train::checkpoint::Checkpoint;
use kiln_train::model::InputSpec;
use kiln_train::trainer::{TrainSettings, precision_name};

use crate::args::{Format, PrecisionArg, ProfileMode, ProfileModelArgs};
use crate::commands;

const TORCHSCRIPT_NEEDS_SHAPE: &str = "--input-shape is needed to profile a TorchScript module \
     (the shape of one sample, e.g. --input-shape 784 or --input-shape 64,469)";

/// What `--model` names.
enum Target {
    /// A reference model built from the configuration's `model.*` settings, random weights.
    BuiltIn(ModelKind),
    /// A checkpoint (opened and verified) or a TorchScript file.
    Source(ModelSource, Option<Box<Checkpoint>>),
    /// An ONNX file, run in ONNX Runtime.
    Onnx(std::path::PathBuf),
}

fn target(model: &Path) -> anyhow::Result<Target> {
    if let Some(kind) = model.to_str().and_then(|m| m.parse::<ModelKind>().ok()) {
        if model.exists() {
            eprintln!(
                "note: --model {} is the built-in model; write ./{} for the file of that name",
                model.display(),
                model.display()
            );
        }
        return Ok(Target::BuiltIn(kind));
    }
    if !model.exists() {
        anyhow::bail!(
            "--model {}: not a built-in model (transformer, mlp, convnet or unet3d) and no such file or \
             directory; give a built-in name, a kiln run or checkpoint directory, a TorchScript \
             .pt file or an .onnx file",
            model.display()
        );
    }
    let source = ModelSource::detect(model)?;
    let checkpoint = match &source {
        ModelSource::Onnx(path) => return Ok(Target::Onnx(path.clone())),
        ModelSource::Checkpoint(path) => Some(
            model::open_checkpoint(path)
                .map(Box::new)
                .with_context(|| format!("--model {}", model.display()))?,
        ),
        _ => None,
    };
    Ok(Target::Source(source, checkpoint))
}

/// The sample shape a built-in model takes, as `build` checks it, for the `--input-shape` error.
fn check_builtin_shape(kind: ModelKind, shape: &[usize]) -> anyhow::Result<()> {
    let (expected, dims) = match kind {
        ModelKind::Mlp => return Ok(()),
        ModelKind::Transformer => ("[sequence, features]", 2),
        ModelKind::ConvNet => ("[channels, height, width]", 3),
        ModelKind::Unet3d => ("[channels, depth, height, width]", 4),
        ModelKind::TorchScript | ModelKind::Program => return Ok(()),
    };
    if shape.len() != dims {
        let default = kiln_train::models::synthetic_shape(kind).map_or(vec![], |s| s.0);
        anyhow::bail!(
            "--input-shape {}: the {kind} takes samples of shape {expected} ({dims} dimensions), \
             e.g. --input-shape {} (its default)",
            join(shape),
            join(&default)
        );
    }
    Ok(())
}

fn join(shape: &[usize]) -> String {
    shape
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The shape to profile: the model's own where it records one (a `--input-shape` must agree),
/// else `--input-shape`.
fn sample_shape(
    known: Option<&[usize]>,
    given: Option<&[usize]>,
    description: &str,
) -> anyhow::Result<Vec<usize>> {
    match (known, given) {
        (Some(known), Some(given)) if known != given => anyhow::bail!(
            "--input-shape {}: {description} takes samples of shape {known:?} (leave \
             --input-shape out to use it)",
            join(given)
        ),
        (Some(known), _) => Ok(known.to_vec()),
        (None, Some(given)) => Ok(given.to_vec()),
        (None, None) => anyhow::bail!("{TORCHSCRIPT_NEEDS_SHAPE}"),
    }
}

/// A note of where a setting came from, e.g. " (profile cpu)".
fn source_note(r: &Resolution, key: &str) -> String {
    r.plan
        .source_of(key)
        .map_or_else(String::new, |p| format!(" ({})", p.source))
}

pub fn run(args: &ProfileModelArgs) -> anyhow::Result<ExitCode> {
    let target = target(&args.model)?;
    let mode = match args.mode {
        ProfileMode::Infer => Mode::Infer,
        ProfileMode::Train => Mode::Train,
    };
    if let Target::BuiltIn(kind) = &target
        && let Some(shape) = &args.input_shape
    {
        check_builtin_shape(*kind, shape)?;
    }
    if let Target::Source(ModelSource::TorchScript(path), _) = &target {
        if mode == Mode::Train {
            anyhow::bail!(
                "--mode train: {} is a TorchScript module, which kiln profiles in --mode infer \
                 only; train mode takes a built-in model (transformer, mlp, convnet, unet3d) or a kiln \
                 checkpoint",
                path.display()
            );
        }
        if args.input_shape.is_none() {
            anyhow::bail!("{TORCHSCRIPT_NEEDS_SHAPE}");
        }
    }
    if let (Target::Onnx(path), Mode::Train) = (&target, mode) {
        anyhow::bail!(
            "--mode train: {} is an ONNX model, which kiln profiles in --mode infer only (ONNX \
             Runtime does not train)",
            path.display()
        );
    }
    let r = configure(args, &target, mode)?;
    let plan = &r.plan;
    let (precision, batch) = match mode {
        Mode::Infer => (plan.infer.precision, plan.infer.batch_size),
        Mode::Train => {
            if plan.train.batch_size_auto && args.batch_size.is_none() {
                eprintln!(
                    "train.batch_size = auto{}: profiling where its search starts, {}; give \
                     --batch-size to profile another size",
                    source_note(&r, "train.batch_size"),
                    plan.train.batch_size
                );
            }
            (plan.train.amp, plan.train.batch_size)
        }
    };
    let batch = usize::try_from(batch).context("the batch size does not fit this machine")?;
    let (batch_key, precision_key) = keys(mode);
    eprintln!(
        "profiling in {mode} mode: batch size {batch}{}, precision {}{}",
        source_note(&r, batch_key),
        precision_name(precision),
        source_note(&r, precision_key),
    );
    let run = Run {
        plan,
        device: r.selection.device,
        precision,
        batch,
        iterations: Iterations {
            warmup: args.warmup,
            timed: args.iterations,
        },
        given_shape: args.input_shape.as_deref(),
    };
    let profiled = match mode {
        Mode::Infer => run.forward(&target)?,
        Mode::Train => run.train_step(&target)?,
    };
    let measurement = &profiled.measurement;
    let stats = measurement.stats();
    let report = Report {
        model: profiled.description,
        parameters: profiled.parameters,
        device: match &r.selection.gpu {
            Some(g) => format!("{} ({})", r.selection.device, g.name),
            None => r.selection.device.to_string(),
        },
        precision: if matches!(target, Target::Onnx(_)) {
            "fp32".to_owned()
        } else {
            precision_name(precision).to_owned()
        },
        mode,
        batch_size: batch,
        input_shape: profiled.shape,
        warmup: run.iterations.warmup,
        iterations: measurement.times_ms.len(),
        time: stats,
        samples_per_s: stats.samples_per_s(batch),
        peak_memory_bytes: measurement.peak_memory_bytes,
        peak_memory_source: measurement.peak_memory_source,
    };
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Text => print!("{}", report_text(&report)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The configuration keys `--batch-size` and `--precision` set in `mode`.
fn keys(mode: Mode) -> (&'static str, &'static str) {
    match mode {
        Mode::Infer => ("infer.batch_size", "infer.precision"),
        Mode::Train => ("train.batch_size", "train.amp"),
    }
}

/// Resolves the configuration (a checkpoint's model settings under the user's layers, the
/// friendly flags on top) and applies its backend settings.
fn configure(args: &ProfileModelArgs, target: &Target, mode: Mode) -> anyhow::Result<Resolution> {
    let (batch_key, precision_key) = keys(mode);
    let precision = match args.precision {
        PrecisionArg::Auto => None,
        PrecisionArg::Fp32 => Some("fp32".to_owned()),
        PrecisionArg::Bf16 => Some("bf16".to_owned()),
        PrecisionArg::Fp16 => Some("fp16".to_owned()),
    };
    let (model_name, checkpoint) = match target {
        Target::BuiltIn(kind) => (Some(kind.as_str().to_owned()), None),
        Target::Source(_, checkpoint) => (None, checkpoint.as_deref()),
        Target::Onnx(_) => (None, None),
    };
    let batch_size = args.batch_size.map(|n| n.to_string());
    let flags = crate::args::given([
        ("--device", "device.request", &args.device),
        ("--profile", "device.profile", &args.profile),
        ("--model", "model.name", &model_name),
        ("--batch-size", batch_key, &batch_size),
        ("--precision", precision_key, &precision),
    ]);
    let layer = checkpoint.map(|c| (c.dir.display().to_string(), model::model_settings(c)));
    let r = commands::load_layers(&args.config_args(), flags, layer)
        .context("cannot resolve the configuration")?;
    eprintln!(
        "device {} ({}): {}",
        r.selection.device, r.plan.device_request, r.selection.reason
    );
    commands::apply_backend(&r);
    Ok(r)
}

/// What is profiled, resolved.
struct Run<'a> {
    plan: &'a RunPlan,
    device: kiln_device::Device,
    precision: AmpDtype,
    batch: usize,
    iterations: Iterations,
    given_shape: Option<&'a [usize]>,
}

/// A profiled model: what it is, its size, the sample shape, the times.
struct Profiled {
    description: String,
    parameters: Option<usize>,
    shape: Vec<usize>,
    measurement: Measurement,
}

impl Run<'_> {
    /// A built-in model: the configuration's model settings, random weights, fp32.
    fn reference(&self, kind: ModelKind) -> Result<TrainableModel, InferError> {
        TrainableModel::reference(
            &self.plan.model,
            builtin_input(kind, self.given_shape),
            self.plan.performance.channels_last,
            self.plan.performance.backend.seed,
            kiln_train::feed::tch_device(self.device),
        )
    }

    fn forward(&self, target: &Target) -> anyhow::Result<Profiled> {
        let model = match target {
            Target::BuiltIn(kind) => self.reference(*kind)?.into_inference(self.precision),
            Target::Onnx(path) => return self.forward_onnx(path),
            Target::Source(source, checkpoint) => model::load(
                source,
                checkpoint.as_deref(),
                self.plan,
                kiln_train::feed::tch_device(self.device),
                self.precision,
            )?,
        };
        let shape = sample_shape(model.sample_shape(), self.given_shape, model.description())?;
        let measurement = profile::forward(&model, &shape, self.batch, self.iterations);
        Ok(Profiled {
            description: model.description().to_owned(),
            parameters: Some(model.parameters()?),
            measurement: explain(measurement, self.given_shape)?,
            shape,
        })
    }

    fn train_step(&self, target: &Target) -> anyhow::Result<Profiled> {
        let model = match target {
            Target::BuiltIn(kind) => self.reference(*kind)?,
            Target::Source(_, Some(ckpt)) if ckpt.program().is_some() => TrainableModel::program(
                ckpt,
                &self.plan.model,
                self.plan.train.loss,
                self.precision,
                kiln_train::feed::tch_device(self.device),
                self.batch,
            )?,
            Target::Source(ModelSource::Program(path), None) => anyhow::bail!(
                "--mode train: give a run or checkpoint of {} (it knows the data's targets and \
                 the loss the step is compiled with); the program alone profiles in --mode infer",
                path.display()
            ),
            Target::Source(_, Some(ckpt)) => TrainableModel::from_checkpoint(
                ckpt,
                &self.plan.model,
                self.plan.performance.channels_last,
                kiln_train::feed::tch_device(self.device),
            )?,
            Target::Source(..) | Target::Onnx(_) => {
                anyhow::bail!("--mode train needs a kiln model")
            }
        };
        let shape = sample_shape(
            Some(&model.input().sample_shape),
            self.given_shape,
            model.description(),
        )?;
        let mut settings =
            TrainSettings::from_plan(&self.plan.train, self.plan.performance.empty_cache_interval);
        settings.precision = self.precision;
        let measurement = profile::train_step(
            &model,
            settings,
            self.plan.train.lr,
            self.batch,
            self.iterations,
        );
        Ok(Profiled {
            description: model.description().to_owned(),
            parameters: Some(model.parameters()),
            measurement: explain(measurement, self.given_shape)?,
            shape,
        })
    }
}

impl Run<'_> {
    /// An ONNX model in ONNX Runtime, in fp32 (its own precision), timed host to host.
    fn forward_onnx(&self, path: &Path) -> anyhow::Result<Profiled> {
        if self.precision != AmpDtype::None {
            eprintln!(
                "note: ONNX Runtime runs {} in fp32, its exported precision, not {}",
                path.display(),
                precision_name(self.precision)
            );
        }
        let options = kiln_infer::onnx::OnnxOptions {
            max_batch: self.batch,
            threads: usize::try_from(tch::get_num_threads()).unwrap_or(1),
            device: kiln_train::feed::tch_device(self.device),
            input_shape: self.given_shape.map(<[usize]>::to_vec),
        };
        let mut engine = kiln_infer::onnx::OnnxEngine::open(path, &options)?;
        if engine.max_batch() < self.batch {
            anyhow::bail!(
                "{} takes batches of exactly {}: profile it with --batch-size {}",
                path.display(),
                engine.max_batch(),
                engine.max_batch()
            );
        }
        let measurement = profile::forward_onnx(&mut engine, self.batch, self.iterations);
        Ok(Profiled {
            description: format!(
                "{} ({}; timed host to host: inputs copied in, outputs out)",
                engine.description(),
                engine.status()
            ),
            parameters: None,
            shape: engine.sample_shape().to_vec(),
            measurement: explain(measurement, self.given_shape)?,
        })
    }
}

/// What a built-in model is built for: `--input-shape` or its synthetic data's shape, and its
/// synthetic data's classes.
fn builtin_input(kind: ModelKind, given_shape: Option<&[usize]>) -> InputSpec {
    let (default_shape, classes) = kiln_train::models::synthetic_shape(kind).unwrap_or_default();
    InputSpec {
        sample_shape: given_shape.map_or(default_shape, <[usize]>::to_vec),
        classes,
        target: None,
        integer_features: false,
        arrays: vec![],
    }
}

/// Names `--input-shape` in a failure of the first batch when the shape came from it.
fn explain(
    measurement: Result<Measurement, InferError>,
    given_shape: Option<&[usize]>,
) -> anyhow::Result<Measurement> {
    match (measurement, given_shape) {
        (Err(e @ InferError::Input(_)), Some(shape)) => {
            Err(e).with_context(|| format!("--input-shape {} does not fit the model", join(shape)))
        }
        (other, _) => Ok(other?),
    }
}

/// 3321956 → "3,321,956".
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn report_text(r: &Report) -> String {
    let t = &r.time;
    let mut s = String::new();
    let _ = writeln!(s, "model        {}", r.model);
    let _ = writeln!(
        s,
        "parameters   {}",
        r.parameters
            .map_or_else(|| "not counted (ONNX)".to_owned(), thousands)
    );
    let _ = writeln!(s, "device       {}", r.device);
    let _ = writeln!(
        s,
        "mode         {}",
        match r.mode {
            Mode::Infer => "infer (forward pass, eval, no autograd)",
            Mode::Train => "train (forward, loss, backward, optimizer step)",
        }
    );
    let _ = writeln!(s, "precision    {}", r.precision);
    let _ = writeln!(
        s,
        "batch        {} samples of shape {:?}",
        r.batch_size, r.input_shape
    );
    let _ = writeln!(
        s,
        "iterations   {} timed after {} warm-up",
        r.iterations, r.warmup
    );
    let _ = writeln!(
        s,
        "time/iter    mean {:.3} ms · p50 {:.3} · p95 {:.3} · min {:.3} · max {:.3}",
        t.mean_ms, t.p50_ms, t.p95_ms, t.min_ms, t.max_ms
    );
    let _ = writeln!(s, "throughput   {:.1} samples/s", r.samples_per_s);
    let _ = writeln!(
        s,
        "peak memory  {} ({})",
        r.peak_memory_bytes.map_or("unknown".to_owned(), mib),
        r.peak_memory_source.describe()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(3_321_956), "3,321,956");
    }

    #[test]
    fn built_in_shapes_are_checked_by_dimension_count() {
        assert!(check_builtin_shape(ModelKind::Mlp, &[7, 3]).is_ok());
        assert!(check_builtin_shape(ModelKind::Transformer, &[8, 16]).is_ok());
        let err = check_builtin_shape(ModelKind::ConvNet, &[3, 32])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--input-shape 3,32") && err.contains("--input-shape 3,32,32"),
            "{err}"
        );
    }
}
