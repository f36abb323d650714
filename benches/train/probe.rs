//! kiln's sides, each a process printing one JSON line: `probe` (kiln's train step on one
//! resident batch), `gemm` (the GEMM peak at one precision), `optim-probe` (one AdamW step).

use std::path::Path;
use std::time::Instant;

use clap::{Args, value_parser};
use kiln_benches::args::{Place, parse_on_off};
use kiln_benches::unfused::UnfusedAdamW;
use kiln_benches::{Msg, device_name, median, peak_memory_mib, resolve_for};
use kiln_config::{ModelKind, ModelPlan};
use kiln_data::TargetSpec;
use kiln_torch_ext::flags::{self, Flag};
use kiln_torch_ext::optim::AdamWConfig;
use kiln_train::loss::Loss;
use kiln_train::model::{InputSpec, Model, parameter_count};
use kiln_train::models::{TransformerShape, synthetic_shape};
use kiln_train::optim::{Optimizer, Rule, param_groups};
use kiln_train::program::{ProgramModel, ProgramSpec};
use kiln_train::script::ScriptModel;
use kiln_train::source::build;
use kiln_train::stepper::{StepOptions, Stepper};
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor, nn};

use super::Result;

/// `probe`'s options.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// mlp, transformer, convnet or unet3d.
    #[arg(long, default_value = "transformer")]
    model: ModelKind,
    /// fp32, bf16, fp16 or auto (kiln's choice for the device).
    #[arg(long, default_value = "fp32")]
    precision: String,
    #[arg(long, default_value_t = 32)]
    batch: usize,
    #[command(flatten)]
    place: Place,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[arg(long, default_value_t = 30)]
    steps: usize,
    /// Steps timed phase by phase after the timed steps (0: no breakdown).
    #[arg(long, default_value_t = 0)]
    breakdown_steps: usize,
    #[arg(long, default_value_t = 0.1)]
    dropout: f64,
    #[arg(long)]
    channels_last: bool,
    /// TF32 matmuls: on or off (default: kiln's profile).
    #[arg(long, value_parser = parse_on_off)]
    tf32: Option<bool>,
    /// cuDNN benchmark mode: on or off (default: kiln's profile).
    #[arg(long, value_parser = parse_on_off)]
    cudnn_benchmark: Option<bool>,
    /// The model's TorchScript twin (from `train_step.py --export-script`) instead.
    #[arg(long, value_name = "MODEL.pt")]
    script: Option<String>,
    /// The model as a torch.export program, trained through kiln's compiled step.
    #[arg(long, value_name = "MODEL.pt2", conflicts_with = "script")]
    program: Option<String>,
    /// With --program on CUDA: the whole step replayed as one CUDA graph.
    #[arg(long, requires = "program")]
    cuda_graphs: bool,
    /// The transformer's size (default: the reference SignTransformer).
    #[command(flatten)]
    shape: ShapeArgs,
}

/// The transformer's size (each at least 1), as `train_step.py` takes it; by default
/// [`REFERENCE`].
#[derive(Debug, Args, serde::Serialize)]
struct ShapeArgs {
    /// Sequence length (the sample is `[seq, 469]`).
    #[arg(long, default_value_t = REFERENCE.seq, value_parser = dim())]
    seq: u32,
    #[arg(long, default_value_t = REFERENCE.d_model, value_parser = dim())]
    d_model: u32,
    #[arg(long, default_value_t = REFERENCE.heads, value_parser = dim())]
    heads: u32,
    #[arg(long, default_value_t = REFERENCE.layers, value_parser = dim())]
    layers: u32,
    #[arg(long, default_value_t = REFERENCE.ff, value_parser = dim())]
    ff: u32,
}

/// The reference SignTransformer's size (over `[64, 469]` samples, 100 classes), as
/// [`ModelPlan::builtin`] has it.
const REFERENCE: ShapeArgs = ShapeArgs {
    seq: 64,
    d_model: 256,
    heads: 8,
    layers: 4,
    ff: 1024,
};

/// A dimension's parser: a positive integer.
fn dim() -> clap::builder::RangedI64ValueParser<u32> {
    value_parser!(u32).range(1..)
}

/// `gemm`'s options.
#[derive(Debug, Args)]
pub struct GemmArgs {
    #[arg(long, value_enum, default_value = "fp32")]
    precision: GemmPrecision,
    #[command(flatten)]
    place: Place,
}

/// `optim-probe`'s options.
#[derive(Debug, Args)]
pub struct OptimProbeArgs {
    /// kiln's optimizer (the fused kernel) or the per-tensor update.
    #[arg(long = "impl", value_enum, default_value = "fused")]
    imp: OptimImpl,
    #[command(flatten)]
    place: Place,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[arg(long, default_value_t = 50)]
    steps: usize,
}

