//! Two `cargo xtask bench` suites over kiln's inference.
//!
//! `infer`: kiln's engine (`kiln infer`'s batches: host inputs in, host fp32 outputs out)
//! against PyTorch eager `inference_mode` (`python/infer_step.py`) on the same model, batch,
//! precision, threads and device: throughput at batch 64, latency at batch 1, bf16, CUDA graphs
//! on a GPU, and with `--batch-sizes` a sweep of throughput and peak memory.
//! `infer-probe` is the kiln side of one such measurement, in its own process.
//!
//! `serve` (the default): kiln's inference server with dynamic batching against the same
//! server answering one request at a time (`infer.batch_size = 1`), on the same model, under the
//! same closed-loop load (`--clients` concurrent keep-alive clients each sending one `.npy`
//! sample at a time). Reports throughput and p50/p95/p99 latency of both, their ratios, and
//! writes its suite output. Goal on a CPU: at least 2× the throughput at no worse
//! p95.
//!
//! The model is an MLP on 784 features (1024, 1024 hidden, 10 classes, fp32, random weights):
//! at batch 1 each request reads all 4 MB of weights for a handful of multiply-adds per weight,
//! which is what batching amortises.

mod serve_peer;

use std::process::Command;
use std::time::{Duration, Instant};

use kiln_benches::report::{Better, Comparison, SWEEP_GROUP, SuiteOutput};
use kiln_benches::{
    bench_root, device, device_name, flag, interleaved, median, median_of, number, numbers,
    peak_memory_mib, python, suite_out,
};
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
        "usage: kiln-bench-serve [serve] [--quick] [--repeats N] [--clients N] [--requests N] \
         [--max-batch N] [--max-wait-ms MS] [--threads N] [--out FILE]\n\
         \x20      kiln-bench-serve infer [--quick] [--repeats N] [--threads N] [--device D] \
         [--batch-sizes 1,2,4…] [--out FILE] [--python PY]\n\
         \x20      kiln-bench-serve infer-probe [--precision fp32|bf16|fp16] [--batch N] \
         [--batches N] [--warmup N] [--threads N] [--device D] [--graphs on|off]"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        usage();
    }
    let rest = args.get(1..).unwrap_or_default();
    let result = match args.first().map(String::as_str) {
        Some("infer") => infer_suite(rest),
        Some("infer-probe") => infer_probe(rest),
        Some("serve") => compare(rest),
        _ => compare(&args),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// A factory for the benchmark's model behind an engine of `max_batch` on the CPU.
fn factory(max_batch: usize) -> RunnerFactory {
    Box::new(move || {
        let engine = engine(Device::Cpu, AmpDtype::None, max_batch, CudaGraphs::Off)?;
        Ok(Box::new(engine) as Box<dyn BatchRunner>)
    })
}

/// The benchmark's model (random weights, seed 0) behind an engine, warmed up at full batch.
fn engine(
    device: Device,
    precision: AmpDtype,
    max_batch: usize,
    cuda_graphs: CudaGraphs,
) -> Result<Engine> {
    {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(device);
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
            script: None,
        };
        let input = InputSpec {
            sample_shape: vec![FEATURES],
            classes: 10,
            target: None,
        };
        let model = build(&plan, &input, &vs, false, 0).map_err(|e| e.to_string())?;
        let model =
            LoadedModel::from_kiln(vs, model, "mlp 784-1024-1024-10", vec![FEATURES], precision);
        let mut engine = Engine::new(
            model,
            vec![FEATURES],
            EngineOptions {
                max_batch,
                cuda_graphs,
            },
        )
        .map_err(|e| e.to_string())?;
        engine
            .run(&vec![0.0; FEATURES * max_batch], max_batch)
            .map_err(|e| e.to_string())?;
        Ok(engine)
    }
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
    let out_path = suite_out(args, "serve");
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
    let mut out = SuiteOutput::new(
        "serve",
        &format!(
            "kiln's HTTP server with dynamic batching (≤ {max_batch} samples, {max_wait_ms} ms) \
             against the same server one request at a time; {clients} closed-loop clients, \
             {requests} requests of one .npy sample; mlp 784-1024-1024-10 fp32 on the CPU, \
             {threads} libtorch thread(s)"
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
    // The serving peer: LitServe on the same model, limits and load (JSON requests).
    let load = serve_peer::Load {
        python: python(args),
        max_batch,
        max_wait,
        clients,
        requests,
        repeats,
        threads,
    };
    serve_peer::compare(&mut out, &load)?;
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
    });
    out.write(&out_path)
}

