//! The serve suite's peer: LitServe (`python/litserve_server.py`, pinned, installed by
//! `cargo xtask bench`) serving the suite's MLP with the very weights kiln serves (written as
//! safetensors), the same batching limits, the same closed-loop clients and requests from the
//! same load generator. LitServe takes JSON, so both servers get the same JSON request body here
//! (kiln's `{"inputs": [...]}`); kiln's `.npy` rows stay beside these. Rows: throughput (goal
//! kiln ≥ 1.5× LitServe) and p50/p95/p99 latency (goal p95 ≤ 1.0×).

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln_benches::report::{Better, Comparison, SuiteOutput};
use kiln_benches::{bench_root, median, peers};
use kiln_config::CudaGraphs;
use kiln_device::settings::AmpDtype;
use kiln_infer::serve::loadgen::{self, LoadReport};
use kiln_infer::serve::{ServeConfig, Server};
use serde_json::json;
use tch::Device;

use super::{FEATURES, Result, factory, mlp};

/// The load both servers get (the suite's settings).
pub struct Load {
    pub python: String,
    pub max_batch: usize,
    pub max_wait: Duration,
    pub clients: usize,
    pub requests: usize,
    pub repeats: usize,
    pub threads: usize,
}

const GROUP: &str = "serving peer";
const ROWS: [&str; 4] = ["throughput", "p50 latency", "p95 latency", "p99 latency"];

