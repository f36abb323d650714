//! Loading a configuration: layers the sources, picks the device and profile, and validates.
//!
//! The profile layer depends on the device, and the device on the user's `device.request`, so
//! loading runs twice: once without the profile to read the `device` section, then with it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Json, Toml, Yaml};
use figment::value::Value;
use figment::{Figment, Metadata, Source};
use kiln_core::select::select;
use kiln_core::settings::AmpDtype;
use kiln_core::{DeviceRequest, MachineFacts, Selection};
use kiln_profiles::{ProfileSet, Resolved, edit_distance, resolve};

use crate::ConfigError;
use crate::keys::{self, KEYS, RawConfig, defaults};
use crate::layers::{Layer, NamedLayer, parse_set_value};
use crate::plan::{ProfileStarts, Provenance, RunPlan, validate};
use crate::setting::Checker;

/// The machine a configuration is for. This crate does not link libtorch, so it cannot probe:
/// the caller does (`kiln_device::probe::probe()`) and passes the facts.
#[derive(Debug, Clone)]
pub enum Machine {
    /// This machine, as probed.
    Probed(MachineFacts),
    /// Another machine (`--simulate-gpu`, tests).
    Simulated(MachineFacts),
}

impl Machine {
    /// The machine's facts, probed or simulated.
    pub fn facts(&self) -> &MachineFacts {
        match self {
            Machine::Probed(facts) | Machine::Simulated(facts) => facts,
        }
    }
}

/// What to load: the user's file, `--set` arguments and friendly flags, and the machine.
#[derive(Debug, Clone)]
pub struct ConfigRequest {
    pub file: Option<PathBuf>,
    /// `section.key=value` arguments, in order (a later one wins).
    pub sets: Vec<String>,
    /// Friendly flags as (flag as typed, key, value), e.g. ("--batch-size", "train.batch_size", "64").
    pub flags: Vec<(String, String, String)>,
    /// Values saved with a checkpoint, as (key, value as text), layered over the profile and
    /// under the user's layers, named `checkpoint <source>`.
    pub checkpoint: Option<(String, Vec<(String, String)>)>,
    pub machine: Machine,
}

impl ConfigRequest {
    pub fn new(machine: Machine) -> Self {
        Self {
            file: None,
            sets: vec![],
            flags: vec![],
            checkpoint: None,
            machine,
        }
    }
}

/// A loaded configuration: the machine, the device and profile chosen, and the plan.
#[derive(Debug, Clone)]
pub struct Resolution {
    pub facts: MachineFacts,
    pub selection: Selection,
    pub profiles: ProfileSet,
    pub profile: Resolved,
    pub plan: RunPlan,
}

/// The config keys a profile sets: (key, the profile field it comes from, value). The one list
/// both the profile layer and the adjustment notes read. (The profile's `num_workers` sets no
/// key: it is the ceiling of `data.num_workers = auto`, see [`workers_note`].)
fn profile_values(p: &kiln_profiles::Profile) -> Vec<(&'static str, &'static str, Value)> {
    let amp = p.amp_dtype.to_string();
    vec![
        (
            keys::train::batch_size,
            "train_batch_size",
            p.train_batch_size.into(),
        ),
        (
            keys::infer::batch_size,
            "infer_batch_size",
            p.infer_batch_size.into(),
        ),
        (
            keys::sliding_window::batch_size,
            "sliding_window_batch_size",
            p.sliding_window_batch_size.into(),
        ),
        (
            keys::performance::memory_fraction,
            "memory_fraction",
            p.memory_fraction.into(),
        ),
        (keys::performance::tf32, "tf32", p.tf32.into()),
        (
            keys::performance::matmul_precision,
            "matmul_precision",
            p.matmul_precision.to_string().into(),
        ),
        (
            keys::performance::cudnn_benchmark,
            "cudnn_benchmark",
            p.cudnn_benchmark.into(),
        ),
        (
            keys::performance::cudnn_deterministic,
            "cudnn_deterministic",
            p.cudnn_deterministic.into(),
        ),
        (keys::train::amp, "amp_dtype", amp.clone().into()),
        (keys::infer::precision, "amp_dtype", amp.into()),
    ]
}

