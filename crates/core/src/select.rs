//! Pure device selection: a request and the machine's facts in, a device and the reason out.
//! Nothing here probes anything, so every case is tested with fixtures.

use std::fmt;

use serde::Serialize;

use crate::facts::{GIB, GpuFacts, GpuSource, MachineFacts};
use crate::{DeviceRequest, SelectError};

/// The device a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(into = "String")]
pub enum Device {
    Cpu,
    /// A CUDA GPU by CUDA index.
    Cuda(usize),
    Mps,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
            Self::Mps => f.write_str("mps"),
        }
    }
}

impl From<Device> for String {
    fn from(d: Device) -> String {
        d.to_string()
    }
}

/// The outcome of selection: the device, its GPU facts when it is one, and why it was chosen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Selection {
    pub device: Device,
    pub gpu: Option<GpuFacts>,
    pub reason: String,
}

/// The devices this machine offers, for error messages: "cpu, cuda:0 (NVIDIA H100 80GB HBM3)".
pub fn available_devices(facts: &MachineFacts) -> String {
    let mut list = vec!["cpu".to_owned()];
    for (i, gpu) in facts.cuda_gpus() {
        list.push(format!("cuda:{i} ({})", gpu.name));
    }
    if facts.mps_available {
        list.push("mps".to_owned());
    }
    list.join(", ")
}

/// When NVML sees GPUs that libtorch cannot use, says why that usually happens and what to do.
pub fn cuda_diagnosis(facts: &MachineFacts) -> Option<String> {
    let invisible: Vec<&str> = facts
        .gpus
        .iter()
        .filter(|g| g.source == GpuSource::NvmlOnly)
        .map(|g| g.name.as_str())
        .collect();
    if invisible.is_empty() {
        return None;
    }
    let why = if facts.cuda_gpus().next().is_none() && !facts.libtorch_cuda {
        "libtorch reports no CUDA at all: the libtorch in use is a CPU build, its CUDA library \
         was not loaded, or the driver is older than its CUDA 13 runtime needs (run `kiln \
         doctor`; `cargo xtask setup` installs a CUDA build)"
    } else {
        "they are hidden from this process (CUDA_VISIBLE_DEVICES) or in use exclusively"
    };
    Some(format!(
        "NVML sees {} GPU(s) libtorch cannot use ({}): {why}",
        invisible.len(),
        invisible.join(", ")
    ))
}

fn free_bytes(gpu: &GpuFacts) -> u64 {
    gpu.free_memory_bytes.unwrap_or(gpu.total_memory_bytes)
}

fn describe(gpu: &GpuFacts) -> String {
    match gpu.free_memory_bytes {
        Some(free) => format!(
            "{}, {:.1} of {:.1} GiB free",
            gpu.name,
            free as f64 / GIB,
            gpu.memory_gib()
        ),
        None => format!("{}, {:.1} GiB", gpu.name, gpu.memory_gib()),
    }
}

/// The CUDA GPU with the most free memory (lowest index on a tie).
fn best_gpu(facts: &MachineFacts) -> Option<(usize, &GpuFacts)> {
    facts
        .cuda_gpus()
        .max_by(|(ia, a), (ib, b)| free_bytes(a).cmp(&free_bytes(b)).then(ib.cmp(ia)))
}

/// Chooses the device for `request` on the machine described by `facts`.
pub fn select(request: DeviceRequest, facts: &MachineFacts) -> Result<Selection, SelectError> {
    let unavailable = |reason: String| SelectError::Unavailable {
        request: request.to_string(),
        reason,
        available: available_devices(facts),
    };
    let cuda_count = facts.cuda_gpus().count();
    let no_cuda_reason = || {
        cuda_diagnosis(facts).unwrap_or_else(|| match &facts.nvml {
            crate::facts::NvmlStatus::Unavailable(why) => {
                format!("no CUDA GPU found (NVML: {why})")
            }
            crate::facts::NvmlStatus::Available { .. } => "no CUDA GPU found".to_owned(),
        })
    };
    match request {
        DeviceRequest::Auto => {
            if let Some((i, gpu)) = best_gpu(facts) {
                let reason = if cuda_count == 1 {
                    format!("the only CUDA GPU ({})", describe(gpu))
                } else {
                    format!(
                        "the CUDA GPU with the most free memory of {cuda_count} ({})",
                        describe(gpu)
                    )
                };
                return Ok(Selection {
                    device: Device::Cuda(i),
                    gpu: Some(gpu.clone()),
                    reason,
                });
            }
            if facts.mps_available {
                return Ok(Selection {
                    device: Device::Mps,
                    gpu: None,
                    reason: "no CUDA GPU; Apple silicon GPU (MPS) available".to_owned(),
                });
            }
            Ok(Selection {
                device: Device::Cpu,
                gpu: None,
                reason: format!("{}; no MPS: using the CPU", no_cuda_reason()),
            })
        }
        DeviceRequest::Cpu => Ok(Selection {
            device: Device::Cpu,
            gpu: None,
            reason: "requested".to_owned(),
        }),
        DeviceRequest::Cuda(None) => match best_gpu(facts) {
            Some((i, gpu)) => Ok(Selection {
                device: Device::Cuda(i),
                gpu: Some(gpu.clone()),
                reason: format!("requested cuda; most free memory ({})", describe(gpu)),
            }),
            None => Err(unavailable(no_cuda_reason())),
        },
        DeviceRequest::Cuda(Some(index)) => match facts.cuda_gpus().find(|(i, _)| *i == index) {
            Some((i, gpu)) => Ok(Selection {
                device: Device::Cuda(i),
                gpu: Some(gpu.clone()),
                reason: format!("requested ({})", describe(gpu)),
            }),
            None if cuda_count == 0 => Err(unavailable(no_cuda_reason())),
            None => Err(unavailable(format!(
                "this machine has {cuda_count} CUDA GPU(s), numbered from cuda:0"
            ))),
        },
        DeviceRequest::Mps => {
            if facts.mps_available {
                Ok(Selection {
                    device: Device::Mps,
                    gpu: None,
                    reason: "requested".to_owned(),
                })
            } else if facts.os == "macos" {
                Err(unavailable(
                    "libtorch reports MPS unavailable (it needs Apple silicon and macOS 12.3+)"
                        .to_owned(),
                ))
            } else {
                Err(unavailable(format!(
                    "MPS exists only on Apple silicon Macs; this machine runs {}",
                    facts.os
                )))
            }
        }
    }
}