/// Adds the LitServe rows to `out`, or "not run" rows saying why they could not be measured.
pub fn compare(out: &mut SuiteOutput, load: &Load) -> Result<()> {
    let peers = match peers::dir() {
        Ok(dir) => dir,
        Err(why) => {
            skip_all(out, &format!("not run: {why}"));
            return Ok(());
        }
    };
    let work = std::env::temp_dir().join(format!("kiln-bench-litserve-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let result = measure_both(&work, &peers, load);
    std::fs::remove_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    match result {
        Ok((kiln, lit)) => push_rows(out, load, &kiln, &lit),
        Err(why) => skip_all(out, &format!("not run: {why}")),
    }
    Ok(())
}

fn skip_all(out: &mut SuiteOutput, why: &str) {
    for row in ROWS {
        out.skip(&format!("dynamic batching {row} vs LitServe"), why);
    }
}

/// The JSON request both servers get: one sample, as the suite's `.npy` one.
fn json_body() -> Vec<u8> {
    let sample: Vec<f32> = (0..FEATURES)
        .map(|i| (i % 17) as f32 / 17.0 - 0.5)
        .collect();
    json!({ "inputs": sample }).to_string().into_bytes()
}

/// Writes the suite's model (seed 0, as `engine` builds it: [`mlp`]) as safetensors.
fn write_weights(path: &Path) -> Result<()> {
    let (vs, _model) = mlp(Device::Cpu)?;
    vs.save(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Alternating runs of kiln's server and LitServe on the same JSON load.
fn measure_both(
    work: &Path,
    peers: &Path,
    load: &Load,
) -> Result<(Vec<LoadReport>, Vec<LoadReport>)> {
    let weights = work.join("mlp.safetensors");
    write_weights(&weights)?;
    let (mut kiln, mut lit) = (vec![], vec![]);
    for r in 0..load.repeats {
        for kiln_first in [r % 2 == 0, r % 2 == 1] {
            if kiln_first {
                kiln.push(kiln_json(load)?);
            } else {
                lit.push(litserve(work, peers, &weights, load, r)?);
            }
            let last = if kiln_first { &kiln } else { &lit };
            if let Some(rep) = last.last() {
                eprintln!(
                    "  {:<28} {:>8.0} req/s  p50 {:>7.2} ms  p95 {:>7.2} ms  p99 {:>7.2} ms",
                    if kiln_first {
                        "kiln, JSON"
                    } else {
                        "LitServe, JSON"
                    },
                    rep.throughput_rps,
                    rep.p50_ms,
                    rep.p95_ms,
                    rep.p99_ms
                );
            }
        }
    }
    Ok((kiln, lit))
}

/// A warm-up, then the measured load, against `addr`.
fn drive(addr: SocketAddr, load: &Load) -> Result<LoadReport> {
    let body = json_body();
    let json = "application/json";
    let warm = (load.requests / 10).max(load.clients);
    loadgen::run(addr, body.clone(), json, load.clients, warm).map_err(|e| e.to_string())?;
    let report =
        loadgen::run(addr, body, json, load.clients, load.requests).map_err(|e| e.to_string())?;
    if report.errors > 0 {
        return Err(format!(
            "{} of {} requests to {addr} failed: {}",
            report.errors,
            report.requests,
            report.first_error.clone().unwrap_or_default()
        ));
    }
    Ok(report)
}

/// kiln's server with dynamic batching, on the JSON load.
fn kiln_json(load: &Load) -> Result<LoadReport> {
    let config = ServeConfig {
        port: 0,
        max_batch: load.max_batch,
        max_wait: load.max_wait,
        ..ServeConfig::default()
    };
    let server = Server::start(config, factory(load.max_batch)).map_err(|e| e.to_string())?;
    server.wait_ready().map_err(|e| e.to_string())?;
    let report = drive(server.local_addr(), load);
    server.shutdown().map_err(|e| e.to_string())?;
    report
}

/// A LitServe server process (its own process group, ended with it).
struct LitServe {
    child: Child,
    log: PathBuf,
}

impl Drop for LitServe {
    fn drop(&mut self) {
        // The server forks its API and inference workers into our group: end them all.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        if !wait_exit(&mut self.child, Duration::from_secs(10)) {
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = self.child.wait();
        }
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Starts LitServe and waits for `GET /health` to answer 200 (at most two minutes).
fn start_litserve(
    work: &Path,
    peers: &Path,
    weights: &Path,
    load: &Load,
    r: usize,
) -> Result<(LitServe, SocketAddr)> {
    use std::os::unix::process::CommandExt;
    let port = free_port()?;
    let log = work.join(format!("litserve-{r}.log"));
    let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&load.python);
    cmd.arg(bench_root().join("python/litserve_server.py"))
        .arg("--weights")
        .arg(weights)
        .args(["--port", &port.to_string()])
        .args(["--max-batch", &load.max_batch.to_string()])
        .args([
            "--batch-timeout-ms",
            &(load.max_wait.as_secs_f64() * 1e3).to_string(),
        ])
        .args(["--threads", &load.threads.to_string()])
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .process_group(0);
    peers::put_first_on_path(&mut cmd, peers);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let mut server = LitServe { child, log };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        if let Ok(Some(status)) = server.child.try_wait() {
            return Err(format!(
                "LitServe exited ({status}) before it was ready; {}",
                tail(&server.log)
            ));
        }
        if healthy(addr) {
            return Ok((server, addr));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!(
        "LitServe was not ready after 120 s; {}",
        tail(&server.log)
    ))
}

/// Whether `GET /health` answers 200.
fn healthy(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    s.write_all(request.as_bytes()).is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(8).collect();
    format!(
        "the end of its log {}: {}",
        log.display(),
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    )
}

/// `POST /v1/predict` with `body` on a fresh connection; the answer's JSON body.
fn post_json(addr: SocketAddr, body: &[u8]) -> Result<serde_json::Value> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let head = format!(
        "POST /v1/predict HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| format!("{addr}: {e}"))?;
    let (_, json) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr} answered no HTTP body: {answer}"))?;
    serde_json::from_str(json).map_err(|e| format!("{addr} answered no JSON ({e}): {answer}"))
}

/// The largest difference between LitServe's outputs for the suite's sample and kiln's engine's
/// (fp32 on both sides: it must be rounding only).
fn same_outputs(addr: SocketAddr) -> Result<f64> {
    let answer = post_json(addr, &json_body())?;
    let theirs: Vec<f64> = answer["outputs"]
        .as_array()
        .map(|v| v.iter().filter_map(serde_json::Value::as_f64).collect())
        .unwrap_or_default();
    let sample: Vec<f32> = (0..FEATURES)
        .map(|i| (i % 17) as f32 / 17.0 - 0.5)
        .collect();
    let mut engine = super::engine(Device::Cpu, AmpDtype::None, 1, CudaGraphs::Off)?;
    let (ours, _) = engine.run(&sample, 1).map_err(|e| e.to_string())?;
    if theirs.len() != ours.len() {
        return Err(format!(
            "LitServe answered {answer}; kiln gives {} outputs",
            ours.len()
        ));
    }
    let diff = ours
        .iter()
        .zip(&theirs)
        .map(|(&a, &b)| (f64::from(a) - b).abs())
        .fold(0.0, f64::max);
    if diff > 1e-4 {
        return Err(format!(
            "LitServe's outputs differ from kiln's by up to {diff:e}: it does not serve the \
             same model"
        ));
    }
    Ok(diff)
}

fn litserve(
    work: &Path,
    peers: &Path,
    weights: &Path,
    load: &Load,
    r: usize,
) -> Result<LoadReport> {
    let (server, addr) = start_litserve(work, peers, weights, load, r)?;
    let diff = same_outputs(addr).map_err(|e| format!("{e}; {}", tail(&server.log)))?;
    eprintln!("  LitServe's outputs match kiln's engine (largest difference {diff:.1e})");
    let report = drive(addr, load).map_err(|e| format!("{e}; {}", tail(&server.log)));
    drop(server);
    report
}

fn push_rows(out: &mut SuiteOutput, load: &Load, kiln: &[LoadReport], lit: &[LoadReport]) {
    let pick = |v: &[LoadReport], f: fn(&LoadReport) -> f64| median(v.iter().map(f).collect());
    let base = format!(
        "LitServe {} (one inference worker, {} torch thread(s), LitAPI max_batch_size {}, \
         batch_timeout {} ms), same JSON requests",
        litserve_version(),
        load.threads,
        load.max_batch,
        load.max_wait.as_secs_f64() * 1e3
    );
    let runs = json!({"kiln_json": kiln, "litserve": lit});
    out.push(
        Comparison::new(
            "serve",
            GROUP,
            "dynamic batching throughput vs LitServe (JSON)",
            "req/s",
            Better::Higher,
            (
                pick(kiln, |r| r.throughput_rps),
                pick(lit, |r| r.throughput_rps),
            ),
            base.clone(),
        )
        .at_least(1.5)
        .detail("runs", runs),
    );
    type Figure = fn(&LoadReport) -> f64;
    let latencies: [(&str, Figure, Option<f64>); 3] = [
        ("p50", |r| r.p50_ms, None),
        ("p95", |r| r.p95_ms, Some(1.0)),
        ("p99", |r| r.p99_ms, None),
    ];
    for (name, f, goal) in latencies {
        let c = Comparison::new(
            "serve",
            GROUP,
            format!("dynamic batching {name} latency vs LitServe (JSON)"),
            "ms",
            Better::Lower,
            (pick(kiln, f), pick(lit, f)),
            base.clone(),
        );
        out.push(match goal {
            Some(g) => c.at_most(g),
            None => c,
        });
    }
}

/// The pinned LitServe version, from the pinned list.
fn litserve_version() -> String {
    let pins = std::fs::read_to_string(bench_root().join("python/peers-requirements.txt"))
        .unwrap_or_default();
    pins.lines()
        .find_map(|l| l.trim().strip_prefix("litserve=="))
        .unwrap_or("?")
        .to_owned()
}
