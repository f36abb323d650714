//! Joins NVML's and libtorch's views of the GPUs into one list, matched by UUID: NVML numbers
//! GPUs in the driver's order, CUDA in its own (and after `CUDA_VISIBLE_DEVICES`).

use kiln_torch_ext::cuda;

use crate::DeviceError;
use crate::facts::{ComputeCapability, GpuFacts, GpuSource};

/// One GPU as libtorch reports it, by CUDA index.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchGpu {
    pub cuda_index: usize,
    pub name: String,
    pub uuid: Option<String>,
    pub total_memory_bytes: u64,
    pub compute_capability: ComputeCapability,
}

/// libtorch's GPUs.
pub(super) fn torch_gpus() -> Result<Vec<TorchGpu>, DeviceError> {
    let count = cuda::device_count()?;
    (0..count)
        .map(|i| {
            let p = cuda::device_properties(i)?;
            Ok(TorchGpu {
                cuda_index: i,
                name: p.name,
                uuid: p.uuid,
                total_memory_bytes: p.total_memory_bytes,
                compute_capability: ComputeCapability::new(
                    p.compute_capability.0,
                    p.compute_capability.1,
                ),
            })
        })
        .collect()
}

/// NVML's UUIDs read "GPU-xxxxxxxx-…"; libtorch's may lack the prefix. Compare without it.
fn same_uuid(a: &str, b: &str) -> bool {
    let strip = |s: &str| {
        s.trim_start_matches("GPU-")
            .trim_start_matches("MIG-")
            .to_ascii_lowercase()
    };
    strip(a) == strip(b)
}

/// Merges the two views. Every libtorch GPU appears once, by CUDA index, enriched with NVML's
/// facts when a UUID matches; NVML GPUs libtorch cannot see follow, without a CUDA index.
/// `nvml` holds NVML's GPUs as facts (no CUDA index yet), or is `None` when NVML is unavailable:
/// libtorch's view is then all there is.
pub fn merge_gpu_views(nvml: Option<&[GpuFacts]>, torch: &[TorchGpu]) -> Vec<GpuFacts> {
    let nvml = nvml.unwrap_or(&[]);
    let mut used = vec![false; nvml.len()];
    let mut out = Vec::new();
    for t in torch {
        let matched = t.uuid.as_deref().and_then(|tu| {
            nvml.iter()
                .enumerate()
                .find(|(j, n)| !used[*j] && n.uuid.as_deref().is_some_and(|nu| same_uuid(nu, tu)))
        });
        out.push(match matched {
            Some((j, n)) => {
                used[j] = true;
                GpuFacts {
                    cuda_index: Some(t.cuda_index),
                    source: GpuSource::Both,
                    ..n.clone()
                }
            }
            None => GpuFacts {
                cuda_index: Some(t.cuda_index),
                nvml_index: None,
                name: t.name.clone(),
                uuid: t.uuid.clone(),
                total_memory_bytes: t.total_memory_bytes,
                free_memory_bytes: None,
                compute_capability: t.compute_capability,
                utilization_percent: None,
                temperature_celsius: None,
                power_watts: None,
                source: GpuSource::LibtorchOnly,
            },
        });
    }
    out.extend(
        nvml.iter()
            .zip(&used)
            .filter(|(_, used)| !**used)
            .map(|(n, _)| GpuFacts {
                cuda_index: None,
                source: GpuSource::NvmlOnly,
                ..n.clone()
            }),
    );
    out
}
