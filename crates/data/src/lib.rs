//! kiln's data layer: random-access datasets (in memory, memory-mapped shards, CSV, synthetic),
//! samplers (sequential, seeded shuffle, rank sharding, resumable position) and the multi-worker
//! prefetching loader that assembles batches into contiguous buffers.
//!
//! Layering: knows nothing of training, and nothing of tensors until the batcher at its edge.
//! The datasets and the loader arrive with the data work (issue 4).
