//! kiln's training loop: a top-to-bottom loop over a small model trait, mixed precision with a
//! dynamic loss scaler, AdamW on the native fused kernel, gradient accumulation and clipping,
//! LR schedules, metrics, and crash-safe checkpoints with exact resume.
//!
//! Layering: uses `kiln-device`, `kiln-config`, `kiln-data` and `kiln-torch-ext`; knows nothing
//! of inference or the CLI. The trainer arrives with the training work (issues 5 and 6); the
//! fused AdamW kernel it will drive is already in `kiln_torch_ext::optim`.
