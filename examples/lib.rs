//! kiln's runnable library examples live beside this file (`regression.rs`,
//! `own_model.rs`); this crate has no code of its own.
