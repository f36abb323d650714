//! Probing: asks NVML, libtorch and the OS about this machine and turns the answers into
//! [`MachineFacts`](crate::facts::MachineFacts). The only module that talks to NVML.

mod cpu;
mod gpu;
mod nvml;

pub use cpu::{parse_cpuinfo, parse_meminfo, probe_cpu};
pub use gpu::{TorchGpu, merge_gpu_views};
pub use nvml::device_memory as nvml_memory;

use crate::DeviceError;
use crate::facts::MachineFacts;

/// Looks at the whole machine. GPU facts come from NVML and libtorch, matched by UUID.
pub fn probe() -> Result<MachineFacts, DeviceError> {
    // Make sure libtorch's CUDA library is loaded before asking libtorch about CUDA.
    crate::libtorch::ensure_cuda_library()?;
    let (nvml_status, nvml_gpus) = nvml::probe();
    let torch_gpus = gpu::torch_gpus()?;
    let gpus = merge_gpu_views(nvml_gpus.as_deref(), &torch_gpus);
    Ok(MachineFacts {
        os: std::env::consts::OS.to_owned(),
        gpus,
        nvml: nvml_status,
        libtorch_cuda: tch::Cuda::is_available(),
        mps_available: tch::utils::has_mps(),
        cpu: probe_cpu(),
    })
}
