//! Stage one: the layered values as the user wrote them, one struct per section, every field
//! optional, unknown keys rejected. Numbers may arrive as strings from the environment
//! (`KILN_TRAIN__LR=5e-4`), so numeric fields accept both.

use serde::{Deserialize, Deserializer, Serialize};

/// Every section; the field names are the keys users write.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub device: RawDevice,
    pub performance: RawPerformance,
    pub data: RawData,
    pub model: RawModel,
    pub train: RawTrain,
    pub checkpoint: RawCheckpoint,
    pub infer: RawInfer,
    pub serve: RawServe,
    pub profiling: RawProfiling,
    pub run: RawRun,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDevice {
    /// auto, cpu, cuda, cuda:N or mps.
    pub request: Option<String>,
    /// Use this profile by name instead of matching the GPU.
    pub profile: Option<String>,
    /// A directory of profile TOML files that add to or override the built-in ones.
    pub profiles_dir: Option<String>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPerformance {
    pub tf32: Option<bool>,
    pub matmul_precision: Option<String>,
    pub cudnn_benchmark: Option<bool>,
    pub cudnn_deterministic: Option<bool>,
    /// off, warn or error (torch.use_deterministic_algorithms).
    pub deterministic: Option<String>,
    #[serde(deserialize_with = "lenient_f64")]
    pub memory_fraction: Option<f64>,
    #[serde(deserialize_with = "lenient_u64")]
    pub empty_cache_interval: Option<u64>,
    pub channels_last: Option<bool>,
    #[serde(deserialize_with = "lenient_u64")]
    pub intra_op_threads: Option<u64>,
    #[serde(deserialize_with = "lenient_u64")]
    pub inter_op_threads: Option<u64>,
    #[serde(deserialize_with = "lenient_u64")]
    pub seed: Option<u64>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawData {
    #[serde(deserialize_with = "lenient_u64")]
    pub num_workers: Option<u64>,
    #[serde(deserialize_with = "lenient_u64")]
    pub prefetch_factor: Option<u64>,
    /// Share of the dataset held out for validation, in [0, 1).
    #[serde(deserialize_with = "lenient_f64")]
    pub val_fraction: Option<f64>,
    /// Size of the built-in synthetic dataset (train and validation together).
    #[serde(deserialize_with = "lenient_u64")]
    pub synthetic_samples: Option<u64>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawModel {
    /// transformer, mlp or convnet.
    pub name: Option<String>,
    #[serde(deserialize_with = "lenient_f64")]
    pub dropout: Option<f64>,
    #[serde(deserialize_with = "lenient_u64")]
    pub d_model: Option<u64>,
    #[serde(deserialize_with = "lenient_u64")]
    pub heads: Option<u64>,
    #[serde(deserialize_with = "lenient_u64")]
    pub layers: Option<u64>,
    #[serde(deserialize_with = "lenient_u64")]
    pub ff: Option<u64>,
    /// MLP hidden widths, comma separated ("256,256"; one width may be a plain number).
    #[serde(deserialize_with = "widths")]
    pub hidden: Option<String>,
    /// Conv net channels per stage, comma separated ("32,64,128").
    #[serde(deserialize_with = "widths")]
    pub channels: Option<String>,
    /// Recompute each transformer layer's activations in backward instead of keeping them.
    pub activation_checkpointing: Option<bool>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTrain {
    /// A number, or "auto" to search for one on this machine.
    #[serde(deserialize_with = "batch_size")]
    pub batch_size: Option<RawBatchSize>,
    /// fp32, fp16 or bf16 (none is accepted for fp32).
    pub amp: Option<String>,
    #[serde(deserialize_with = "lenient_u64")]
    pub epochs: Option<u64>,
    #[serde(deserialize_with = "lenient_f64")]
    pub lr: Option<f64>,
    /// adamw or sgd.
    pub optimizer: Option<String>,
    #[serde(deserialize_with = "lenient_f64")]
    pub weight_decay: Option<f64>,
    #[serde(deserialize_with = "lenient_f64")]
    pub momentum: Option<f64>,
    #[serde(deserialize_with = "lenient_u64")]
    pub grad_accum_steps: Option<u64>,
    /// Clip the global gradient norm to this; 0 = off.
    #[serde(deserialize_with = "lenient_f64")]
    pub clip_grad_norm: Option<f64>,
    /// constant or cosine (linear warmup, then cosine decay to min_lr).
    pub schedule: Option<String>,
    #[serde(deserialize_with = "lenient_u64")]
    pub warmup_steps: Option<u64>,
    #[serde(deserialize_with = "lenient_f64")]
    pub min_lr: Option<f64>,
    #[serde(deserialize_with = "lenient_f64")]
    pub loss_scale_init: Option<f64>,
    #[serde(deserialize_with = "lenient_f64")]
    pub loss_scale_growth: Option<f64>,
    #[serde(deserialize_with = "lenient_f64")]
    pub loss_scale_backoff: Option<f64>,
    #[serde(deserialize_with = "lenient_u64")]
    pub loss_scale_growth_interval: Option<u64>,
    /// Print a progress line every N optimizer steps when not on a terminal.
    #[serde(deserialize_with = "lenient_u64")]
    pub log_interval: Option<u64>,
    /// Stop after this many consecutive steps with non-finite gradients (fp32/bf16).
    #[serde(deserialize_with = "lenient_u64")]
    pub max_bad_steps: Option<u64>,
    /// auto, cross_entropy, mse, l1, huber, bce_with_logits or module.
    pub loss: Option<String>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawCheckpoint {
    pub enabled: Option<bool>,
    /// Also checkpoint every N optimizer steps (0: only at the end of each epoch).
    #[serde(deserialize_with = "lenient_u64")]
    pub every_steps: Option<u64>,
    /// How many of the most recent checkpoints to keep.
    #[serde(deserialize_with = "lenient_u64")]
    pub keep_last: Option<u64>,
    /// Also keep the checkpoint with the best validation accuracy.
    pub keep_best: Option<bool>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawInfer {
    #[serde(deserialize_with = "lenient_u64")]
    pub batch_size: Option<u64>,
    /// fp32, fp16 or bf16 (none is accepted for fp32).
    pub precision: Option<String>,
    /// auto, on or off: replay CUDA graphs for static input shapes.
    pub cuda_graphs: Option<String>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServe {
    /// The address `kiln serve` binds.
    pub host: Option<String>,
    #[serde(deserialize_with = "lenient_u64")]
    pub port: Option<u64>,
    /// How long the first request of a batch waits for more, in milliseconds.
    #[serde(deserialize_with = "lenient_f64")]
    pub max_wait_ms: Option<f64>,
    /// Requests that may wait for a batch; beyond this the server answers 503.
    #[serde(deserialize_with = "lenient_u64")]
    pub queue_capacity: Option<u64>,
    /// The largest request body accepted.
    #[serde(deserialize_with = "lenient_u64")]
    pub max_body_bytes: Option<u64>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawProfiling {
    /// Steps (or epochs) to skip before each profiling cycle.
    #[serde(deserialize_with = "lenient_u64")]
    pub wait: Option<u64>,
    /// Steps (or epochs) the profiler runs without keeping events, before recording.
    #[serde(deserialize_with = "lenient_u64")]
    pub warmup: Option<u64>,
    /// Steps (or epochs) recorded per cycle; 0 = profiling off.
    #[serde(deserialize_with = "lenient_u64")]
    pub active: Option<u64>,
    /// Cycles to run; 0 = until training ends.
    #[serde(deserialize_with = "lenient_u64")]
    pub repeat: Option<u64>,
    /// steps or epochs: what wait, warmup and active count.
    pub unit: Option<String>,
    pub record_shapes: Option<bool>,
    pub profile_memory: Option<bool>,
    pub with_stack: Option<bool>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRun {
    pub name: Option<String>,
    pub output_dir: Option<String>,
}

/// Every valid key, as `section.key`, in the order `--explain` shows them.
pub const KEYS: &[&str] = &[
    "device.request",
    "device.profile",
    "device.profiles_dir",
    "performance.tf32",
    "performance.matmul_precision",
    "performance.cudnn_benchmark",
    "performance.cudnn_deterministic",
    "performance.deterministic",
    "performance.memory_fraction",
    "performance.empty_cache_interval",
    "performance.channels_last",
    "performance.intra_op_threads",
    "performance.inter_op_threads",
    "performance.seed",
    "data.num_workers",
    "data.prefetch_factor",
    "data.val_fraction",
    "data.synthetic_samples",
    "model.name",
    "model.dropout",
    "model.d_model",
    "model.heads",
    "model.layers",
    "model.ff",
    "model.hidden",
    "model.channels",
    "model.activation_checkpointing",
    "train.batch_size",
    "train.amp",
    "train.epochs",
    "train.lr",
    "train.optimizer",
    "train.weight_decay",
    "train.momentum",
    "train.grad_accum_steps",
    "train.clip_grad_norm",
    "train.schedule",
    "train.warmup_steps",
    "train.min_lr",
    "train.loss_scale_init",
    "train.loss_scale_growth",
    "train.loss_scale_backoff",
    "train.loss_scale_growth_interval",
    "train.log_interval",
    "train.max_bad_steps",
    "train.loss",
    "checkpoint.enabled",
    "checkpoint.every_steps",
    "checkpoint.keep_last",
    "checkpoint.keep_best",
    "infer.batch_size",
    "infer.precision",
    "infer.cuda_graphs",
    "serve.host",
    "serve.port",
    "serve.max_wait_ms",
    "serve.queue_capacity",
    "serve.max_body_bytes",
    "profiling.wait",
    "profiling.warmup",
    "profiling.active",
    "profiling.repeat",
    "profiling.unit",
    "profiling.record_shapes",
    "profiling.profile_memory",
    "profiling.with_stack",
    "run.name",
    "run.output_dir",
];

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrString<T> {
    Num(T),
    Str(String),
}

fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + std::str::FromStr,
{
    match Option::<NumOrString<T>>::deserialize(d)? {
        None => Ok(None),
        Some(NumOrString::Num(n)) => Ok(Some(n)),
        Some(NumOrString::Str(s)) => s.trim().parse().map(Some).map_err(|_| {
            serde::de::Error::custom(format!("`{s}` is not a number of the right kind"))
        }),
    }
}

/// `train.batch_size` as written: a number, or a word ("auto") checked in validation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RawBatchSize {
    Number(u64),
    Text(String),
}

fn batch_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RawBatchSize>, D::Error> {
    Ok(
        Option::<NumOrString<u64>>::deserialize(d)?.map(|v| match v {
            NumOrString::Num(n) => RawBatchSize::Number(n),
            NumOrString::Str(s) => match s.trim().parse::<u64>() {
                Ok(n) => RawBatchSize::Number(n),
                Err(_) => RawBatchSize::Text(s),
            },
        }),
    )
}

/// A list of widths as written: "256,128", or one width as a number (`--set model.hidden=64`).
fn widths<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(
        Option::<NumOrString<u64>>::deserialize(d)?.map(|v| match v {
            NumOrString::Num(n) => n.to_string(),
            NumOrString::Str(s) => s,
        }),
    )
}

fn lenient_f64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    lenient(d)
}

fn lenient_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    lenient(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_list_exactly_the_fields_of_every_section() {
        let sections = [
            "device",
            "performance",
            "data",
            "model",
            "train",
            "checkpoint",
            "infer",
            "serve",
            "profiling",
            "run",
        ];
        for section in sections {
            // serde lists a struct's fields when it meets an unknown one.
            let text = format!("[{section}]\nzzz_unknown = 1\n");
            let err = toml::from_str::<RawConfig>(&text).unwrap_err().to_string();
            let expected_part = err.split("expected").nth(1).unwrap_or("");
            let fields: Vec<String> = expected_part
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|f| format!("{section}.{f}"))
                .collect();
            let keys: Vec<String> = KEYS
                .iter()
                .filter(|k| k.starts_with(&format!("{section}.")))
                .map(|k| (*k).to_owned())
                .collect();
            assert_eq!(fields, keys, "section {section}: {err}");
        }
    }
}
