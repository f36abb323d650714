//! kiln's criterion benchmarks of the hot pieces; the code is in the `[[bench]]` targets beside
//! this file (`cargo bench -p kiln-benches`). End-to-end comparisons against PyTorch belong to
//! `cargo xtask bench`.
