//! Stage two: the validated, typed run plan. Options are enums, ranges are checked, and every
//! value carries its [`Provenance`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln_core::settings::{AmpDtype, BackendSettings, Determinism, MatmulPrecision};
use kiln_core::{DeviceRequest, OptionError};
use serde::Serialize;

pub use kiln_core::options::{CudaGraphs, LossKind, OptimizerKind, ProfileUnit, ScheduleKind};

use crate::ConfigError;
use crate::layers::Layer;
use crate::raw::{RawBatchSize, RawConfig};

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
    pub num_workers: u64,
    pub prefetch_factor: u64,
    /// Share of the samples held out for validation, in [0, 1).
    pub val_fraction: f64,
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
    /// A TorchScript module (`torch.jit.script(model.train()).save(path)`).
    TorchScript,
}

impl ModelKind {
    /// The built-in models.
    pub const ALL: [ModelKind; 3] = [Self::Transformer, Self::Mlp, Self::ConvNet];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transformer => "transformer",
            Self::Mlp => "mlp",
            Self::ConvNet => "convnet",
            Self::TorchScript => "torchscript",
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
            .ok_or_else(|| "use transformer, mlp or convnet".to_owned())
    }
}

/// The model and its sizes (the sizes apply to the built-in models only).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlan {
    pub kind: ModelKind,
    /// The TorchScript file, for [`ModelKind::TorchScript`].
    pub script: Option<PathBuf>,
    pub dropout: f64,
    pub d_model: u64,
    pub heads: u64,
    pub layers: u64,
    pub ff: u64,
    pub hidden: Vec<u64>,
    pub channels: Vec<u64>,
    /// Recompute transformer layers' activations in backward (less memory, more compute).
    pub activation_checkpointing: bool,
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
    pub lr: f64,
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
}

/// When and how many checkpoints a run keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPlan {
    pub enabled: bool,
    /// Also every N optimizer steps; 0 = only at the end of each epoch.
    pub every_steps: u64,
    pub keep_last: u64,
    pub keep_best: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InferPlan {
    pub batch_size: u64,
    pub precision: AmpDtype,
    pub cuda_graphs: CudaGraphs,
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
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub name: String,
    pub output_dir: PathBuf,
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
    pub run: RunInfo,
    /// Where each value came from, by `section.key`.
    pub provenance: BTreeMap<String, Provenance>,
}