fn precision_arg(args: &[String]) -> Result<AmpDtype> {
    flag(args, "--precision")
        .unwrap_or("fp32")
        .parse::<AmpDtype>()
}

/// Times kiln's engine over `--batches` batches of random host inputs; prints one JSON line.
fn infer_probe(args: &[String]) -> Result<()> {
    let device = device(args)?;
    let precision = precision_arg(args)?;
    let batch = number(args, "--batch", 64)?.max(1);
    let batches = number(args, "--batches", 200)?.max(1);
    let warmup = number(args, "--warmup", 20)?;
    let threads = number(args, "--threads", 2)?.max(1);
    let graphs = match flag(args, "--graphs").unwrap_or("off") {
        "on" => CudaGraphs::On,
        "off" => CudaGraphs::Off,
        "auto" => CudaGraphs::Auto,
        other => return Err(format!("--graphs `{other}`: expected on, off or auto")),
    };
    kiln_torch_ext::memory::set_num_threads(threads).map_err(|e| e.to_string())?;
    let mut engine = engine(device, precision, batch, graphs)?;
    tch::manual_seed(1);
    let inputs: Vec<f32> = Vec::<f32>::try_from(tch::Tensor::randn(
        [(batch * FEATURES) as i64],
        (tch::Kind::Float, Device::Cpu),
    ))
    .map_err(|e| e.to_string())?;
    let mut times = vec![];
    for i in 0..warmup + batches {
        let start = Instant::now();
        // `run` returns host outputs, so it has waited for the device.
        let (outputs, shape) = engine.run(&inputs, batch).map_err(|e| e.to_string())?;
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64());
        }
        if shape != [10] || outputs.len() != batch * 10 || outputs.iter().any(|v| !v.is_finite()) {
            return Err(format!(
                "unexpected outputs: {} values of sample shape {shape:?} for {batch} samples",
                outputs.len()
            ));
        }
    }
    let total: f64 = times.iter().sum();
    let mut ordered = times.clone();
    ordered.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        let rank = ((q / 100.0 * ordered.len() as f64).ceil() as usize).clamp(1, ordered.len());
        ordered[rank - 1] * 1e3
    };
    let (memory, memory_kind) = peak_memory_mib(device);
    println!(
        "{}",
        json!({
            "framework": "kiln",
            "device": device_name(device),
            "precision": kiln_train::trainer::precision_name(precision),
            "batch": batch,
            "batches": batches,
            "threads": threads,
            "graphs": format!("{:?}", engine.graph_status()),
            "samples_per_s": (batch * batches) as f64 / total,
            "p50_ms": median(times.clone()) * 1e3,
            "p95_ms": pct(95.0),
            "p99_ms": pct(99.0),
            "peak_memory_mib": memory,
            "peak_memory_kind": memory_kind,
        })
    );
    Ok(())
}

