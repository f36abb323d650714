//! Profiling one model (`kiln profile-model`): its forward pass (eval mode, no autograd, weights
//! in the precision asked for) or a whole train step, repeated on one fixed random batch on its
//! device, the device synchronized before each clock read; per-iteration time statistics,
//! throughput and peak memory.

use std::time::Instant;

use kiln_config::{ModelKind, ModelPlan};
use kiln_device::settings::AmpDtype;
use kiln_train::checkpoint::Checkpoint;
use kiln_train::feed::DeviceBatch;
use kiln_train::model::InputSpec;
use kiln_train::model::Model;
use kiln_train::trainer::{TrainSettings, Trainer};
use serde::Serialize;
use tch::{Device, Kind, Tensor, nn};

use crate::offline::Percentiles;
use crate::{InferError, LoadedModel};

/// What one profiled iteration runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The forward pass in eval mode under `no_grad`.
    Infer,
    /// One optimizer step: forward and loss (under autocast at reduced precision), backward,
    /// the optimizer's update.
    Train,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Infer => "infer",
            Mode::Train => "train",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many iterations run: `warmup` untimed ones (allocations, kernel selection, lazy
/// initialisation), then `timed` timed ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Iterations {
    pub warmup: usize,
    pub timed: usize,
}

/// Milliseconds per iteration over the timed iterations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IterationStats {
    pub mean_ms: f64,
    /// Nearest-rank percentiles.
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl IterationStats {
    /// The statistics of `times_ms` (any order); zeros when empty.
    pub fn of(times_ms: &[f64]) -> Self {
        if times_ms.is_empty() {
            return Self {
                mean_ms: 0.0,
                p50_ms: 0.0,
                p95_ms: 0.0,
                min_ms: 0.0,
                max_ms: 0.0,
            };
        }
        let p = Percentiles::of(times_ms);
        Self {
            mean_ms: times_ms.iter().sum::<f64>() / times_ms.len() as f64,
            p50_ms: p.p50,
            p95_ms: p.p95,
            min_ms: times_ms.iter().copied().fold(f64::INFINITY, f64::min),
            max_ms: p.max,
        }
    }

    /// Samples per second at `batch` samples per iteration, from the mean time.
    pub fn samples_per_s(&self, batch: usize) -> f64 {
        if self.mean_ms > 0.0 {
            batch as f64 * 1e3 / self.mean_ms
        } else {
            0.0
        }
    }
}

/// Which memory figure a peak is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeakMemorySource {
    /// The CUDA caching allocator's peak of bytes in tensors, reset after loading the model.
    CudaAllocatorPeak,
    /// The process's resident-set high-water mark (`VmHWM` in `/proc/self/status`) since the
    /// process started: libtorch itself included, since the CPU allocator keeps no statistics.
    ProcessRssHighWaterMark,
}

impl PeakMemorySource {
    /// How reports describe it.
    pub fn describe(self) -> &'static str {
        match self {
            PeakMemorySource::CudaAllocatorPeak => "CUDA allocator peak, tensors only",
            PeakMemorySource::ProcessRssHighWaterMark => {
                "process RSS high-water mark (VmHWM), whole process"
            }
        }
    }
}

/// The peak memory so far on `device` and which figure it is: the CUDA allocator's peak of bytes
/// in tensors on a GPU, else the process's resident-set high-water mark (`None` where the kernel
/// does not report it).
pub fn peak_memory(device: Device) -> Result<(Option<u64>, PeakMemorySource), InferError> {
    Ok(match device {
        Device::Cuda(i) => (
            Some(kiln_torch_ext::memory::stats(i)?.allocated_peak),
            PeakMemorySource::CudaAllocatorPeak,
        ),
        _ => (
            kiln_device::memory::process_rss().map(|(_, peak)| peak),
            PeakMemorySource::ProcessRssHighWaterMark,
        ),
    })
}