fn join(values: &[u64]) -> String {
    values
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl RunPlan {
    /// Every key with its resolved value as text, in the order of [`crate::raw::KEYS`].
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let p = &self.performance.backend;
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".to_owned());
        vec![
            ("device.request", self.device_request.to_string()),
            ("device.profile", opt(&self.forced_profile)),
            (
                "device.profiles_dir",
                opt(&self.profiles_dir.as_ref().map(|d| d.display().to_string())),
            ),
            ("performance.tf32", p.tf32.to_string()),
            (
                "performance.matmul_precision",
                p.matmul_precision.to_string(),
            ),
            ("performance.cudnn_benchmark", p.cudnn_benchmark.to_string()),
            (
                "performance.cudnn_deterministic",
                p.cudnn_deterministic.to_string(),
            ),
            ("performance.deterministic", p.deterministic.to_string()),
            ("performance.memory_fraction", p.memory_fraction.to_string()),
            (
                "performance.empty_cache_interval",
                self.performance.empty_cache_interval.to_string(),
            ),
            (
                "performance.channels_last",
                self.performance.channels_last.to_string(),
            ),
            (
                "performance.intra_op_threads",
                p.intra_op_threads.to_string(),
            ),
            (
                "performance.inter_op_threads",
                p.inter_op_threads.to_string(),
            ),
            ("performance.seed", p.seed.to_string()),
            ("data.num_workers", self.data.num_workers.to_string()),
            (
                "data.prefetch_factor",
                self.data.prefetch_factor.to_string(),
            ),
            ("data.val_fraction", self.data.val_fraction.to_string()),
            (
                "data.synthetic_samples",
                self.data.synthetic_samples.to_string(),
            ),
            (
                "model.name",
                match &self.model.script {
                    Some(path) => path.display().to_string(),
                    None => self.model.kind.to_string(),
                },
            ),
            ("model.dropout", self.model.dropout.to_string()),
            ("model.d_model", self.model.d_model.to_string()),
            ("model.heads", self.model.heads.to_string()),
            ("model.layers", self.model.layers.to_string()),
            ("model.ff", self.model.ff.to_string()),
            ("model.hidden", join(&self.model.hidden)),
            ("model.channels", join(&self.model.channels)),
            (
                "model.activation_checkpointing",
                self.model.activation_checkpointing.to_string(),
            ),
            (
                "train.batch_size",
                if self.train.batch_size_auto {
                    format!("auto (search starts at {})", self.train.batch_size)
                } else {
                    self.train.batch_size.to_string()
                },
            ),
            ("train.amp", self.train.amp.to_string()),
            ("train.epochs", self.train.epochs.to_string()),
            ("train.lr", self.train.lr.to_string()),
            ("train.optimizer", self.train.optimizer.to_string()),
            ("train.weight_decay", self.train.weight_decay.to_string()),
            ("train.momentum", self.train.momentum.to_string()),
            (
                "train.grad_accum_steps",
                self.train.grad_accum_steps.to_string(),
            ),
            (
                "train.clip_grad_norm",
                self.train.clip_grad_norm.to_string(),
            ),
            ("train.schedule", self.train.schedule.to_string()),
            ("train.warmup_steps", self.train.warmup_steps.to_string()),
            ("train.min_lr", self.train.min_lr.to_string()),
            (
                "train.loss_scale_init",
                self.train.loss_scale.init.to_string(),
            ),
            (
                "train.loss_scale_growth",
                self.train.loss_scale.growth.to_string(),
            ),
            (
                "train.loss_scale_backoff",
                self.train.loss_scale.backoff.to_string(),
            ),
            (
                "train.loss_scale_growth_interval",
                self.train.loss_scale.growth_interval.to_string(),
            ),
            ("train.log_interval", self.train.log_interval.to_string()),
            ("train.max_bad_steps", self.train.max_bad_steps.to_string()),
            ("train.loss", self.train.loss.to_string()),
            ("checkpoint.enabled", self.checkpoint.enabled.to_string()),
            (
                "checkpoint.every_steps",
                self.checkpoint.every_steps.to_string(),
            ),
            (
                "checkpoint.keep_last",
                self.checkpoint.keep_last.to_string(),
            ),
            (
                "checkpoint.keep_best",
                self.checkpoint.keep_best.to_string(),
            ),
            ("infer.batch_size", self.infer.batch_size.to_string()),
            ("infer.precision", self.infer.precision.to_string()),
            ("infer.cuda_graphs", self.infer.cuda_graphs.to_string()),
            ("serve.host", self.serve.host.to_string()),
            ("serve.port", self.serve.port.to_string()),
            (
                "serve.max_wait_ms",
                (self.serve.max_wait.as_secs_f64() * 1e3).to_string(),
            ),
            (
                "serve.queue_capacity",
                self.serve.queue_capacity.to_string(),
            ),
            (
                "serve.max_body_bytes",
                self.serve.max_body_bytes.to_string(),
            ),
            ("profiling.wait", self.profiling.wait.to_string()),
            ("profiling.warmup", self.profiling.warmup.to_string()),
            ("profiling.active", self.profiling.active.to_string()),
            ("profiling.repeat", self.profiling.repeat.to_string()),
            ("profiling.unit", self.profiling.unit.to_string()),
            (
                "profiling.record_shapes",
                self.profiling.record_shapes.to_string(),
            ),
            (
                "profiling.profile_memory",
                self.profiling.profile_memory.to_string(),
            ),
            (
                "profiling.with_stack",
                self.profiling.with_stack.to_string(),
            ),
            ("run.name", self.run.name.clone()),
            ("run.output_dir", self.run.output_dir.display().to_string()),
        ]
    }

    /// The provenance of `key` (every key has one).
    pub fn source_of(&self, key: &str) -> Option<&Provenance> {
        self.provenance.get(key)
    }
}

