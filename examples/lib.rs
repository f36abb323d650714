//! kiln's runnable library examples live beside this file (`regression.rs`,
//! `torchscript.rs`); this crate has no code of its own.
