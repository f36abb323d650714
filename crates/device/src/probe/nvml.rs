//! NVML's view of the machine's NVIDIA GPUs (the driver's view: every GPU, with live memory,
//! utilisation, temperature and power). The only place in kiln that calls NVML.

use std::sync::OnceLock;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;

use crate::facts::{ComputeCapability, GpuFacts, GpuSource, NvmlStatus};

/// The process-wide NVML handle (initialised once; an error is remembered too).
fn nvml() -> Result<&'static Nvml, String> {
    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(Clone::clone)
}

/// NVML's status and GPUs (as facts without a CUDA index, which only libtorch knows); `None`
/// for the GPUs when NVML cannot be used at all.
pub fn probe() -> (NvmlStatus, Option<Vec<GpuFacts>>) {
    let nvml = match nvml() {
        Ok(nvml) => nvml,
        Err(why) => {
            return (
                NvmlStatus::Unavailable(format!(
                    "{why} (no NVIDIA driver, or libnvidia-ml.so.1 not on the loader path)"
                )),
                None,
            );
        }
    };
    let driver_version = nvml
        .sys_driver_version()
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let cuda_driver_version = nvml.sys_cuda_driver_version().map_or_else(
        |e| format!("unknown ({e})"),
        |v| {
            format!(
                "{}.{}",
                nvml_wrapper::cuda_driver_version_major(v),
                nvml_wrapper::cuda_driver_version_minor(v)
            )
        },
    );
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            return (
                NvmlStatus::Unavailable(format!("NVML could not count devices: {e}")),
                None,
            );
        }
    };
    let mut gpus = Vec::new();
    for index in 0..count {
        let device = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("NVML device {index} could not be opened: {e}");
                continue;
            }
        };
        let memory = device.memory_info().ok();
        let cc = device.cuda_compute_capability().ok();
        gpus.push(GpuFacts {
            cuda_index: None,
            nvml_index: Some(index),
            name: device
                .name()
                .unwrap_or_else(|_| format!("NVIDIA GPU {index}")),
            uuid: device.uuid().ok(),
            total_memory_bytes: memory.as_ref().map_or(0, |m| m.total),
            free_memory_bytes: memory.as_ref().map(|m| m.free),
            compute_capability: cc.map_or(ComputeCapability::new(0, 0), |c| {
                ComputeCapability::new(c.major.max(0) as u32, c.minor.max(0) as u32)
            }),
            utilization_percent: device.utilization_rates().ok().map(|u| u.gpu),
            temperature_celsius: device.temperature(TemperatureSensor::Gpu).ok(),
            power_watts: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            source: GpuSource::NvmlOnly,
        });
    }
    (
        NvmlStatus::Available {
            driver_version,
            cuda_driver_version,
        },
        Some(gpus),
    )
}

/// NVML's (used, total) memory in bytes of the GPU with `uuid`, if NVML works.
pub fn device_memory(uuid: &str) -> Option<(u64, u64)> {
    let nvml = nvml().ok()?;
    let device = nvml.device_by_uuid(uuid).ok()?;
    let info = device.memory_info().ok()?;
    Some((info.used, info.total))
}
