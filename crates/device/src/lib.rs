//! kiln's bottom layer: what hardware this machine has, which device a run uses, and the backend
//! settings applied to it, as plain Rust types that the crates above use without knowing tch,
//! NVML or the native extension.
//!
//! Detection is probe → facts → pure selection: [`probe::probe`] asks NVML, libtorch and the OS
//! and returns [`MachineFacts`]; [`select::select`] turns a [`DeviceRequest`] and those facts
//! into a device, with no I/O, so it is tested with fixtures for any machine.

mod error;
pub mod facts;
pub mod libtorch;
pub mod memory;
pub mod probe;
mod request;
pub mod select;
pub mod settings;

pub use error::DeviceError;
pub use facts::{ComputeCapability, CpuFacts, GpuFacts, GpuSource, MachineFacts, NvmlStatus};
pub use request::DeviceRequest;
pub use select::{Device, Selection};
