//! The `infer` suite (the group's docs say what it measures) and `infer-probe`, the kiln side
//! of one measurement in its own process.

use super::*;
use kiln_benches::report::{SAMPLES_S, SECONDS, SidesRuns};
use kiln_benches::{cold_first, not_run, or_skip, python_script, resolve_for};

/// Times kiln's engine over `--batches` batches of random host inputs; prints one JSON line.
pub(super) fn infer_probe(a: &InferProbeArgs) -> Result<()> {
    let (device, threads) = (a.place.device(), a.place.set_threads()?);
    let (batch, batches) = (a.batch.max(1), a.batches.max(1));
    if a.onnx.is_some() && a.precision != AmpDtype::None {
        return Err("--onnx: ONNX Runtime runs the file in fp32 only".to_owned());
    }
    // The engine is ready once it has run its first (warm-up) batch.
    let start = Instant::now();
    let (mut runner, graphs): (Box<dyn Runner>, String) = if let Some(path) = &a.onnx {
        let engine = onnx_engine(path, device, batch, threads)?;
        let graphs = engine.cuda_graphs();
        (Box::new(engine), graphs)
    } else {
        let engine = engine(device, batch, (a.precision, a.graphs))?;
        let graphs = format!("{:?}", engine.graph_status());
        (Box::new(engine), graphs)
    };
    let first_batch = start.elapsed().as_secs_f64();
    let inputs = probe_inputs(batch)?;
    let (mut times, mut last) = (vec![], vec![]);
    for i in 0..a.warmup + batches {
        let start = Instant::now();
        // `run` returns host outputs, so it has waited for the device.
        let (outputs, shape) = Runner::run(&mut runner, &inputs, batch).msg()?;
        if i >= a.warmup {
            times.push(start.elapsed().as_secs_f64());
        }
        if shape != [10] || outputs.len() != batch * 10 || outputs.iter().any(|v| !v.is_finite()) {
            let n = outputs.len();
            let what = format!("{n} values of sample shape {shape:?} for {batch} samples");
            return Err(format!("unexpected outputs: {what}"));
        }
        last = outputs;
    }
    let total: f64 = times.iter().sum();
    let ms: Vec<f64> = times.iter().map(|t| t * 1e3).collect();
    let tail = kiln_infer::offline::Percentiles::of(&ms);
    let (memory, memory_kind) = peak_memory_mib(device);
    // ONNX Runtime against the libtorch engine on the same batch, after the timing.
    let mut max_abs = Value::Null;
    if a.onnx.is_some() {
        let mut torch = engine(device, batch, FP32)?;
        max_abs = json!(max_abs_vs(&mut torch, &inputs, &last)?);
    }
    let run = json!({
        "framework": "kiln", "engine": runner.engine(), "max_abs_vs_libtorch": max_abs,
        "device": device_name(device), "precision": a.precision.as_str(),
        "batch": batch, "batches": batches, "threads": threads, "graphs": graphs,
        "first_batch_s": first_batch, "samples_per_s": (batch * batches) as f64 / total,
        "p50_ms": median(times) * 1e3, "p95_ms": tail.p95, "p99_ms": tail.p99,
        "peak_memory_mib": memory, "peak_memory_kind": memory_kind,
    });
    println!("{run}");
    Ok(())
}

/// The infer suite's settings, as the probes' command-line values.
pub(super) struct InferOpts {
    pub(super) quick: bool,
    pub(super) repeats: usize,
    pub(super) threads: String,
    dev: String,
    pub(super) python: String,
    me: PathBuf,
    warmup: &'static str,
    batches: &'static str,
    graphs: &'static str,
    /// kiln's automatic precision here (fp32 or bf16).
    auto: &'static str,
    /// The bench model's ONNX export, where it could be made and run here.
    onnx: Option<OnnxModel>,
}

/// One PyTorch configuration of an infer row: its precision, grad mode (`no_grad` or PyTorch's
/// default `inference_mode`), and `torch.compile` (else eager).
#[derive(Clone, Copy)]
struct TorchSide {
    precision: &'static str,
    grad: &'static str,
    compile: bool,
}

impl TorchSide {
    fn eager(precision: &'static str, grad: &'static str) -> Self {
        Self {
            precision,
            grad,
            compile: false,
        }
    }

    /// What it runs, for the row's baseline name.
    fn describe(self) -> String {
        let how = if self.compile {
            "torch.compile(model), default mode,"
        } else {
            "PyTorch eager"
        };
        let grad = self.grad;
        match self.precision {
            "fp32" => format!("{how} fp32, {grad}"),
            p => format!("{how} {p} weights (model.to, no autocast), {grad}"),
        }
    }
}

