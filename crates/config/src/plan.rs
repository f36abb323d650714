//! Stage two: the validated, typed run plan. Options are enums, ranges are checked, and every
//! value carries its [`Provenance`]. Each key is parsed and checked by the key table
//! ([`crate::keys`]); here each section's values are placed in the plan, with the checks that
//! relate two keys.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln_core::DeviceRequest;
use kiln_core::settings::{AmpDtype, BackendSettings};
use serde::Serialize;

pub use kiln_core::options::{
    AttentionKernel, BlendMode, CudaGraphs, InferEngineKind, LossKind, MetricMode, MetricName,
    OptimizerKind, OutputDevice, PadMode, ProfileUnit, ScheduleKind,
};

use crate::ConfigError;
use crate::keys::{
    self, CheckpointValues, DataValues, DistributedValues, EarlyStoppingValues, EmaValues,
    InferValues, ModelValues, PerformanceValues, ProfilingValues, RawConfig, ServeValues,
    SlidingWindowValues, TrainValues, Values,
};
use crate::layers::Layer;
pub use crate::setting::KeepBest;
use crate::setting::{BatchSize, Checker, LearningRate, ValSteps, Workers};

/// Which layer set a value, and where exactly (file path, variable name, flag).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Provenance {
    pub layer: Layer,
    /// "TOML file /home/me/kiln.toml", "environment variable KILN_TRAIN__LR", …
    pub source: String,
    /// Why kiln changed a profile value for this machine, if it did.
    pub note: Option<String>,
}

/// Performance settings for the run: the backend settings `kiln-device` applies, plus the ones
/// the trainer honours itself.
#[derive(Debug, Clone, PartialEq)]
pub struct PerformancePlan {
    pub backend: BackendSettings,
    /// Empty the CUDA cache every N steps; 0 = never.
    pub empty_cache_interval: u64,
    pub channels_last: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DataPlan {
    /// Loader threads; with `num_workers_auto`, the most the measurement tries (the profile's
    /// count, capped by the machine's cores).
    pub num_workers: u64,
    /// `data.num_workers = auto`: the trainer measures the count on the first steps.
    pub num_workers_auto: bool,
    pub prefetch_factor: u64,
    /// Share of the samples held out for validation, in [0, 1).
    pub val_fraction: f64,
    /// For a windowed dataset: the last steps of every series held out for validation;
    /// `None`: the dataset's horizon.
    pub val_steps: Option<u64>,
    /// Size of the built-in synthetic dataset.
    pub synthetic_samples: u64,
}

/// The model a run trains: one of the built-in reference models, or the user's own PyTorch
/// module saved as TorchScript (its path is [`ModelPlan::script`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    Transformer,
    Mlp,
    ConvNet,
    /// A small 3-D U-Net segmenter (a class per voxel).
    Unet3d,
    /// A TorchScript module (`torch.jit.script(model.train()).save(path)`), the older format.
    TorchScript,
    /// A `torch.export` program (`torch.export.save(torch.export.export(…), path)`), trained
    /// through a compiled step.
    Program,
}

impl ModelKind {
    /// The built-in models.
    pub const ALL: [ModelKind; 4] = [Self::Transformer, Self::Mlp, Self::ConvNet, Self::Unet3d];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transformer => "transformer",
            Self::Mlp => "mlp",
            Self::ConvNet => "convnet",
            Self::Unet3d => "unet3d",
            Self::TorchScript => "torchscript",
            Self::Program => "program",
        }
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ModelKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| "use transformer, mlp, convnet or unet3d".to_owned())
    }
}

