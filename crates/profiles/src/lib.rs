//! kiln's hardware profiles: tuned per-GPU settings (batch sizes, workers, memory fraction,
//! precision, TF32, cuDNN flags) kept as TOML data in the top-level `profiles/` directory, and
//! the rules that match a detected GPU to one.
//!
//! Layering: knows `kiln-device`'s plain facts about hardware, nothing above it. The profile
//! tables, matching and derivation for unknown GPUs arrive with the hardware-aware
//! configuration work (issue 3); this crate holds the place in the workspace until then.