/// What the timed iterations measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Milliseconds of each timed iteration, in order.
    pub times_ms: Vec<f64>,
    /// Peak memory in bytes; `None` where the platform does not say (no `/proc`).
    pub peak_memory_bytes: Option<u64>,
    pub peak_memory_source: PeakMemorySource,
}

impl Measurement {
    pub fn stats(&self) -> IterationStats {
        IterationStats::of(&self.times_ms)
    }
}

/// A profile as `kiln profile-model` reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub model: String,
    /// Not counted for ONNX models.
    pub parameters: Option<usize>,
    pub device: String,
    pub precision: String,
    pub mode: Mode,
    pub batch_size: usize,
    /// The shape of one sample.
    pub input_shape: Vec<usize>,
    pub warmup: usize,
    pub iterations: usize,
    #[serde(flatten)]
    pub time: IterationStats,
    pub samples_per_s: f64,
    pub peak_memory_bytes: Option<u64>,
    pub peak_memory_source: PeakMemorySource,
}

/// Waits for the work queued on `device` (a no-op on the CPU).
fn synchronize(device: Device) -> Result<(), InferError> {
    Ok(kiln_torch_ext::cuda::synchronize(device)?)
}

/// Runs `step(i)` for `iterations.warmup + iterations.timed` iterations and times the last
/// `timed`, synchronizing `device` before each clock read so that a time covers the work, not
/// its launch. The peak memory covers every iteration (on CUDA the allocator's peak is reset
/// first). An error of `step` ends the run and is returned as it is.
pub fn measure(
    device: Device,
    iterations: Iterations,
    mut step: impl FnMut(usize) -> Result<(), InferError>,
) -> Result<Measurement, InferError> {
    if iterations.timed == 0 {
        return Err(InferError::Input(
            "at least one timed iteration is needed".to_owned(),
        ));
    }
    if let Device::Cuda(i) = device {
        kiln_torch_ext::memory::reset_peak(i)?;
    }
    let mut times_ms = Vec::with_capacity(iterations.timed);
    for i in 0..iterations.warmup + iterations.timed {
        synchronize(device)?;
        let start = Instant::now();
        step(i)?;
        synchronize(device)?;
        let elapsed = start.elapsed();
        if i >= iterations.warmup {
            times_ms.push(elapsed.as_secs_f64() * 1e3);
        }
    }
    let (peak_memory_bytes, peak_memory_source) = peak_memory(device)?;
    Ok(Measurement {
        times_ms,
        peak_memory_bytes,
        peak_memory_source,
    })
}

/// `[batch, sample_shape…]` as libtorch dimensions.
fn batch_dims(batch: usize, sample_shape: &[usize]) -> Result<Vec<i64>, InferError> {
    std::iter::once(batch)
        .chain(sample_shape.iter().copied())
        .map(|d| {
            i64::try_from(d)
                .map_err(|_| InferError::Input(format!("dimension {d} is too large for libtorch")))
        })
        .collect()
}

/// A failed iteration, said plainly: running out of memory names the batch size; any other
/// failure of the first iteration is the batch not fitting the model (its shape, usually).
fn failed(iteration: usize, dims: &[i64], model: &str, what: &str, e: InferError) -> InferError {
    let text = e.to_string();
    if e.is_out_of_memory() {
        InferError::Model {
            model: model.to_owned(),
            message: format!(
                "{what} at batch size {} ran out of memory; profile a smaller batch ({text})",
                dims[0]
            ),
        }
    } else if iteration == 0 {
        InferError::Input(format!(
            "the first batch, of shape {dims:?}, failed: {text}"
        ))
    } else {
        e
    }
}

