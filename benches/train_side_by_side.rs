//! `cargo xtask bench train`: kiln's train step against PyTorch eager Python with fused AdamW
//! (`python/train_step.py`) on the same reference model, batch, thread count and fixed random
//! batch. Reports step-time ratios (kiln / PyTorch; below 1 means kiln is faster), kiln's share
//! of this machine's measured fp32 GEMM peak, and writes a JSON report.
//!
//! `kiln-bench-train probe …` is the kiln side of one case, in its own process like the Python
//! side, so neither inherits the other's threads or caches.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use kiln_benches::{bench_root, flag, median, number, python, report_path};
use kiln_config::{ConfigRequest, Machine, ModelKind, ModelPlan, OptimizerKind, ScheduleKind};
use kiln_device::settings::AmpDtype;
use kiln_train::feed::DeviceBatch;
use kiln_train::models::{InputSpec, TransformerShape, build, parameter_count};
use kiln_train::run::synthetic_shape;
use kiln_train::trainer::{TrainSettings, Trainer};
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor, nn};

type Result<T> = std::result::Result<T, String>;

fn usage() -> ! {
    eprintln!(
        "usage: kiln-bench-train [--quick] [--repeats N] [--threads N] [--out FILE] [--python PY]\n\
         \x20      kiln-bench-train probe --model M --precision fp32|bf16|auto --batch N --threads N \
         [--warmup N] [--steps N] [--dropout P] [--channels-last]\n\
         \x20      kiln-bench-train gemm --threads N"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("probe") => probe(&args[1..]),
        Some("gemm") => gemm(&args[1..]),
        _ => compare(&args),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn model_plan(kind: ModelKind, dropout: f64) -> ModelPlan {
    ModelPlan {
        kind,
        dropout,
        d_model: 256,
        heads: 8,
        layers: 4,
        ff: 1024,
        hidden: vec![256, 256],
        channels: vec![32, 64, 128],
        activation_checkpointing: false,
    }
}

/// Matrix-multiply FLOPs of one train step (3 × forward), as the Python script counts them.
fn flops_per_step(kind: ModelKind, batch: usize) -> f64 {
    let forward = match kind {
        ModelKind::Mlp => 2.0 * (64.0 * 256.0 + 256.0 * 256.0 + 256.0 * 10.0),
        ModelKind::Transformer => TransformerShape {
            seq_len: 64,
            features: 469,
            d_model: 256,
            heads: 8,
            layers: 4,
            ff: 1024,
            classes: 100,
        }
        .forward_flops_per_sample() as f64,
        ModelKind::ConvNet => 20_646_400.0,
    };
    3.0 * forward * batch as f64
}

/// kiln's automatic precision on this machine: what the resolved profile picks.
fn auto_precision() -> Result<AmpDtype> {
    let mut req = ConfigRequest::new(Machine::Probe);
    req.sets = vec!["device.request=cpu".to_owned()];
    Ok(kiln_config::load(&req)
        .map_err(|e| e.to_string())?
        .plan
        .train
        .amp)
}

/// Times kiln's train step for one case; prints one JSON line.
fn probe(args: &[String]) -> Result<()> {
    let kind: ModelKind = flag(args, "--model")
        .unwrap_or("transformer")
        .parse()
        .map_err(|e| format!("--model: {e}"))?;
    let precision_arg = flag(args, "--precision").unwrap_or("fp32");
    let precision = if precision_arg == "auto" {
        auto_precision()?
    } else {
        precision_arg.parse::<AmpDtype>()?
    };
    let batch = number(args, "--batch", 32)?.max(1);
    let threads = number(args, "--threads", 2)?.max(1);
    let warmup = number(args, "--warmup", 5)?;
    let steps = number(args, "--steps", 30)?.max(1);
    let dropout: f64 = flag(args, "--dropout")
        .unwrap_or("0.1")
        .parse()
        .map_err(|_| "--dropout must be a number in [0, 1)".to_owned())?;
    kiln_torch_ext::memory::set_num_threads(threads).map_err(|e| e.to_string())?;
    tch::manual_seed(0);

    let (shape, classes) = synthetic_shape(kind);
    let vs = nn::VarStore::new(Device::Cpu);
    let input = InputSpec {
        sample_shape: shape.clone(),
        classes,
    };
    let channels_last = args.iter().any(|a| a == "--channels-last");
    let model = build(&model_plan(kind, dropout), &input, &vs, channels_last, 0)
        .map_err(|e| e.to_string())?;
    let settings = TrainSettings {
        epochs: 1,
        precision,
        optimizer: OptimizerKind::AdamW,
        lr: 1e-3,
        weight_decay: 0.01,
        momentum: 0.0,
        grad_accum_steps: 1,
        clip_grad_norm: 0.0,
        schedule: ScheduleKind::Constant,
        warmup_steps: 0,
        min_lr: 0.0,
        loss_scale: kiln_config::LossScalePlan {
            init: 65536.0,
            growth: 2.0,
            backoff: 0.5,
            growth_interval: 2000,
        },
        log_interval: 1,
        empty_cache_interval: 0,
        max_bad_steps: 10,
    };
    let mut trainer = Trainer::new(model.as_ref(), kind.as_str(), &vs, settings, Device::Cpu)
        .map_err(|e| e.to_string())?;
    let mut dims = vec![batch as i64];
    dims.extend(shape.iter().map(|&d| d as i64));
    let features = Tensor::randn(dims.as_slice(), (Kind::Float, Device::Cpu));
    let labels = Tensor::randint(classes as i64, [batch as i64], (Kind::Int64, Device::Cpu));
    let mut times = Vec::with_capacity(steps);
    let (mut first_loss, mut last_loss) = (f64::NAN, f64::NAN);
    for i in 0..warmup + steps {
        let start = Instant::now();
        let out = trainer
            .train_step(
                &[DeviceBatch {
                    features: features.shallow_clone(),
                    labels: labels.shallow_clone(),
                    indices: vec![],
                    number: i,
                }],
                1e-3,
            )
            .map_err(|e| e.to_string())?;
        // Read the loss each step, as a training loop that logs does (loss.item()).
        let loss = out.loss_sum.double_value(&[]) / batch as f64;
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64());
        }
        if i == 0 {
            first_loss = loss;
        }
        last_loss = loss;
    }
    let median = median(times.clone());
    let flops = flops_per_step(kind, batch);
    println!(
        "{}",
        json!({
            "framework": "kiln",
            "torch_version": kiln_torch_ext::runtime::torch_version(),
            "model": kind.as_str(),
            "precision": match precision { AmpDtype::None => "fp32", AmpDtype::Fp16 => "fp16", AmpDtype::Bf16 => "bf16" },
            "precision_requested": precision_arg,
            "batch": batch,
            "threads": threads,
            "params": parameter_count(&vs),
            "flops_per_step": flops,
            "step_s_median": median,
            "step_s_min": times.iter().copied().fold(f64::INFINITY, f64::min),
            "samples_per_s": batch as f64 / median,
            "gflops": flops / median / 1e9,
            "loss_first": first_loss,
            "loss_last": last_loss,
        })
    );
    Ok(())
}

