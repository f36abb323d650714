//! Device memory for a run: libtorch's caching-allocator view (allocated, reserved, peaks) and
//! NVML's whole-device view (every process on the GPU).

use kiln_torch_ext::memory as native;
use serde::Serialize;

use crate::{Device, DeviceError, GpuFacts};

pub use kiln_torch_ext::memory::MemoryStats;

/// What is known about a device's memory now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryReport {
    /// libtorch's allocator, for this process (CUDA only).
    #[serde(skip)]
    pub allocator: Option<MemoryStats>,
    /// NVML's (used, total) bytes for the whole GPU, all processes.
    pub device_used_total: Option<(u64, u64)>,
    /// Main memory: (available, total) bytes, for CPU runs.
    pub host_available_total: Option<(u64, u64)>,
}

/// The memory report for `device` (`gpu` = its facts when it is a CUDA GPU).
pub fn report(device: Device, gpu: Option<&GpuFacts>) -> Result<MemoryReport, DeviceError> {
    match device {
        Device::Cuda(i) => Ok(MemoryReport {
            allocator: Some(native::stats(i)?),
            device_used_total: gpu
                .and_then(|g| g.uuid.as_deref())
                .and_then(crate::probe::nvml_memory),
            host_available_total: None,
        }),
        _ => {
            let cpu = crate::probe::probe_cpu();
            Ok(MemoryReport {
                allocator: None,
                device_used_total: None,
                host_available_total: Some((cpu.available_memory_bytes, cpu.total_memory_bytes)),
            })
        }
    }
}

/// Resets the allocator's peak statistics (CUDA only; a no-op elsewhere).
pub fn reset_peak(device: Device) -> Result<(), DeviceError> {
    match device {
        Device::Cuda(i) => Ok(native::reset_peak(i)?),
        _ => Ok(()),
    }
}

/// Returns cached GPU memory to the driver (CUDA only; a no-op elsewhere). The trainer calls
/// it every `performance.empty_cache_interval` steps.
pub fn empty_cache(device: Device) -> Result<(), DeviceError> {
    match device {
        Device::Cuda(_) => Ok(native::empty_cache()?),
        _ => Ok(()),
    }
}

/// This process's resident memory from `/proc/self/status`: (current RSS, peak RSS) in bytes.
/// `None` where the kernel does not provide it (not Linux).
pub fn process_rss() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_rss(&status)
}

fn parse_rss(status: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        status.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.trim();
            let kib: u64 = rest.strip_suffix("kB")?.trim().parse().ok()?;
            Some(kib * 1024)
        })
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_comes_from_vmrss_and_vmhwm() {
        let status = "Name:\tkiln\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_rss(status), Some((1024 * 1024, 2048 * 1024)));
        assert_eq!(parse_rss("Name:\tkiln\n"), None);
        if cfg!(target_os = "linux") {
            let (rss, peak) = process_rss().unwrap();
            assert!(rss > 0 && peak >= rss);
        }
    }
}