/// Times `model`'s forward pass (eval mode, no autograd) on one random normal batch of `batch`
/// samples of `sample_shape`, made once on the model's device in its element type.
///
/// # Shapes
/// The batch is `[batch, sample_shape…]`.
pub fn forward(
    model: &LoadedModel,
    sample_shape: &[usize],
    batch: usize,
    iterations: Iterations,
) -> Result<Measurement, InferError> {
    let dims = batch_dims(batch, sample_shape)?;
    let device = model.device();
    let xs = Tensor::f_randn(dims.as_slice(), (Kind::Float, device))?.f_to_kind(model.kind())?;
    let _no_grad = tch::no_grad_guard();
    measure(device, iterations, |i| {
        model
            .forward(&xs)
            .map(drop)
            .map_err(|e| failed(i, &dims, model.description(), "a forward pass", e))
    })
}

/// Times an ONNX model in ONNX Runtime on one random batch of `batch` samples, host to host
/// (the batch is copied in and the outputs out each time, as it serves; libtorch's forward is
/// timed on the device, so the two are not directly comparable). Peak memory is the process's
/// on the host: ONNX Runtime's CUDA allocator is not libtorch's.
pub fn forward_onnx(
    engine: &mut crate::onnx::OnnxEngine,
    batch: usize,
    iterations: Iterations,
) -> Result<Measurement, InferError> {
    let dims = batch_dims(batch, engine.sample_shape())?;
    let numel: usize = engine.sample_shape().iter().product();
    let input = Tensor::f_randn(
        [i64::try_from(batch * numel).unwrap_or(0)],
        (Kind::Float, Device::Cpu),
    )?;
    let input = Vec::<f32>::try_from(&input)?;
    let model = engine.description().to_owned();
    measure(Device::Cpu, iterations, |i| {
        engine
            .run(&input, batch)
            .map(drop)
            .map_err(|e| failed(i, &dims, &model, "a forward pass", e))
    })
}

/// "transformer (kiln reference model: d_model 256, heads 8, layers 4, ff 1024; random
/// weights)".
fn reference_description(plan: &ModelPlan) -> String {
    let list = |values: &[u64]| {
        values
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let sizes = match plan.kind {
        ModelKind::Mlp => format!("hidden {}", list(&plan.hidden)),
        ModelKind::Transformer => format!(
            "d_model {}, heads {}, layers {}, ff {}",
            plan.d_model, plan.heads, plan.layers, plan.ff
        ),
        ModelKind::ConvNet | ModelKind::Unet3d => format!("channels {}", list(&plan.channels)),
        ModelKind::TorchScript => "a TorchScript module".to_owned(),
        ModelKind::Program => "an exported program".to_owned(),
    };
    format!(
        "{} (kiln reference model: {sizes}; random weights)",
        plan.kind
    )
}

/// A kiln model with trainable fp32 parameters, for timing train steps (or, converted, the
/// forward pass).
pub struct TrainableModel {
    vs: nn::VarStore,
    model: Box<dyn Model>,
    input: InputSpec,
    description: String,
}

impl std::fmt::Debug for TrainableModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainableModel")
            .field("description", &self.description)
            .field("input", &self.input)
            .finish_non_exhaustive()
    }
}

impl TrainableModel {
    /// `model`, built in `vs` for data of `input`'s shape.
    pub fn new(
        vs: nn::VarStore,
        model: Box<dyn Model>,
        input: InputSpec,
        description: impl Into<String>,
    ) -> Self {
        Self {
            vs,
            model,
            input,
            description: description.into(),
        }
    }

    /// The reference model `plan` describes, with random weights, for data of `input`'s shape
    /// on `device`. `seed` seeds its dropout.
    pub fn reference(
        plan: &ModelPlan,
        input: InputSpec,
        channels_last: bool,
        seed: u64,
        device: Device,
    ) -> Result<Self, InferError> {
        let vs = nn::VarStore::new(device);
        let model = kiln_train::source::build(plan, &input, &vs, channels_last, seed)?;
        Ok(Self::new(vs, model, input, reference_description(plan)))
    }