/// The model and its sizes (the sizes apply to the built-in models only).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlan {
    pub kind: ModelKind,
    /// The model file: TorchScript for [`ModelKind::TorchScript`], the `.pt2` program for
    /// [`ModelKind::Program`].
    pub script: Option<PathBuf>,
    /// The output the loss uses, for a program returning a dict or a tuple.
    pub output: Option<String>,
    /// A program's parameters kept at their values (names or prefixes, comma separated).
    pub freeze: Option<String>,
    /// The dataset arrays a TorchScript module's forward arguments get, in order (comma
    /// separated).
    pub inputs: Option<String>,
    /// The quantile levels of a forecaster's last output dimension (`model.quantiles`).
    pub quantiles: Option<Vec<f64>>,
    pub dropout: f64,
    pub d_model: u64,
    pub heads: u64,
    pub layers: u64,
    pub ff: u64,
    pub hidden: Vec<u64>,
    pub channels: Vec<u64>,
    /// Recompute transformer layers' activations in backward (less memory, more compute).
    pub activation_checkpointing: bool,
    /// The attention kernel (`model.attention`).
    pub attention: AttentionKernel,
}

impl ModelPlan {
    /// The built-in model `kind` at the key table's default sizes, without dropout, a model
    /// file or activation checkpointing: what benches and tests start from, changing the sizes
    /// they need with struct update syntax.
    pub fn builtin(kind: ModelKind) -> Self {
        Self {
            kind,
            script: None,
            output: None,
            freeze: None,
            inputs: None,
            quantiles: None,
            dropout: 0.0,
            d_model: 256,
            heads: 8,
            layers: 4,
            ff: 1024,
            hidden: vec![256, 256],
            channels: vec![32, 64, 128],
            activation_checkpointing: false,
            attention: AttentionKernel::Auto,
        }
    }
}

/// The dynamic loss scaler's settings (fp16 only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScalePlan {
    pub init: f64,
    pub growth: f64,
    pub backoff: f64,
    pub growth_interval: u64,
}

/// The profiler's schedule and what it records (seed 002): skip `wait`, warm up for `warmup`,
/// record `active`, `repeat` times (0 = until the end). `active = 0` turns profiling off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfilingPlan {
    pub wait: u64,
    pub warmup: u64,
    pub active: u64,
    pub repeat: u64,
    pub unit: ProfileUnit,
    pub record_shapes: bool,
    pub profile_memory: bool,
    pub with_stack: bool,
}

impl ProfilingPlan {
    pub fn enabled(&self) -> bool {
        self.active > 0
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TrainPlan {
    /// The batch size; with `batch_size_auto`, where the search starts (the profile's value).
    pub batch_size: u64,
    /// `train.batch_size = "auto"`: search this machine for the batch size before training.
    pub batch_size_auto: bool,
    pub amp: AmpDtype,
    pub epochs: u64,
    /// The learning rate; with `lr_auto`, the fallback and the rate until the range test has
    /// found one (kiln's default, 1e-3).
    pub lr: f64,
    /// `train.lr = "auto"`: a learning-rate range test on the run's model and data before
    /// training, after the batch size is known.
    pub lr_auto: bool,
    pub optimizer: OptimizerKind,
    pub weight_decay: f64,
    pub momentum: f64,
    pub grad_accum_steps: u64,
    /// 0 = no clipping.
    pub clip_grad_norm: f64,
    pub schedule: ScheduleKind,
    pub warmup_steps: u64,
    pub min_lr: f64,
    pub loss_scale: LossScalePlan,
    pub log_interval: u64,
    pub max_bad_steps: u64,
    pub loss: LossKind,
    /// Whether a compiled train step is replayed as one CUDA graph.
    pub cuda_graphs: CudaGraphs,
    /// The run ends after this many optimizer steps (over resumes), if set.
    pub max_steps: Option<u64>,
    /// The run ends after this much training time (over resumes), if set.
    pub max_time: Option<std::time::Duration>,
    pub early_stopping: EarlyStoppingPlan,
    pub ema: EmaPlan,
}

/// `train.ema`: an exponential moving average of the weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmaPlan {
    /// 0: off.
    pub decay: f64,
    pub warmup: bool,
}

impl Default for EmaPlan {
    /// Off; when on, with the decay's warm-up (the key table's defaults).
    fn default() -> Self {
        Self {
            decay: 0.0,
            warmup: true,
        }
    }
}

impl EmaPlan {
    pub fn enabled(&self) -> bool {
        self.decay > 0.0
    }
}

/// `train.early_stopping`: end the run when a validation metric stops improving.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EarlyStoppingPlan {
    /// Off, the task's own metric, or one named.
    pub metric: KeepBest,
    pub mode: MetricMode,
    pub patience: u64,
    pub min_delta: f64,
}

