//! The `serve` suite: kiln's server with dynamic batching against one request at a time and
//! against `infer.engine = auto`, under one closed-loop load.

use super::*;
use kiln_benches::or_skip;

const REQ_S: Unit = ("req/s", Better::Higher);

/// The load a server gets: batching limits, closed-loop clients and requests, runs, threads.
#[derive(Debug, Clone)]
pub(super) struct Load {
    pub python: String,
    pub max_batch: usize,
    pub max_wait: Duration,
    pub clients: usize,
    pub requests: usize,
    pub repeats: usize,
    pub threads: usize,
}

/// A request body and its content type.
pub(super) type Body = (Vec<u8>, &'static str);

/// The one sample every request carries.
pub(super) fn sample() -> Vec<f32> {
    (0..FEATURES)
        .map(|i| (i % 17) as f32 / 17.0 - 0.5)
        .collect()
}

/// One measured run: a fresh server from `factory` with `load`'s limits, then [`drive`].
pub(super) fn measure(factory: RunnerFactory, load: &Load, body: &Body) -> Result<LoadReport> {
    let config = ServeConfig {
        port: 0,
        max_batch: load.max_batch,
        max_wait: load.max_wait,
        ..ServeConfig::default()
    };
    let server = Server::start(config, factory).msg()?;
    server.wait_ready().msg()?;
    let report = drive(server.local_addr(), load, body);
    server.shutdown().msg()?;
    report
}

/// A warm-up, then the measured load, against `addr`.
pub(super) fn drive(addr: SocketAddr, load: &Load, (body, kind): &Body) -> Result<LoadReport> {
    let run = |n| loadgen::run(addr, body.clone(), kind, load.clients, n);
    run((load.requests / 10).max(load.clients)).msg()?;
    let report = run(load.requests).msg()?;
    if report.errors > 0 {
        let (n, of) = (report.errors, report.requests);
        let first = report.first_error.unwrap_or_default();
        return Err(format!("{n} of {of} requests to {addr} failed: {first}"));
    }
    Ok(report)
}

/// Logs one run's figures under `side`.
pub(super) fn print_run(side: &str, r: &LoadReport) {
    eprintln!(
        "  {side:<28} {:>8.0} req/s  p50 {:>7.2} ms  p95 {:>7.2} ms  p99 {:>7.2} ms",
        r.throughput_rps, r.p50_ms, r.p95_ms, r.p99_ms
    );
}

/// The medians of runs' figures, and the runs.
pub(super) fn summary(reports: &[LoadReport]) -> Value {
    let pick = |f: fn(&LoadReport) -> f64| median(reports.iter().map(f).collect());
    json!({"throughput_rps": pick(|r| r.throughput_rps), "p50_ms": pick(|r| r.p50_ms),
           "p95_ms": pick(|r| r.p95_ms), "p99_ms": pick(|r| r.p99_ms), "runs": reports})
}

/// The serving rows' figures: the summary's key and the row's metric.
pub(super) const FIGURES: [(&str, &str); 4] = [
    ("throughput_rps", "throughput"),
    ("p50_ms", "p50 latency"),
    ("p95_ms", "p95 latency"),
    ("p99_ms", "p99 latency"),
];

/// Dynamic batching's rows, summary `k` against `b`: throughput (goal `at_least`×), latency.
pub(super) fn load_rows(
    (group, suffix, baseline): (&str, &str, &str),
    (k, b): (&Value, &Value),
    at_least: f64,
) -> Vec<Comparison> {
    let row = |(key, metric): (&str, &str)| {
        let name = format!("dynamic batching {metric}{suffix}");
        let figures = (num(&k[key]), num(&b[key]));
        let row = |unit| Comparison::new("serve", group, name, unit, figures, baseline);
        match key {
            "throughput_rps" => row(REQ_S).at_least(at_least),
            "p95_ms" => row(MS).at_most(1.0),
            _ => row(MS),
        }
    };
    FIGURES.into_iter().map(row).collect()
}

/// A server factory with `infer.engine = auto` over libtorch and `onnx`; its note goes to `note`.
fn auto_factory(load: &Load, onnx: PathBuf, note: Arc<Mutex<Option<String>>>) -> RunnerFactory {
    let (max_batch, threads) = (load.max_batch, load.threads);
    Box::new(move || {
        let torch = engine(Device::Cpu, max_batch, FP32)?;
        let onnx = onnx_engine(&onnx, Device::Cpu, max_batch, threads)?;
        let auto = AutoEngine::new(torch, onnx, "kiln bench mlp", None).msg()?;
        if let Ok(mut n) = note.lock() {
            *n = Some(auto.note().to_owned());
        }
        Ok(Box::new(auto) as Box<dyn BatchRunner>)
    })
}

/// The suite's load from its arguments.
fn load(a: &SuiteArgs) -> Load {
    let clients = a.clients.unwrap_or(32).max(1);
    let requests = a.requests.unwrap_or(if a.quick { 2_000 } else { 6_000 });
    Load {
        python: a.python.clone(),
        max_batch: a.max_batch.unwrap_or(64).max(1),
        max_wait: Duration::from_secs_f64(a.max_wait_ms.unwrap_or(2.0) / 1e3),
        clients,
        requests: requests.max(clients),
        repeats: a.repeats_or(if a.quick { 1 } else { 3 }).max(1),
        threads: a.threads_or(1).max(1),
    }
}

pub(super) fn compare(a: &SuiteArgs) -> Result<()> {
    let load = load(a);
    let (max_batch, max_wait_ms) = (load.max_batch, a.max_wait_ms.unwrap_or(2.0));
    let (clients, requests, repeats, threads) =
        (load.clients, load.requests, load.repeats, load.threads);
    let out_path = a.out_or("serve");
    tch::set_num_threads(i32::try_from(threads).unwrap_or(1));
    eprintln!(
        "serve: {MODEL} fp32 on the CPU ({threads} libtorch thread(s)), {clients} clients, \
         {requests} requests of one .npy sample, {repeats} repeat(s)"
    );
    let mut out = SuiteOutput::new(
        "serve",
        &format!(
            "kiln's HTTP server with dynamic batching (≤ {max_batch} samples, {max_wait_ms} ms) \
             against the same server one request at a time, and with infer.engine = auto \
             (libtorch or the model's ONNX export in ONNX Runtime per batch-size bucket) against \
             dynamic batching on libtorch; {clients} closed-loop clients, {requests} requests of \
             one .npy sample; {MODEL} fp32 on the CPU, {threads} libtorch (and onnxruntime) \
             thread(s)"
        ),
    );
    // The `engine = auto` side needs the model's ONNX export; without it that side is skipped.
    let exported = export_onnx(&out_path, "serve", (Device::Cpu, threads), max_batch);
    let onnx = or_skip(&mut out, AUTO_ROW, exported);
    if let Some(m) = &onnx {
        let path = m.path.display();
        eprintln!("  exported {path} for engine = auto ({})", m.check);
    }
    let auto_note = Arc::new(Mutex::new(None::<String>));
    let npy = kiln_data::npy_f32_bytes(&[FEATURES], &sample())?;
    let body = (npy, "application/x-npy");
    let single = Load {
        max_batch: 1,
        max_wait: Duration::ZERO,
        ..load.clone()
    };
    let dynamic = format!("dynamic batching (≤{max_batch}, {max_wait_ms} ms)");
    let mut sides = vec![(dynamic.as_str(), &load, None)];
    sides.push(("batch size 1", &single, None));
    let auto = "engine = auto, dynamic batching";
    sides.extend(onnx.as_ref().map(|m| (auto, &load, Some(m))));
    let runs = alternating(repeats, &sides, |_, (name, load, onnx)| {
        let factory = match onnx {
            Some(m) => auto_factory(load, m.path.clone(), auto_note.clone()),
            None => factory(load.max_batch),
        };
        let report = measure(factory, load, &body)?;
        print_run(name, &report);
        Ok(Some(report))
    })?;
    let (d, s) = (summary(&runs[0]), summary(&runs[1]));
    let baseline = "kiln serving at batch size 1";
    for row in load_rows(("serving", "", baseline), (&d, &s), 2.0) {
        out.push(row);
    }
    let auto_note = auto_note.lock().ok().and_then(|n| n.clone());
    if let Some(note) = &auto_note {
        eprintln!("  {note}");
    }
    let unknown = "the server did not report its choice";
    let note = auto_note.as_deref().unwrap_or(unknown);
    let auto_summary = onnx.as_ref().map(|m| {
        let x = summary(&runs[2]);
        push_auto_rows(&mut out, (&x, &d), m, note);
        x
    });
    // The serving peer: LitServe on the same model, limits and load (JSON requests).
    super::peer::compare(&mut out, &load)?;
    out.details = json!({
        "model": format!("{MODEL} fp32, cpu"), "threads": threads, "clients": clients,
        "requests": requests, "max_batch": max_batch, "max_wait_ms": max_wait_ms,
        "repeats": repeats, "dynamic_batching": d, "batch_size_1": s,
        "engine_auto": auto_summary, "engine_auto_note": auto_note,
        "onnx": onnx.map(|m| m.details),
    });
    out.write(&out_path)
}

/// The `engine = auto` rows' name (throughput; the p95 row adds its metric).
const AUTO_ROW: &str = "serve engine=auto vs dynamic batching (libtorch)";

/// `engine = auto` (summary `x`) against dynamic batching on libtorch (`d`): throughput, p95.
fn push_auto_rows(out: &mut SuiteOutput, (x, d): (&Value, &Value), onnx: &OnnxModel, note: &str) {
    let baseline = "kiln serving with dynamic batching, libtorch engine";
    let both = |key: &str| json!({"auto": num(&x[key]), "libtorch": num(&d[key])});
    for (metric, key, unit) in [
        ("", "throughput_rps", REQ_S),
        (" p95 latency", "p95_ms", MS),
    ] {
        let figures = (num(&x[key]), num(&d[key]));
        let name = format!("{AUTO_ROW}{metric}");
        let row = out.row("serving", name, unit, figures, baseline);
        let row = row.detail("engine_auto", json!(note));
        out.push(match key {
            "throughput_rps" => row
                .detail("p95_ms", both("p95_ms"))
                .detail("p50_ms", both("p50_ms"))
                .detail("onnx", onnx.details.clone()),
            _ => row.detail("throughput_rps", both("throughput_rps")),
        });
    }
}