/// One probe of an infer measurement: kiln's engine (or ONNX Runtime over a file), or PyTorch.
#[derive(Clone, Copy)]
enum Probe<'a> {
    Kiln(Option<&'a Path>),
    Torch(TorchSide),
}

impl InferOpts {
    /// `probe`'s command at `batch` (kiln's at `precision`; inductor's cache under `cache`).
    fn command(&self, probe: Probe<'_>, precision: &str, batch: usize, cache: &Path) -> Command {
        let (mut c, precision) = match probe {
            Probe::Kiln(_) => (command(&self.me, &["serve", "infer-probe"]), precision),
            Probe::Torch(side) => (python_script(&self.python, "infer_step.py"), side.precision),
        };
        match probe {
            Probe::Kiln(Some(onnx)) => c.arg("--onnx").arg(onnx),
            Probe::Kiln(None) => c.args(["--graphs", self.graphs]),
            Probe::Torch(side) => c.args(["--grad-mode", side.grad]),
        };
        c.args(["--precision", precision, "--batch", &batch.to_string()])
            .args(["--warmup", self.warmup, "--batches", self.batches])
            .args(["--threads", &self.threads, "--device", &self.dev]);
        if let Probe::Torch(TorchSide { compile: true, .. }) = probe {
            compile_env(&mut c, cache);
        }
        c
    }

    /// The runs of kiln, each PyTorch side and (with `onnx`) ONNX Runtime, alternating, in that
    /// order; a compiled side gets an inductor cache of its own, empty at its first run.
    fn runs(
        &self,
        (precision, batch): (&str, usize),
        sides: &[TorchSide],
        onnx: Option<&Path>,
    ) -> Result<Vec<Vec<Value>>> {
        let mut probes = vec![Probe::Kiln(None)];
        probes.extend(sides.iter().map(|&s| Probe::Torch(s)));
        probes.extend(onnx.map(|path| Probe::Kiln(Some(path))));
        in_temp_dir(&format!("inductor-infer-{precision}-{batch}"), |cache| {
            alternating(self.repeats, &probes, |_, probe| {
                run_json(self.command(probe, precision, batch, cache)).map(Some)
            })
        })
    }
}

/// The headline at `batch` (latency at 1, else throughput): metric, key, unit, the other key.
fn headline(batch: usize) -> (&'static str, &'static str, Unit, &'static str) {
    match batch {
        1 => ("p50 latency", "p50_ms", MS, "samples_per_s"),
        _ => ("throughput", "samples_per_s", SAMPLES_S, "p50_ms"),
    }
}

/// One infer row: kiln's runs `k` against PyTorch's `t` (`side`, `what` to kiln's).
fn infer_row(
    name: String,
    batch: usize,
    (k, t): SidesRuns<'_>,
    (side, what): (TorchSide, &str),
) -> Comparison {
    let (_, key, unit, other) = headline(batch);
    let both = |key| json!({"kiln": median_of(k, key), "baseline": median_of(t, key)});
    let path = match k[0]["precision"].as_str() {
        Some("fp32") | None => "fp32 weights and inputs".to_owned(),
        Some(p) => format!("weights converted to {p} once, inputs cast, no autocast"),
    };
    let figures = (median_of(k, key), median_of(t, key));
    let baseline = format!("{} ({what})", side.describe());
    let kiln = json!({"precision": k[0]["precision"], "path": path, "grad_mode": "no_grad",
                      "threads": k[0]["threads"], "graphs": k[0]["graphs"]});
    let torch = json!({"runs": side.describe(), "precision": side.precision,
                       "grad_mode": t[0]["grad_mode"], "threads": t[0]["threads"]});
    Comparison::new("infer", "inference", name, unit, figures, baseline)
        .detail("batch_size", json!(batch))
        .detail("kiln", kiln)
        .detail("baseline", torch)
        .detail(other, both(other))
        .detail("p95_ms", both("p95_ms"))
}

/// The `torch.compile` rows of `label` (or why not run): the batch row, and kiln's first batch
/// against `torch.compile`'s (compiling the forward) from an empty inductor cache.
fn push_compile_rows(
    out: &mut SuiteOutput,
    (label, batch): (&str, usize),
    (k, t): SidesRuns<'_>,
    side: TorchSide,
) {
    let precision = side.precision;
    let name = format!("{label} vs torch.compile {precision}, same computation");
    if let Some(reason) = not_run(t) {
        return out.skip(&name, &format!("not run: {reason}"));
    }
    let what = "kiln's precision and no_grad";
    out.push(infer_row(name.clone(), batch, (k, t), (side, what)));
    let firsts = |cache: &str| -> Vec<f64> {
        let runs = t.iter().filter(|r| r["compile"]["inductor_cache"] == cache);
        runs.filter_map(|r| r["compile"]["first_batch_s"].as_f64())
            .collect()
    };
    let (first, caches) = cold_first(t, "first_batch_s");
    let compile_s: Vec<&Value> = t.iter().map(|r| &r["compile"]["compile_s"]).collect();
    let name = name.replacen(headline(batch).0, "first batch (compile time)", 1);
    let figures = (median_of(k, "first_batch_s"), first);
    let base = format!("torch.compile first batch, {caches}");
    let compile = json!({"mode": "default", "cold_first_batch_s": firsts("cold"),
                         "warm_first_batch_s": firsts("warm"), "compile_s": compile_s,
                         "kiln_first_batch": "building the engine (model, weights, a warm-up \
                                              batch)"});
    let row = out.row("compile time", name, SECONDS, figures, base);
    let row = row.detail("batch_size", json!(batch));
    out.push(row.detail("compile", compile));
}