impl Default for EarlyStoppingPlan {
    /// Off; when on, Lightning's defaults: patience 3, any improvement counts.
    fn default() -> Self {
        Self {
            metric: KeepBest::Off,
            mode: MetricMode::Auto,
            patience: 3,
            min_delta: 0.0,
        }
    }
}

/// When and how many checkpoints a run keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPlan {
    pub enabled: bool,
    /// Also every N optimizer steps; 0 = only at the end of each epoch.
    pub every_steps: u64,
    /// Also when this many seconds of training passed since the last one; 0 = off.
    pub every_seconds: u64,
    pub keep_last: u64,
    pub keep_best: KeepBest,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InferPlan {
    pub batch_size: u64,
    pub precision: AmpDtype,
    pub cuda_graphs: CudaGraphs,
    pub engine: InferEngineKind,
    /// Run a checkpoint's EMA weights.
    pub ema: bool,
    pub sliding_window: SlidingWindowPlan,
}

/// `infer.sliding_window`: windows over an input larger than the model takes.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindowPlan {
    /// The window's spatial size; one size for every dimension; 0 or less: the input's own.
    pub roi: Vec<i64>,
    pub overlap: f64,
    pub mode: BlendMode,
    pub sigma_scale: f64,
    pub batch_size: u64,
    pub padding_mode: PadMode,
    pub cval: f64,
    pub output_device: OutputDevice,
}

/// The `serve` section: the inference server's address and batching limits.
#[derive(Debug, Clone, PartialEq)]
pub struct ServePlan {
    pub host: std::net::IpAddr,
    pub port: u16,
    /// How long the first request of a batch waits for more.
    pub max_wait: std::time::Duration,
    pub queue_capacity: u64,
    pub max_body_bytes: u64,
    /// How long a request may take to arrive, from its first byte to its body's last.
    pub read_timeout: std::time::Duration,
    /// Connections open at once; beyond this, 503 and close.
    pub max_connections: u64,
}

/// The `distributed` section: how ranks of a data-parallel run wait for each other and bucket
/// their gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct DistributedPlan {
    /// How long a rank waits for the others before it fails.
    pub timeout: std::time::Duration,
    pub bucket_cap_mb: f64,
    pub first_bucket_mb: f64,
    pub find_unused_parameters: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub name: String,
    pub output_dir: PathBuf,
    /// TensorBoard event files in the run directory.
    pub tensorboard: bool,
}

/// Everything a run needs to know, typed and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub device_request: DeviceRequest,
    /// A profile forced by name (`device.profile`), if any.
    pub forced_profile: Option<String>,
    pub profiles_dir: Option<PathBuf>,
    pub performance: PerformancePlan,
    pub data: DataPlan,
    pub model: ModelPlan,
    pub train: TrainPlan,
    pub checkpoint: CheckpointPlan,
    pub infer: InferPlan,
    pub serve: ServePlan,
    pub profiling: ProfilingPlan,
    pub distributed: DistributedPlan,
    pub run: RunInfo,
    /// Where each value came from, by `section.key`.
    pub provenance: BTreeMap<String, Provenance>,
}

impl RunPlan {
    /// The provenance of `key` (every key has one).
    pub fn source_of(&self, key: &str) -> Option<&Provenance> {
        self.provenance.get(key)
    }
}

/// What the profile gives the keys set to `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProfileStarts {
    /// Where a `train.batch_size = "auto"` search starts.
    pub batch_size: u64,
    /// The most loader threads `data.num_workers = "auto"` tries.
    pub workers: u64,
}

