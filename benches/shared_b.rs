//! What the data, serve and train groups share beyond the crate's other pieces: rows that
//! cannot run here, torch.compile's first step or batch, kiln's resolved profile, and commands.

use std::ffi::OsStr;
use std::process::Command;

use serde_json::Value;

use crate::report::SuiteOutput;
use crate::{Result, median, median_of};

/// kiln's configuration resolved for `device` (its hardware profile, no user settings).
pub fn resolve_for(device: tch::Device) -> Result<kiln_config::Resolution> {
    let request = if device.is_cuda() { "cuda" } else { "cpu" };
    crate::resolve(&[format!("device.request={request}")])
}

/// `r`'s value, or `None` with `name` recorded as not run here (why: `r`'s error).
pub fn or_skip<T>(out: &mut SuiteOutput, name: &str, r: Result<T>) -> Option<T> {
    r.map_err(|why| out.skip(name, &format!("not run: {why}")))
        .ok()
}

/// Why a baseline's runs did not run here, where one says so (`not_run`).
pub fn not_run(runs: &[Value]) -> Option<&str> {
    runs.iter().find_map(|r| r["not_run"].as_str())
}

/// `torch.compile`'s first step or batch (`key` in its runs' `compile`): the median of its runs
/// from an empty inductor cache where there were such, else of all its runs' `key`; and which.
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
    command(python, &[crate::bench_root().join("python").join(name)])
}
