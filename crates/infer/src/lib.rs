//! kiln's inference: batched, reduced-precision offline inference over kiln checkpoints and
//! TorchScript modules, CUDA graphs for static shapes, and an HTTP server with dynamic batching.
//!
//! Layering: uses `kiln-device`, `kiln-config` and `kiln-torch-ext`; knows nothing of training
//! loops or the CLI. It arrives with the inference work (issue 7).
