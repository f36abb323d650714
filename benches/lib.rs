//! The shared pieces of `kiln-bench`'s suites, which measure kiln against PyTorch and its peers.

pub mod args;
pub mod datasets;
pub mod peers;
pub mod plot;
pub mod proc_memory;
pub mod report;
pub mod run_cli;
pub mod unfused;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub use args::SuiteArgs;

/// What a suite's steps return: on failure, a message naming what failed and why.
pub type Result<T> = std::result::Result<T, String>;

/// Makes a failed call's error a suite's message: as it is (`msg`), or after a path (`at`).
pub trait Msg<T> {
    fn msg(self) -> Result<T>;
    fn at(self, path: &Path) -> Result<T>;
}

impl<T, E: std::fmt::Display> Msg<T> for std::result::Result<T, E> {
    fn msg(self) -> Result<T> {
        self.map_err(|e| e.to_string())
    }

    fn at(self, path: &Path) -> Result<T> {
        self.map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// This machine's resolution of `sets` (`key=value` settings), as `kiln train` resolves them.
pub fn resolve(sets: &[String]) -> Result<kiln_config::Resolution> {
    let facts = kiln_device::probe::probe().msg()?;
    let mut req = kiln_config::ConfigRequest::new(kiln_config::Machine::Probed(facts));
    req.sets = sets.to_vec();
    kiln_config::load(&req).msg()
}

/// `key`'s value in a run's JSON, which must be a finite number.
pub fn figure(run: &Value, key: &str) -> Result<f64> {
    run[key]
        .as_f64()
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("a run reported no finite {key}: {run}"))
}

/// The median (upper middle for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The mean (0 for none).
pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// A number of a run's JSON, NaN where there is none.
pub fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// A port on 127.0.0.1 free right now (for a server or a rendezvous).
pub fn free_port() -> Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port on 127.0.0.1: {e}"))
}

