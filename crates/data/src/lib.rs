//! kiln's data layer: random-access datasets (in memory, memory-mapped shards, CSV, synthetic),
//! per-sample transforms, samplers (sequential, seeded shuffle, rank sharding, resumable
//! position), the multi-worker prefetching loader that assembles batches into contiguous
//! buffers, `prepare`, which turns CSV or `.npy` files into shards, and time-series windows over
//! stored series for forecasters. A sample's target is a class label or a tensor of classes or
//! values of a fixed shape ([`TargetSpec`]).
//!
//! Layering: knows nothing of training, and nothing of tensors: a [`Batch`] is plain contiguous
//! memory (the trainer's own, through [`BatchBuffers`], where it provides some) that the trainer
//! turns into a tensor at its edge.

mod buffers;
mod csv;
mod csv_groups;
mod dataset;
mod dtype;
mod error;
mod loader;
mod manifest;
mod npy;
mod prepare;
mod rng;
mod sampler;
mod shards;
pub mod space;
mod synthetic;
mod synthetic_volumes;
mod target;
pub mod tiff_stack;
mod transform;
mod windows;

pub use buffers::{BatchBuffers, FeatureBuffer, HeapBuffers};
pub use csv::{CsvDataset, CsvOptions};
pub use csv_groups::ColumnGroup;
pub use dataset::{Dataset, InMemory, Subset, SyntheticClassification};
pub use dtype::DType;
pub use error::DataError;
pub use loader::{ArrayBatch, Batch, EpochIter, Loader, LoaderConfig, LoaderStats};
pub use manifest::{
    ArraySpec, FEATURES_TENSOR, LABELS_TENSOR, LabelSpec, MANIFEST_FILE, MANIFEST_VERSION,
    Manifest, ShardEntry, StoredTarget, TARGETS_TENSOR, Task,
};
pub use npy::{
    NpyArray, NpyHeader, header as npy_header, npy_f32_bytes, parse_header as npy_parse_header,
};
pub use prepare::{PrepareOptions, PrepareSource, ShardFormat, prepare, write_npy};
pub use sampler::{Position, Sampler, SamplerConfig};
pub use shards::ShardedDataset;
pub use space::NoSpace;
pub use synthetic::{SyntheticImages, SyntheticSequences};
pub use synthetic_volumes::SyntheticVolumes;
pub use target::MAX_EXACT_ID;
pub use target::{TargetSlot, TargetSpec, Targets};
pub use transform::{Normalize, Transform, Transformed};
pub use windows::{
    Series, TableFormat, TargetNormalizer, WINDOWS_FILE, WindowColumns, WindowedDataset, Windows,
    WindowsManifest, WindowsSource, prepare_windows,
};