/// Validates layered raw values: each key on its own (the key table), then each section's
/// relations between keys as it is placed in the plan, the profile's values standing in for
/// `"auto"` ([`ProfileStarts`]).
pub(crate) fn validate(
    raw: RawConfig,
    provenance: BTreeMap<String, Provenance>,
    starts: ProfileStarts,
) -> Result<RunPlan, ConfigError> {
    let check = Checker::new(&provenance);
    let v = Values::read(raw, &check)?;
    let model = model_plan(v.model, &check)?;
    let train = train_plan(
        v.train,
        (v.early_stopping, v.ema),
        starts.batch_size,
        &check,
    )?;
    let d = v.device;
    Ok(RunPlan {
        device_request: d.request,
        forced_profile: d.profile,
        profiles_dir: d.profiles_dir,
        performance: performance_plan(v.performance),
        data: data_plan(v.data, starts.workers),
        model,
        train,
        checkpoint: checkpoint_plan(v.checkpoint),
        infer: infer_plan(v.infer, v.sliding_window),
        serve: serve_plan(v.serve),
        profiling: profiling_plan(v.profiling),
        distributed: distributed_plan(v.distributed),
        run: RunInfo {
            name: v.run.name,
            output_dir: v.run.output_dir,
            tensorboard: v.run.tensorboard,
        },
        provenance,
    })
}

fn performance_plan(v: PerformanceValues) -> PerformancePlan {
    PerformancePlan {
        backend: BackendSettings {
            tf32: v.tf32,
            matmul_precision: v.matmul_precision,
            cudnn_benchmark: v.cudnn_benchmark,
            cudnn_deterministic: v.cudnn_deterministic,
            deterministic: v.deterministic,
            memory_fraction: v.memory_fraction,
            intra_op_threads: v.intra_op_threads,
            inter_op_threads: v.inter_op_threads,
            seed: v.seed,
            malloc_tuning: v.malloc_tuning,
        },
        empty_cache_interval: v.empty_cache_interval,
        channels_last: v.channels_last,
    }
}

fn data_plan(v: DataValues, worker_ceiling: u64) -> DataPlan {
    let (num_workers, num_workers_auto) = match v.num_workers {
        Workers::Fixed(n) => (n, false),
        Workers::Auto => (worker_ceiling, true),
    };
    DataPlan {
        num_workers,
        num_workers_auto,
        prefetch_factor: v.prefetch_factor,
        val_fraction: v.val_fraction,
        val_steps: match v.val_steps {
            ValSteps::Horizon => None,
            ValSteps::Steps(n) => Some(n),
        },
        synthetic_samples: v.synthetic_samples,
    }
}

fn model_plan(v: ModelValues, check: &Checker<'_>) -> Result<ModelPlan, ConfigError> {
    if !v.d_model.is_multiple_of(v.heads) {
        return Err(check.invalid(
            keys::model::heads,
            v.heads.to_string(),
            format!("must divide {} ({})", keys::model::d_model, v.d_model),
        ));
    }
    Ok(ModelPlan {
        kind: v.name.kind,
        script: v.name.script,
        output: v.output,
        freeze: v.freeze,
        inputs: v.inputs,
        quantiles: v.quantiles.map(|q| q.0),
        dropout: v.dropout,
        d_model: v.d_model,
        heads: v.heads,
        layers: v.layers,
        ff: v.ff,
        hidden: v.hidden.0,
        channels: v.channels.0,
        activation_checkpointing: v.activation_checkpointing,
        attention: v.attention,
    })
}

/// `train.lr`'s default, and the rate `train.lr = "auto"` falls back to until its range test
/// has run.
pub const DEFAULT_LR: f64 = 1e-3;

