//! Stage two: the validated, typed run plan. Options are enums, ranges are checked, and every
//! value carries its [`Provenance`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln_device::DeviceRequest;
use kiln_device::settings::{AmpDtype, BackendSettings, Determinism, parse_matmul_precision};
use serde::Serialize;

use crate::ConfigError;
use crate::layers::Layer;
use crate::raw::RawConfig;

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
}

#[derive(Debug, Clone, PartialEq)]
pub struct TrainPlan {
    pub batch_size: u64,
    pub amp: AmpDtype,
    pub epochs: u64,
    pub lr: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InferPlan {
    pub batch_size: u64,
    pub precision: AmpDtype,
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
    pub train: TrainPlan,
    pub infer: InferPlan,
    pub profiling_enabled: bool,
    pub run: RunInfo,
    /// Where each value came from, by `section.key`.
    pub provenance: BTreeMap<String, Provenance>,
}

fn determinism_str(d: Determinism) -> &'static str {
    match d {
        Determinism::Off => "off",
        Determinism::Warn => "warn",
        Determinism::Error => "error",
    }
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
            (
                "performance.deterministic",
                determinism_str(p.deterministic).to_owned(),
            ),
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
            ("train.batch_size", self.train.batch_size.to_string()),
            ("train.amp", self.train.amp.to_string()),
            ("train.epochs", self.train.epochs.to_string()),
            ("train.lr", self.train.lr.to_string()),
            ("infer.batch_size", self.infer.batch_size.to_string()),
            ("infer.precision", self.infer.precision.to_string()),
            ("profiling.enabled", self.profiling_enabled.to_string()),
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
pub(crate) fn validate(
    raw: RawConfig,
    provenance: BTreeMap<String, Provenance>,
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
    let amp = |key: &str, v: String| {
        v.parse::<AmpDtype>()
            .map_err(|e| invalid(key, format!("{v:?}"), e))
    };

    let request_text = need!(raw.device.request, "device.request");
    let device_request = request_text.parse::<DeviceRequest>().map_err(|_| {
        invalid(
            "device.request",
            format!("{request_text:?}"),
            "use one of auto, cpu, cuda, cuda:N, mps".to_owned(),
        )
    })?;

    let p = raw.performance;
    let mp_text = need!(p.matmul_precision, "performance.matmul_precision");
    let matmul_precision = parse_matmul_precision(&mp_text)
        .map_err(|e| invalid("performance.matmul_precision", format!("{mp_text:?}"), e))?;
    let det_text = need!(p.deterministic, "performance.deterministic");
    let deterministic = match det_text.trim().to_ascii_lowercase().as_str() {
        "off" | "false" => Determinism::Off,
        "warn" => Determinism::Warn,
        "error" | "on" | "true" => Determinism::Error,
        _ => {
            return Err(invalid(
                "performance.deterministic",
                format!("{det_text:?}"),
                "use off, warn or error".to_owned(),
            ));
        }
    };
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

    let data = DataPlan {
        num_workers: need!(raw.data.num_workers, "data.num_workers"),
        prefetch_factor: at_least_1(
            "data.prefetch_factor",
            need!(raw.data.prefetch_factor, "data.prefetch_factor"),
        )?,
    };
    let lr = need!(raw.train.lr, "train.lr");
    if !(lr.is_finite() && lr > 0.0) {
        return Err(invalid(
            "train.lr",
            lr.to_string(),
            "must be a number > 0".to_owned(),
        ));
    }
    let train = TrainPlan {
        batch_size: at_least_1(
            "train.batch_size",
            need!(raw.train.batch_size, "train.batch_size"),
        )?,
        amp: amp("train.amp", need!(raw.train.amp, "train.amp"))?,
        epochs: at_least_1("train.epochs", need!(raw.train.epochs, "train.epochs"))?,
        lr,
    };
    let infer = InferPlan {
        batch_size: at_least_1(
            "infer.batch_size",
            need!(raw.infer.batch_size, "infer.batch_size"),
        )?,
        precision: amp(
            "infer.precision",
            need!(raw.infer.precision, "infer.precision"),
        )?,
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
        train,
        infer,
        profiling_enabled: need!(raw.profiling.enabled, "profiling.enabled"),
        run: RunInfo {
            name,
            output_dir: PathBuf::from(need!(raw.run.output_dir, "run.output_dir")),
        },
        provenance,
    })
}
