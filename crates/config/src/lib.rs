//! kiln's configuration: built-in defaults, the matched hardware profile, the user's file
//! (TOML, YAML or JSON), the environment (`KILN_SECTION__KEY`) and the command line
//! (`--set section.key=value` and friendly flags), layered with figment in that order, so the
//! user always wins over the profile, even with a value equal to the default.
//!
//! Two stages, as in ripgrep: [`raw`] holds the layered values close to the user's input
//! (unknown keys rejected with a "did you mean"); [`plan`] validates them into a typed
//! [`RunPlan`] whose every value knows the layer that set it ([`Provenance`]). Every key is
//! defined once, in [`keys`]: its raw field, default, check and `--explain` entry.
//!
//! Layering: knows `kiln-core` and `kiln-profiles`, nothing above them, and no libtorch: the
//! caller probes the machine (`kiln_device::probe::probe`) and passes its facts in a [`Machine`].

mod error;
pub mod keys;
mod layers;
pub mod plan;
pub mod raw;
mod resolve;
mod setting;

pub use error::ConfigError;
pub use layers::Layer;
pub use plan::{
    AttentionKernel, BlendMode, CheckpointPlan, CudaGraphs, DistributedPlan, EarlyStoppingPlan,
    EmaPlan, InferEngineKind, InferPlan, KeepBest, LossKind, LossScalePlan, MetricMode, MetricName,
    ModelKind, ModelPlan, OptimizerKind, OutputDevice, PadMode, ProfileUnit, ProfilingPlan,
    Provenance, RunPlan, ScheduleKind, ServePlan, SlidingWindowPlan, TrainPlan,
};
pub use resolve::{ConfigRequest, Machine, Resolution, load, simulated_machine};
pub use setting::UNSET;