    /// The checkpoint's model, rebuilt from `plan` (the settings it was trained with) with its
    /// weights, on `device`.
    pub fn from_checkpoint(
        ckpt: &Checkpoint,
        plan: &ModelPlan,
        channels_last: bool,
        device: Device,
    ) -> Result<Self, InferError> {
        let (vs, model, input) = crate::model::rebuild(ckpt, plan, channels_last, device)?;
        Ok(Self::new(
            vs,
            model,
            input,
            crate::model::checkpoint_description(ckpt, plan),
        ))
    }

    /// An exported program's checkpoint with its train step compiled for `precision`, the
    /// loss `loss` names and steps of `batch` samples on `device` (or found in kiln's cache: the
    /// run's own when they are the run's), and the checkpoint's weights.
    pub fn program(
        ckpt: &Checkpoint,
        plan: &ModelPlan,
        loss: kiln_config::LossKind,
        precision: AmpDtype,
        device: Device,
        batch: usize,
    ) -> Result<Self, InferError> {
        let input = ckpt.meta.input.clone().ok_or_else(|| InferError::Model {
            model: ckpt.dir.display().to_string(),
            message: "the checkpoint does not record its input shape".to_owned(),
        })?;
        let target = input
            .target
            .clone()
            .unwrap_or(kiln_data::TargetSpec::label(input.classes));
        let path = ckpt.program().ok_or_else(|| InferError::Model {
            model: ckpt.dir.display().to_string(),
            message: "the checkpoint holds no exported program (model.pt2)".to_owned(),
        })?;
        let spec = kiln_train::program::ProgramSpec {
            path: &path,
            loss: kiln_train::loss::Loss::resolve(loss, &target)?,
            precision,
            output: plan.output.clone(),
            freeze: plan.freeze.clone(),
            attention: plan.attention,
            threads: kiln_torch_ext::memory::num_threads()?.0,
            batch: Some(batch as u64),
        };
        let vs = nn::VarStore::new(device);
        let model = kiln_train::program::ProgramModel::load(&spec, &input, &vs)?;
        crate::model::copy_weights(ckpt, &vs)?;
        let description = format!(
            "kiln exported-program checkpoint {} (step {})",
            ckpt.dir.display(),
            ckpt.meta.step
        );
        Ok(Self::new(vs, Box::new(model), input, description))
    }

