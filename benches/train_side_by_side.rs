//! `cargo xtask bench` suites over the train step, each side by side with PyTorch eager Python
//! (`python/train_step.py`, fused AdamW on) on the same reference model, batch, thread count,
//! device and fixed random batch:
//!
//! - `train` (the default): step-time ratios (kiln / PyTorch; below 1 means kiln is faster),
//!   each step's model FLOP utilization against this machine's measured GEMM peak, the step
//!   breakdown (data wait, forward, backward, optimizer) of both sides, and with
//!   `--batch-sizes 1,2,4…` a sweep of throughput and peak memory over batch sizes. Besides
//!   PyTorch eager, the transformer rows run against `torch.compile(model)` (default mode; not
//!   in `--quick`), its compile time (the first step, from an empty inductor cache) a row apart.
//! - `optimizer`: one AdamW step over the transformer's parameters: kiln's fused kernel against
//!   the per-tensor update and against `torch.optim.AdamW` fused, foreach and single-tensor.
//! - `opts`: one optimization toggled at a time on kiln's own step (precision, fused AdamW,
//!   TF32, cuDNN benchmark, channels-last, loader workers, CUDA graphs), each one's speedup.
//!
//! `probe`, `gemm` and `optim-probe` are the kiln side of one measurement, each in its own
//! process like the Python side, so neither inherits the other's threads, caches or flags.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use kiln_benches::report::{Better, Comparison, SWEEP_GROUP, SuiteOutput};
use kiln_benches::unfused::UnfusedAdamW;
use kiln_benches::{
    bench_root, device, device_name, flag, interleaved, median, median_of, number, numbers,
    peak_memory_mib, python, run_json, suite_out,
};
use kiln_config::{ConfigRequest, Machine, ModelKind, ModelPlan, OptimizerKind, ScheduleKind};
use kiln_data::{Loader, LoaderConfig, SyntheticClassification};
use kiln_device::settings::AmpDtype;
use kiln_torch_ext::flags::{self, Flag};
use kiln_train::feed::DeviceBatch;
use kiln_train::model::Model;
use kiln_train::models::{InputSpec, TransformerShape, build, parameter_count};
use kiln_train::optim::{Optimizer, Rule, param_groups};
use kiln_train::run::synthetic_shape;
use kiln_train::script::ScriptModel;
use kiln_train::trainer::{TrainSettings, Trainer, precision_name};
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor, nn};

type Result<T> = std::result::Result<T, String>;

fn usage() -> ! {
    eprintln!(
        "usage: kiln-bench-train [train|optimizer|opts] [--quick] [--repeats N] [--threads N] \
         [--device D] [--batch-sizes 1,2,4…] [--out FILE] [--python PY]\n\
         \x20      kiln-bench-train probe --model M --precision fp32|bf16|fp16|auto --batch N \
         [--threads N] [--device D] [--warmup N] [--steps N] [--breakdown-steps N] [--dropout P] \
         [--channels-last] [--tf32 on|off] [--cudnn-benchmark on|off] [--script MODEL.pt]\n\
         \x20      kiln-bench-train gemm [--precision fp32|tf32|bf16|fp16] [--threads N] [--device D]\n\
         \x20      kiln-bench-train optim-probe --impl fused|unfused [--threads N] [--device D] \
         [--warmup N] [--steps N]"
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
        Some("probe") => probe(rest),
        Some("gemm") => gemm(rest),
        Some("optim-probe") => optim_probe(rest),
        Some("optimizer") => optimizer_suite(rest),
        Some("opts") => opts_suite(rest),
        Some("train") => train_suite(rest),
        _ => train_suite(&args),
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
        script: None,
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
        // The benchmarked TorchScript module is the transformer's twin.
        ModelKind::TorchScript => return flops_per_step(ModelKind::Transformer, batch),
    };
    3.0 * forward * batch as f64
}

/// kiln's configuration resolved for `device` (its hardware profile, no user settings).
fn resolved(device: Device) -> Result<kiln_config::Resolution> {
    let mut req = ConfigRequest::new(Machine::Probed(
        kiln_device::probe::probe().map_err(|e| e.to_string())?,
    ));
    req.sets = vec![format!(
        "device.request={}",
        if device.is_cuda() { "cuda" } else { "cpu" }
    )];
    kiln_config::load(&req).map_err(|e| e.to_string())
}

fn on_off(args: &[String], name: &str) -> Result<Option<bool>> {
    match flag(args, name) {
        None => Ok(None),
        Some("on") => Ok(Some(true)),
        Some("off") => Ok(Some(false)),
        Some(v) => Err(format!("{name} `{v}`: expected on or off")),
    }
}

/// Applies kiln's profile backend settings on a GPU (what `kiln train` does there), then the
/// probe's explicit `--tf32` / `--cudnn-benchmark`; returns whether fp32 matmuls use TF32.
fn backend(args: &[String], device: Device) -> Result<bool> {
    if let Device::Cuda(i) = device {
        let plan = resolved(device)?.plan;
        kiln_device::settings::apply(&plan.performance.backend, kiln_device::Device::Cuda(i));
    }
    if let Some(on) = on_off(args, "--tf32")? {
        flags::set_flag(Flag::Tf32CuBlas, on).map_err(|e| e.to_string())?;
        flags::set_flag(Flag::Tf32CuDnn, on).map_err(|e| e.to_string())?;
    }
    if let Some(on) = on_off(args, "--cudnn-benchmark")? {
        flags::set_flag(Flag::CuDnnBenchmark, on).map_err(|e| e.to_string())?;
    }
    Ok(device.is_cuda() && flags::flag(Flag::Tf32CuBlas).unwrap_or(false))
}

fn settings(precision: AmpDtype) -> TrainSettings {
    TrainSettings {
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
        loss: kiln_config::LossKind::Auto,
    }
}