pub(super) fn infer_suite(a: &SuiteArgs) -> Result<()> {
    let (quick, device) = (a.quick, a.device());
    // kiln's inference precision here by default: bf16 where the device computes it fast.
    let auto = resolve_for(device)?.plan.infer.precision.as_str();
    let mut o = InferOpts {
        quick,
        repeats: a.repeats_or(if quick { 1 } else { 3 }).max(1),
        threads: a.threads_or(2).max(1).to_string(),
        dev: device_name(device),
        python: a.python.clone(),
        me: std::env::current_exe().msg()?,
        warmup: if quick { "5" } else { "20" },
        batches: if quick { "30" } else { "200" },
        graphs: if device.is_cuda() { "on" } else { "off" },
        auto,
        onnx: None,
    };
    let mut out = SuiteOutput::new(
        "infer",
        &format!(
            "offline inference of mlp 784-1024-1024-10 (random weights) on {}, {} threads: \
             kiln's engine (host batches in, fp32 host outputs out, no_grad; at fp32 and at its \
             automatic precision, {auto} here) against PyTorch doing the same in eager mode \
             (no_grad: the same computation; inference_mode and fp32: PyTorch's default) and \
             under torch.compile; and the same model exported to ONNX in ONNX Runtime (fp32, \
             batches 1 and 64) against PyTorch eager no_grad, kiln's libtorch figure beside it",
            o.dev, o.threads
        ),
    );
    let mut runs = vec![];
    // `--filter` picks groups: the mlp rows, `sliding window`, `int8`.
    if a.selects("mlp") {
        runs.extend(mlp_rows(a, &mut o, &mut out)?);
    }
    let work = kiln_benches::run_cli::fresh_work_dir(a, "infer")?;
    if a.selects("sliding window") {
        runs.extend(super::sliding::rows(&o, &mut out, &work)?);
    }
    if a.selects("int8") {
        runs.extend(super::int8::rows(&o, &mut out, &work)?);
    }
    out.details = json!({"repeats": o.repeats, "warmup_batches": o.warmup,
                         "timed_batches": o.batches, "auto_precision": auto, "runs": runs,
                         "onnx": o.onnx.as_ref().map(|m| &m.details)});
    out.write(&a.out_or("infer"))
}

/// The rows of the suite's own model: batches 64 and 1, ONNX Runtime beside them, the sweep.
fn mlp_rows(a: &SuiteArgs, o: &mut InferOpts, out: &mut SuiteOutput) -> Result<Vec<Value>> {
    let (device, threads) = (a.device(), a.threads_or(2).max(1));
    // The onnxruntime rows' model: exported once, before the batches.
    let exported = export_onnx(&a.out_or("infer"), "infer", (device, threads), 64);
    o.onnx = or_skip(out, "onnxruntime rows", exported);
    let mut runs = vec![];
    for batch in [64, 1] {
        runs.extend(infer_batch(o, out, batch)?);
    }
    if !device.is_cuda() {
        let why = "needs a CUDA GPU; this machine has none";
        out.skip("CUDA-graph latency", why);
    }
    if o.quick {
        let why = "left out of --quick: compiling takes minutes";
        out.skip("torch.compile rows", why);
    }
    // `--batch-sizes`: kiln fp32 against PyTorch's default, throughput and peak memory.
    let side = TorchSide::eager("fp32", "inference_mode");
    for &b in a.batch_sizes() {
        let r = o.runs(("fp32", b), &[side], None)?;
        out.push_sweep("mlp fp32", b, (&r[0], &r[1]), &side.describe());
        runs.push(json!({"sweep_batch": b, "kiln": r[0], "torch": r[1]}));
    }
    Ok(runs)
}

