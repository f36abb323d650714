//! `cargo xtask bench serve`: kiln's inference server with dynamic batching against the same
//! server answering one request at a time (`infer.batch_size = 1`), on the same model, under the
//! same closed-loop load (`--clients` concurrent keep-alive clients each sending one `.npy`
//! sample at a time). Reports throughput and p50/p95/p99 latency of both, their ratios, and
//! writes `target/kiln-bench/serve.json`. Goal on a CPU: at least 2× the throughput at no worse
//! p95.
//!
//! The model is an MLP on 784 features (1024, 1024 hidden, 10 classes, fp32, random weights):
//! at batch 1 each request reads all 4 MB of weights for a handful of multiply-adds per weight,
//! which is what batching amortises.

use std::time::Duration;

use kiln_benches::{flag, median, number, report_path};
use kiln_config::{CudaGraphs, ModelKind, ModelPlan};
use kiln_device::settings::AmpDtype;
use kiln_infer::serve::loadgen::{self, LoadReport};
use kiln_infer::serve::{BatchRunner, RunnerFactory, ServeConfig, Server};
use kiln_infer::{Engine, EngineOptions, LoadedModel};
use kiln_train::models::{InputSpec, build};
use serde_json::{Value, json};
use tch::{Device, nn};

type Result<T> = std::result::Result<T, String>;

const FEATURES: usize = 784;

fn usage() -> ! {
    eprintln!(
        "usage: kiln-bench-serve [--quick] [--repeats N] [--clients N] [--requests N] \
         [--max-batch N] [--max-wait-ms MS] [--threads N] [--out FILE]"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        usage();
    }
    if let Err(e) = compare(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// A factory for the benchmark's model behind an engine of `max_batch`.
fn factory(max_batch: usize) -> RunnerFactory {
    Box::new(move || {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let plan = ModelPlan {
            kind: ModelKind::Mlp,
            dropout: 0.0,
            d_model: 256,
            heads: 8,
            layers: 4,
            ff: 1024,
            hidden: vec![1024, 1024],
            channels: vec![32, 64, 128],
            activation_checkpointing: false,
        };
        let input = InputSpec {
            sample_shape: vec![FEATURES],
            classes: 10,
        };
        let model = build(&plan, &input, &vs, false, 0).map_err(|e| e.to_string())?;
        let model = LoadedModel::from_kiln(
            vs,
            model,
            "mlp 784-1024-1024-10",
            vec![FEATURES],
            AmpDtype::None,
        );
        let mut engine = Engine::new(
            model,
            vec![FEATURES],
            EngineOptions {
                max_batch,
                cuda_graphs: CudaGraphs::Off,
            },
        )
        .map_err(|e| e.to_string())?;
        engine
            .run(&vec![0.0; FEATURES * max_batch], max_batch)
            .map_err(|e| e.to_string())?;
        Ok(Box::new(engine) as Box<dyn BatchRunner>)
    })
}

/// One measured run: a fresh server, a warm-up, then the load.
fn measure(
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
    let server = Server::start(config, factory(max_batch)).map_err(|e| e.to_string())?;
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

fn compare(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let repeats = number(args, "--repeats", if quick { 1 } else { 3 })?.max(1);
    let clients = number(args, "--clients", 32)?.max(1);
    let requests = number(args, "--requests", if quick { 2_000 } else { 6_000 })?.max(clients);
    let max_batch = number(args, "--max-batch", 64)?.max(1);
    let max_wait_ms: f64 = flag(args, "--max-wait-ms").map_or(Ok(2.0), |v| {
        v.parse()
            .map_err(|_| format!("--max-wait-ms `{v}` is not a number"))
    })?;
    let threads = number(args, "--threads", 1)?.max(1);
    let out =
        flag(args, "--out").map_or_else(|| report_path("serve.json"), std::path::PathBuf::from);
    tch::set_num_threads(i32::try_from(threads).unwrap_or(1));
    let max_wait = Duration::from_secs_f64(max_wait_ms / 1e3);

    eprintln!(
        "serve: mlp 784-1024-1024-10 fp32 on the CPU ({threads} libtorch thread(s)), {clients} \
         clients, {requests} requests of one .npy sample, {repeats} repeat(s)"
    );
    let mut dynamic = vec![];
    let mut single = vec![];
    for r in 0..repeats {
        // Alternate the order so neither side always runs on a warmer machine.
        let order = if r % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for batched in order {
            let report = if batched {
                measure(max_batch, max_wait, clients, requests)?
            } else {
                measure(1, Duration::ZERO, clients, requests)?
            };
            eprintln!(
                "  {:<28} {:>8.0} req/s  p50 {:>7.2} ms  p95 {:>7.2} ms  p99 {:>7.2} ms",
                if batched {
                    format!("dynamic batching (≤{max_batch}, {max_wait_ms} ms)")
                } else {
                    "batch size 1".to_owned()
                },
                report.throughput_rps,
                report.p50_ms,
                report.p95_ms,
                report.p99_ms
            );
            if batched {
                dynamic.push(report);
            } else {
                single.push(report);
            }
        }
    }
    let d = summary(&dynamic);
    let s = summary(&single);
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let throughput_ratio = f(&d, "throughput_rps") / f(&s, "throughput_rps");
    let p95_ratio = f(&d, "p95_ms") / f(&s, "p95_ms");
    let met = throughput_ratio >= 2.0 && p95_ratio <= 1.0;
    eprintln!(
        "serve: dynamic batching / batch size 1: throughput {throughput_ratio:.2}×, p95 latency \
         {p95_ratio:.2}× (goal: ≥ 2× throughput at ≤ 1× p95: {})",
        if met { "met" } else { "NOT met" }
    );
    let report = json!({
        "suite": "serve",
        "model": "mlp 784-1024-1024-10 fp32, cpu",
        "threads": threads,
        "clients": clients,
        "requests": requests,
        "max_batch": max_batch,
        "max_wait_ms": max_wait_ms,
        "dynamic_batching": d,
        "batch_size_1": s,
        "throughput_ratio": throughput_ratio,
        "p95_ratio": p95_ratio,
        "goal_met": met,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!("serve: wrote {}", out.display());
    Ok(())
}