/// Times kiln's train step for one case; prints one JSON line.
fn probe(args: &[String]) -> Result<()> {
    let kind: ModelKind = flag(args, "--model")
        .unwrap_or("transformer")
        .parse()
        .map_err(|e| format!("--model: {e}"))?;
    let device = device(args)?;
    let precision_arg = flag(args, "--precision").unwrap_or("fp32");
    let precision = if precision_arg == "auto" {
        resolved(device)?.plan.train.amp
    } else {
        precision_arg
            .parse::<AmpDtype>()
            .map_err(|e| format!("--precision: {e}"))?
    };
    let batch = number(args, "--batch", 32)?.max(1);
    let threads = number(args, "--threads", 2)?.max(1);
    let warmup = number(args, "--warmup", 5)?;
    let steps = number(args, "--steps", 30)?.max(1);
    let breakdown_steps = number(args, "--breakdown-steps", 0)?;
    let dropout: f64 = flag(args, "--dropout")
        .unwrap_or("0.1")
        .parse()
        .map_err(|_| "--dropout must be a number in [0, 1)".to_owned())?;
    kiln_torch_ext::memory::set_num_threads(threads).map_err(|e| e.to_string())?;
    let tf32 = backend(args, device)?;
    tch::manual_seed(0);

    let (shape, classes) = synthetic_shape(kind).ok_or("no synthetic data for this model")?;
    let vs = nn::VarStore::new(device);
    let input = InputSpec {
        sample_shape: shape.clone(),
        classes,
        target: None,
    };
    let channels_last = args.iter().any(|a| a == "--channels-last");
    // `--script PATH`: the model's TorchScript twin from `train_step.py --export-script`.
    let script = flag(args, "--script");
    let model: Box<dyn Model> = match script {
        Some(path) => {
            Box::new(ScriptModel::load(std::path::Path::new(path), &vs).map_err(|e| e.to_string())?)
        }
        None => build(&model_plan(kind, dropout), &input, &vs, channels_last, 0)
            .map_err(|e| e.to_string())?,
    };
    let mut trainer = Trainer::new(
        model.as_ref(),
        kind.as_str(),
        &vs,
        settings(precision),
        device,
    )
    .map_err(|e| e.to_string())?;
    let mut dims = vec![batch as i64];
    dims.extend(shape.iter().map(|&d| d as i64));
    let features = Tensor::randn(dims.as_slice(), (Kind::Float, device));
    let labels = Tensor::randint(classes as i64, [batch as i64], (Kind::Int64, device));
    let mut times = Vec::with_capacity(steps);
    let mut losses = vec![];
    let mut data_wait = 0.0;
    let mut first_step = f64::NAN;
    for i in 0..warmup + steps + breakdown_steps {
        if i == warmup + steps {
            trainer.set_phase_timing(true);
        }
        let start = Instant::now();
        // One resident batch, as on the Python side: the data wait is fetching it.
        let batch_in = DeviceBatch {
            features: features.shallow_clone(),
            targets: labels.shallow_clone(),
            indices: vec![],
            number: i,
        };
        if i >= warmup + steps {
            data_wait += start.elapsed().as_secs_f64();
        }
        let out = trainer
            .train_step(&[batch_in], 1e-3)
            .map_err(|e| e.to_string())?;
        // Read the loss each step, as a training loop that logs does (loss.item()).
        let loss = out
            .sums
            .values
            .f_double_value(&[0])
            .map_err(|e| e.to_string())?
            / batch as f64;
        if (warmup..warmup + steps).contains(&i) {
            times.push(start.elapsed().as_secs_f64());
        }
        if i == 0 {
            first_step = start.elapsed().as_secs_f64();
        }
        losses.push(loss);
    }
    if losses.iter().any(|l| !l.is_finite()) {
        return Err(format!("non-finite loss during training: {losses:?}"));
    }
    let breakdown = trainer.phase_times().map(|t| {
        let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / breakdown_steps as f64;
        json!({
            "data_wait_ms": data_wait * 1e3 / breakdown_steps as f64,
            "forward_ms": per(t.forward),
            "backward_ms": per(t.backward),
            "optimizer_ms": per(t.optimizer),
        })
    });
    let median = median(times.clone());
    let flops = flops_per_step(kind, batch);
    let (memory, memory_kind) = peak_memory_mib(device);
    println!(
        "{}",
        json!({
            "framework": "kiln",
            "torch_version": kiln_torch_ext::runtime::torch_version(),
            "device": device_name(device),
            "model": kind.as_str(),
            "torchscript": script,
            "precision": precision_name(precision),
            "precision_requested": precision_arg,
            "tf32": tf32,
            "batch": batch,
            "threads": threads,
            "params": parameter_count(&vs),
            "flops_per_step": flops,
            "step_s_median": median,
            "step_s_min": times.iter().copied().fold(f64::INFINITY, f64::min),
            "samples_per_s": batch as f64 / median,
            "gflops": flops / median / 1e9,
            "first_step_s": first_step,
            "loss_first": losses.first(),
            "loss_last": losses.last(),
            "breakdown": breakdown,
            "peak_memory_mib": memory,
            "peak_memory_kind": memory_kind,
        })
    );
    Ok(())
}

/// This machine's GEMM peak through libtorch at one precision (best GFLOP/s over large
/// shapes), the device synchronised around each timed call.
fn gemm(args: &[String]) -> Result<()> {
    let threads = number(args, "--threads", 2)?.max(1);
    let device = device(args)?;
    let precision = flag(args, "--precision").unwrap_or("fp32");
    let kind = match precision {
        "fp32" | "tf32" => Kind::Float,
        "bf16" => Kind::BFloat16,
        "fp16" => Kind::Half,
        other => {
            return Err(format!(
                "--precision `{other}`: expected fp32, tf32, bf16 or fp16"
            ));
        }
    };
    kiln_torch_ext::memory::set_num_threads(threads).map_err(|e| e.to_string())?;
    if device.is_cuda() {
        flags::set_flag(Flag::Tf32CuBlas, precision == "tf32").map_err(|e| e.to_string())?;
    }
    let sync = || kiln_torch_ext::cuda::synchronize(device).map_err(|e| e.to_string());
    let mut best: f64 = 0.0;
    let mut shapes = vec![];
    let sizes: &[(i64, i64, i64)] = if device.is_cuda() {
        &[(8192, 8192, 8192), (4096, 4096, 4096)]
    } else {
        &[(2048, 1024, 1024), (4096, 4096, 4096), (2048, 256, 1024)]
    };
    for &(m, k, n) in sizes {
        let a = Tensor::randn([m, k], (kind, device));
        let b = Tensor::randn([k, n], (kind, device));
        for _ in 0..3 {
            let _ = a.f_matmul(&b).map_err(|e| e.to_string())?;
        }
        let iters = if device.is_cuda() || m * k * n <= 1 << 32 {
            10
        } else {
            3
        };
        let mut fastest = f64::INFINITY;
        for _ in 0..iters {
            sync()?;
            let start = Instant::now();
            let _ = a.f_matmul(&b).map_err(|e| e.to_string())?;
            sync()?;
            fastest = fastest.min(start.elapsed().as_secs_f64());
        }
        let gflops = 2.0 * (m * k * n) as f64 / fastest / 1e9;
        shapes.push(json!({"shape": [m, k, n], "gflops": gflops}));
        best = best.max(gflops);
    }
    println!(
        "{}",
        json!({"gemm_gflops": best, "precision": precision, "device": device_name(device),
               "threads": threads, "shapes": shapes})
    );
    Ok(())
}

