//! kiln's hardware layer: probes this machine into facts, applies a run's backend settings and
//! reports memory and the libtorch in use, over tch, NVML and the native extension, so the
//! crates above never see their types.
//!
//! Detection is probe → facts → pure selection: [`probe::probe`] asks NVML, libtorch and the OS
//! and returns [`MachineFacts`]; [`select::select`] (from `kiln-core`, re-exported here with the
//! facts and requests) turns a [`DeviceRequest`] and those facts into a device, with no I/O.

mod error;
pub mod libtorch;
pub mod malloc;
pub mod measured;
pub mod memory;
pub mod probe;
pub mod settings;

pub use error::DeviceError;
pub use kiln_core::facts::{
    self, ComputeCapability, CpuFacts, GpuFacts, GpuSource, MachineFacts, NvmlStatus,
};
pub use kiln_core::select::{self, Device, Selection};
pub use kiln_core::{DeviceRequest, SelectError};
