//! From a selected device to the profile a run starts from: the matched profile corrected for
//! what the hardware cannot do, or one derived from the GPU's facts when no profile names it.

use kiln_core::settings::{AmpDtype, MatmulPrecision};
use kiln_core::{CpuFacts, Device, GpuFacts, Selection};

use crate::{Origin, Profile, ProfileDevice, ProfileError, ProfileSet};

/// Why the run uses the profile it uses.
#[derive(Debug, Clone, PartialEq)]
pub enum Basis {
    /// The GPU's name matched this pattern of the profile.
    Matched { pattern: String },
    /// No profile names the GPU: values derived from its facts and the nearest profile by memory.
    Derived { nearest: String },
    /// The device's own profile (CPU or MPS).
    Device,
    /// Chosen by name in the configuration (`device.profile`).
    Named,
}

/// A profile value kiln changed for this machine, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Adjustment {
    pub key: &'static str,
    pub from: String,
    pub to: String,
    pub reason: String,
}

/// The profile for this run, with how it was found and what was changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub profile: Profile,
    pub basis: Basis,
    pub adjustments: Vec<Adjustment>,
}

impl Resolved {
    fn adjust<T: ToString>(
        &mut self,
        key: &'static str,
        from: T,
        to: T,
        reason: impl Into<String>,
    ) {
        self.adjustments.push(Adjustment {
            key,
            from: from.to_string(),
            to: to.to_string(),
            reason: reason.into(),
        });
    }
}

/// The profile for `selection` on a machine with `cpu`; `forced` names a profile to use
/// instead of matching (it is still corrected for what the hardware cannot do).
pub fn resolve(
    set: &ProfileSet,
    selection: &Selection,
    cpu: &CpuFacts,
    forced: Option<&str>,
) -> Result<Resolved, ProfileError> {
    let mut resolved = match (selection.device, &selection.gpu, forced) {
        (_, gpu, Some(name)) => {
            let mut r = Resolved {
                profile: set.get(name)?.clone(),
                basis: Basis::Named,
                adjustments: vec![],
            };
            if let Some(gpu) = gpu {
                correct_for_hardware(&mut r, gpu);
            }
            r
        }
        (Device::Cuda(_), Some(gpu), None) => for_gpu(set, gpu)?,
        (Device::Mps, _, None) => Resolved {
            profile: device_profile(set, ProfileDevice::Mps)?,
            basis: Basis::Device,
            adjustments: vec![],
        },
        _ => for_cpu(set, cpu)?,
    };
    let cores = u32::try_from(cpu.logical_cores).unwrap_or(u32::MAX).max(1);
    if resolved.profile.num_workers > cores {
        let from = resolved.profile.num_workers;
        resolved.profile.num_workers = cores;
        resolved.adjust(
            "num_workers",
            from,
            cores,
            format!("this machine has {cores} CPU core(s)"),
        );
    }
    Ok(resolved)
}

fn device_profile(set: &ProfileSet, device: ProfileDevice) -> Result<Profile, ProfileError> {
    let name = match device {
        ProfileDevice::Mps => "apple-mps",
        _ => "generic-cpu",
    };
    set.get(name).cloned()
}

fn for_cpu(set: &ProfileSet, cpu: &CpuFacts) -> Result<Resolved, ProfileError> {
    let mut r = Resolved {
        profile: device_profile(set, ProfileDevice::Cpu)?,
        basis: Basis::Device,
        adjustments: vec![],
    };
    if r.profile.amp_dtype == AmpDtype::None && cpu.has_fast_bf16() {
        r.profile.amp_dtype = AmpDtype::Bf16;
        let units = if cpu.amx_bf16 {
            "AMX-BF16"
        } else {
            "AVX512-BF16"
        };
        r.adjust(
            "amp_dtype",
            AmpDtype::None,
            AmpDtype::Bf16,
            format!("the CPU has {units}"),
        );
    }
    Ok(r)
}

fn for_gpu(set: &ProfileSet, gpu: &GpuFacts) -> Result<Resolved, ProfileError> {
    let mut r = match set.match_gpu(&gpu.name)? {
        Some(m) => Resolved {
            profile: m.profile.clone(),
            basis: Basis::Matched {
                pattern: m.pattern.to_owned(),
            },
            adjustments: vec![],
        },
        None => derive(set, gpu)?,
    };
    correct_for_hardware(&mut r, gpu);
    Ok(r)
}

