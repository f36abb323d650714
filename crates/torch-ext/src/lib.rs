//! kiln's native extension over libtorch: what tch does not expose (global math flags, per-thread
//! autocast state, fused AdamW/SGD, loss scaling, gradient clipping, fast dropout masks,
//! activation checkpointing, facts about saved TorchScript modules, AOTInductor packages, the
//! kineto profiler, CUDA device queries, library loading, the sliding window's stitch on the
//! CPU), as safe Rust.
//!
//! Every function returns [`Result`]; a C++ exception thrown inside libtorch comes back as
//! [`Error::Torch`] naming the operation and carrying its [`ErrorKind`] (out of memory, invalid
//! argument, not implemented, other), never as an unwind or an abort. Errors of tch's own calls
//! are text only: [`tch_out_of_memory`] is the one place that recognises running out of memory
//! in them.

pub mod aoti;
pub mod autocast;
pub mod blend;
pub mod cuda;
pub mod dist;
pub mod dropout;
mod error;
mod ffi;
pub mod flags;
pub mod graphs;
pub mod layout;
pub mod memory;
pub mod optim;
pub mod profiler;
pub mod recompute;
pub mod rng;
pub mod runtime;
pub mod script;
pub mod transfer;

pub use error::{CallbackError, Error, ErrorKind, Result, tch_out_of_memory};
