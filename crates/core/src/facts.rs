//! Plain facts about a machine's hardware: what probing found, and all that selection and
//! profile matching look at. No tch or NVML types here, so fixtures can describe any machine.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// A CUDA compute capability, such as 9.0 for an H100.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl ComputeCapability {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// bf16 tensor cores (Ampere, 8.0, and later).
    pub fn supports_bf16(self) -> bool {
        self >= Self::new(8, 0)
    }

    /// TF32 tensor cores (Ampere, 8.0, and later).
    pub fn supports_tf32(self) -> bool {
        self >= Self::new(8, 0)
    }

    /// fp16 tensor cores (Volta, 7.0, and later).
    pub fn supports_fp16_tensor_cores(self) -> bool {
        self >= Self::new(7, 0)
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for ComputeCapability {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parse = || {
            let (major, minor) = s.trim().split_once('.')?;
            Some(Self::new(major.parse().ok()?, minor.parse().ok()?))
        };
        parse().ok_or_else(|| format!("`{s}` is not a compute capability like 8.6 or 9.0"))
    }
}

/// Where a GPU's facts came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSource {
    /// NVML and libtorch both see it (matched by UUID).
    Both,
    /// Only NVML sees it: the driver knows the GPU but libtorch cannot use it.
    NvmlOnly,
    /// Only libtorch sees it (NVML is missing): the fallback view.
    LibtorchOnly,
}

/// One NVIDIA GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuFacts {
    /// CUDA's index (what `cuda:N` means, after `CUDA_VISIBLE_DEVICES`); `None` when libtorch
    /// does not see this GPU.
    pub cuda_index: Option<usize>,
    /// NVML's index (the driver's order, not CUDA's).
    pub nvml_index: Option<u32>,
    /// The name as NVML reports it, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    pub uuid: Option<String>,
    pub total_memory_bytes: u64,
    /// Free memory now (NVML); `None` from libtorch's view alone.
    pub free_memory_bytes: Option<u64>,
    pub compute_capability: ComputeCapability,
    pub utilization_percent: Option<u32>,
    pub temperature_celsius: Option<u32>,
    pub power_watts: Option<f64>,
    pub source: GpuSource,
}

impl GpuFacts {
    /// Total memory in GiB.
    pub fn memory_gib(&self) -> f64 {
        self.total_memory_bytes as f64 / GIB
    }
}

/// The CPU and main memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuFacts {
    pub model: String,
    pub physical_cores: usize,
    pub logical_cores: usize,
    pub total_memory_bytes: u64,
    pub available_memory_bytes: u64,
    pub avx512: bool,
    pub avx512_bf16: bool,
    pub amx_bf16: bool,
}

impl CpuFacts {
    /// Whether bf16 matrix work runs natively (AMX-BF16 or AVX512-BF16), which makes CPU bf16
    /// autocast worth it (about 2x on a transformer train step on the 2-core Xeons kiln is
    /// tested on).
    pub fn has_fast_bf16(&self) -> bool {
        self.amx_bf16 || self.avx512_bf16
    }
}

/// Whether NVML could be used, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "detail", rename_all = "snake_case")]
pub enum NvmlStatus {
    /// NVML works; the driver and CUDA driver versions it reports.
    Available {
        driver_version: String,
        cuda_driver_version: String,
    },
    /// NVML could not be loaded or initialised (no NVIDIA driver, usually).
    Unavailable(String),
}

/// Everything probing found out about this machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MachineFacts {
    pub os: String,
    pub gpus: Vec<GpuFacts>,
    pub nvml: NvmlStatus,
    /// Whether libtorch can use CUDA (driver and GPU present, CUDA build).
    pub libtorch_cuda: bool,
    /// Whether MPS (Apple silicon) is available to libtorch.
    pub mps_available: bool,
    pub cpu: CpuFacts,
}

impl MachineFacts {
    /// The GPUs libtorch can run on, by CUDA index.
    pub fn cuda_gpus(&self) -> impl Iterator<Item = (usize, &GpuFacts)> {
        self.gpus
            .iter()
            .filter_map(|g| g.cuda_index.map(|i| (i, g)))
    }
}

pub(crate) const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
