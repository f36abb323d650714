//! The job suite's measurements: a process run with its wall time and the peak memory of its
//! whole process tree (PSS and RSS from `/proc/<pid>/smaps_rollup`, polled), and a streaming
//! `.npy` writer for the job's data (a gigabyte of features never sits in memory at once).

use std::io::Write;
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

/// Writes an f32 `.npy` array of `shape` sample by sample: `fill(i, out)` writes sample `i`
/// and returns its label. Returns the labels.
pub fn write_f32_npy(
    path: &Path,
    shape: &[usize],
    mut fill: impl FnMut(usize, &mut [f32]) -> Result<i64>,
) -> Result<Vec<i64>> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}",
        dims.join(", ")
    );
    let unpadded = 10 + header.len() + 1;
    header.extend(std::iter::repeat_n(
        ' ',
        unpadded.next_multiple_of(64) - unpadded,
    ));
    header.push('\n');
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).map_err(err)?);
    w.write_all(b"\x93NUMPY\x01\x00").map_err(err)?;
    let len = u16::try_from(header.len()).map_err(|_| "npy header too long".to_owned())?;
    w.write_all(&len.to_le_bytes()).map_err(err)?;
    w.write_all(header.as_bytes()).map_err(err)?;
    let numel: usize = shape[1..].iter().product();
    let mut sample = vec![0f32; numel];
    let mut labels = Vec::with_capacity(shape[0]);
    for i in 0..shape[0] {
        labels.push(fill(i, &mut sample)?);
        let bytes: Vec<u8> = sample.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.write_all(&bytes).map_err(err)?;
    }
    w.flush().map_err(err)?;
    Ok(labels)
}
