//! The `serve` suite: kiln's inference server with dynamic batching against the same server
//! answering one request at a time, and against `infer.engine = auto`, under one closed-loop load.

use super::*;

/// A factory for a server with `infer.engine = auto` over the bench model: the libtorch engine
/// and ONNX Runtime over `onnx`, each batch-size bucket measured when the server starts (not
/// cached); the choice's note goes to `note`.
fn auto_factory(
    max_batch: usize,
    onnx: PathBuf,
    threads: usize,
    note: Arc<Mutex<Option<String>>>,
) -> RunnerFactory {
    Box::new(move || {
        let torch = engine(Device::Cpu, AmpDtype::None, max_batch, CudaGraphs::Off)?;
        let onnx = onnx_engine(&onnx, Device::Cpu, max_batch, threads)?;
        let auto =
            AutoEngine::new(torch, onnx, "kiln bench mlp", None).map_err(|e| e.to_string())?;
        if let Ok(mut n) = note.lock() {
            *n = Some(auto.note().to_owned());
        }
        Ok(Box::new(auto) as Box<dyn BatchRunner>)
    })
}

/// One measured run: a fresh server built by `factory`, a warm-up, then the load.
fn measure(
    factory: RunnerFactory,
    max_batch: usize,
    max_wait: Duration,
    clients: usize,
    requests: usize,
) -> Result<LoadReport> {
    let config = ServeConfig {
        port: 0,
        max_batch,
        max_wait,
        ..ServeConfig::default()
    };
    let server = Server::start(config, factory).map_err(|e| e.to_string())?;
    server.wait_ready().map_err(|e| e.to_string())?;
    let sample: Vec<f32> = (0..FEATURES)
        .map(|i| (i % 17) as f32 / 17.0 - 0.5)
        .collect();
    let body = kiln_data::npy_f32_bytes(&[FEATURES], &sample)?;
    let addr = server.local_addr();
    loadgen::run(
        addr,
        body.clone(),
        "application/x-npy",
        clients,
        (requests / 10).max(clients),
    )
    .map_err(|e| e.to_string())?;
    let report = loadgen::run(addr, body, "application/x-npy", clients, requests)
        .map_err(|e| e.to_string())?;
    server.shutdown().map_err(|e| e.to_string())?;
    if report.errors > 0 {
        return Err(format!(
            "{} of {} requests failed: {}",
            report.errors,
            report.requests,
            report.first_error.unwrap_or_default()
        ));
    }
    Ok(report)
}

fn summary(reports: &[LoadReport]) -> Value {
    let pick = |f: fn(&LoadReport) -> f64| median(reports.iter().map(f).collect());
    json!({
        "throughput_rps": pick(|r| r.throughput_rps),
        "p50_ms": pick(|r| r.p50_ms),
        "p95_ms": pick(|r| r.p95_ms),
        "p99_ms": pick(|r| r.p99_ms),
        "runs": reports,
    })
}

