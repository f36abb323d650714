//! kiln's training layer: a top-to-bottom loop over a small model trait (kiln's built-in
//! models, a TorchScript module, or any tch module), mixed precision with a dynamic loss
//! scaler, AdamW on the native fused kernel, gradient accumulation and clipping, LR schedules,
//! losses and metrics for classification, dense and regression targets, crash-safe checkpoints
//! with exact resume, and [`learner::Learner`], the front door for library users
//! (`use kiln_train::prelude::*`).
//!
//! Layering: uses `kiln-device`, `kiln-config`, `kiln-data` and `kiln-torch-ext`; knows nothing
//! of inference or the CLI.

pub mod batch_search;
pub mod checkpoint;
pub mod distributed;
pub mod ema;
mod error;
pub mod fault;
pub mod feed;
pub mod init;
pub mod inputs;
pub mod learner;
pub mod loss;
pub mod lr_find;
pub mod metrics;
pub mod model;
pub mod model_summary;
pub mod models;
pub mod monitor;
pub mod optim;
pub mod plot;
pub mod profiling;
pub mod program;
pub mod python;
pub mod record;
pub mod run;
pub mod rundir;
pub mod scaler;
pub mod schedule;
pub mod script;
pub mod source;
pub mod stepper;
pub mod stopping;
pub mod tensorboard;
pub mod trainer;
pub mod weights;
pub mod workers;

pub use error::TrainError;

/// What a library user needs to train their own model: the [`learner::Learner`], the
/// [`model::Model`] trait and its tch adapter, datasets and targets, and tch itself.
pub mod prelude {
    pub use crate::TrainError;
    pub use crate::learner::{Learner, LearnerBuilder};
    pub use crate::metrics::{BatchOutput, Metric, MetricValues};
    pub use crate::model::InputSpec;
    pub use crate::model::{Model, TchModule};
    pub use crate::record::{EpochRecord, Observer, Silent, StepRecord, Summary};
    pub use crate::run::{Resume, RunData, RunOutcome};
    pub use crate::script::ScriptModel;
    pub use crate::stepper::{StepOptions, Stepper};
    pub use kiln_data::{Dataset, InMemory, ShardedDataset, TargetSlot, TargetSpec, Targets};
    pub use tch::{self, Device, Kind, Tensor, nn};
}
