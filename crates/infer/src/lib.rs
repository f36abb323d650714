//! kiln's inference: batched, reduced-precision offline inference over kiln checkpoints and
//! TorchScript modules, CUDA graphs for static shapes, an HTTP server with dynamic batching, and
//! the profile of one model's forward pass or train step.
//!
//! Layering: uses `kiln-train` for the reference models and the checkpoint format (kiln serves
//! what it trained), and `kiln-device`, `kiln-config`, `kiln-data` and `kiln-torch-ext`; knows
//! nothing of the CLI.

pub mod choose;
pub mod engine;
mod error;
pub mod export;
pub mod forecast;
pub mod io;
pub mod model;
pub mod offline;
pub mod onnx;
pub mod profile;
mod pyscript;
pub mod quantize;
pub mod serve;
pub mod sliding;
pub mod volume;

pub use engine::{Engine, EngineOptions, GraphStatus, Runner};
pub use error::InferError;
pub use model::{LoadedModel, ModelSource};