/// The parameters (shapes) the optimizer benchmarks update: the reference transformer's.
fn optimizer_store(device: Device) -> Result<nn::VarStore> {
    let vs = nn::VarStore::new(device);
    let (shape, classes) = synthetic_shape(ModelKind::Transformer).ok_or("no synthetic data")?;
    let input = InputSpec {
        sample_shape: shape,
        classes,
        target: None,
    };
    build(
        &model_plan(ModelKind::Transformer, 0.0),
        &input,
        &vs,
        false,
        0,
    )
    .map_err(|e| e.to_string())?;
    Ok(vs)
}

fn shapes_arg(vs: &nn::VarStore) -> String {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars.iter()
        .map(|(_, t)| {
            t.size()
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join("x")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Times one AdamW step over the transformer's parameters: kiln's optimizer (the fused kernel,
/// one call per parameter group) or the per-tensor update.
fn optim_probe(args: &[String]) -> Result<()> {
    let device = device(args)?;
    let threads = number(args, "--threads", 2)?.max(1);
    let warmup = number(args, "--warmup", 5)?;
    let steps = number(args, "--steps", 50)?.max(1);
    let fused = match flag(args, "--impl").unwrap_or("fused") {
        "fused" => true,
        "unfused" => false,
        other => return Err(format!("--impl `{other}`: expected fused or unfused")),
    };
    kiln_torch_ext::memory::set_num_threads(threads).map_err(|e| e.to_string())?;
    tch::manual_seed(0);
    let vs = optimizer_store(device)?;
    let groups = param_groups(&vs, 0.01);
    let params: Vec<Tensor> = groups
        .iter()
        .flat_map(|g| g.params.iter().map(Tensor::shallow_clone))
        .collect();
    let decays: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.params.iter().map(|_| g.weight_decay))
        .collect();
    // Fixed random gradients, set through autograd (d/dp Σ p·g = g).
    let grads: Vec<Tensor> = params.iter().map(Tensor::randn_like).collect();
    let mut total = Tensor::f_zeros([], (Kind::Float, device)).map_err(|e| e.to_string())?;
    for (p, g) in params.iter().zip(&grads) {
        let term = p
            .f_mul(g)
            .and_then(|t| t.f_sum(Kind::Float))
            .map_err(|e| e.to_string())?;
        total = total.f_add(&term).map_err(|e| e.to_string())?;
    }
    total.f_backward().map_err(|e| e.to_string())?;
    let mut step: Box<dyn FnMut() -> Result<()>> = if fused {
        let config = kiln_torch_ext::optim::AdamWConfig {
            lr: 1e-3,
            weight_decay: 0.01,
            ..Default::default()
        };
        let mut opt = Optimizer::new(Rule::AdamW(config), groups).map_err(|e| e.to_string())?;
        Box::new(move || opt.step(None, None).map_err(|e| e.to_string()))
    } else {
        let mut opt = UnfusedAdamW::new(&params, decays, 1e-3).map_err(|e| e.to_string())?;
        Box::new(move || opt.step(&params, &grads).map_err(|e| e.to_string()))
    };
    let sync = || kiln_torch_ext::cuda::synchronize(device).map_err(|e| e.to_string());
    for _ in 0..warmup {
        step()?;
    }
    sync()?;
    let mut times = vec![];
    for _ in 0..steps {
        let start = Instant::now();
        step()?;
        sync()?;
        times.push(start.elapsed().as_secs_f64());
    }
    println!(
        "{}",
        json!({
            "framework": "kiln",
            "impl": if fused { "fused" } else { "unfused" },
            "device": device_name(device),
            "threads": threads,
            "tensors": vs.variables().len(),
            "params": parameter_count(&vs),
            "step_s_median": median(times.clone()),
            "step_s_min": times.iter().copied().fold(f64::INFINITY, f64::min),
        })
    );
    Ok(())
}

/// Common options of the suites.
struct Opts {
    quick: bool,
    repeats: usize,
    threads: String,
    device: Device,
    python: String,
    me: std::path::PathBuf,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Self> {
        let quick = args.iter().any(|a| a == "--quick");
        Ok(Self {
            quick,
            repeats: number(args, "--repeats", if quick { 1 } else { 3 })?.max(1),
            threads: number(args, "--threads", 2)?.max(1).to_string(),
            device: device(args)?,
            python: python(args),
            me: std::env::current_exe().map_err(|e| e.to_string())?,
        })
    }

    fn kiln(&self, mode: &str) -> Command {
        let mut c = Command::new(&self.me);
        c.arg(mode)
            .args(["--threads", &self.threads])
            .args(["--device", &device_name(self.device)]);
        c
    }

    fn torch(&self) -> Command {
        let mut c = Command::new(&self.python);
        c.arg(bench_root().join("python/train_step.py"))
            .args(["--threads", &self.threads])
            .args(["--device", &device_name(self.device)]);
        c
    }

    fn interleaved(&self, cmds: &[&dyn Fn() -> Command]) -> Result<Vec<Vec<Value>>> {
        interleaved(self.repeats, cmds)
    }
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

/// The GEMM peaks the train-step results are measured against: fp32 and bf16 on the CPU;
/// fp32, TF32, bf16 and fp16 on a GPU.
fn peaks(o: &Opts) -> Result<Value> {
    let precisions: &[&str] = if o.device.is_cuda() {
        &["fp32", "tf32", "bf16", "fp16"]
    } else {
        &["fp32", "bf16"]
    };
    let mut peaks = serde_json::Map::new();
    for p in precisions {
        let mut c = o.kiln("gemm");
        c.args(["--precision", p]);
        let v = run_json(c)?;
        eprintln!(
            "{p} GEMM peak through libtorch on {}: {:.0} GFLOP/s",
            device_name(o.device),
            f(&v, "gemm_gflops")
        );
        peaks.insert(format!("{p}_gemm_gflops"), v["gemm_gflops"].clone());
    }
    Ok(Value::Object(peaks))
}

/// The peak a step at `precision` (with fp32 matmuls in TF32 or not) is measured against.
fn peak_for(peaks: &Value, precision: &str, tf32: bool) -> (f64, String) {
    let key = if precision == "fp32" && tf32 {
        "tf32"
    } else {
        precision
    };
    (
        f(peaks, &format!("{key}_gemm_gflops")),
        format!("{key} GEMM"),
    )
}

/// One comparison of the train suite: kiln's precision against PyTorch's, and the goal.
struct Case {
    model: &'static str,
    kiln: &'static str,
    torch: &'static str,
    goal: Option<f64>,
    /// Extra arguments for both sides.
    extra: &'static [&'static str],
    /// Extra arguments for the PyTorch side alone (a same-computation baseline).
    torch_extra: &'static [&'static str],
    /// What the row's name adds (`""`: nothing).
    label: &'static str,
    /// The PyTorch side is `torch.compile(model)` (default mode) rather than eager.
    compile: bool,
}

impl Case {
    /// A row against PyTorch eager.
    const fn eager(
        model: &'static str,
        (kiln, torch): (&'static str, &'static str),
        goal: Option<f64>,
        (extra, torch_extra): (&'static [&'static str], &'static [&'static str]),
        label: &'static str,
    ) -> Self {
        Self {
            model,
            kiln,
            torch,
            goal,
            extra,
            torch_extra,
            label,
            compile: false,
        }
    }

    /// The same row against `torch.compile`.
    const fn compiled(self) -> Self {
        Self {
            compile: true,
            ..self
        }
    }
}

