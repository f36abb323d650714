//! kiln's criterion benchmarks of the hot pieces; the code is in the `[[bench]]` targets beside
//! this file (`cargo bench -p kiln-benches`). End-to-end comparisons against PyTorch belong to
//! `cargo xtask bench`.

use std::path::{Path, PathBuf};

/// The value after `name` in `args`, if given.
pub fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// A non-negative integer option, `default` when absent.
pub fn number(args: &[String], name: &str, default: usize) -> Result<usize, String> {
    flag(args, name).map_or(Ok(default), |v| {
        v.parse()
            .map_err(|_| format!("{name} `{v}` is not a non-negative integer"))
    })
}

/// The median (upper middle for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The baseline's Python: `--python`, else `KILN_BENCH_PYTHON`, else `python3`.
pub fn python(args: &[String]) -> String {
    flag(args, "--python")
        .map(str::to_owned)
        .or_else(|| std::env::var("KILN_BENCH_PYTHON").ok())
        .unwrap_or_else(|| "python3".to_owned())
}

/// This crate's directory (for `python/` scripts).
pub fn bench_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `<target>/kiln-bench/<name>`: where reports go unless `--out` says otherwise.
pub fn report_path(name: &str) -> PathBuf {
    let root = bench_root();
    let workspace = root
        .parent()
        .map_or_else(|| root.clone(), Path::to_path_buf);
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), PathBuf::from)
        .join("kiln-bench")
        .join(name)
}
