//! The job suite's measurements: a process run with its wall time and the peak memory of its
//! whole process tree (PSS and RSS from `/proc/<pid>/smaps_rollup`, polled).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kiln_benches::proc_memory::{Peak, tree_memory};
use serde::Serialize;
use serde_json::Value;

use kiln_benches::Result;

/// One run: its JSON result, wall time and peak memory.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub result: Value,
    /// From spawning the process to its exit.
    pub seconds: f64,
    pub peak_pss_mib: f64,
    pub peak_rss_mib: f64,
}

/// Runs `cmd` with stdout and stderr in `log`, sampling its tree's memory every 100 ms; its
/// result is the last line of its stdout that is a JSON object (the `result` of a kiln run is
/// filled in by the caller from its summary).
pub fn measured(mut cmd: Command, log: &Path) -> Result<Measured> {
    let out_path = log.with_extension("stdout");
    let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(file(&out_path)?)
        .stderr(file(log)?)
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let mut peak = Peak::default();
    let status = loop {
        peak = peak.max(tree_memory(child.id()));
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let seconds = started.elapsed().as_secs_f64();
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    if !status.success() {
        let err = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = err.lines().rev().take(15).collect();
        return Err(format!(
            "{cmd:?} failed ({status}); the end of its log {}:\n{}",
            log.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    let result = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .map_or(Ok(Value::Null), serde_json::from_str)
        .map_err(|e| format!("{cmd:?} printed no JSON result ({e}): {stdout}"))?;
    let mib = |b: u64| b as f64 / 1048576.0;
    Ok(Measured {
        result,
        seconds,
        peak_pss_mib: mib(peak.pss),
        peak_rss_mib: mib(peak.rss),
    })
}