/// PyTorch given kiln's attention choice (the explicit matmul–softmax product on the CPU in
/// bf16, SDPA elsewhere).
const KILN_ATTENTION: &[&str] = &["--attention", "kiln"];
const NO_DROPOUT: &[&str] = &["--dropout", "0"];

/// The train rows. Baselines are PyTorch as a user writes it (SDPA, `nn.Dropout`) unless the
/// row says "same computation": then the PyTorch twin makes kiln's per-precision choices too
/// (the explicit matmul–softmax attention kiln uses on the CPU in bf16), or both sides run
/// without dropout, so that the difference between two rows is what kiln's choice is worth.
/// The `torch.compile` rows (left out of `--quick`) compile the same twin, default mode.
const CASES: [Case; 11] = [
    Case::eager("mlp", ("fp32", "fp32"), Some(0.7), (&[], &[]), ""),
    Case::eager("transformer", ("fp32", "fp32"), Some(1.0), (&[], &[]), ""),
    Case::eager(
        "transformer",
        ("fp32", "fp32"),
        Some(1.0),
        (NO_DROPOUT, &[]),
        ", dropout 0 on both sides",
    ),
    Case::eager(
        "transformer",
        ("auto", "bf16"),
        Some(1.0),
        (&[], &[]),
        " (PyTorch default: SDPA)",
    ),
    Case::eager(
        "transformer",
        ("auto", "bf16"),
        Some(0.9),
        (&[], KILN_ATTENTION),
        ", same computation (PyTorch with kiln's attention choice)",
    ),
    Case::eager(
        "transformer",
        ("auto", "bf16"),
        Some(0.9),
        (NO_DROPOUT, KILN_ATTENTION),
        ", same computation, dropout 0 on both sides",
    ),
    Case::eager("transformer", ("auto", "fp32"), Some(0.5), (&[], &[]), ""),
    Case::eager(
        "convnet",
        ("fp32", "fp32"),
        None,
        (&["--channels-last"], &[]),
        " channels-last",
    ),
    Case::eager(
        "transformer",
        ("auto", "bf16"),
        Some(1.0),
        (&[], KILN_ATTENTION),
        ", same computation (kiln's attention choice)",
    )
    .compiled(),
    Case::eager(
        "transformer",
        ("fp32", "fp32"),
        Some(1.0),
        (&[], &[]),
        " vs torch.compile fp32, same computation (SDPA, kiln's fp32 choice)",
    )
    .compiled(),
    Case::eager(
        "transformer",
        ("auto", "bf16"),
        None,
        (&[], &[]),
        " (PyTorch default: SDPA, nn.Dropout)",
    )
    .compiled(),
];

