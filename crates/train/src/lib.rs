//! kiln's training loop: a top-to-bottom loop over a small model trait, mixed precision with a
//! dynamic loss scaler, AdamW on the native fused kernel, gradient accumulation and clipping,
//! LR schedules, metrics, and crash-safe checkpoints with exact resume.
//!
//! Layering: uses `kiln-device`, `kiln-config`, `kiln-data` and `kiln-torch-ext`; knows nothing
//! of inference or the CLI.

pub mod batch_search;
pub mod checkpoint;
mod error;
pub mod feed;
pub mod init;
pub mod model;
pub mod models;
pub mod monitor;
pub mod optim;
pub mod plot;
pub mod profiling;
pub mod record;
pub mod run;
pub mod rundir;
pub mod scaler;
pub mod schedule;
pub mod trainer;

pub use error::TrainError;
