//! The gpu-check step `compiled-train`: a `torch.export`ed transformer (SDPA attention) saved by
//! PyTorch on this machine, trained through kiln's compiled step (AOTInductor, compiled here for
//! the device): its fp32 gradients against PyTorch eager's per parameter, a bf16 run's losses
//! against eager bf16 autocast on the same module, and the compile time on the device.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use kiln_device::settings::AmpDtype;
use kiln_train::loss::Loss;
use kiln_train::model::InputSpec;
use kiln_train::program::{ProgramModel, ProgramSpec};
use kiln_train::run::RunControl;
use serde_json::{Value, json};
use tch::{Kind, Tensor, nn};

use super::training::{Record, plan};
use super::{Ctx, Outcome};

/// PyTorch's side: the program, its data and eager's reference values.
const SCRIPT: &str = include_str!("compiled_train.py");

/// Full-batch bf16 steps of the learning comparison.
const STEPS: usize = 30;

/// The largest relative gradient error per parameter (fp32, TF32 off), as on the CPU.
const GRADIENT_TOLERANCE: f64 = 1e-5;

/// The final bf16 loss against eager's, in nats (the `learning` suite's bf16 criterion).
const LOSS_TOLERANCE: f64 = 0.02;

pub fn compiled_train(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let reference = make_reference(ctx)?;
    let program = ctx.dir.join("model.pt2");
    let compiles = compile_checked(ctx, &program, &reference)?;
    let gradients = check_gradients(ctx, &program, &reference)?;
    let bf16 = match compiles.bf16 {
        Ok(loaded) => loaded,
        Err(e) if refusal(&e) => return Ok(refused_bf16(&e, &gradients, compiles.fixed)),
        Err(e) => return Err(e.context("the bf16 compile")),
    };
    let learning = learn_bf16(ctx, &program, &reference)?;
    let loaded = (&compiles.fp32, &bf16, compiles.fixed);
    outcome(&reference, loaded, &gradients, &learning)
}

/// The step's compiles: fp32 (which must pass), bf16, and on CUDA bf16 with the batch fixed
/// (what that one gave, in words).
struct Compiles {
    fp32: Loaded,
    bf16: anyhow::Result<Loaded>,
    fixed: Option<String>,
}

fn compile_checked(ctx: &Ctx, program: &Path, reference: &Value) -> anyhow::Result<Compiles> {
    // Each at the batch it runs: the gradient check's, and the learning runs' full batch.
    let grad_batch = reference["grad_batch"].as_u64().context("grad_batch")?;
    let samples = reference["x"]["shape"][0].as_u64().context("x shape")?;
    let mut jobs = vec![
        (program.to_owned(), AmpDtype::None, grad_batch),
        (program.to_owned(), AmpDtype::Bf16, samples),
    ];
    if ctx.cuda() {
        jobs.push((ctx.dir.join("model_fixed.pt2"), AmpDtype::Bf16, samples));
    }
    let mut compiled = compile_all(&jobs, &input(reference)?, ctx.device).into_iter();
    let fp32 = compiled.next().context("the fp32 compile")??;
    let bf16 = compiled.next().context("the bf16 compile")?;
    let fixed = compiled.next().map(|r| match r {
        Ok(loaded) => format!("passed ({})", loaded.verdict),
        Err(e) if refusal(&e) => format!("refused: {e:#}"),
        Err(e) => format!("failed: {e:#}"),
    });
    Ok(Compiles { fp32, bf16, fixed })
}

/// The fp32 gradient check: the largest relative error, its parameter, a cache hit's load time.
type Gradients = (f64, String, f64);

/// The bf16 runs against eager's losses (and on CUDA the run in one CUDA graph).
struct Learning {
    losses: Vec<f64>,
    eager: Vec<f64>,
    samples_per_s: f64,
    graphed: Option<(Vec<f64>, f64)>,
}

fn learn_bf16(ctx: &Ctx, program: &Path, reference: &Value) -> anyhow::Result<Learning> {
    let (losses, samples_per_s) = train_bf16(ctx, program, reference, false)?;
    let graphed = match ctx.cuda() {
        true => Some(train_bf16(ctx, program, reference, true)?),
        false => None,
    };
    Ok(Learning {
        losses,
        eager: serde_json::from_value(reference["losses"].clone())?,
        samples_per_s,
        graphed,
    })
}

