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
pub(super) fn measure(
    factory: RunnerFactory,
    load: &Load,
    body: &Body,
    side: &str,
) -> Result<LoadReport> {
    let config = ServeConfig {
        port: 0,
        max_batch: load.max_batch,
        max_wait: load.max_wait,
        ..ServeConfig::default()
    };
    let server = Server::start(config, factory).msg()?;
    server.wait_ready().msg()?;
    let report = drive(server.local_addr(), load, body, side);
    server.shutdown().msg()?;
    report
}

/// A warm-up, then the measured load, against `addr`; logs the figures under `side`.
pub(super) fn drive(addr: SocketAddr, load: &Load, body: &Body, side: &str) -> Result<LoadReport> {
    let (body, kind) = body;
    let run = |n| loadgen::run(addr, body.clone(), kind, load.clients, n);
    run((load.requests / 10).max(load.clients)).msg()?;
    let r = run(load.requests).msg()?;
    if r.errors > 0 {
        let (n, of) = (r.errors, r.requests);
        let first = r.first_error.unwrap_or_default();
        return Err(format!("{n} of {of} requests to {addr} failed: {first}"));
    }
    eprintln!(
        "  {side:<28} {:>8.0} req/s  p50 {:>7.2} ms  p95 {:>7.2} ms  p99 {:>7.2} ms",
        r.throughput_rps, r.p50_ms, r.p95_ms, r.p99_ms
    );
    Ok(r)
}

/// The medians of runs' figures, and the runs.
pub(super) fn summary(reports: &[LoadReport]) -> Value {
    let pick = |f: fn(&LoadReport) -> f64| median(reports.iter().map(f).collect());
    json!({"throughput_rps": pick(|r| r.throughput_rps), "p50_ms": pick(|r| r.p50_ms),
           "p95_ms": pick(|r| r.p95_ms), "p99_ms": pick(|r| r.p99_ms), "runs": reports})
}

/// The serving rows' figures: the summary's key, the row's metric and its unit.
pub(super) const FIGURES: [(&str, &str, Unit); 4] = [
    ("throughput_rps", "throughput", REQ_S),
    ("p50_ms", "p50 latency", MS),
    ("p95_ms", "p95 latency", MS),
    ("p99_ms", "p99 latency", MS),
];

/// Pushes dynamic batching's rows, `k` against `b`: throughput (goal `at_least`×), latencies;
/// `details` go to the throughput row.
pub(super) fn push_load_rows(
    out: &mut SuiteOutput,
    (group, suffix, baseline): (&str, &str, &str),
    (k, b): (&Value, &Value),
    at_least: f64,
    details: Value,
) {
    for (key, metric, unit) in FIGURES {
        let name = format!("dynamic batching {metric}{suffix}");
        let mut row = out.row(group, name, unit, (num(&k[key]), num(&b[key])), baseline);
        if key == "throughput_rps" {
            row = row.at_least(at_least);
            row.details = details.clone();
        } else if key == "p95_ms" {
            row = row.at_most(1.0);
        }
        out.push(row);
    }
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

pub(super) fn compare(a: &SuiteArgs) -> Result<()> {
    let max_batch = a.max_batch.unwrap_or(64).max(1);
    let max_wait_ms = a.max_wait_ms.unwrap_or(2.0);
    let clients = a.clients.unwrap_or(32).max(1);
    let requests = a.requests.unwrap_or(if a.quick { 2_000 } else { 6_000 });
    let requests = requests.max(clients);
    let repeats = a.repeats_or(if a.quick { 1 } else { 3 }).max(1);
    let threads = a.threads_or(1).max(1);
    let load = Load {
        python: a.python.clone(),
        max_batch,
        max_wait: Duration::from_secs_f64(max_wait_ms / 1e3),
        clients,
        requests,
        repeats,
        threads,
    };
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
    let auto_note = Arc::new(Mutex::new(None::<String>));
    let npy = kiln_data::npy_f32_bytes(&[FEATURES], &sample())?;
    let body = (npy, "application/x-npy");
    let mut single = load.clone();
    single.max_batch = 1;
    single.max_wait = Duration::ZERO;
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
        measure(factory, load, &body, name).map(Some)
    })?;
    let (d, s) = (summary(&runs[0]), summary(&runs[1]));
    let names = ("serving", "", "kiln serving at batch size 1");
    push_load_rows(&mut out, names, (&d, &s), 2.0, json!({}));
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
    super::peer::compare(&mut out, &load);
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
    let throughput = json!({"engine_auto": note, "p95_ms": both("p95_ms"),
                            "p50_ms": both("p50_ms"), "onnx": onnx.details});
    let p95 = json!({"engine_auto": note, "throughput_rps": both("throughput_rps")});
    for (metric, key, unit, details) in [
        ("", "throughput_rps", REQ_S, throughput),
        (" p95 latency", "p95_ms", MS, p95),
    ] {
        let figures = (num(&x[key]), num(&d[key]));
        let name = format!("{AUTO_ROW}{metric}");
        let mut row = out.row("serving", name, unit, figures, baseline);
        row.details = details;
        out.push(row);
    }
}
