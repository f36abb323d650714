//! kiln's training loop: a top-to-bottom loop over a small model trait, mixed precision with a
//! dynamic loss scaler, AdamW on the native fused kernel, gradient accumulation and clipping,
//! LR schedules, metrics, and crash-safe checkpoints with exact resume.
//!
//! Layering: uses `kiln-device`, `kiln-config`, `kiln-data` and `kiln-torch-ext`; knows nothing
//! of inference or the CLI. So far it holds the data edge ([`feed`]): the loader settings a run
//! plan implies, and the feeder that moves batches to the device one batch ahead of compute.
//! The trainer arrives with issues 5 and 6.

mod error;
pub mod feed;

pub use error::TrainError;