/// This machine's fp32 GEMM peak through libtorch (best GFLOP/s over large shapes).
fn gemm(args: &[String]) -> Result<()> {
    let threads = number(args, "--threads", 2)?.max(1);
    kiln_torch_ext::memory::set_num_threads(threads).map_err(|e| e.to_string())?;
    let mut best: f64 = 0.0;
    let mut shapes = vec![];
    for (m, k, n) in [
        (2048i64, 1024i64, 1024i64),
        (4096, 4096, 4096),
        (2048, 256, 1024),
    ] {
        let a = Tensor::randn([m, k], (Kind::Float, Device::Cpu));
        let b = Tensor::randn([k, n], (Kind::Float, Device::Cpu));
        for _ in 0..3 {
            let _ = a.matmul(&b);
        }
        let iters = if m * k * n > 1 << 32 { 3 } else { 10 };
        let mut fastest = f64::INFINITY;
        for _ in 0..iters {
            let start = Instant::now();
            let _ = a.matmul(&b);
            fastest = fastest.min(start.elapsed().as_secs_f64());
        }
        let gflops = 2.0 * (m * k * n) as f64 / fastest / 1e9;
        shapes.push(json!({"shape": [m, k, n], "gflops": gflops}));
        best = best.max(gflops);
    }
    println!(
        "{}",
        json!({"gemm_gflops": best, "threads": threads, "shapes": shapes})
    );
    Ok(())
}

fn run_json(mut cmd: Command) -> Result<Value> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("");
    serde_json::from_str(line).map_err(|e| format!("{cmd:?} printed no JSON ({e}): {text}"))
}

/// One comparison: kiln's precision against PyTorch's, and the goal for the ratio.
struct Case {
    model: &'static str,
    kiln: &'static str,
    torch: &'static str,
    /// The goal for the ratio; `None` for rows that are for information.
    goal: Option<f64>,
    /// Extra arguments for both sides.
    extra: &'static [&'static str],
}

const CASES: [Case; 5] = [
    Case {
        model: "mlp",
        kiln: "fp32",
        torch: "fp32",
        goal: Some(0.7),
        extra: &[],
    },
    Case {
        model: "transformer",
        kiln: "fp32",
        torch: "fp32",
        goal: Some(1.0),
        extra: &[],
    },
    Case {
        model: "transformer",
        kiln: "auto",
        torch: "bf16",
        goal: Some(1.0),
        extra: &[],
    },
    Case {
        model: "transformer",
        kiln: "auto",
        torch: "fp32",
        goal: Some(0.5),
        extra: &[],
    },
    Case {
        model: "convnet",
        kiln: "fp32",
        torch: "fp32",
        goal: None,
        extra: &["--channels-last"],
    },
];