/// The profile's values as a layer named after the profile and where it came from.
fn profile_layer(r: &Resolved) -> NamedLayer {
    let p = &r.profile;
    let mut layer = NamedLayer::new(format!("profile {} ({})", p.name, p.origin));
    for (key, _, value) in profile_values(p) {
        layer.push(key, value);
    }
    layer
}

/// The defaults of the built-in model named `name` where they differ from the key table's
/// (the 3-D U-Net's volumes cost far more per sample than the others' inputs).
fn model_defaults(name: Option<&str>) -> Option<NamedLayer> {
    let kind = name?.parse::<crate::ModelKind>().ok()?;
    let values: &[(&str, &str)] = match kind {
        crate::ModelKind::Unet3d => &[
            (keys::model::channels, "16,32,64"),
            (keys::data::synthetic_samples, "512"),
            (keys::train::epochs, "3"),
        ],
        _ => return None,
    };
    let mut layer = NamedLayer::model_defaults(kind.as_str());
    for (key, value) in values {
        layer.push(key, parse_set_value(value));
    }
    Some(layer)
}

/// Adds the user's layers: file, environment, `--set`, flags.
fn user_layers(mut fig: Figment, req: &ConfigRequest) -> Result<Figment, ConfigError> {
    if let Some((source, values)) = &req.checkpoint {
        let mut layer = NamedLayer::new(format!("checkpoint {source}"));
        for (key, value) in values {
            layer.push(key, parse_set_value(value));
        }
        fig = fig.merge(layer);
    }
    if let Some(path) = &req.file {
        fig = fig.merge(file_provider(path)?);
    }
    fig = fig.merge(
        Env::prefixed("KILN_")
            .filter(|k| k.as_str().contains("__"))
            .split("__"),
    );
    for arg in &req.sets {
        let (key, value) = arg.split_once('=').ok_or_else(|| ConfigError::BadSet {
            arg: arg.clone(),
            message: "expected section.key=value".to_owned(),
        })?;
        let key = key.trim();
        // section.key, or section.sub.key for a nested section.
        if !(2..=3).contains(&key.split('.').count()) || key.split('.').any(str::is_empty) {
            return Err(ConfigError::BadSet {
                arg: arg.clone(),
                message: format!("`{key}` is not of the form section.key"),
            });
        }
        let mut layer = NamedLayer::new(format!("command line (--set {arg})"));
        layer.push(key, parse_set_value(value.trim()));
        fig = fig.merge(layer);
    }
    for (flag, key, value) in &req.flags {
        let mut layer = NamedLayer::new(format!("command line ({flag})"));
        layer.push(key, parse_set_value(value));
        fig = fig.merge(layer);
    }
    Ok(fig)
}

