//! The serve suite's peer: LitServe (`python/litserve_server.py`, pinned) serving the suite's
//! MLP with kiln's weights, batching limits and load, both servers on the same JSON requests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};

use super::dynamic::{Body, FIGURES, Load, drive, measure, push_load_rows, sample, summary};
use super::*;
use kiln_benches::{free_port, peers, python_script};

/// Adds the LitServe rows to `out` (kiln's runs against LitServe's, with the pinned LitServe
/// version), or "not run" rows saying why they could not be measured.
pub(super) fn compare(out: &mut SuiteOutput, load: &Load) {
    let measured =
        peers::dir().and_then(|p| in_temp_dir("litserve", |w| measure_both(w, &p, load)));
    let runs = match measured {
        Ok(runs) => runs,
        Err(why) => {
            for (_, metric, _) in FIGURES {
                let name = format!("dynamic batching {metric} vs LitServe");
                out.skip(&name, &format!("not run: {why}"));
            }
            return;
        }
    };
    let pins = bench_root().join("python/peers-requirements.txt");
    let pins = std::fs::read_to_string(pins).unwrap_or_default();
    let version = pins
        .lines()
        .find_map(|l| l.trim().strip_prefix("litserve=="))
        .unwrap_or("?");
    let (threads, batch) = (load.threads, load.max_batch);
    let wait = load.max_wait.as_secs_f64() * 1e3;
    let base = format!(
        "LitServe {version} (one inference worker, {threads} torch thread(s), LitAPI \
         max_batch_size {batch}, batch_timeout {wait} ms), same JSON requests"
    );
    let names = ("serving peer", " vs LitServe (JSON)", base.as_str());
    let details = json!({"runs": {"kiln_json": runs[0], "litserve": runs[1]}});
    let (k, b) = (summary(&runs[0]), summary(&runs[1]));
    push_load_rows(out, names, (&k, &b), 1.5, details);
}

/// kiln's runs and LitServe's, alternating, on the same JSON load (the suite's one sample).
fn measure_both(work: &Path, peers: &Path, load: &Load) -> Result<Vec<Vec<LoadReport>>> {
    // The suite's model (seed 0, as `engine` builds it: [`mlp`]) as safetensors.
    let weights = work.join("mlp.safetensors");
    mlp(Device::Cpu)?.0.save(&weights).at(&weights)?;
    let json = json!({ "inputs": sample() }).to_string().into_bytes();
    let body = (json, "application/json");
    alternating(load.repeats, &[true, false], |r, kiln| {
        let report = if kiln {
            measure(factory(load.max_batch), load, &body, "kiln, JSON")?
        } else {
            litserve(work, peers, load, r, &body)?
        };
        Ok(Some(report))
    })
}

/// A LitServe server process (its own process group, ended with it) and its log.
struct LitServe(Child, PathBuf);

impl LitServe {
    /// `e` with the last lines of the server's log.
    fn fail(&self, e: impl std::fmt::Display) -> String {
        let text = std::fs::read_to_string(&self.1).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let last = lines[lines.len().saturating_sub(8)..].join(" | ");
        format!("{e}; the end of its log {}: {last}", self.1.display())
    }
}

impl Drop for LitServe {
    fn drop(&mut self) {
        // The server forks its API and inference workers into our group: end them all.
        let group = format!("-{}", self.0.id());
        let kill = |signal| command("kill", &[signal, "--", &group]).status();
        let _ = kill("-TERM");
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = kill("-KILL");
        let _ = self.0.wait();
    }
}

/// One LitServe run: started, awaited (two minutes at most), checked, then [`drive`]n.
fn litserve(work: &Path, peers: &Path, load: &Load, r: usize, body: &Body) -> Result<LoadReport> {
    let port = free_port()?;
    let log = work.join(format!("litserve-{r}.log"));
    let file = std::fs::File::create(&log).at(&log)?;
    let batch_timeout_ms = load.max_wait.as_secs_f64() * 1e3;
    let mut cmd = python_script(&load.python, "litserve_server.py");
    cmd.arg("--weights")
        .arg(work.join("mlp.safetensors"))
        .args(["--port", &port.to_string()])
        .args(["--max-batch", &load.max_batch.to_string()])
        .args(["--batch-timeout-ms", &batch_timeout_ms.to_string()])
        .args(["--threads", &load.threads.to_string()])
        .stdin(Stdio::null())
        .stdout(file.try_clone().msg()?)
        .stderr(file)
        .process_group(0);
    peers::put_first_on_path(&mut cmd, peers);
    let spawned = cmd.spawn();
    let child = spawned.map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let mut server = LitServe(child, log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    while !http(addr, "GET /health", &[], (1, 2)).is_ok_and(|a| a.starts_with("HTTP/1.1 200")) {
        if let Ok(Some(status)) = server.0.try_wait() {
            return Err(server.fail(format!("LitServe exited ({status}) before it was ready")));
        }
        if start.elapsed() >= Duration::from_secs(120) {
            return Err(server.fail("LitServe was not ready after 120 s"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let diff = same_outputs(addr, &body.0).map_err(|e| server.fail(e))?;
    eprintln!("  LitServe's outputs match kiln's engine (largest difference {diff:.1e})");
    drive(addr, load, body, "LitServe, JSON").map_err(|e| server.fail(e))
}

/// The answer to `request` (`METHOD /path`, JSON `body`), with timeouts in seconds `wait`.
fn http(addr: SocketAddr, request: &str, body: &[u8], wait: (u64, u64)) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(wait.0))?;
    s.set_read_timeout(Some(Duration::from_secs(wait.1)))?;
    let n = body.len();
    let head = format!(
        "{request} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {n}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(&[head.as_bytes(), body].concat())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer)
}

/// The largest difference between LitServe's and kiln's outputs for `body` (rounding only).
fn same_outputs(addr: SocketAddr, body: &[u8]) -> Result<f64> {
    let answer =
        http(addr, "POST /v1/predict", body, (5, 30)).map_err(|e| format!("{addr}: {e}"))?;
    let (_, json) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr} answered no HTTP body: {answer}"))?;
    let theirs: Vec<f32> = serde_json::from_str::<Value>(json)
        .and_then(|parsed| serde_json::from_value(parsed["outputs"].clone()))
        .map_err(|e| format!("{addr} answered no JSON outputs ({e}): {answer}"))?;
    let mut ours = engine(Device::Cpu, 1, FP32)?;
    let diff = max_abs_vs(&mut ours, &sample(), &theirs)
        .map_err(|e| format!("LitServe answered {json}: {e}"))?;
    if diff.is_nan() || diff > 1e-4 {
        let what = "LitServe's outputs differ from kiln's by up to";
        return Err(format!("{what} {diff:e}: it does not serve the same model"));
    }
    Ok(diff)
}