/// The rows at `batch`: kiln fp32 and auto against PyTorch's same computation, default, compile.
fn infer_batch(o: &InferOpts, out: &mut SuiteOutput, batch: usize) -> Result<Vec<Value>> {
    let auto = o.auto;
    let (metric, ..) = headline(batch);
    let graphs = match o.graphs {
        "on" => ", CUDA graphs",
        _ => "",
    };
    let same = "the same computation as kiln's engine";
    let default = TorchSide::eager("fp32", "inference_mode");
    let fp32_same = TorchSide::eager("fp32", "no_grad");
    let compiled = TorchSide {
        compile: true,
        ..TorchSide::eager(auto, "no_grad")
    };
    let compile = (!o.quick).then_some(compiled);
    let mut fp32_sides = vec![fp32_same, default];
    fp32_sides.extend(compile.filter(|_| auto == "fp32"));
    let onnx = o.onnx.as_ref().filter(|_| [1, 64].contains(&batch));
    let mut r = o.runs(("fp32", batch), &fp32_sides, onnx.map(|m| m.path.as_path()))?;
    let ort = onnx.and_then(|_| r.pop());
    let fp32 = format!("mlp fp32 b={batch} {metric}{graphs}");
    let name = format!("{fp32}, same computation");
    out.push(infer_row(name, batch, (&r[0], &r[1]), (fp32_same, same)));
    if let (Some(m), Some(ort)) = (onnx, &ort) {
        out.push(onnx_row(batch, ort, (&r[0], &r[1]), m));
    }
    let name = format!("{fp32} (PyTorch default: inference_mode)");
    let side = (default, "PyTorch default");
    out.push(infer_row(name, batch, (&r[0], &r[2]), side));
    let mut runs = vec![json!({"precision": "fp32", "batch": batch, "kiln": r[0],
                               "torch": &r[1..], "onnxruntime": ort})];
    if auto == "fp32" {
        if let Some(t) = r.get(3) {
            push_compile_rows(out, (&fp32, batch), (&r[0], t), compiled);
        }
        return Ok(runs);
    }
    let auto_same = TorchSide::eager(auto, "no_grad");
    let auto_sides: Vec<TorchSide> = std::iter::once(auto_same).chain(compile).collect();
    let a = o.runs((auto, batch), &auto_sides, None)?;
    let label = format!("mlp auto ({auto}) b={batch} {metric}{graphs}");
    let name = format!("{label} vs PyTorch {auto}, same computation");
    out.push(infer_row(name, batch, (&a[0], &a[1]), (auto_same, same)));
    let name = format!("{label} vs PyTorch fp32 (PyTorch default: fp32, inference_mode)");
    let what = "PyTorch default: fp32 unless the user converts the model";
    out.push(infer_row(name, batch, (&a[0], &r[2]), (default, what)));
    if let Some(t) = a.get(2) {
        push_compile_rows(out, (&label, batch), (&a[0], t), compiled);
    }
    runs.push(json!({"precision": auto, "batch": batch, "kiln": a[0], "torch": &a[1..]}));
    Ok(runs)
}

/// The onnxruntime row: ONNX Runtime's runs `ort` against PyTorch's `t`, libtorch's `k` beside.
fn onnx_row(batch: usize, ort: &[Value], (k, t): SidesRuns<'_>, m: &OnnxModel) -> Comparison {
    let (metric, key, ..) = headline(batch);
    let (libtorch, ratio) = (median_of(k, key), median_of(ort, key) / median_of(k, key));
    let diffs = ort.iter().map(|r| r["max_abs_vs_libtorch"].as_f64());
    let max_abs = nan_max(diffs.map(|d| d.unwrap_or(f64::NAN)));
    let name = format!("mlp fp32 b={batch} {metric}, onnxruntime");
    let what = "the same computation as the ONNX model";
    eprintln!(
        "  onnxruntime b={batch}: libtorch {key} {libtorch:.4}, onnxruntime/libtorch \
         {ratio:.2}×, max |Δ| vs libtorch {max_abs:.2e}"
    );
    let kiln = json!({"engine": ort[0]["engine"], "precision": "fp32",
                      "path": "kiln's MLP exported to ONNX (opset 17), run by kiln's ONNX engine",
                      "threads": ort[0]["threads"], "graphs": ort[0]["graphs"]});
    let libtorch = json!({key: libtorch, "onnxruntime_over_libtorch": ratio,
                          "runs": "kiln's libtorch engine, fp32, the same batches (its own row \
                                   above)"});
    let same = json!({"max_abs_diff_vs_libtorch": max_abs, "batch": batch,
                      "what": "ONNX Runtime's outputs against kiln's libtorch engine on the timed \
                               batch (the same weights); PyTorch eager runs the same MLP \
                               architecture in fp32 under no_grad"});
    let side = (TorchSide::eager("fp32", "no_grad"), what);
    infer_row(name, batch, (ort, t), side)
        .detail("kiln", kiln)
        .detail("libtorch", libtorch)
        .detail("same_function", same)
        .detail("onnx", m.details.clone())
}