fn infer_suite(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let repeats = number(args, "--repeats", if quick { 1 } else { 3 })?.max(1);
    let threads = number(args, "--threads", 2)?.max(1).to_string();
    let device = device(args)?;
    let dev = device_name(device);
    let python = python(args);
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let (warmup, batches) = if quick { ("5", "30") } else { ("20", "200") };
    let sizes = numbers(args, "--batch-sizes")?;
    let mixed = "bf16";
    let mut out = SuiteOutput::new(
        "infer",
        &format!(
            "offline inference of mlp 784-1024-1024-10 (random weights) on {dev}, {threads} \
             threads: kiln's engine (host batches in, fp32 host outputs out) against PyTorch \
             eager inference_mode doing the same"
        ),
    );
    let kiln = |precision: &str, batch: usize, graphs: &str| {
        let mut c = Command::new(&me);
        c.arg("infer-probe")
            .args(["--precision", precision, "--batch", &batch.to_string()])
            .args([
                "--warmup",
                warmup,
                "--batches",
                batches,
                "--threads",
                &threads,
            ])
            .args(["--device", &dev, "--graphs", graphs]);
        c
    };
    let torch = |precision: &str, batch: usize| {
        let mut c = Command::new(&python);
        c.arg(bench_root().join("python/infer_step.py"))
            .args(["--precision", precision, "--batch", &batch.to_string()])
            .args([
                "--warmup",
                warmup,
                "--batches",
                batches,
                "--threads",
                &threads,
            ])
            .args(["--device", &dev]);
        c
    };
    // Interleaved A/B runs: returns the kiln and torch runs.
    let ab = |precision: &str, batch: usize, graphs: &str| -> Result<(Vec<Value>, Vec<Value>)> {
        let k = || kiln(precision, batch, graphs);
        let t = || torch(precision, batch);
        let mut runs = interleaved(repeats, &[&k, &t])?;
        let t = runs.pop().unwrap_or_default();
        Ok((runs.pop().unwrap_or_default(), t))
    };
    let mut runs = vec![];
    let graphs = if device.is_cuda() { "on" } else { "off" };
    for (precision, batch) in [("fp32", 64), ("fp32", 1), (mixed, 64), (mixed, 1)] {
        let (k, t) = ab(precision, batch, graphs)?;
        let baseline = format!("PyTorch eager {precision} inference_mode");
        let with_graphs = if graphs == "on" { ", CUDA graphs" } else { "" };
        out.push(
            Comparison::new(
                "infer",
                "inference",
                format!("mlp {precision} b={batch} throughput{with_graphs}"),
                "samples/s",
                Better::Higher,
                (
                    median_of(&k, "samples_per_s"),
                    median_of(&t, "samples_per_s"),
                ),
                baseline.clone(),
            )
            .detail("batch_size", json!(batch)),
        );
        out.push(
            Comparison::new(
                "infer",
                "inference",
                format!("mlp {precision} b={batch} p50 latency{with_graphs}"),
                "ms",
                Better::Lower,
                (median_of(&k, "p50_ms"), median_of(&t, "p50_ms")),
                baseline,
            )
            .detail("batch_size", json!(batch))
            .detail(
                "p95_ms",
                json!({"kiln": median_of(&k, "p95_ms"), "baseline": median_of(&t, "p95_ms")}),
            ),
        );
        runs.push(json!({"precision": precision, "batch": batch, "kiln": k, "torch": t}));
    }
    if !device.is_cuda() {
        out.skip(
            "CUDA-graph latency",
            "needs a CUDA GPU; this machine has none",
        );
    }
    for &b in &sizes {
        let (k, t) = ab("fp32", b, graphs)?;
        let baseline = "PyTorch eager fp32 inference_mode";
        out.push(
            Comparison::new(
                "infer",
                SWEEP_GROUP,
                format!("mlp fp32 b={b} throughput"),
                "samples/s",
                Better::Higher,
                (
                    median_of(&k, "samples_per_s"),
                    median_of(&t, "samples_per_s"),
                ),
                baseline,
            )
            .detail("batch_size", json!(b)),
        );
        out.push(
            Comparison::new(
                "infer",
                SWEEP_GROUP,
                format!("mlp fp32 b={b} peak memory"),
                "MiB",
                Better::Lower,
                (
                    median_of(&k, "peak_memory_mib"),
                    median_of(&t, "peak_memory_mib"),
                ),
                baseline,
            )
            .detail("batch_size", json!(b))
            .detail("memory", k[0]["peak_memory_kind"].clone()),
        );
        runs.push(json!({"sweep_batch": b, "kiln": k, "torch": t}));
    }
    out.details = json!({"repeats": repeats, "warmup_batches": warmup,
                         "timed_batches": batches, "runs": runs});
    out.write(&suite_out(args, "infer"))
}