/// The step's verdict and figures from its compiles, gradients and bf16 runs.
fn outcome(
    reference: &Value,
    (fp32, bf16, fixed): (&Loaded, &Loaded, Option<String>),
    (grad_err, worst, hit_s): &Gradients,
    l: &Learning,
) -> anyhow::Result<Outcome> {
    let (Some(&last), Some(&eager_last)) = (l.losses.last(), l.eager.last()) else {
        anyhow::bail!("no steps were logged");
    };
    let final_diff = (last - eager_last).abs();
    let graph_diff = l.graphed.as_ref().map(|(g, _)| match g.last() {
        Some(x) if g.len() == STEPS => (x - last).abs(),
        _ => f64::INFINITY,
    });
    let pass = *grad_err <= GRADIENT_TOLERANCE
        && l.losses.len() == STEPS
        && final_diff <= LOSS_TOLERANCE
        && last < 0.8 * l.losses[0]
        && graph_diff.is_none_or(|d| d <= LOSS_TOLERANCE);
    let graph_text = match (&l.graphed, graph_diff) {
        (Some((_, graph_rate)), Some(d)) => format!(
            "; in one CUDA graph (train.cuda_graphs = on): final loss |Δ| {d:.4} from the \
             eager step, {:.2}× its samples/s",
            graph_rate / l.samples_per_s
        ),
        _ => String::new(),
    };
    let summary = format!(
        "fp32 gradients vs eager: worst {grad_err:.1e} relative ({worst}; ≤ {GRADIENT_TOLERANCE:e}); \
         bf16, {STEPS} full-batch steps: loss {:.4} → {last:.4} vs eager {:.4} → \
         {eager_last:.4} (|Δ| {final_diff:.4}, ≤ {LOSS_TOLERANCE}); compile {:.1} s fp32, \
         {:.1} s bf16, cache hit {hit_s:.2} s{graph_text}; batch sizes the packages run: \
         fp32 {}, bf16 {}",
        l.losses[0], l.eager[0], fp32.compile_s, bf16.compile_s, fp32.ranges, bf16.ranges
    );
    Ok(Outcome::new(pass, summary)
        .figure("graph_bf16_losses", json!(l.graphed.as_ref().map(|g| &g.0)))
        .figure(
            "graph_samples_per_s",
            json!(l.graphed.as_ref().map(|g| g.1)),
        )
        .figure("graph_final_loss_abs_diff", json!(graph_diff))
        .figure("params", reference["params"].clone())
        .figure("gradient_max_relative_error", *grad_err)
        .figure("gradient_worst_parameter", worst.as_str())
        .figure("bf16_losses", json!(l.losses))
        .figure("eager_bf16_losses", json!(l.eager))
        .figure("bf16_final_loss_abs_diff", final_diff)
        .figure("bf16_samples_per_s", l.samples_per_s)
        .figure("compile_fp32_s", fp32.compile_s)
        .figure("compile_bf16_s", bf16.compile_s)
        .figure("compiled_now", fp32.compiled_now && bf16.compiled_now)
        .figure("bf16_check", json!(bf16.verdict))
        .figure("bf16_fixed_batch_check", json!(fixed))
        .figure("cache_hit_load_s", *hit_s)
        .figure("fp32_batch_ranges", fp32.ranges.as_str())
        .figure("bf16_batch_ranges", bf16.ranges.as_str())
        .figure("torch_python", reference["torch"].clone()))
}

/// Runs `compiled_train.py` in the provisioned Python (`KILN_PYTHON` on a GPU machine).
fn make_reference(ctx: &Ctx) -> anyhow::Result<Value> {
    let script = ctx.dir.join("compiled_train.py");
    std::fs::write(&script, SCRIPT)?;
    let python = kiln_train::python::python();
    let out = Command::new(&python)
        .arg(&script)
        .arg(&ctx.dir)
        .arg(ctx.device_key())
        .arg(STEPS.to_string())
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} compiled_train.py failed: {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(ctx.dir.join("reference.json"))?;
    Ok(serde_json::from_str(&text)?)
}

/// A tensor from `{"shape": [...], "values": [...]}`.
fn tensor(v: &Value, kind: Kind, device: tch::Device) -> anyhow::Result<Tensor> {
    let shape: Vec<i64> = serde_json::from_value(v["shape"].clone())?;
    let values: Vec<f64> = serde_json::from_value(v["values"].clone())?;
    Ok(Tensor::from_slice(&values)
        .reshape(shape.as_slice())
        .to_kind(kind)
        .to_device(device))
}

/// The per-sample input of the program's data: [32, 16] features, 4 classes.
fn input(reference: &Value) -> anyhow::Result<InputSpec> {
    let shape: Vec<usize> = serde_json::from_value(reference["x"]["shape"].clone())?;
    Ok(InputSpec {
        sample_shape: shape[1..].to_vec(),
        classes: 4,
        target: Some(kiln_data::TargetSpec::label(4)),
        integer_features: false,
        arrays: vec![],
    })
}