/// Validates layered raw values. `source` names the layer that set a key, for error messages.
/// `auto_batch_start` is the profile's batch size, where an `"auto"` search starts.
pub(crate) fn validate(
    raw: RawConfig,
    provenance: BTreeMap<String, Provenance>,
    auto_batch_start: u64,
) -> Result<RunPlan, ConfigError> {
    let source = |key: &str| {
        provenance.get(key).map_or_else(
            || "kiln's built-in defaults".to_owned(),
            |p| p.source.clone(),
        )
    };
    let invalid = |key: &str, value: String, expected: String| ConfigError::InvalidValue {
        key: key.to_owned(),
        value,
        expected,
        set_by: source(key),
    };
    let missing = |key: &str| ConfigError::Other(format!("`{key}` has no value in any layer"));
    macro_rules! need {
        ($v:expr, $key:literal) => {
            $v.ok_or_else(|| missing($key))?
        };
    }
    let at_least_1 = |key: &str, v: u64| {
        if v >= 1 {
            Ok(v)
        } else {
            Err(invalid(key, v.to_string(), "must be at least 1".to_owned()))
        }
    };
    // An option's word, parsed by its enum; the error says what is valid.
    macro_rules! option {
        ($v:expr, $key:literal) => {{
            let text = need!($v, $key);
            text.parse()
                .map_err(|e: OptionError| invalid($key, format!("{text:?}"), e.usage()))?
        }};
    }

    let request_text = need!(raw.device.request, "device.request");
    let device_request = request_text.parse::<DeviceRequest>().map_err(|_| {
        invalid(
            "device.request",
            format!("{request_text:?}"),
            "use one of auto, cpu, cuda, cuda:N, mps".to_owned(),
        )
    })?;

    let p = raw.performance;
    let matmul_precision: MatmulPrecision =
        option!(p.matmul_precision, "performance.matmul_precision");
    let deterministic: Determinism = option!(p.deterministic, "performance.deterministic");
    let memory_fraction = need!(p.memory_fraction, "performance.memory_fraction");
    if !(memory_fraction > 0.0 && memory_fraction <= 1.0) {
        return Err(invalid(
            "performance.memory_fraction",
            memory_fraction.to_string(),
            "must be in (0, 1]".to_owned(),
        ));
    }
    let performance = PerformancePlan {
        backend: BackendSettings {
            tf32: need!(p.tf32, "performance.tf32"),
            matmul_precision,
            cudnn_benchmark: need!(p.cudnn_benchmark, "performance.cudnn_benchmark"),
            cudnn_deterministic: need!(p.cudnn_deterministic, "performance.cudnn_deterministic"),
            deterministic,
            memory_fraction,
            intra_op_threads: need!(p.intra_op_threads, "performance.intra_op_threads"),
            inter_op_threads: need!(p.inter_op_threads, "performance.inter_op_threads"),
            seed: need!(p.seed, "performance.seed"),
        },
        empty_cache_interval: need!(p.empty_cache_interval, "performance.empty_cache_interval"),
        channels_last: need!(p.channels_last, "performance.channels_last"),
    };

    let in_range = |key: &str, v: f64, ok: bool, expected: &str| {
        if ok && v.is_finite() {
            Ok(v)
        } else {
            Err(invalid(key, v.to_string(), expected.to_owned()))
        }
    };
    let val_fraction = need!(raw.data.val_fraction, "data.val_fraction");
    let data = DataPlan {
        num_workers: need!(raw.data.num_workers, "data.num_workers"),
        prefetch_factor: at_least_1(
            "data.prefetch_factor",
            need!(raw.data.prefetch_factor, "data.prefetch_factor"),
        )?,
        val_fraction: in_range(
            "data.val_fraction",
            val_fraction,
            (0.0..1.0).contains(&val_fraction),
            "must be in [0, 1)",
        )?,
        synthetic_samples: at_least_1(
            "data.synthetic_samples",
            need!(raw.data.synthetic_samples, "data.synthetic_samples"),
        )?,
    };

    let m = raw.model;
    let name = need!(m.name, "model.name");
    let (kind, script) =
        model_of(&name).map_err(|e| invalid("model.name", format!("{name:?}"), e))?;
    let widths = |key: &str, text: String| -> Result<Vec<u64>, ConfigError> {
        let parsed: Option<Vec<u64>> = text
            .split(',')
            .map(|w| w.trim().parse::<u64>().ok().filter(|&w| w >= 1))
            .collect();
        parsed.filter(|v| !v.is_empty()).ok_or_else(|| {
            invalid(
                key,
                format!("{text:?}"),
                "use comma-separated widths of at least 1, like \"256,256\"".to_owned(),
            )
        })
    };
    let dropout = need!(m.dropout, "model.dropout");
    let d_model = at_least_1("model.d_model", need!(m.d_model, "model.d_model"))?;
    let heads = at_least_1("model.heads", need!(m.heads, "model.heads"))?;
    if d_model % heads != 0 {
        return Err(invalid(
            "model.heads",
            heads.to_string(),
            format!("must divide model.d_model ({d_model})"),
        ));
    }
    let model = ModelPlan {
        kind,
        script,
        dropout: in_range(
            "model.dropout",
            dropout,
            (0.0..1.0).contains(&dropout),
            "must be in [0, 1)",
        )?,
        d_model,
        heads,
        layers: at_least_1("model.layers", need!(m.layers, "model.layers"))?,
        ff: at_least_1("model.ff", need!(m.ff, "model.ff"))?,
        hidden: widths("model.hidden", need!(m.hidden, "model.hidden"))?,
        channels: widths("model.channels", need!(m.channels, "model.channels"))?,
        activation_checkpointing: need!(
            m.activation_checkpointing,
            "model.activation_checkpointing"
        ),
    };

    let t = raw.train;
    let lr = need!(t.lr, "train.lr");
    let lr = in_range("train.lr", lr, lr > 0.0, "must be a number > 0")?;
    let optimizer: OptimizerKind = option!(t.optimizer, "train.optimizer");
    let schedule: ScheduleKind = option!(t.schedule, "train.schedule");
    let non_negative = |key: &str, v: f64| in_range(key, v, v >= 0.0, "must be a number >= 0");
    let momentum = need!(t.momentum, "train.momentum");
    let min_lr = non_negative("train.min_lr", need!(t.min_lr, "train.min_lr"))?;
    if min_lr > lr {
        return Err(invalid(
            "train.min_lr",
            min_lr.to_string(),
            format!("must not exceed train.lr ({lr})"),
        ));
    }
    let growth = need!(t.loss_scale_growth, "train.loss_scale_growth");
    let backoff = need!(t.loss_scale_backoff, "train.loss_scale_backoff");
    let init = need!(t.loss_scale_init, "train.loss_scale_init");
    let (batch_size, batch_size_auto) = match need!(t.batch_size, "train.batch_size") {
        RawBatchSize::Number(n) => (at_least_1("train.batch_size", n)?, false),
        RawBatchSize::Text(text) if text.trim().eq_ignore_ascii_case("auto") => {
            (auto_batch_start.max(1), true)
        }
        RawBatchSize::Text(text) => {
            return Err(invalid(
                "train.batch_size",
                format!("{text:?}"),
                "use a whole number of at least 1, or \"auto\" to search this machine for one"
                    .to_owned(),
            ));
        }
    };
    let train = TrainPlan {
        batch_size,
        batch_size_auto,
        amp: option!(t.amp, "train.amp"),
        epochs: at_least_1("train.epochs", need!(t.epochs, "train.epochs"))?,
        lr,
        optimizer,
        weight_decay: non_negative(
            "train.weight_decay",
            need!(t.weight_decay, "train.weight_decay"),
        )?,
        momentum: in_range(
            "train.momentum",
            momentum,
            (0.0..1.0).contains(&momentum),
            "must be in [0, 1)",
        )?,
        grad_accum_steps: at_least_1(
            "train.grad_accum_steps",
            need!(t.grad_accum_steps, "train.grad_accum_steps"),
        )?,
        clip_grad_norm: non_negative(
            "train.clip_grad_norm",
            need!(t.clip_grad_norm, "train.clip_grad_norm"),
        )?,
        schedule,
        warmup_steps: need!(t.warmup_steps, "train.warmup_steps"),
        min_lr,
        loss_scale: LossScalePlan {
            init: in_range("train.loss_scale_init", init, init > 0.0, "must be > 0")?,
            growth: in_range(
                "train.loss_scale_growth",
                growth,
                growth > 1.0,
                "must be > 1",
            )?,
            backoff: in_range(
                "train.loss_scale_backoff",
                backoff,
                backoff > 0.0 && backoff < 1.0,
                "must be in (0, 1)",
            )?,
            growth_interval: at_least_1(
                "train.loss_scale_growth_interval",
                need!(
                    t.loss_scale_growth_interval,
                    "train.loss_scale_growth_interval"
                ),
            )?,
        },
        log_interval: at_least_1(
            "train.log_interval",
            need!(t.log_interval, "train.log_interval"),
        )?,
        max_bad_steps: at_least_1(
            "train.max_bad_steps",
            need!(t.max_bad_steps, "train.max_bad_steps"),
        )?,
        loss: option!(t.loss, "train.loss"),
    };
    let c = raw.checkpoint;
    let checkpoint = CheckpointPlan {
        enabled: need!(c.enabled, "checkpoint.enabled"),
        every_steps: need!(c.every_steps, "checkpoint.every_steps"),
        keep_last: at_least_1(
            "checkpoint.keep_last",
            need!(c.keep_last, "checkpoint.keep_last"),
        )?,
        keep_best: need!(c.keep_best, "checkpoint.keep_best"),
    };
    let infer = InferPlan {
        batch_size: at_least_1(
            "infer.batch_size",
            need!(raw.infer.batch_size, "infer.batch_size"),
        )?,
        precision: option!(raw.infer.precision, "infer.precision"),
        cuda_graphs: option!(raw.infer.cuda_graphs, "infer.cuda_graphs"),
    };
    let sv = raw.serve;
    let host_text = need!(sv.host, "serve.host");
    let host = host_text.trim().parse::<std::net::IpAddr>().map_err(|_| {
        invalid(
            "serve.host",
            format!("{host_text:?}"),
            "must be an IP address such as 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
                .to_owned(),
        )
    })?;
    let port = need!(sv.port, "serve.port");
    let port = u16::try_from(port).map_err(|_| {
        invalid(
            "serve.port",
            port.to_string(),
            "must be a TCP port, 0 to 65535 (0 = any free port)".to_owned(),
        )
    })?;
    let max_wait_ms = need!(sv.max_wait_ms, "serve.max_wait_ms");
    let max_wait_ms = in_range(
        "serve.max_wait_ms",
        max_wait_ms,
        (0.0..=10_000.0).contains(&max_wait_ms),
        "must be in [0, 10000] milliseconds",
    )?;
    let serve = ServePlan {
        host,
        port,
        max_wait: std::time::Duration::from_secs_f64(max_wait_ms / 1e3),
        queue_capacity: at_least_1(
            "serve.queue_capacity",
            need!(sv.queue_capacity, "serve.queue_capacity"),
        )?,
        max_body_bytes: at_least_1(
            "serve.max_body_bytes",
            need!(sv.max_body_bytes, "serve.max_body_bytes"),
        )?,
    };
    let pr = raw.profiling;
    let profiling = ProfilingPlan {
        wait: need!(pr.wait, "profiling.wait"),
        warmup: need!(pr.warmup, "profiling.warmup"),
        active: need!(pr.active, "profiling.active"),
        repeat: need!(pr.repeat, "profiling.repeat"),
        unit: option!(pr.unit, "profiling.unit"),
        record_shapes: need!(pr.record_shapes, "profiling.record_shapes"),
        profile_memory: need!(pr.profile_memory, "profiling.profile_memory"),
        with_stack: need!(pr.with_stack, "profiling.with_stack"),
    };
    let name = need!(raw.run.name, "run.name");
    if name.is_empty() || name.contains(['/', '\\']) {
        return Err(invalid(
            "run.name",
            format!("{name:?}"),
            "must be a non-empty name without path separators".to_owned(),
        ));
    }
    Ok(RunPlan {
        device_request,
        forced_profile: raw.device.profile,
        profiles_dir: raw.device.profiles_dir.map(PathBuf::from),
        performance,
        data,
        model,
        train,
        checkpoint,
        infer,
        serve,
        profiling,
        run: RunInfo {
            name,
            output_dir: PathBuf::from(need!(raw.run.output_dir, "run.output_dir")),
        },
        provenance,
    })
}

/// `model.name`: a built-in model's name, or the path of a TorchScript file (one ending in
/// `.pt`, `.pth` or `.ts`, or any existing file).
fn model_of(name: &str) -> Result<(ModelKind, Option<PathBuf>), String> {
    if let Ok(kind) = name.parse::<ModelKind>() {
        return Ok((kind, None));
    }
    let path = PathBuf::from(name.trim());
    let scripted = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("pt" | "pth" | "ts")
    );
    if scripted || path.is_file() {
        Ok((ModelKind::TorchScript, Some(path)))
    } else {
        Err(
            "use transformer, mlp or convnet, or the path of a TorchScript file (.pt) saved \
             with torch.jit.script(model.train()).save(path)"
                .to_owned(),
        )
    }
}