/// Turns off what this GPU cannot do; the profile's wish is never applied blindly.
fn correct_for_hardware(r: &mut Resolved, gpu: &GpuFacts) {
    let cc = gpu.compute_capability;
    let p = &mut r.profile;
    let mut changes = vec![];
    if p.amp_dtype == AmpDtype::Bf16 && !cc.supports_bf16() {
        let to = if cc.supports_fp16_tensor_cores() {
            AmpDtype::Fp16
        } else {
            AmpDtype::None
        };
        changes.push((
            "amp_dtype",
            p.amp_dtype.to_string(),
            to.to_string(),
            format!("compute capability {cc} has no bf16 (needs 8.0)"),
        ));
        p.amp_dtype = to;
    }
    if p.amp_dtype == AmpDtype::Fp16 && !cc.supports_fp16_tensor_cores() {
        changes.push((
            "amp_dtype",
            AmpDtype::Fp16.to_string(),
            AmpDtype::None.to_string(),
            format!("compute capability {cc} has no fp16 tensor cores (needs 7.0)"),
        ));
        p.amp_dtype = AmpDtype::None;
    }
    if p.tf32 && !cc.supports_tf32() {
        changes.push((
            "tf32",
            "true".to_owned(),
            "false".to_owned(),
            format!("compute capability {cc} has no TF32 (needs 8.0)"),
        ));
        p.tf32 = false;
    }
    if p.matmul_precision != MatmulPrecision::Highest && !cc.supports_tf32() {
        changes.push((
            "matmul_precision",
            p.matmul_precision.to_string(),
            MatmulPrecision::Highest.to_string(),
            format!("compute capability {cc} has no TF32 or bf16 matmul units"),
        ));
        p.matmul_precision = MatmulPrecision::Highest;
    }
    for (key, from, to, reason) in changes {
        r.adjust(key, from, to, reason);
    }
}

/// Rounds to a multiple of 8 (tensor-core friendly), at least 1.
fn round_batch(x: f64) -> u32 {
    if x < 8.0 {
        x.round().max(1.0) as u32
    } else {
        ((x / 8.0).round() * 8.0) as u32
    }
}

/// A profile for a GPU no profile names: the nearest profile by memory, batch sizes scaled by
/// memory, precision from the compute capability.
fn derive(set: &ProfileSet, gpu: &GpuFacts) -> Result<Resolved, ProfileError> {
    let memory = gpu.memory_gib().max(0.5);
    let nearest = set
        .all()
        .iter()
        .filter(|p| p.device == ProfileDevice::Cuda)
        .min_by(|a, b| {
            let da = (memory / a.memory_gib).ln().abs();
            let db = (memory / b.memory_gib).ln().abs();
            da.total_cmp(&db)
        })
        .ok_or_else(|| ProfileError::Unknown {
            name: "any cuda profile".to_owned(),
            suggestion: String::new(),
            known: set
                .all()
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let scale = memory / nearest.memory_gib;
    let cc = gpu.compute_capability;
    let amp = if cc.supports_bf16() {
        AmpDtype::Bf16
    } else if cc.supports_fp16_tensor_cores() {
        AmpDtype::Fp16
    } else {
        AmpDtype::None
    };
    let tf32 = cc.supports_tf32();
    let profile = Profile {
        name: format!("derived-{}", nearest.name),
        display_name: gpu.name.clone(),
        device: ProfileDevice::Cuda,
        patterns: vec![],
        memory_gib: memory,
        compute_capability: cc,
        train_batch_size: round_batch(f64::from(nearest.train_batch_size) * scale),
        infer_batch_size: round_batch(f64::from(nearest.infer_batch_size) * scale),
        sliding_window_batch_size: round_batch(
            f64::from(nearest.sliding_window_batch_size) * scale,
        ),
        num_workers: nearest.num_workers.min(8),
        memory_fraction: nearest.memory_fraction,
        amp_dtype: amp,
        tf32,
        matmul_precision: if tf32 {
            MatmulPrecision::High
        } else {
            MatmulPrecision::Highest
        },
        cudnn_benchmark: true,
        cudnn_deterministic: false,
        notes: format!(
            "No profile names this GPU: batch sizes scaled from `{}` by memory ({memory:.0} vs {:.0} GiB), precision from compute capability {cc}.",
            nearest.name, nearest.memory_gib
        ),
        origin: Origin::Derived,
    };
    Ok(Resolved {
        profile,
        basis: Basis::Derived {
            nearest: nearest.name.clone(),
        },
        adjustments: vec![],
    })
}