    /// The model for inference: eval mode, weights converted to `precision` and frozen.
    pub fn into_inference(self, precision: AmpDtype) -> LoadedModel {
        LoadedModel::from_kiln(
            self.vs,
            self.model,
            self.description,
            self.input.sample_shape,
            precision,
        )
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn input(&self) -> &InputSpec {
        &self.input
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// The number of trainable parameters.
    pub fn parameters(&self) -> usize {
        kiln_train::model::parameter_count(&self.vs)
    }
}

/// Times whole train steps of `model` (the trainer's `train_step`: forward and loss under
/// autocast at `settings.precision`, backward, the optimizer's update at learning rate `lr`) on
/// one random batch of `batch` samples with random labels, made once on the model's device.
/// Running out of memory is an error, not retried in micro-batches: the profile is of this
/// batch size.
///
/// # Shapes
/// Features `[batch, input.sample_shape…]` (f32), labels `[batch]` (i64, below
/// `input.classes`).
pub fn train_step(
    model: &TrainableModel,
    settings: TrainSettings,
    lr: f64,
    batch: usize,
    iterations: Iterations,
) -> Result<Measurement, InferError> {
    let device = model.device();
    let dims = batch_dims(batch, &model.input.sample_shape)?;
    let classes = i64::try_from(model.input.classes).unwrap_or(i64::MAX);
    let features = Tensor::f_randn(dims.as_slice(), (Kind::Float, device))?;
    let labels = Tensor::f_randint(classes, [dims[0]], (Kind::Int64, device))?;
    let mut trainer = Trainer::new(
        model.model.as_ref(),
        &model.description,
        &model.vs,
        settings,
        device,
    )?;
    trainer.set_retry_out_of_memory(false);
    measure(device, iterations, |i| {
        let batches = [DeviceBatch {
            inputs: kiln_train::inputs::Inputs::features(features.shallow_clone()),
            targets: labels.shallow_clone(),
            indices: vec![],
            number: i,
        }];
        trainer
            .train_step(&batches, lr)
            .map(drop)
            .map_err(|e| failed(i, &dims, &model.description, "a train step", e.into()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_are_ordered_and_throughput_comes_from_the_mean() {
        let times: Vec<f64> = (1..=20).rev().map(f64::from).collect();
        let s = IterationStats::of(&times);
        assert_eq!(s.mean_ms, 10.5);
        assert_eq!(
            (s.min_ms, s.p50_ms, s.p95_ms, s.max_ms),
            (1.0, 10.0, 19.0, 20.0)
        );
        assert!((s.samples_per_s(21) - 2000.0).abs() < 1e-9);
        let one = IterationStats::of(&[4.0]);
        assert_eq!(
            (one.min_ms, one.p50_ms, one.p95_ms, one.max_ms),
            (4.0, 4.0, 4.0, 4.0)
        );
        assert_eq!(IterationStats::of(&[]).samples_per_s(8), 0.0);
    }

    #[test]
    fn failures_name_the_batch_size_on_out_of_memory_else_the_first_batch() {
        let e = |m: &str| InferError::Input(m.to_owned());
        let tch_oom = InferError::Tch(tch::TchError::Torch("CUDA out of memory.".to_owned()));
        let oom = failed(3, &[64, 10], "m", "a forward pass", tch_oom);
        assert!(matches!(oom, InferError::Model { .. }), "{oom}");
        assert!(
            oom.to_string()
                .contains("a forward pass at batch size 64 ran out of memory"),
            "{oom}"
        );
        let first = failed(0, &[8, 7], "m", "a train step", e("mat1 and mat2 shapes"));
        assert!(matches!(first, InferError::Input(_)), "{first}");
        assert!(
            first
                .to_string()
                .contains("the first batch, of shape [8, 7], failed: inputs: mat1"),
            "{first}"
        );
        let later = failed(2, &[8, 7], "m", "a train step", e("boom"));
        assert_eq!(later.to_string(), "inputs: boom");
        // The kind decides, not the text: a kiln call's out-of-memory whatever it says, and
        // not an input error that mentions memory.
        let kiln_oom = InferError::Torch(kiln_torch_ext::Error::Torch {
            op: "dropout mask",
            kind: kiln_torch_ext::ErrorKind::OutOfMemory,
            message: "the allocator is exhausted".to_owned(),
        });
        let oom = failed(2, &[32, 7], "m", "a train step", kiln_oom);
        assert!(
            oom.to_string().contains("batch size 32 ran out of memory"),
            "{oom}"
        );
        let text_only = failed(2, &[8, 7], "m", "a train step", e("CUDA out of memory."));
        assert!(matches!(text_only, InferError::Input(_)), "{text_only}");
    }

    #[test]
    fn measure_runs_warmup_then_timed_iterations_and_passes_errors_on() {
        let mut seen = vec![];
        let m = measure(
            Device::Cpu,
            Iterations {
                warmup: 2,
                timed: 3,
            },
            |i| {
                seen.push(i);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, [0, 1, 2, 3, 4]);
        assert_eq!(m.times_ms.len(), 3);
        assert_eq!(
            m.peak_memory_source,
            PeakMemorySource::ProcessRssHighWaterMark
        );
        if cfg!(target_os = "linux") {
            assert!(m.peak_memory_bytes.unwrap() > 0);
        }

        let err = measure(
            Device::Cpu,
            Iterations {
                warmup: 0,
                timed: 0,
            },
            |_| Ok(()),
        )
        .unwrap_err();
        assert!(err.to_string().contains("at least one timed iteration"));

        let err = measure(
            Device::Cpu,
            Iterations {
                warmup: 1,
                timed: 5,
            },
            |i| match i {
                3 => Err(InferError::Input("boom".to_owned())),
                _ => Ok(()),
            },
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "inputs: boom");
    }
}