/// A program's batch ranges in words: "train 1 to 128, eval 1 or more".
fn ranges_text(r: kiln_train::program::compile::BatchRanges) -> String {
    let text = |r: Option<kiln_train::program::compile::BatchRange>| {
        r.map_or_else(|| "unknown".to_owned(), |r| r.to_string())
    };
    format!("train {}, eval {}", text(r.train), text(r.eval))
}

/// How long a program took to get ready.
struct Loaded {
    /// The compile's own time (now, or when it was cached).
    compile_s: f64,
    /// Whether this step compiled it (else the cache had it).
    compiled_now: bool,
    /// kiln's check of the packages against eager PyTorch, in words.
    verdict: String,
    /// The batch sizes its packages are valid for, in words (Inductor's guards on the
    /// traced batch bound them; kiln refuses a batch outside them).
    ranges: String,
}

/// Compiles each (program, precision) of `jobs` for cross-entropy at once, in compiler
/// processes of their own: on a GPU machine the cold compiles are most of this step's time
/// (75 s and 65 s one after the other on an H100's 16-core host). Returns them in that order;
/// a compile kiln refused (its check against eager PyTorch failed) is an error.
fn compile_all(
    jobs: &[(PathBuf, AmpDtype, u64)],
    input: &InputSpec,
    device: tch::Device,
) -> Vec<anyhow::Result<Loaded>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(program, precision, batch)| {
                s.spawn(move || -> anyhow::Result<Loaded> {
                    let started = Instant::now();
                    let spec = spec(program, *precision, *batch)?;
                    let model = ProgramModel::load(&spec, input, &nn::VarStore::new(device))?;
                    let compiled = model.compiled();
                    let verdict = kiln_train::program::check::kept(&compiled.dir)
                        .map(|v| v.summary)
                        .unwrap_or_default();
                    Ok(Loaded {
                        compile_s: compiled.manifest.compile_s,
                        compiled_now: started.elapsed().as_secs_f64()
                            >= compiled.manifest.compile_s,
                        verdict,
                        ranges: ranges_text(compiled.manifest.batch_range),
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a compile thread panicked")))
            })
            .collect()
    })
}

/// Whether `e` is kiln refusing packages that failed their check against eager PyTorch.
fn refusal(e: &anyhow::Error) -> bool {
    format!("{e:#}").contains(kiln_train::program::compile::REFUSED)
}

/// The step's outcome where kiln refused the bf16 packages (`error`): the fp32 gradients, the
/// refusal, and on CUDA what the same program with its batch fixed gave.
fn refused_bf16(error: &anyhow::Error, gradients: &Gradients, fixed: Option<String>) -> Outcome {
    let (grad_err, worst, _) = gradients;
    let fixed_text = fixed
        .as_ref()
        .map(|f| format!("; the program with its batch fixed (256): {f}"))
        .unwrap_or_default();
    Outcome::new(
        false,
        format!(
            "fp32 gradients vs eager: worst {grad_err:.1e} relative ({worst}; ≤ \
             {GRADIENT_TOLERANCE:e}); bf16 refused by kiln's check against eager PyTorch: \
             {error:#}{fixed_text}"
        ),
    )
    .figure("gradient_max_relative_error", *grad_err)
    .figure("gradient_worst_parameter", worst.as_str())
    .figure("bf16_refused", format!("{error:#}"))
    .figure("bf16_fixed_batch_check", json!(fixed))
}

/// Loads the program, already compiled, for cross-entropy at `precision` into `vs`: the load's
/// time (a cache hit) and the model.
fn load(
    program: &Path,
    (precision, batch): (AmpDtype, u64),
    input: &InputSpec,
    vs: &nn::VarStore,
) -> anyhow::Result<(f64, ProgramModel)> {
    let started = Instant::now();
    let model = ProgramModel::load(&spec(program, precision, batch)?, input, vs)?;
    Ok((started.elapsed().as_secs_f64(), model))
}

fn spec(program: &Path, precision: AmpDtype, batch: u64) -> anyhow::Result<ProgramSpec<'_>> {
    Ok(ProgramSpec {
        path: program,
        loss: Loss::CrossEntropy,
        precision,
        output: None,
        freeze: None,
        attention: kiln_config::AttentionKernel::Auto,
        threads: kiln_torch_ext::memory::num_threads()?.0,
        batch: Some(batch),
    })
}