/// `gemm --precision`: the matmul's dtype (`tf32`: fp32 with TF32 tensor cores on CUDA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmPrecision {
    Fp32,
    Tf32,
    Bf16,
    Fp16,
}

/// `optim-probe --impl`: the AdamW update timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimImpl {
    Fused,
    Unfused,
}

/// Seconds of each of `n` calls of `f` (the device synchronised around each) after `warmup`.
fn time_calls(
    device: Device,
    (warmup, n): (usize, usize),
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let sync = || kiln_torch_ext::cuda::synchronize(device).msg();
    for _ in 0..warmup {
        f()?;
    }
    (0..n)
        .map(|_| {
            sync()?;
            let start = Instant::now();
            f()?;
            sync()?;
            Ok(start.elapsed().as_secs_f64())
        })
        .collect()
}

/// The fastest of `times`.
fn fastest(times: &[f64]) -> f64 {
    times.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The input of `kind`'s synthetic data, the transformer's over sequences of `seq`.
fn synthetic_input(kind: ModelKind, seq: u32) -> Result<InputSpec> {
    let (mut sample_shape, classes) =
        synthetic_shape(kind).ok_or("no synthetic data for this model")?;
    if kind == ModelKind::Transformer {
        sample_shape[0] = seq as usize;
    }
    // The U-Net segments (a class per voxel of the volume's spatial shape); the others classify.
    let segments = (kind == ModelKind::Unet3d).then(|| TargetSpec::Classes {
        classes,
        shape: sample_shape[1..].to_vec(),
    });
    let input = InputSpec::of(&sample_shape, &TargetSpec::label(classes));
    Ok(InputSpec {
        target: segments,
        ..input
    })
}

/// Matrix-multiply FLOPs of one train step (3 × forward), as the Python script counts them.
fn flops_per_step(kind: ModelKind, shape: &ShapeArgs, input: &InputSpec, batch: usize) -> f64 {
    let transformer = TransformerShape {
        seq_len: shape.seq.into(),
        features: *input.sample_shape.last().unwrap_or(&0) as i64,
        d_model: shape.d_model.into(),
        heads: shape.heads.into(),
        layers: shape.layers.into(),
        ff: shape.ff.into(),
        classes: input.classes as i64,
    };
    let forward = match kind {
        ModelKind::Mlp => 2.0 * (64.0 * 256.0 + 256.0 * 256.0 + 256.0 * 10.0),
        // The benchmarked TorchScript module and program are the transformer's twin.
        ModelKind::Transformer | ModelKind::TorchScript | ModelKind::Program => {
            transformer.forward_flops_per_sample() as f64
        }
        ModelKind::ConvNet => 20_646_400.0,
        // Not a case of the train suite.
        ModelKind::Unet3d => f64::NAN,
    };
    3.0 * forward * batch as f64
}

/// Applies kiln's GPU backend settings, `--tf32`, `--cudnn-benchmark`; returns TF32's state.
fn backend(a: &ProbeArgs, device: Device) -> Result<bool> {
    if let Device::Cuda(i) = device {
        let plan = resolve_for(device)?.plan;
        kiln_device::settings::apply(&plan.performance.backend, kiln_device::Device::Cuda(i));
    }
    if let Some(on) = a.tf32 {
        flags::set_flag(Flag::Tf32CuBlas, on).msg()?;
        flags::set_flag(Flag::Tf32CuDnn, on).msg()?;
    }
    if let Some(on) = a.cudnn_benchmark {
        flags::set_flag(Flag::CuDnnBenchmark, on).msg()?;
    }
    Ok(device.is_cuda() && flags::flag(Flag::Tf32CuBlas).unwrap_or(false))
}

/// Times kiln's train step for one case; prints one JSON line.
pub fn probe(a: &ProbeArgs) -> Result<()> {
    let kind = a.model;
    let device = a.place.device();
    let shape = &a.shape;
    let precision = match a.precision.as_str() {
        "auto" => resolve_for(device)?.plan.train.amp,
        p => p.parse().map_err(|e| format!("--precision: {e}"))?,
    };
    let batch = a.batch.max(1);
    let threads = a.place.set_threads()?;
    let tf32 = backend(a, device)?;
    tch::manual_seed(0);
    let input = synthetic_input(kind, shape.seq)?;
    if kind == ModelKind::Transformer && !shape.d_model.is_multiple_of(shape.heads) {
        return Err(format!(
            "--d-model ({}) must be divisible by --heads ({})",
            shape.d_model, shape.heads
        ));
    }
    let plan = ModelPlan {
        dropout: a.dropout,
        d_model: shape.d_model.into(),
        heads: shape.heads.into(),
        layers: shape.layers.into(),
        ff: shape.ff.into(),
        ..ModelPlan::builtin(kind)
    };
    let vs = nn::VarStore::new(device);
    let loading = Instant::now();
    let mut attention = None;
    let model: Box<dyn Model> = match (&a.script, &a.program) {
        (Some(path), _) => Box::new(ScriptModel::load(Path::new(path), &vs).msg()?),
        (_, Some(path)) => {
            let spec = ProgramSpec {
                path: Path::new(path),
                loss: Loss::CrossEntropy,
                precision,
                output: None,
                freeze: None,
                attention: kiln_config::AttentionKernel::Auto,
                threads,
                batch: Some(batch as u64),
            };
            let program = ProgramModel::load(&spec, &input, &vs).msg()?;
            let choice = program.compiled().manifest.attention.as_ref();
            attention = choice.map(|c| c.kernel.clone());
            Box::new(program)
        }
        _ => build(&plan, &input, &vs, a.channels_last, 0).msg()?,
    };
    let load_s = loading.elapsed().as_secs_f64();
    let options = StepOptions {
        cuda_graphs: a.cuda_graphs,
        ..StepOptions::new(precision)
    };
    let mut stepper = Stepper::new(model.as_ref(), kind.as_str(), &vs, &options, device).msg()?;
    let mut dims = vec![batch as i64];
    dims.extend(input.sample_shape.iter().map(|&d| d as i64));
    let features = Tensor::randn(dims.as_slice(), (Kind::Float, device));
    let mut label_dims = vec![batch as i64];
    if let Some(target) = &input.target {
        stepper.set_target(target).msg()?;
        label_dims.extend(dims[2..].iter());
    }
    let classes = input.classes as i64;
    let labels = Tensor::randint(classes, label_dims.as_slice(), (Kind::Int64, device));
    let (times, losses, first_step, breakdown) = run_steps(a, &mut stepper, (&features, &labels))?;
    let median = median(times.clone());
    let flops = flops_per_step(kind, shape, &input, batch);
    let (memory, memory_kind) = peak_memory_mib(device);
    let run = json!({
        "framework": "kiln", "torch_version": kiln_torch_ext::runtime::torch_version(),
        "device": device_name(device), "model": kind.as_str(),
        "torchscript": a.script, "program": a.program, "cuda_graphs": a.cuda_graphs,
        "attention": attention,
        "load_s": load_s,
        "precision": precision.as_str(), "precision_requested": a.precision, "tf32": tf32,
        "batch": batch, "threads": threads, "params": parameter_count(&vs), "config": shape,
        "flops_per_step": flops, "step_s_median": median, "step_s_min": fastest(&times),
        "samples_per_s": batch as f64 / median, "gflops": flops / median / 1e9,
        "first_step_s": first_step, "loss_first": losses.first(), "loss_last": losses.last(),
        "breakdown": breakdown, "peak_memory_mib": memory, "peak_memory_kind": memory_kind,
    });
    println!("{run}");
    Ok(())
}

/// The timed steps' seconds, every step's loss, the first step's seconds, the phase times.
type Steps = (Vec<f64>, Vec<f64>, f64, Option<Value>);

/// The warm-up, timed and breakdown steps on one resident batch.
fn run_steps(a: &ProbeArgs, stepper: &mut Stepper<'_>, batch: (&Tensor, &Tensor)) -> Result<Steps> {
    let (warmup, steps, breakdown_steps) = (a.warmup, a.steps.max(1), a.breakdown_steps);
    let (mut seconds, mut losses, mut data_wait) = (vec![], vec![], 0.0);
    for i in 0..warmup + steps + breakdown_steps {
        if i == warmup + steps {
            stepper.time_phases(true);
        }
        let start = Instant::now();
        // One resident batch, as on the Python side: the data wait is fetching it.
        let (x, y) = (batch.0.shallow_clone(), batch.1.shallow_clone());
        if i >= warmup + steps {
            data_wait += start.elapsed().as_secs_f64();
        }
        // The loss is read each step, as a training loop that logs does (loss.item()).
        losses.push(stepper.step(&x, &y).msg()?);
        seconds.push(start.elapsed().as_secs_f64());
    }
    if losses.iter().any(|l| !l.is_finite()) {
        return Err(format!("non-finite loss during training: {losses:?}"));
    }
    let breakdown = stepper.phase_times().map(|t| {
        let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / breakdown_steps as f64;
        json!({"data_wait_ms": data_wait * 1e3 / breakdown_steps as f64,
               "forward_ms": per(t.forward), "backward_ms": per(t.backward),
               "optimizer_ms": per(t.optimizer)})
    });
    let times = seconds[warmup..warmup + steps].to_vec();
    Ok((times, losses, seconds[0], breakdown))
}

/// This machine's GEMM peak through libtorch at one precision (best GFLOP/s over large shapes).
pub fn gemm(a: &GemmArgs) -> Result<()> {
    let device = a.place.device();
    let kind = match a.precision {
        GemmPrecision::Fp32 | GemmPrecision::Tf32 => Kind::Float,
        GemmPrecision::Bf16 => Kind::BFloat16,
        GemmPrecision::Fp16 => Kind::Half,
    };
    let threads = a.place.set_threads()?;
    if device.is_cuda() {
        flags::set_flag(Flag::Tf32CuBlas, a.precision == GemmPrecision::Tf32).msg()?;
    }
    let sizes: &[(i64, i64, i64)] = if device.is_cuda() {
        &[(8192, 8192, 8192), (4096, 4096, 4096)]
    } else {
        &[(2048, 1024, 1024), (4096, 4096, 4096), (2048, 256, 1024)]
    };
    let (mut best, mut shapes): (f64, _) = (0.0, vec![]);
    for &(m, k, n) in sizes {
        // A CPU without native bf16 (AVX512-BF16, AMX) converts in software at a few GFLOP/s:
        // a shape whose call would take over 2 s at the rate so far is left out (4096³ in bf16
        // took over ten minutes on an AMD EPYC with AVX2 only).
        let flops = 2.0 * (m * k * n) as f64;
        if best > 0.0 && flops / (best * 1e9) > 2.0 {
            shapes.push(json!({"shape": [m, k, n], "skipped": "over 2 s a call at this rate"}));
            continue;
        }
        let a = Tensor::randn([m, k], (kind, device));
        let b = Tensor::randn([k, n], (kind, device));
        let big = !device.is_cuda() && m * k * n > 1 << 32;
        let iters = if big { 3 } else { 10 };
        let times = time_calls(device, (3, iters), || a.f_matmul(&b).map(drop).msg())?;
        let gflops = flops / fastest(&times) / 1e9;
        shapes.push(json!({"shape": [m, k, n], "gflops": gflops}));
        best = best.max(gflops);
    }
    let run = json!({"gemm_gflops": best, "precision": a.precision, "device": device_name(device),
                     "threads": threads, "shapes": shapes});
    println!("{run}");
    Ok(())
}

/// The parameters (shapes) the optimizer benchmarks update: the reference transformer's.
pub fn optimizer_store(device: Device) -> Result<nn::VarStore> {
    let vs = nn::VarStore::new(device);
    let input = synthetic_input(ModelKind::Transformer, REFERENCE.seq)?;
    let plan = ModelPlan::builtin(ModelKind::Transformer);
    build(&plan, &input, &vs, false, 0).msg()?;
    Ok(vs)
}

/// Times one AdamW step over the transformer's parameters: kiln's optimizer (the fused kernel,
/// one call per parameter group) or the per-tensor update.
pub fn optim_probe(a: &OptimProbeArgs) -> Result<()> {
    let device = a.place.device();
    let threads = a.place.set_threads()?;
    tch::manual_seed(0);
    let vs = optimizer_store(device)?;
    let groups = param_groups(&vs, 0.01);
    let (params, decays): (Vec<Tensor>, Vec<f64>) = groups
        .iter()
        .flat_map(|g| g.params.iter().map(|p| (p.shallow_clone(), g.weight_decay)))
        .unzip();
    // Fixed random gradients, set through autograd (d/dp Σ p·g = g).
    let grads: Vec<Tensor> = params.iter().map(Tensor::randn_like).collect();
    for (p, g) in params.iter().zip(&grads) {
        p.f_mul(g)
            .and_then(|t| t.f_sum(Kind::Float)?.f_backward())
            .msg()?;
    }
    let counts = (a.warmup, a.steps.max(1));
    let times = match a.imp {
        OptimImpl::Fused => {
            let config = AdamWConfig {
                lr: 1e-3,
                weight_decay: 0.01,
                ..Default::default()
            };
            let mut opt = Optimizer::new(Rule::AdamW(config), groups).msg()?;
            time_calls(device, counts, || opt.step(None, None).msg())?
        }
        OptimImpl::Unfused => {
            let mut opt = UnfusedAdamW::new(&params, decays, 1e-3).msg()?;
            time_calls(device, counts, || opt.step(&params, &grads).msg())?
        }
    };
    let run = json!({
        "framework": "kiln", "impl": a.imp, "device": device_name(device), "threads": threads,
        "tensors": vs.variables().len(), "params": parameter_count(&vs),
        "step_s_median": median(times.clone()), "step_s_min": fastest(&times),
    });
    println!("{run}");
    Ok(())
}