fn train_plan(
    v: TrainValues,
    (stop, ema): (EarlyStoppingValues, EmaValues),
    auto_batch_start: u64,
    check: &Checker<'_>,
) -> Result<TrainPlan, ConfigError> {
    if let LearningRate::Fixed(lr) = v.lr
        && v.min_lr > lr
    {
        return Err(check.invalid(
            keys::train::min_lr,
            v.min_lr.to_string(),
            format!("must not exceed {} ({lr})", keys::train::lr),
        ));
    }
    if v.cuda_graphs == CudaGraphs::On {
        let clash = if v.amp == AmpDtype::Fp16 {
            Some((
                keys::train::amp,
                "fp16",
                "bf16 or fp32: fp16's loss scaler decides on the host",
            ))
        } else if v.optimizer == OptimizerKind::Sgd {
            Some((
                keys::train::optimizer,
                "sgd",
                "adamw: only AdamW reads its learning rate from the device",
            ))
        } else if v.grad_accum_steps > 1 {
            Some((
                keys::train::grad_accum_steps,
                "more than 1",
                "1: a step of several micro-batches is not one graph",
            ))
        } else {
            None
        };
        if let Some((key, value, expected)) = clash {
            return Err(check.invalid(
                key,
                value.to_owned(),
                format!("{expected} ({} = on)", keys::train::cuda_graphs),
            ));
        }
    }
    let (lr, lr_auto) = match v.lr {
        LearningRate::Fixed(x) => (x, false),
        LearningRate::Auto => (DEFAULT_LR, true),
    };
    let (batch_size, batch_size_auto) = match v.batch_size {
        BatchSize::Fixed(n) => (n, false),
        BatchSize::Auto => (auto_batch_start.max(1), true),
    };
    Ok(TrainPlan {
        batch_size,
        batch_size_auto,
        amp: v.amp,
        epochs: v.epochs,
        lr,
        lr_auto,
        optimizer: v.optimizer,
        weight_decay: v.weight_decay,
        momentum: v.momentum,
        grad_accum_steps: v.grad_accum_steps,
        clip_grad_norm: v.clip_grad_norm,
        schedule: v.schedule,
        warmup_steps: v.warmup_steps,
        min_lr: v.min_lr,
        loss_scale: LossScalePlan {
            init: v.loss_scale_init,
            growth: v.loss_scale_growth,
            backoff: v.loss_scale_backoff,
            growth_interval: v.loss_scale_growth_interval,
        },
        log_interval: v.log_interval,
        max_bad_steps: v.max_bad_steps,
        loss: v.loss,
        cuda_graphs: v.cuda_graphs,
        max_steps: (v.max_steps > 0).then_some(v.max_steps),
        max_time: v.max_time.0,
        early_stopping: EarlyStoppingPlan {
            metric: stop.metric,
            mode: stop.mode,
            patience: stop.patience,
            min_delta: stop.min_delta,
        },
        ema: EmaPlan {
            decay: ema.decay,
            warmup: ema.warmup,
        },
    })
}

fn checkpoint_plan(v: CheckpointValues) -> CheckpointPlan {
    CheckpointPlan {
        enabled: v.enabled,
        every_steps: v.every_steps,
        every_seconds: v.every_seconds,
        keep_last: v.keep_last,
        keep_best: v.keep_best,
    }
}

fn infer_plan(v: InferValues, w: SlidingWindowValues) -> InferPlan {
    InferPlan {
        batch_size: v.batch_size,
        precision: v.precision,
        cuda_graphs: v.cuda_graphs,
        engine: v.engine,
        ema: v.ema,
        sliding_window: SlidingWindowPlan {
            roi: w.roi.0,
            overlap: w.overlap,
            mode: w.mode,
            sigma_scale: w.sigma_scale,
            batch_size: w.batch_size,
            padding_mode: w.padding_mode,
            cval: w.cval,
            output_device: w.output_device,
        },
    }
}

fn serve_plan(v: ServeValues) -> ServePlan {
    ServePlan {
        host: v.host,
        port: v.port.0,
        max_wait: std::time::Duration::from_secs_f64(v.max_wait_ms / 1e3),
        queue_capacity: v.queue_capacity,
        max_body_bytes: v.max_body_bytes,
        read_timeout: std::time::Duration::from_secs_f64(v.read_timeout_s),
        max_connections: v.max_connections,
    }
}

fn distributed_plan(v: DistributedValues) -> DistributedPlan {
    DistributedPlan {
        timeout: std::time::Duration::from_secs_f64(v.timeout_s),
        bucket_cap_mb: v.bucket_cap_mb,
        first_bucket_mb: v.first_bucket_mb,
        find_unused_parameters: v.find_unused_parameters,
    }
}

fn profiling_plan(v: ProfilingValues) -> ProfilingPlan {
    ProfilingPlan {
        wait: v.wait,
        warmup: v.warmup,
        active: v.active,
        repeat: v.repeat,
        unit: v.unit,
        record_shapes: v.record_shapes,
        profile_memory: v.profile_memory,
        with_stack: v.with_stack,
    }
}
