//! The backend settings a run applies to libtorch, as plain values (`kiln-device` applies them).

pub use crate::options::{AmpDtype, Determinism, MatmulPrecision};

/// The backend settings a run applies to libtorch (process-wide).
#[derive(Debug, Clone, PartialEq)]
pub struct BackendSettings {
    pub tf32: bool,
    pub matmul_precision: MatmulPrecision,
    pub cudnn_benchmark: bool,
    pub cudnn_deterministic: bool,
    pub deterministic: Determinism,
    /// Fraction of the GPU's memory the caching allocator may take, in (0, 1].
    pub memory_fraction: f64,
    /// CPU intra-op threads; 0 keeps libtorch's default.
    pub intra_op_threads: u64,
    /// CPU inter-op threads; 0 keeps libtorch's default.
    pub inter_op_threads: u64,
    pub seed: u64,
    /// Keep memory the run frees for its next tensors (glibc's mmap and trim thresholds raised)
    /// instead of giving it back to the system.
    pub malloc_tuning: bool,
}