/// The user's-own-model rows: kiln training the reference transformer's TorchScript twin
/// (scripted by `train_step.py --export-script` from the same Python module, dropout 0, same
/// seed and so the same initial weights) against PyTorch eager training that module, as a user
/// writes it (goal: at most 1.05× its step), and against PyTorch training the same TorchScript
/// file, as by default and with the graph optimization off that kiln turns off on the CPU;
/// fp32, batch 32.
fn script_case(o: &Opts, warm: &str, timed: &str, split: &str) -> Result<(Vec<Comparison>, Value)> {
    let dir = std::env::temp_dir().join(format!("kiln-bench-script-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join("transformer.pt");
    let path_text = path.to_string_lossy().into_owned();
    let mut export = o.torch();
    export
        .args(["--model", "transformer", "--dropout", "0"])
        .args(["--export-script", &path_text]);
    let common = |c: &mut Command| {
        c.args([
            "--model",
            "transformer",
            "--precision",
            "fp32",
            "--dropout",
            "0",
        ])
        .args(["--batch", "32", "--warmup", warm, "--steps", timed])
        .args(["--breakdown-steps", split]);
    };
    let kiln_cmd = || {
        let mut c = o.kiln("probe");
        common(&mut c);
        c.args(["--script", &path_text]);
        c
    };
    let torch_cmd = || {
        let mut c = o.torch();
        common(&mut c);
        c
    };
    let torch_script_cmd = || {
        let mut c = torch_cmd();
        c.args(["--script", &path_text]);
        c
    };
    let torch_script_plain_cmd = || {
        let mut c = torch_script_cmd();
        c.args(["--jit-optimize", "off"]);
        c
    };
    let cmds: [&dyn Fn() -> Command; 4] = [
        &kiln_cmd,
        &torch_cmd,
        &torch_script_cmd,
        &torch_script_plain_cmd,
    ];
    let sides = run_json(export).and_then(|e| Ok((e, o.interleaved(&cmds)?)));
    let _ = std::fs::remove_dir_all(&dir);
    let (export, sides) = sides?;
    if sides
        .iter()
        .any(|side| side[0]["params"] != export["params"])
    {
        return Err(format!(
            "TorchScript case: the sides trained different models ({} exported parameters)",
            export["params"]
        ));
    }
    let k = &sides[0];
    let ks = median_of(k, "step_s_median");
    let row = |baseline_runs: &[Value], baseline: &str| {
        Comparison::new(
            "train",
            "step time",
            format!("your own model (transformer as TorchScript) fp32 step vs {baseline}"),
            "ms/step",
            Better::Lower,
            (ks * 1e3, median_of(baseline_runs, "step_s_median") * 1e3),
            format!("{baseline}, training the same Python module (fused AdamW)"),
        )
        .at_most(1.05)
        .detail("batch_size", json!(32))
        .detail("dropout", json!(0.0))
        .detail(
            "breakdown",
            json!({"kiln": k.last().map(|r| r["breakdown"].clone()),
                   "baseline": baseline_runs.last().map(|r| r["breakdown"].clone())}),
        )
    };
    let rows = vec![
        row(&sides[1], "PyTorch eager"),
        row(&sides[2], "PyTorch running the TorchScript file"),
        row(
            &sides[3],
            "PyTorch running the TorchScript file, graph optimization off (kiln's CPU choice)",
        ),
    ];
    let run = json!({"case": "torchscript transformer", "kiln": k, "torch": sides[1],
                     "torch_script": sides[2], "torch_script_optimize_off": sides[3]});
    Ok((rows, run))
}

/// The step counts of a suite run, as the probes' command-line values.
struct StepCounts {
    warm: String,
    timed: String,
    split: String,
}

/// What one case gave: its rows, or why its PyTorch side could not run here; and its runs.
struct Outcome {
    name: String,
    rows: Vec<Comparison>,
    not_run: Option<String>,
    run: Value,
}

/// The row name of `case` (kiln's `auto` resolved to `kiln_precision`).
fn case_name(case: &Case, kiln_precision: &str) -> String {
    let who = if case.compile {
        "torch.compile"
    } else {
        "PyTorch"
    };
    match case.kiln {
        "auto" => format!(
            "{} auto ({kiln_precision}) step vs {who} {}{}",
            case.model, case.torch, case.label
        ),
        p => format!("{} {p} step{}", case.model, case.label),
    }
}

/// What the baseline of `case` runs, from its first run's JSON `t`.
fn baseline_name(case: &Case, t: &Value) -> String {
    format!(
        "{} {}{} (fused AdamW{}; attention: {}; dropout {})",
        if case.compile {
            "torch.compile(model), default mode,"
        } else {
            "PyTorch eager"
        },
        case.torch,
        if case.torch == "fp32" {
            ""
        } else {
            " autocast"
        },
        if case.compile { " eager" } else { "" },
        t["config"]["attention"].as_str().unwrap_or("-"),
        t["config"]["dropout"]
    )
}

/// `--compile` with inductor's caches under `cache` (which holds an empty `tmp`): its cache
/// directory, and `TMPDIR` for the C++ headers it precompiles once per machine.
fn compile_env(c: &mut Command, cache: &std::path::Path) {
    c.arg("--compile")
        .env("TORCHINDUCTOR_CACHE_DIR", cache.join("inductor"))
        .env("TMPDIR", cache.join("tmp"));
}

/// Runs one case, kiln and PyTorch alternating; a `torch.compile` case in its own inductor
/// cache, empty at its first run (a cold compile) and reused by the later ones (warm).
fn run_case(o: &Opts, (i, case): (usize, &Case), n: &StepCounts, peaks: &Value) -> Result<Outcome> {
    let common = |c: &mut Command, precision: &str| {
        c.args(["--model", case.model, "--precision", precision])
            .args(["--batch", "32", "--warmup", &n.warm, "--steps", &n.timed])
            .args(["--breakdown-steps", &n.split])
            .args(case.extra);
    };
    let cache =
        std::env::temp_dir().join(format!("kiln-bench-inductor-{}-{i}", std::process::id()));
    let kiln_cmd = || {
        let mut c = o.kiln("probe");
        common(&mut c, case.kiln);
        c
    };
    let torch_cmd = || {
        let mut c = o.torch();
        common(&mut c, case.torch);
        c.args(case.torch_extra);
        if case.compile {
            compile_env(&mut c, &cache);
        }
        c
    };
    if case.compile {
        std::fs::create_dir_all(cache.join("tmp"))
            .map_err(|e| format!("{}: {e}", cache.display()))?;
    }
    let sides = o.interleaved(&[&kiln_cmd, &torch_cmd]);
    let _ = std::fs::remove_dir_all(&cache);
    let sides = sides?;
    let (k, t) = (&sides[0], &sides[1]);
    let kiln_precision = k[0]["precision"].as_str().unwrap_or("?").to_owned();
    let name = case_name(case, &kiln_precision);
    let run = json!({"case": name, "kiln": k, "torch": t});
    if let Some(reason) = t.iter().find_map(|r| r["not_run"].as_str()) {
        return Ok(Outcome {
            name,
            rows: vec![],
            not_run: Some(reason.to_owned()),
            run,
        });
    }
    if k[0]["params"] != t[0]["params"] {
        return Err(format!(
            "{}: the two sides built different models ({} vs {} parameters)",
            case.model, k[0]["params"], t[0]["params"]
        ));
    }
    let mut rows = vec![step_row(case, &name, (k, t), peaks)];
    if case.model == "transformer" && case.kiln == "fp32" && case.extra.is_empty() && !case.compile
    {
        rows.push(machine_limit_row(&name, (k, t), peaks));
    }
    if case.compile {
        rows.push(compile_time_row(case, &name, (k, t)));
    }
    Ok(Outcome {
        name,
        rows,
        not_run: None,
        run,
    })
}

fn breakdowns(k: &[Value], t: &[Value]) -> Value {
    json!({"kiln": k.last().map(|r| r["breakdown"].clone()),
           "baseline": t.last().map(|r| r["breakdown"].clone())})
}

/// The step-time row of a case.
fn step_row(case: &Case, name: &str, (k, t): (&[Value], &[Value]), peaks: &Value) -> Comparison {
    let (ks, ts) = (median_of(k, "step_s_median"), median_of(t, "step_s_median"));
    let kiln_precision = k[0]["precision"].as_str().unwrap_or("?");
    let flops = f(&k[0], "flops_per_step");
    let (peak, peak_name) = peak_for(peaks, kiln_precision, k[0]["tf32"] == true);
    let (torch_peak, _) = peak_for(peaks, case.torch, false);
    let mut c = Comparison::new(
        "train",
        "step time",
        name,
        "ms/step",
        Better::Lower,
        (ks * 1e3, ts * 1e3),
        baseline_name(case, &t[0]),
    )
    .detail("mfu", json!(flops / ks / 1e9 / peak))
    .detail("baseline_mfu", json!(flops / ts / 1e9 / torch_peak))
    .detail("peak", json!(peak_name))
    .detail("kiln_precision", json!(kiln_precision))
    .detail("batch_size", json!(32))
    .detail("samples_per_s", json!(32.0 / ks))
    .detail("baseline_samples_per_s", json!(32.0 / ts))
    .detail("breakdown", breakdowns(k, t));
    if case.compile {
        c = c.detail("compile", compile_summary(t));
    }
    match case.goal {
        Some(goal) => c.at_most(goal),
        None => c,
    }
}

/// kiln's fp32 transformer step against this machine's GEMM peak.
fn machine_limit_row(name: &str, (k, t): (&[Value], &[Value]), peaks: &Value) -> Comparison {
    let (ks, ts) = (median_of(k, "step_s_median"), median_of(t, "step_s_median"));
    let flops = f(&k[0], "flops_per_step");
    let kiln_precision = k[0]["precision"].as_str().unwrap_or("?");
    let (peak, peak_name) = peak_for(peaks, kiln_precision, k[0]["tf32"] == true);
    Comparison::new(
        "train",
        "machine limit",
        format!("{name}: achieved vs {peak_name} peak"),
        "GFLOP/s",
        Better::Higher,
        (flops / ks / 1e9, peak),
        format!("measured {peak_name} peak"),
    )
    .at_least(0.7)
    .detail("baseline_achieved_gflops", json!(flops / ts / 1e9))
    .detail("breakdown", breakdowns(k, t))
}

/// The compile figures of `torch.compile` runs: the cold run's (inductor cache empty) and the
/// median of the warm ones.
fn compile_summary(t: &[Value]) -> Value {
    let (cold, warm): (Vec<&Value>, Vec<&Value>) = t
        .iter()
        .partition(|r| r["compile"]["inductor_cache"] == "cold");
    let pick = |runs: &[&Value], key: &str| {
        let v: Vec<f64> = runs
            .iter()
            .filter_map(|r| r["compile"][key].as_f64())
            .collect();
        if v.is_empty() {
            Value::Null
        } else {
            json!(median(v))
        }
    };
    json!({
        "mode": "default",
        "what": t[0]["compile"]["what"],
        "cold_first_step_s": pick(&cold, "first_step_s"),
        "cold_compile_s": pick(&cold, "compile_s"),
        "warm_first_step_s": pick(&warm, "first_step_s"),
        "warm_compile_s": pick(&warm, "compile_s"),
        "graph_breaks": t[0]["compile"]["graph_breaks"],
        "compile_s_means": "the first step (compiling forward and backward) less one steady step",
    })
}

/// The compile-time row's name, from its step row's.
fn compile_time_name(step_row: &str) -> String {
    step_row.replacen(" step", " first step (compile time)", 1)
}

/// Time to the first step: kiln's first step against `torch.compile`'s (which compiles the
/// forward and backward graphs), from an empty inductor cache where a run had one.
fn compile_time_row(case: &Case, name: &str, (k, t): (&[Value], &[Value])) -> Comparison {
    let summary = compile_summary(t);
    let cold = summary["cold_first_step_s"].as_f64();
    let first = cold.unwrap_or_else(|| median_of(t, "first_step_s"));
    Comparison::new(
        "train",
        "compile time",
        compile_time_name(name),
        "s",
        Better::Lower,
        (median_of(k, "first_step_s"), first),
        format!(
            "torch.compile {} first step, {}",
            case.torch,
            if cold.is_some() {
                "inductor's caches empty (a user's first compile here)"
            } else {
                "inductor's caches warm"
            }
        ),
    )
    .detail("compile", summary)
}

fn train_suite(args: &[String]) -> Result<()> {
    let o = Opts::parse(args)?;
    let (warmup, steps, breakdown) = if o.quick { (2, 5, 3) } else { (5, 20, 10) };
    let sizes = numbers(args, "--batch-sizes")?;
    let mut out = SuiteOutput::new(
        "train",
        &format!(
            "train step (forward, cross-entropy, backward, fused AdamW, loss read) on one fixed \
             batch of 32 on {}, {} threads: kiln against PyTorch eager and torch.compile; MFU \
             against this machine's measured GEMM peak",
            device_name(o.device),
            o.threads
        ),
    );
    out.peaks = peaks(&o)?;
    let n = StepCounts {
        warm: warmup.to_string(),
        timed: steps.to_string(),
        split: breakdown.to_string(),
    };
    let (warm, timed, split) = (&n.warm, &n.timed, &n.split);
    let mut runs = vec![];
    for (i, case) in CASES.iter().enumerate() {
        if case.compile && o.quick {
            continue;
        }
        let outcome = run_case(&o, (i, case), &n, &out.peaks)?;
        match outcome.not_run {
            Some(reason) => out.skip(&outcome.name, &format!("not run: {reason}")),
            None => outcome.rows.into_iter().for_each(|c| out.push(c)),
        }
        runs.push(outcome.run);
    }
    if o.quick {
        out.skip(
            "torch.compile rows",
            "left out of --quick: compiling takes minutes",
        );
    }
    let (comparisons, run) = script_case(&o, warm, timed, split)?;
    for c in comparisons {
        out.push(c);
    }
    runs.push(run);
    for &b in &sizes {
        let batch = b.to_string();
        let precision = if o.device.is_cuda() { "bf16" } else { "fp32" };
        let kiln_cmd = || {
            let mut c = o.kiln("probe");
            c.args(["--model", "transformer", "--precision", precision])
                .args(["--batch", &batch, "--warmup", warm, "--steps", timed]);
            c
        };
        let torch_cmd = || {
            let mut c = o.torch();
            c.args(["--model", "transformer", "--precision", precision])
                .args(["--batch", &batch, "--warmup", warm, "--steps", timed]);
            c
        };
        let sides = o.interleaved(&[&kiln_cmd, &torch_cmd])?;
        let (k, t) = (&sides[0], &sides[1]);
        let baseline = format!("PyTorch eager {precision}");
        out.push(
            Comparison::new(
                "train",
                SWEEP_GROUP,
                format!("transformer {precision} b={b} throughput"),
                "samples/s",
                Better::Higher,
                (median_of(k, "samples_per_s"), median_of(t, "samples_per_s")),
                baseline.clone(),
            )
            .detail("batch_size", json!(b)),
        );
        out.push(
            Comparison::new(
                "train",
                SWEEP_GROUP,
                format!("transformer {precision} b={b} peak memory"),
                "MiB",
                Better::Lower,
                (
                    median_of(k, "peak_memory_mib"),
                    median_of(t, "peak_memory_mib"),
                ),
                baseline,
            )
            .detail("batch_size", json!(b))
            .detail("memory", k[0]["peak_memory_kind"].clone()),
        );
        runs.push(json!({"sweep_batch": b, "kiln": k, "torch": t}));
    }
    out.details = json!({"repeats": o.repeats, "warmup_steps": warmup, "timed_steps": steps,
                         "breakdown_steps": breakdown, "runs": runs});
    out.write(&suite_out(args, "train"))
}

fn optimizer_suite(args: &[String]) -> Result<()> {
    let o = &Opts::parse(args)?;
    let (warmup, steps) = if o.quick { (3, 10) } else { (10, 100) };
    let (warm, timed) = (warmup.to_string(), steps.to_string());
    let shapes = shapes_arg(&optimizer_store(Device::Cpu)?);
    let kiln_cmd = |imp: &'static str| {
        let (warm, timed) = (&warm, &timed);
        move || {
            let mut c = o.kiln("optim-probe");
            c.args(["--impl", imp, "--warmup", warm, "--steps", timed]);
            c
        }
    };
    let torch_cmd = |imp: &'static str| {
        let (warm, timed, shapes) = (&warm, &timed, &shapes);
        move || {
            let mut c = o.torch();
            c.args(["--optimizer", imp, "--shapes", shapes])
                .args(["--warmup", warm, "--steps", timed]);
            c
        }
    };
    let (kf, ku) = (kiln_cmd("fused"), kiln_cmd("unfused"));
    let (tf, te, ts) = (
        torch_cmd("fused"),
        torch_cmd("foreach"),
        torch_cmd("single"),
    );
    let runs = o.interleaved(&[&kf, &ku, &tf, &te, &ts])?;
    if runs[0][0]["params"] != runs[2][0]["params"] {
        return Err(format!(
            "the two sides updated different parameter counts ({} vs {})",
            runs[0][0]["params"], runs[2][0]["params"]
        ));
    }
    let ms: Vec<f64> = runs
        .iter()
        .map(|r| median_of(r, "step_s_median") * 1e3)
        .collect();
    let mut out = SuiteOutput::new(
        "optimizer",
        &format!(
            "one AdamW step over the reference transformer's {} parameters in {} tensors on {}: \
             kiln's fused kernel against the per-tensor update and torch.optim.AdamW",
            runs[0][0]["params"],
            runs[0][0]["tensors"],
            device_name(o.device)
        ),
    );
    let c = |name: &str, other: usize, baseline: &str| {
        Comparison::new(
            "optimizer",
            "optimizer step",
            name,
            "ms/step",
            Better::Lower,
            (ms[0], ms[other]),
            baseline,
        )
        .detail("speedup", json!(ms[other] / ms[0]))
    };
    // The headline: the same kernel as `AdamW(fused=True)` (kiln must add nothing around it),
    // and PyTorch's default implementation (foreach). The per-tensor rows are the ablation.
    out.push(
        c(
            "AdamW kiln fused vs PyTorch fused (the same kernel)",
            2,
            "torch.optim.AdamW(fused=True)",
        )
        .at_most(1.05),
    );
    out.push(
        c(
            "AdamW kiln fused vs PyTorch default (foreach)",
            3,
            "torch.optim.AdamW() (foreach, its default)",
        )
        .at_most(0.6),
    );
    out.push(c(
        "ablation: AdamW kiln fused vs kiln unfused",
        1,
        "kiln AdamW as per-tensor ops",
    ));
    out.push(c(
        "ablation: AdamW kiln fused vs PyTorch single-tensor",
        4,
        "torch.optim.AdamW(foreach=False)",
    ));
    out.details = json!({"warmup_steps": warmup, "timed_steps": steps, "repeats": o.repeats,
                         "runs": {"kiln_fused": runs[0], "kiln_unfused": runs[1],
                                  "torch_fused": runs[2], "torch_foreach": runs[3],
                                  "torch_single": runs[4]}});
    out.write(&suite_out(args, "optimizer"))
}