/// One fp32 compiled step on the reference's first batch: the largest relative gradient error
/// over the parameters, which parameter had it, and the load's time (a cache hit).
fn check_gradients(
    ctx: &Ctx,
    program: &Path,
    reference: &Value,
) -> anyhow::Result<(f64, String, f64)> {
    let vs = nn::VarStore::new(ctx.device);
    let n = reference["grad_batch"].as_i64().context("grad_batch")?;
    let (hit_s, model) = load(program, (AmpDtype::None, n as u64), &input(reference)?, &vs)?;
    let x = tensor(&reference["x"], Kind::Float, ctx.device)?.narrow(0, 0, n);
    let y = tensor(&reference["y"], Kind::Int64, ctx.device)?.narrow(0, 0, n);
    let step = kiln_train::model::Model::compiled_step(&model).context("no compiled step")?;
    let x = kiln_train::inputs::Inputs::features(x);
    let (_loss, _output) = step.step(&x, &y, 1.0, None)?;
    let vars = vs.variables();
    let grads = reference["gradients"].as_object().context("no gradients")?;
    anyhow::ensure!(
        grads.len() == vs.trainable_variables().len(),
        "kiln has {} parameters, PyTorch {}",
        vs.trainable_variables().len(),
        grads.len()
    );
    let mut worst = (0.0, String::new());
    for (name, want) in grads {
        let ours = vars
            .get(name)
            .with_context(|| format!("no parameter {name}"))?;
        let err = relative(&ours.grad(), &tensor(want, Kind::Float, ctx.device)?);
        if err > worst.0 || err.is_nan() {
            worst = (err, name.clone());
        }
    }
    Ok((worst.0, worst.1, hit_s))
}

/// ‖a − b‖ / ‖b‖ (the absolute error where ‖b‖ is tiny).
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_kind(Kind::Double);
    let b = b.to_kind(Kind::Double);
    let diff = (&a - &b).norm().double_value(&[]);
    let norm = b.norm().double_value(&[]);
    if norm < 1e-8 { diff } else { diff / norm }
}

/// `STEPS` full-batch bf16 steps of `kiln train` on the reference's data, as PyTorch's loop
/// runs them (`graphs`: the step replayed as one CUDA graph); the logged losses and the run's
/// samples/s.
fn train_bf16(
    ctx: &Ctx,
    program: &Path,
    reference: &Value,
    graphs: bool,
) -> anyhow::Result<(Vec<f64>, f64)> {
    let data = ctx.dir.join("data");
    if !data.is_dir() {
        write_data(&ctx.dir, reference)?;
    }
    let samples = reference["x"]["shape"][0].as_u64().context("x shape")?;
    let model = format!("model.name={}", program.display());
    let batch = format!("train.batch_size={samples}");
    let epochs = format!("train.epochs={STEPS}");
    let sets = [
        model.as_str(),
        batch.as_str(),
        epochs.as_str(),
        "train.amp=bf16",
        "train.lr=0.003",
        "train.weight_decay=0.01",
        "train.schedule=constant",
        "train.warmup_steps=0",
        "train.clip_grad_norm=0",
        "train.log_interval=1",
        "data.val_fraction=0",
        "data.num_workers=0",
        "checkpoint.enabled=false",
        if graphs {
            "train.cuda_graphs=on"
        } else {
            "train.cuda_graphs=off"
        },
    ];
    let runs = ctx.dir.join(if graphs { "graph-runs" } else { "runs" });
    let plan = plan(ctx.device_key(), &runs, &sets)?;
    let device = match ctx.device {
        tch::Device::Cuda(i) => kiln_device::Device::Cuda(i),
        _ => kiln_device::Device::Cpu,
    };
    kiln_train::run::apply_backend(&plan, device);
    let mut record = Record::default();
    kiln_train::run::train(
        &plan,
        device,
        Some(&data),
        RunControl::default(),
        &mut record,
    )?;
    let losses = record.steps.iter().map(|s| s.metrics.loss()).collect();
    let summary = record.summary.context("no summary")?;
    Ok((losses, summary.samples_per_s))
}

/// The reference's samples as a prepared dataset (`.npy` files, then `kiln data prepare`).
fn write_data(dir: &Path, reference: &Value) -> anyhow::Result<PathBuf> {
    let shape: Vec<usize> = serde_json::from_value(reference["x"]["shape"].clone())?;
    let xs: Vec<f32> = serde_json::from_value(reference["x"]["values"].clone())?;
    let ys: Vec<f64> = serde_json::from_value(reference["y"]["values"].clone())?;
    let (fx, fy) = (dir.join("x.npy"), dir.join("y.npy"));
    std::fs::write(
        &fx,
        kiln_data::npy_f32_bytes(&shape, &xs).map_err(anyhow::Error::msg)?,
    )?;
    let labels: Vec<u8> = ys.iter().flat_map(|&v| (v as i64).to_le_bytes()).collect();
    kiln_data::write_npy(&fy, kiln_data::DType::I64, &[ys.len()], &labels)?;
    let out = dir.join("data");
    let source = kiln_data::PrepareSource::Npy {
        features: fx,
        labels: fy,
    };
    kiln_data::prepare(&source, &out, &kiln_data::PrepareOptions::default())?;
    Ok(out)
}
