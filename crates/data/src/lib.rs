//! kiln's data layer: random-access datasets, samplers (sequential, seeded shuffle, rank
//! sharding, resumable position) and the multi-worker prefetching loader that assembles batches
//! into contiguous buffers.
//!
//! Layering: knows nothing of training, and nothing of tensors: a [`Batch`] is plain contiguous
//! memory that the trainer turns into a tensor at its edge.

mod dataset;
mod error;
mod loader;
mod rng;
mod sampler;

pub use dataset::{Dataset, InMemory, SyntheticClassification};
pub use error::DataError;
pub use loader::{Batch, EpochIter, Loader, LoaderConfig, LoaderStats};
pub use sampler::{Position, Sampler, SamplerConfig};