/// One epoch of kiln's loader over synthetic SignTransformer-shaped samples (generating each
/// sample is the per-sample work) at `workers` workers; seconds.
fn loader_epoch_s(workers: usize, samples: usize) -> Result<f64> {
    let dataset = Arc::new(
        SyntheticClassification::new(samples, vec![64, 469], 100, 0, 0.5)
            .map_err(|e| e.to_string())?,
    );
    let config = LoaderConfig {
        batch_size: 32,
        num_workers: workers,
        prefetch_factor: 2,
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(dataset, config).map_err(|e| e.to_string())?;
    // A first epoch starts the workers; the second is timed.
    let mut count = 0;
    for epoch in 0..2 {
        let start = Instant::now();
        for batch in loader.epoch(epoch) {
            count += batch.map_err(|e| e.to_string())?.indices.len();
        }
        if epoch == 1 {
            return Ok(start.elapsed().as_secs_f64());
        }
    }
    Err(format!("the loader produced {count} samples"))
}

fn opts_suite(args: &[String]) -> Result<()> {
    let o = &Opts::parse(args)?;
    let (warmup, steps) = if o.quick { (2, 5) } else { (5, 20) };
    let (warm, timed) = (warmup.to_string(), steps.to_string());
    let cuda = o.device.is_cuda();
    let mut out = SuiteOutput::new(
        "opts",
        &format!(
            "kiln's own train step (and loader, optimizer and inference) on {} with one \
             optimization on against the same run with it off; the ratio is on / off (below 1: \
             the optimization pays)",
            device_name(o.device)
        ),
    );
    let no_gpu = "needs a CUDA GPU; this machine has none";
    let step_cmd = |model: &'static str, extra: Vec<&'static str>| {
        let (warm, timed) = (&warm, &timed);
        move || {
            let mut c = o.kiln("probe");
            c.args(["--model", model, "--batch", "32"])
                .args(["--warmup", warm, "--steps", timed])
                .args(&extra);
            c
        }
    };
    let mut runs = vec![];
    let mut toggle = |name: &str,
                      model: &'static str,
                      on: Vec<&'static str>,
                      off: Vec<&'static str>|
     -> Result<()> {
        let (a, b) = (step_cmd(model, on), step_cmd(model, off));
        let r = o.interleaved(&[&a, &b])?;
        let (on_ms, off_ms) = (
            median_of(&r[0], "step_s_median") * 1e3,
            median_of(&r[1], "step_s_median") * 1e3,
        );
        out.push(
            Comparison::new(
                "opts",
                "optimization",
                name,
                "ms/step",
                Better::Lower,
                (on_ms, off_ms),
                format!("kiln {model} step without it"),
            )
            .detail("speedup", json!(off_ms / on_ms)),
        );
        runs.push(json!({"toggle": name, "on": r[0], "off": r[1]}));
        Ok(())
    };
    let mixed = if cuda { "bf16" } else { "auto" };
    toggle(
        &format!(
            "precision: {} instead of fp32 (transformer)",
            if cuda { "bf16" } else { "automatic" }
        ),
        "transformer",
        vec!["--precision", mixed],
        vec!["--precision", "fp32"],
    )?;
    if cuda {
        toggle(
            "TF32 matmuls (transformer fp32)",
            "transformer",
            vec!["--precision", "fp32", "--tf32", "on"],
            vec!["--precision", "fp32", "--tf32", "off"],
        )?;
        toggle(
            "cuDNN benchmark (convnet)",
            "convnet",
            vec!["--cudnn-benchmark", "on"],
            vec!["--cudnn-benchmark", "off"],
        )?;
    }
    toggle(
        "channels-last (convnet)",
        "convnet",
        vec!["--channels-last"],
        vec![],
    )?;
    if !cuda {
        out.skip("TF32 matmuls", no_gpu);
        out.skip("cuDNN benchmark", no_gpu);
    }
    // Fused AdamW: the optimizer step alone.
    let (warm_o, timed_o) = if o.quick { ("3", "10") } else { ("10", "100") };
    let optim = |imp: &'static str| {
        move || {
            let mut c = o.kiln("optim-probe");
            c.args(["--impl", imp, "--warmup", warm_o, "--steps", timed_o]);
            c
        }
    };
    let (fa, fb) = (optim("fused"), optim("unfused"));
    let r = o.interleaved(&[&fa, &fb])?;
    let (on_ms, off_ms) = (
        median_of(&r[0], "step_s_median") * 1e3,
        median_of(&r[1], "step_s_median") * 1e3,
    );
    out.push(
        Comparison::new(
            "opts",
            "optimization",
            "fused AdamW (optimizer step)",
            "ms/step",
            Better::Lower,
            (on_ms, off_ms),
            "kiln AdamW as per-tensor ops",
        )
        .detail("speedup", json!(off_ms / on_ms)),
    );
    runs.push(json!({"toggle": "fused AdamW", "on": r[0], "off": r[1]}));
    // Loader workers: in this process, interleaved.
    let samples = if o.quick { 256 } else { 2048 };
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 8);
    let (mut with, mut without) = (vec![], vec![]);
    for _ in 0..o.repeats {
        with.push(loader_epoch_s(workers, samples)?);
        without.push(loader_epoch_s(0, samples)?);
    }
    let (w, wo) = (
        samples as f64 / median(with.clone()),
        samples as f64 / median(without.clone()),
    );
    out.push(
        Comparison::new(
            "opts",
            "optimization",
            format!("loader workers: {workers} instead of 0"),
            "samples/s",
            Better::Higher,
            (w, wo),
            "kiln loader in the training thread",
        )
        .detail("speedup", json!(w / wo)),
    );
    runs.push(json!({"toggle": "workers", "on_s": with, "off_s": without}));
    // CUDA graphs: inference latency at batch 1, from the serve benchmark's binary.
    if cuda {
        let serve = o.me.with_file_name("kiln-bench-serve");
        let graphs = |mode: &'static str| {
            let serve = &serve;
            move || {
                let mut c = Command::new(serve);
                c.args(["infer-probe", "--graphs", mode, "--batch", "1"])
                    .args(["--device", &device_name(o.device)]);
                c
            }
        };
        let (ga, gb) = (graphs("on"), graphs("off"));
        let r = o.interleaved(&[&ga, &gb])?;
        let (on_ms, off_ms) = (median_of(&r[0], "p50_ms"), median_of(&r[1], "p50_ms"));
        out.push(
            Comparison::new(
                "opts",
                "optimization",
                "CUDA graphs (inference, batch 1, p50)",
                "ms",
                Better::Lower,
                (on_ms, off_ms),
                "kiln inference without graphs",
            )
            .detail("speedup", json!(off_ms / on_ms)),
        );
        runs.push(json!({"toggle": "cuda graphs", "on": r[0], "off": r[1]}));
    } else {
        out.skip("CUDA graphs", no_gpu);
    }
    out.details = json!({"repeats": o.repeats, "warmup_steps": warmup, "timed_steps": steps,
                         "runs": runs});
    out.write(&suite_out(args, "opts"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_names_are_unique_and_name_their_baseline() {
        let names: Vec<String> = CASES.iter().map(|c| case_name(c, "bf16")).collect();
        for (i, name) in names.iter().enumerate() {
            assert!(!names[..i].contains(name), "`{name}` names two rows");
        }
        for (case, name) in CASES.iter().zip(&names) {
            assert_eq!(case.compile, name.contains("vs torch.compile"), "{name}");
            if case.compile {
                let first = compile_time_name(name);
                assert!(
                    first.contains(" first step (compile time) vs torch.compile "),
                    "{first}"
                );
            }
        }
    }
}