fn compare(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        usage();
    }
    let quick = args.iter().any(|a| a == "--quick");
    let repeats = number(args, "--repeats", if quick { 1 } else { 3 })?.max(1);
    let threads = number(args, "--threads", 2)?.max(1);
    let (warmup, steps) = if quick { (2, 5) } else { (5, 20) };
    let python = python(args);
    let root = bench_root();
    let script = root.join("python/train_step.py");
    let out = flag(args, "--out").map_or_else(|| report_path("train.json"), PathBuf::from);
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let threads_s = threads.to_string();

    let peak = run_json({
        let mut c = Command::new(&me);
        c.args(["gemm", "--threads", &threads_s]);
        c
    })?;
    let peak_gflops = peak["gemm_gflops"].as_f64().unwrap_or(f64::NAN);
    eprintln!("fp32 GEMM peak through libtorch, {threads} threads: {peak_gflops:.0} GFLOP/s");

    let mut rows = vec![];
    let mut runs = vec![];
    for case in &CASES {
        let (warm, timed) = (warmup.to_string(), steps.to_string());
        let kiln_cmd = || {
            let mut c = Command::new(&me);
            c.args(["probe", "--model", case.model, "--precision", case.kiln])
                .args(["--batch", "32", "--threads", &threads_s])
                .args(["--warmup", &warm, "--steps", &timed])
                .args(case.extra);
            c
        };
        let torch_cmd = || {
            let mut c = Command::new(&python);
            c.arg(&script)
                .args(["--model", case.model, "--precision", case.torch])
                .args(["--batch", "32", "--threads", &threads_s])
                .args(["--warmup", &warm, "--steps", &timed])
                .args(case.extra);
            c
        };
        // Alternate the sides so drift on a busy machine hits both alike.
        let (mut k, mut t) = (vec![], vec![]);
        let (mut k_last, mut t_last) = (Value::Null, Value::Null);
        for _ in 0..repeats {
            k_last = run_json(kiln_cmd())?;
            t_last = run_json(torch_cmd())?;
            k.push(k_last["step_s_median"].as_f64().unwrap_or(f64::NAN));
            t.push(t_last["step_s_median"].as_f64().unwrap_or(f64::NAN));
            runs.push(json!({"kiln": k_last, "torch": t_last}));
        }
        if k_last["params"] != t_last["params"] {
            return Err(format!(
                "{}: the two sides built different models ({} vs {} parameters)",
                case.model, k_last["params"], t_last["params"]
            ));
        }
        let (ks, ts) = (median(k), median(t));
        let ratio = ks / ts;
        let flops = k_last["flops_per_step"].as_f64().unwrap_or(f64::NAN);
        let peak_share = flops / ks / 1e9 / peak_gflops;
        let kiln_precision = k_last["precision"].as_str().unwrap_or("?").to_owned();
        eprintln!(
            "{:<11} kiln {:<4}{} {:>8.2} ms  vs  torch {:<4} {:>8.2} ms  ratio {:.2}× ({}){}",
            format!(
                "{}{}",
                case.model,
                if case.extra.is_empty() { "" } else { " (cl)" }
            ),
            kiln_precision,
            if case.kiln == "auto" { "*" } else { " " },
            ks * 1e3,
            case.torch,
            ts * 1e3,
            ratio,
            case.goal.map_or_else(
                || "for information".to_owned(),
                |g| format!("goal ≤ {g:.1}×")
            ),
            if kiln_precision == "fp32" && case.model == "transformer" {
                format!(
                    " · kiln at {:.0}% of the fp32 GEMM peak",
                    100.0 * peak_share
                )
            } else {
                String::new()
            }
        );
        rows.push(json!({
            "model": case.model,
            "batch": 32,
            "threads": threads,
            "kiln_precision": kiln_precision,
            "kiln_precision_requested": case.kiln,
            "torch_precision": case.torch,
            "kiln_step_s": ks,
            "torch_step_s": ts,
            "ratio": ratio,
            "options": case.extra,
            "goal": case.goal,
            "meets_goal": case.goal.map(|g| ratio <= g),
            "kiln_share_of_fp32_gemm_peak": peak_share,
        }));
    }
    eprintln!("(* kiln's automatic precision for this machine's profile; (cl) = channels-last)");
    let report = json!({
        "suite": "train",
        "what": "train step (forward, cross-entropy, backward, fused AdamW, loss read), one fixed batch, CPU",
        "repeats": repeats,
        "warmup_steps": warmup,
        "timed_steps": steps,
        "fp32_gemm_peak": peak,
        "results": rows,
        "runs": runs,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n",
    )
    .map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!("report: {}", out.display());
    Ok(())
}