pub(super) fn compare(a: &SuiteArgs) -> Result<()> {
    let quick = a.quick;
    let repeats = a.repeats_or(if quick { 1 } else { 3 }).max(1);
    let clients = a.clients.unwrap_or(32).max(1);
    let requests = a
        .requests
        .unwrap_or(if quick { 2_000 } else { 6_000 })
        .max(clients);
    let max_batch = a.max_batch.unwrap_or(64).max(1);
    let max_wait_ms = a.max_wait_ms.unwrap_or(2.0);
    let threads = a.threads_or(1).max(1);
    let out_path = a.out_or("serve");
    tch::set_num_threads(i32::try_from(threads).unwrap_or(1));
    let max_wait = Duration::from_secs_f64(max_wait_ms / 1e3);

    eprintln!(
        "serve: mlp 784-1024-1024-10 fp32 on the CPU ({threads} libtorch thread(s)), {clients} \
         clients, {requests} requests of one .npy sample, {repeats} repeat(s)"
    );
    // The `engine = auto` side needs the model's ONNX export; without it that side is skipped.
    let exported = export_onnx(&out_path, "serve", Device::Cpu, threads, max_batch);
    match &exported {
        Ok(m) => eprintln!(
            "  exported {} for engine = auto ({}; max |Δ| vs libtorch at batch {}: {:.2e})",
            m.path.display(),
            m.status,
            m.check_batch,
            m.max_abs
        ),
        Err(why) => eprintln!("  engine = auto is not measured: {why}"),
    }
    let onnx = exported.as_ref().ok();
    let auto_note = Arc::new(Mutex::new(None::<String>));
    let sides = [Side::Dynamic, Side::Single, Side::Auto];
    let mut runs = alternating(repeats, &sides, |_, side| {
        let report = match (side, onnx) {
            (Side::Dynamic, _) => {
                measure(factory(max_batch), max_batch, max_wait, clients, requests)?
            }
            (Side::Single, _) => measure(factory(1), 1, Duration::ZERO, clients, requests)?,
            (Side::Auto, Some(m)) => measure(
                auto_factory(max_batch, m.path.clone(), threads, auto_note.clone()),
                max_batch,
                max_wait,
                clients,
                requests,
            )?,
            (Side::Auto, None) => return Ok(None),
        };
        eprintln!(
            "  {:<28} {:>8.0} req/s  p50 {:>7.2} ms  p95 {:>7.2} ms  p99 {:>7.2} ms",
            match side {
                Side::Dynamic => format!("dynamic batching (≤{max_batch}, {max_wait_ms} ms)"),
                Side::Single => "batch size 1".to_owned(),
                Side::Auto => "engine = auto, dynamic batching".to_owned(),
            },
            report.throughput_rps,
            report.p50_ms,
            report.p95_ms,
            report.p99_ms
        );
        Ok(Some(report))
    })?;
    let (auto, single, dynamic) = (
        runs.pop().unwrap_or_default(),
        runs.pop().unwrap_or_default(),
        runs.pop().unwrap_or_default(),
    );
    let d = summary(&dynamic);
    let s = summary(&single);
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let mut out = SuiteOutput::new(
        "serve",
        &format!(
            "kiln's HTTP server with dynamic batching (≤ {max_batch} samples, {max_wait_ms} ms) \
             against the same server one request at a time, and with infer.engine = auto \
             (libtorch or the model's ONNX export in ONNX Runtime per batch-size bucket) against \
             dynamic batching on libtorch; {clients} closed-loop clients, {requests} requests of \
             one .npy sample; mlp 784-1024-1024-10 fp32 on the CPU, {threads} libtorch (and \
             onnxruntime) thread(s)"
        ),
    );
    let baseline = "kiln serving at batch size 1";
    out.push(
        Comparison::new(
            "serve",
            "serving",
            "dynamic batching throughput",
            "req/s",
            Better::Higher,
            (f(&d, "throughput_rps"), f(&s, "throughput_rps")),
            baseline,
        )
        .at_least(2.0),
    );
    for (key, goal) in [("p50_ms", None), ("p95_ms", Some(1.0)), ("p99_ms", None)] {
        let c = Comparison::new(
            "serve",
            "serving",
            format!("dynamic batching {} latency", key.trim_end_matches("_ms")),
            "ms",
            Better::Lower,
            (f(&d, key), f(&s, key)),
            baseline,
        );
        out.push(match goal {
            Some(g) => c.at_most(g),
            None => c,
        });
    }
    let auto_note = auto_note.lock().ok().and_then(|n| n.clone());
    if let Some(note) = &auto_note {
        eprintln!("  {note}");
    }
    let auto_summary = match &exported {
        Ok(m) => {
            let x = summary(&auto);
            push_auto_rows(&mut out, &x, &d, m, auto_note.as_deref());
            x
        }
        Err(why) => {
            out.skip(AUTO_ROW, &format!("not run: {why}"));
            Value::Null
        }
    };
    // The serving peer: LitServe on the same model, limits and load (JSON requests).
    let load = super::peer::Load {
        python: a.python.clone(),
        max_batch,
        max_wait,
        clients,
        requests,
        repeats,
        threads,
    };
    super::peer::compare(&mut out, &load)?;
    out.details = json!({
        "model": "mlp 784-1024-1024-10 fp32, cpu",
        "threads": threads,
        "clients": clients,
        "requests": requests,
        "max_batch": max_batch,
        "max_wait_ms": max_wait_ms,
        "repeats": repeats,
        "dynamic_batching": d,
        "batch_size_1": s,
        "engine_auto": auto_summary,
        "engine_auto_note": auto_note,
        "onnx": onnx.map(OnnxModel::details),
    });
    out.write(&out_path)
}

/// One of the serve suite's measured sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Dynamic batching on the libtorch engine.
    Dynamic,
    /// One request at a time on the libtorch engine.
    Single,
    /// Dynamic batching with `infer.engine = auto` (libtorch or ONNX Runtime per bucket).
    Auto,
}

/// The `engine = auto` rows' name (throughput; the p95 row adds its metric).
const AUTO_ROW: &str = "serve engine=auto vs dynamic batching (libtorch)";

/// `engine = auto` (summary `x`) against dynamic batching on libtorch (`d`): throughput and p95,
/// with the automatic choice's note.
fn push_auto_rows(
    out: &mut SuiteOutput,
    x: &Value,
    d: &Value,
    onnx: &OnnxModel,
    note: Option<&str>,
) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let baseline = "kiln serving with dynamic batching, libtorch engine";
    let note = json!(note.unwrap_or("the server did not report its choice"));
    let both = |key: &str| json!({"auto": f(x, key), "libtorch": f(d, key)});
    out.push(
        Comparison::new(
            "serve",
            "serving",
            AUTO_ROW,
            "req/s",
            Better::Higher,
            (f(x, "throughput_rps"), f(d, "throughput_rps")),
            baseline,
        )
        .detail("engine_auto", note.clone())
        .detail("p95_ms", both("p95_ms"))
        .detail("p50_ms", both("p50_ms"))
        .detail("onnx", onnx.details()),
    );
    out.push(
        Comparison::new(
            "serve",
            "serving",
            format!("{AUTO_ROW} p95 latency"),
            "ms",
            Better::Lower,
            (f(x, "p95_ms"), f(d, "p95_ms")),
            baseline,
        )
        .detail("engine_auto", note)
        .detail("throughput_rps", both("throughput_rps")),
    );
}