fn file_provider(path: &Path) -> Result<Figment, ConfigError> {
    if !path.is_file() {
        return Err(ConfigError::File {
            path: path.to_path_buf(),
            message: "no such file".to_owned(),
        });
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    Ok(match ext.as_deref() {
        Some("toml") => Figment::from(Toml::file_exact(path)),
        Some("yaml" | "yml") => Figment::from(Yaml::file_exact(path)),
        Some("json") => Figment::from(Json::file_exact(path)),
        _ => {
            return Err(ConfigError::File {
                path: path.to_path_buf(),
                message: "unknown format: use a .toml, .yaml/.yml or .json file".to_owned(),
            });
        }
    })
}

/// Describes the layer that set `key`: its layer and a readable source.
fn provenance_of(fig: &Figment, key: &str) -> Provenance {
    match fig.find_metadata(key) {
        Some(md) => Provenance {
            layer: Layer::of(md),
            source: describe(md, key),
            note: None,
        },
        None => Provenance {
            layer: Layer::Default,
            source: "kiln's built-in defaults".to_owned(),
            note: None,
        },
    }
}

fn describe(md: &Metadata, key: &str) -> String {
    let parts: Vec<&str> = key.split('.').collect();
    match (&md.source, Layer::of(md)) {
        (_, Layer::Env) => format!(
            "environment variable KILN_{}",
            parts.join("__").to_ascii_uppercase()
        ),
        (Some(Source::File(path)), _) => format!("{} {}", md.name, path.display()),
        _ => md.name.to_string(),
    }
}

/// Turns figment's extraction error into ours, naming the key and the layer that set it.
fn extraction_error(fig: &Figment, err: figment::Error) -> ConfigError {
    use figment::error::Kind;
    let path = err.path.join(".");
    match &err.kind {
        Kind::UnknownField(field, expected) => {
            // figment's path may or may not already end with the unknown field.
            let mut section = err.path.clone();
            if section.last() == Some(field) {
                section.pop();
            }
            let path = section.join(".");
            let key = if path.is_empty() {
                field.clone()
            } else {
                format!("{path}.{field}")
            };
            let set_by = fig
                .find_metadata(&key)
                .map_or_else(|| "an unknown layer".to_owned(), |md| describe(md, &key));
            let candidates: Vec<String> = if path.is_empty() {
                expected.iter().map(|s| (*s).to_owned()).collect()
            } else {
                expected.iter().map(|f| format!("{path}.{f}")).collect()
            };
            let suggestion = KEYS
                .iter()
                .map(|k| (edit_distance(&key, k), *k))
                .filter(|(d, _)| *d <= 3)
                .min()
                .map(|(_, k)| format!("; did you mean `{k}`?"))
                .unwrap_or_default();
            ConfigError::UnknownKey {
                key,
                set_by,
                suggestion,
                valid: candidates.join(", "),
            }
        }
        Kind::InvalidType(actual, expected) if !path.is_empty() => ConfigError::InvalidValue {
            key: path.clone(),
            value: actual.to_string(),
            expected: format!("expected {expected}"),
            set_by: fig
                .find_metadata(&path)
                .map_or_else(|| "an unknown layer".to_owned(), |md| describe(md, &path)),
        },
        Kind::Message(msg) if !path.is_empty() => ConfigError::InvalidValue {
            key: path.clone(),
            value: fig
                .find_value(&path)
                .map(|v| format!("{v:?}"))
                .unwrap_or_default(),
            expected: msg.clone(),
            set_by: fig
                .find_metadata(&path)
                .map_or_else(|| "an unknown layer".to_owned(), |md| describe(md, &path)),
        },
        _ => match err.metadata.as_ref().and_then(|md| md.source.as_ref()) {
            Some(Source::File(path)) => ConfigError::File {
                path: path.clone(),
                message: err.kind.to_string(),
            },
            _ => ConfigError::Other(err.to_string()),
        },
    }
}

fn extract(fig: &Figment) -> Result<RawConfig, ConfigError> {
    fig.extract::<RawConfig>()
        .map_err(|e| extraction_error(fig, e))
}

/// Loads, layers and validates a configuration for the machine in `req`.
pub fn load(req: &ConfigRequest) -> Result<Resolution, ConfigError> {
    // Pass 1: defaults and the user's layers, for the device section.
    let pass1 = user_layers(Figment::from(defaults()), req)?;
    let raw = extract(&pass1)?;
    let key = keys::device::request;
    let pass1_source = BTreeMap::from([(key.to_owned(), provenance_of(&pass1, key))]);
    let (request, _) =
        Checker::new(&pass1_source).read::<DeviceRequest>(key, raw.device.request.clone())?;
    let profiles = match &raw.device.profiles_dir {
        Some(dir) => ProfileSet::with_user_dir(Path::new(&dir.0))?,
        None => ProfileSet::builtin()?,
    };
    let facts = req.machine.facts().clone();
    let selection = select(request, &facts)?;
    let profile = resolve(
        &profiles,
        &selection,
        &facts.cpu,
        raw.device.profile.as_ref().map(|p| p.0.as_str()),
    )?;

    // Pass 2: defaults (with the chosen built-in model's own), the profile, then the user's
    // layers over both.
    let mut base = Figment::from(defaults());
    if let Some(layer) = model_defaults(raw.model.name.as_deref()) {
        base = base.merge(layer);
    }
    let pass2 = user_layers(base.merge(profile_layer(&profile)), req)?;
    let raw = extract(&pass2)?;
    let profile_fields = profile_values(&profile.profile);
    let mut provenance = BTreeMap::new();
    for key in KEYS {
        let mut p = provenance_of(&pass2, key);
        if p.layer == Layer::Profile
            && let Some((_, field, _)) = profile_fields.iter().find(|(k, _, _)| k == key)
        {
            p.note = profile
                .adjustments
                .iter()
                .find(|a| a.key == *field)
                .map(|a| format!("profile said {}; {}", a.from, a.reason));
        }
        provenance.insert((*key).to_owned(), p);
    }
    let starts = ProfileStarts {
        batch_size: u64::from(profile.profile.train_batch_size),
        workers: u64::from(profile.profile.num_workers),
    };
    let mut plan = validate(raw, provenance, starts)?;
    if plan.data.num_workers_auto
        && let Some(p) = plan.provenance.get_mut(keys::data::num_workers)
    {
        p.note = Some(workers_note(&profile));
    }
    warn_about_hardware(&plan, &selection);
    Ok(Resolution {
        facts,
        selection,
        profiles,
        profile,
        plan,
    })
}

/// Where `data.num_workers = auto`'s ceiling comes from: the profile's count, and why it was
/// lowered for this machine if it was.
fn workers_note(profile: &Resolved) -> String {
    let name = &profile.profile.name;
    match profile.adjustments.iter().find(|a| a.key == "num_workers") {
        Some(a) => format!(
            "the most it tries is profile {name}'s num_workers: profile said {}; {}",
            a.from, a.reason
        ),
        None => format!("the most it tries is profile {name}'s num_workers"),
    }
}

/// A user-set precision the GPU cannot do natively is the user's call, but it is logged.
fn warn_about_hardware(plan: &RunPlan, selection: &Selection) {
    if let Some(gpu) = &selection.gpu {
        let cc = gpu.compute_capability;
        if plan.train.amp == AmpDtype::Bf16 && !cc.supports_bf16() {
            tracing::warn!(
                "train.amp = bf16 on {} (compute capability {cc}) is emulated and slow; fp16 is native there",
                gpu.name
            );
        }
    }
}

/// Facts for a machine that is not this one (`--simulate-gpu`): one GPU named `gpu_name` with
/// the given memory and compute capability (taken from its profile when one matches and they
/// are not given), on `cpu` with its core count optionally replaced.
pub fn simulated_machine(
    profiles: &ProfileSet,
    gpu_name: Option<&str>,
    memory_gib: Option<f64>,
    compute_capability: Option<kiln_core::ComputeCapability>,
    cpus: Option<usize>,
    mut cpu: kiln_core::CpuFacts,
) -> Result<MachineFacts, ConfigError> {
    if let Some(n) = cpus {
        if n == 0 {
            return Err(ConfigError::InvalidValue {
                key: "--cpus".to_owned(),
                value: "0".to_owned(),
                expected: "must be at least 1".to_owned(),
                set_by: "command line (--cpus)".to_owned(),
            });
        }
        cpu.logical_cores = n;
        cpu.physical_cores = cpu.physical_cores.min(n).max(1);
    }
    let gpus =
        match gpu_name {
            None => vec![],
            Some(name) => {
                let matched = profiles.match_gpu(name)?.map(|m| m.profile);
                let memory = memory_gib.or(matched.map(|p| p.memory_gib)).ok_or_else(|| {
                ConfigError::Other(format!(
                    "no profile matches `{name}`, so its memory is unknown: add --memory-gib N"
                ))
            })?;
                let cc = compute_capability
                .or(matched.map(|p| p.compute_capability))
                .ok_or_else(|| {
                    ConfigError::Other(format!(
                        "no profile matches `{name}`, so its compute capability is unknown: add \
                         --compute-capability X.Y"
                    ))
                })?;
                if !(memory.is_finite() && memory > 0.0) {
                    return Err(ConfigError::InvalidValue {
                        key: "--memory-gib".to_owned(),
                        value: memory.to_string(),
                        expected: "must be a number > 0".to_owned(),
                        set_by: "command line (--memory-gib)".to_owned(),
                    });
                }
                let bytes = (memory * 1024.0 * 1024.0 * 1024.0) as u64;
                vec![kiln_core::GpuFacts {
                    cuda_index: Some(0),
                    nvml_index: Some(0),
                    name: name.to_owned(),
                    uuid: None,
                    total_memory_bytes: bytes,
                    free_memory_bytes: Some(bytes),
                    compute_capability: cc,
                    utilization_percent: None,
                    temperature_celsius: None,
                    power_watts: None,
                    source: kiln_core::GpuSource::Both,
                }]
            }
        };
    Ok(MachineFacts {
        os: "linux".to_owned(),
        libtorch_cuda: !gpus.is_empty(),
        gpus,
        nvml: kiln_core::NvmlStatus::Available {
            driver_version: "simulated".to_owned(),
            cuda_driver_version: "simulated".to_owned(),
        },
        mps_available: false,
        cpu,
    })
}
