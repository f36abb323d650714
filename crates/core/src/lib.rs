//! kiln's vocabulary, with no libtorch: the facts about a machine, device requests and the pure
//! selection of a device, and every option as an enum with one spelling. The crates that only
//! need these words (`kiln-profiles`, `kiln-config`) build and test without libtorch; a test
//! (`tests/layering.rs`) keeps it so.
//!
//! Detection is probe → facts → pure selection: `kiln-device` probes the machine into
//! [`MachineFacts`]; [`select::select`] turns a [`DeviceRequest`] and those facts into a device,
//! with no I/O, so it is tested with fixtures for any machine.

mod error;
pub mod facts;
pub mod options;
mod request;
pub mod select;
pub mod settings;

pub use error::SelectError;
pub use facts::{ComputeCapability, CpuFacts, GpuFacts, GpuSource, MachineFacts, NvmlStatus};
pub use options::OptionError;
pub use request::DeviceRequest;
pub use select::{Device, Selection};