/// Runs `f` in a fresh temporary directory `kiln-bench-NAME-PID` (with an empty `tmp`).
pub fn in_temp_dir<T>(name: &str, f: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let dir = std::env::temp_dir().join(format!("kiln-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("tmp")).at(&dir)?;
    let result = f(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// `--compile` for a PyTorch script, with inductor's cache and `TMPDIR` under `cache`.
pub fn compile_env(c: &mut Command, cache: &Path) {
    c.arg("--compile")
        .env("TORCHINDUCTOR_CACHE_DIR", cache.join("inductor"))
        .env("TMPDIR", cache.join("tmp"));
}

/// How a baseline given [`malloc_like_kiln`] is described in the rows.
pub const MALLOC_AS_KILN: &str =
    "glibc's malloc thresholds as kiln sets them (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_)";

/// Gives a baseline's `cmd` glibc's malloc thresholds as kiln sets them (`malloc_tuning`).
pub fn malloc_like_kiln(cmd: &mut Command) {
    use kiln_device::malloc::{MMAP_THRESHOLD, TRIM_THRESHOLD};
    cmd.env("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD.to_string())
        .env("MALLOC_TRIM_THRESHOLD_", TRIM_THRESHOLD.to_string());
}

/// The directory of the `python/` scripts: `KILN_BENCH_ROOT` (gpu-check's), else this crate's.
pub fn bench_root() -> PathBuf {
    std::env::var_os("KILN_BENCH_ROOT")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// `<target>/kiln-bench/<name>`: where reports go unless `--out` says otherwise.
pub fn report_path(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = root.parent().unwrap_or(root);
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), PathBuf::from)
        .join("kiln-bench")
        .join(name)
}

/// `cpu` or `cuda:N`, as PyTorch spells it.
pub fn device_name(device: tch::Device) -> String {
    match device {
        tch::Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".to_owned(),
    }
}

/// Peak memory so far in MiB (NaN where unknown) and its source: CUDA's allocator, or peak RSS.
pub fn peak_memory_mib(device: tch::Device) -> (f64, &'static str) {
    match kiln_infer::profile::peak_memory(device) {
        Ok((bytes, source)) => (bytes.map_or(f64::NAN, proc_memory::mib), source.describe()),
        Err(_) => (f64::NAN, "unknown"),
    }
}

/// Runs `cmd` and parses the last line of its stdout that starts with `{` (the probes print one
/// JSON object; human text goes to stderr). A failure's error holds all of its stderr, where
/// callers look for markers (`train/cases.rs`: the export's `REFUSED`).
pub fn run_json(mut cmd: Command) -> Result<Value> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{cmd:?} failed ({}): {}", out.status, err.trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    last_json(&text).map_err(|e| format!("{cmd:?} printed no JSON ({e}): {text}"))
}

/// The last line of `text` that starts with `{`, parsed.
pub fn last_json(text: &str) -> serde_json::Result<Value> {
    serde_json::from_str(json_line(text).unwrap_or(""))
}

/// The last line of `text` that starts with `{`, if any.
pub(crate) fn json_line(text: &str) -> Option<&str> {
    text.lines().rev().find(|l| l.starts_with('{'))
}

/// Runs each of `sides` `repeats` times, alternating between them (the order reversed on odd
/// repeats) so drift on a busy machine hits all alike: `run(repeat, side)` measures one run,
/// `None` where that side is not measured. Returns every side's runs, in `sides`' order.
pub fn alternating<S: Copy, T>(
    repeats: usize,
    sides: &[S],
    mut run: impl FnMut(usize, S) -> Result<Option<T>>,
) -> Result<Vec<Vec<T>>> {
    let mut runs: Vec<Vec<T>> = sides.iter().map(|_| vec![]).collect();
    for r in 0..repeats {
        for k in 0..sides.len() {
            let i = if r % 2 == 0 { k } else { sides.len() - 1 - k };
            if let Some(v) = run(r, sides[i])? {
                runs[i].push(v);
            }
        }
    }
    Ok(runs)
}

/// Runs the `n` commands `cmd(i)` `repeats` times, [`alternating`]: every run's JSON per command.
pub fn interleaved(
    repeats: usize,
    n: usize,
    cmd: impl Fn(usize) -> Command,
) -> Result<Vec<Vec<Value>>> {
    let order: Vec<usize> = (0..n).collect();
    alternating(repeats, &order, |_, i| run_json(cmd(i)).map(Some))
}

/// The median over runs of the number at `key` (NaN where a run lacks it).
pub fn median_of(runs: &[Value], key: &str) -> f64 {
    median(runs.iter().map(|r| num(&r[key])).collect())
}

/// kiln's configuration resolved for `device` (its hardware profile, no user settings).
pub fn resolve_for(device: tch::Device) -> Result<kiln_config::Resolution> {
    let request = if device.is_cuda() { "cuda" } else { "cpu" };
    resolve(&[format!("device.request={request}")])
}

/// `r`'s value, or `None` with `name` recorded as not run here (why: `r`'s error).
pub fn or_skip<T>(out: &mut report::SuiteOutput, name: &str, r: Result<T>) -> Option<T> {
    r.map_err(|why| out.skip(name, &format!("not run: {why}")))
        .ok()
}

/// Why a baseline's runs did not run here, where one says so (`not_run`).
pub fn not_run(runs: &[Value]) -> Option<&str> {
    runs.iter().find_map(|r| r["not_run"].as_str())
}

/// `torch.compile`'s first step or batch (`key`): its cold-cache runs' median, else all runs'.
pub fn cold_first(t: &[Value], key: &str) -> (f64, &'static str) {
    let cold: Vec<f64> = t
        .iter()
        .filter(|r| r["compile"]["inductor_cache"] == "cold")
        .filter_map(|r| r["compile"][key].as_f64())
        .collect();
    if cold.is_empty() {
        (median_of(t, key), "inductor's caches warm")
    } else {
        let empty = "inductor's caches empty (a user's first compile here)";
        (median(cold), empty)
    }
}

/// `program` with `args`.
pub fn command<S: AsRef<OsStr>>(program: impl AsRef<OsStr>, args: &[S]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// `python` running the script `python/NAME` beside the suites.
pub fn python_script(python: impl AsRef<OsStr>, name: &str) -> Command {
    command(python, &[bench_root().join("python").join(name)])
}
