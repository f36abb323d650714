//! kiln's bottom layer: what hardware this machine has, which device a run uses, and the backend
//! settings applied to it, as plain Rust types that the crates above use without knowing tch,
//! NVML or the native extension.
//!
//! Today it reports the libtorch the process runs on ([`libtorch`]); device requests, probing
//! (NVML, CPU features), selection and backend settings arrive with the hardware-aware
//! configuration work (issue 3).

mod error;
pub mod libtorch;

pub use error::DeviceError;
