//! The `infer` suite: kiln's engine against PyTorch eager, its default and `torch.compile` on
//! the same model, batch, threads and device, ONNX Runtime beside; and `infer-probe`, the kiln
//! side of one measurement in its own process.

use super::*;

/// Times kiln's engine over `--batches` batches of random host inputs; prints one JSON line.
pub(super) fn infer_probe(a: &InferProbeArgs) -> Result<()> {
    let device = a.device.unwrap_or_else(Device::cuda_if_available);
    let precision = a.precision;
    let batch = a.batch.max(1);
    let batches = a.batches.max(1);
    let warmup = a.warmup;
    let threads = a.threads.max(1);
    let graphs = a.graphs;
    kiln_torch_ext::memory::set_num_threads(threads).map_err(|e| e.to_string())?;
    // The engine is ready once it has run its first (warm-up) batch.
    let start = Instant::now();
    let (mut runner, graphs): (Box<dyn Runner>, String) = match a.engine {
        ProbeEngine::Libtorch => {
            let engine = engine(device, precision, batch, graphs)?;
            let graphs = format!("{:?}", engine.graph_status());
            (Box::new(engine), graphs)
        }
        ProbeEngine::Onnxruntime => {
            if precision != AmpDtype::None {
                return Err("--engine onnxruntime runs the ONNX file in fp32 only".to_owned());
            }
            let path = a
                .onnx
                .as_deref()
                .ok_or("--engine onnxruntime needs --onnx FILE")?;
            let engine = onnx_engine(path, device, batch, threads)?;
            let graphs = engine.cuda_graphs();
            (Box::new(engine), graphs)
        }
    };
    let first_batch = start.elapsed().as_secs_f64();
    let inputs = probe_inputs(batch)?;
    let mut times = vec![];
    let mut last = vec![];
    for i in 0..warmup + batches {
        let start = Instant::now();
        // `run` returns host outputs, so it has waited for the device.
        let (outputs, shape) =
            Runner::run(&mut runner, &inputs, batch).map_err(|e| e.to_string())?;
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64());
        }
        if shape != [10] || outputs.len() != batch * 10 || outputs.iter().any(|v| !v.is_finite()) {
            return Err(format!(
                "unexpected outputs: {} values of sample shape {shape:?} for {batch} samples",
                outputs.len()
            ));
        }
        last = outputs;
    }
    let total: f64 = times.iter().sum();
    let mut ordered = times.clone();
    ordered.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        let rank = ((q / 100.0 * ordered.len() as f64).ceil() as usize).clamp(1, ordered.len());
        ordered[rank - 1] * 1e3
    };
    let (memory, memory_kind) = peak_memory_mib(device);
    // ONNX Runtime's outputs against the libtorch engine's on the same batch (after the
    // timing and the memory figure): both compute the same function.
    let max_abs = match a.engine {
        ProbeEngine::Libtorch => Value::Null,
        ProbeEngine::Onnxruntime => {
            let mut torch = engine(device, AmpDtype::None, batch, CudaGraphs::Off)?;
            json!(max_abs_vs(&mut torch, &inputs, batch, &last)?)
        }
    };
    println!(
        "{}",
        json!({
            "framework": "kiln",
            "engine": runner.engine(),
            "max_abs_vs_libtorch": max_abs,
            "device": device_name(device),
            "precision": precision.as_str(),
            "batch": batch,
            "batches": batches,
            "threads": threads,
            "graphs": graphs,
            "first_batch_s": first_batch,
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

/// kiln's inference precision on `device` when the user sets none (`infer.precision` from the
/// hardware profile: bf16 where the CPU or GPU computes it fast, fp32 elsewhere).
fn auto_precision(device: Device) -> Result<AmpDtype> {
    let mut req = kiln_config::ConfigRequest::new(kiln_config::Machine::Probed(
        kiln_device::probe::probe().map_err(|e| e.to_string())?,
    ));
    req.sets = vec![format!(
        "device.request={}",
        if device.is_cuda() { "cuda" } else { "cpu" }
    )];
    Ok(kiln_config::load(&req)
        .map_err(|e| e.to_string())?
        .plan
        .infer
        .precision)
}

/// The infer suite's settings, as the probes' command-line values.
struct InferOpts {
    quick: bool,
    repeats: usize,
    threads: String,
    dev: String,
    python: String,
    me: std::path::PathBuf,
    warmup: &'static str,
    batches: &'static str,
    graphs: &'static str,
    /// The bench model's ONNX export, where it could be made and run here.
    onnx: Option<OnnxModel>,
}

/// One PyTorch configuration of an infer row: precision, grad mode, eager or compiled.
#[derive(Clone, Copy)]
struct TorchSide {
    precision: &'static str,
    no_grad: bool,
    compile: bool,
}

impl TorchSide {
    /// What it runs, for the row's baseline name.
    fn describe(self) -> String {
        let weights = if self.precision == "fp32" {
            "fp32".to_owned()
        } else {
            format!("{} weights (model.to, no autocast)", self.precision)
        };
        format!(
            "{} {weights}, {}",
            if self.compile {
                "torch.compile(model), default mode,"
            } else {
                "PyTorch eager"
            },
            if self.no_grad {
                "no_grad"
            } else {
                "inference_mode"
            }
        )
    }
}

impl InferOpts {
    fn kiln(&self, precision: &str, batch: usize) -> Command {
        let mut c = Command::new(&self.me);
        c.args(["serve", "infer-probe"])
            .args(["--precision", precision, "--batch", &batch.to_string()])
            .args(["--warmup", self.warmup, "--batches", self.batches])
            .args(["--threads", &self.threads, "--device", &self.dev])
            .args(["--graphs", self.graphs]);
        c
    }

    /// The ONNX Runtime probe: the same timing as [`InferOpts::kiln`] at fp32 over `onnx`.
    fn onnxruntime(&self, onnx: &Path, batch: usize) -> Command {
        let mut c = Command::new(&self.me);
        c.args(["serve", "infer-probe"])
            .args(["--engine", "onnxruntime", "--onnx"])
            .arg(onnx)
            .args(["--precision", "fp32", "--batch", &batch.to_string()])
            .args(["--warmup", self.warmup, "--batches", self.batches])
            .args(["--threads", &self.threads, "--device", &self.dev]);
        c
    }

    fn torch(&self, side: TorchSide, batch: usize, cache: &std::path::Path) -> Command {
        let mut c = Command::new(&self.python);
        c.arg(bench_root().join("python/infer_step.py"))
            .args(["--precision", side.precision, "--batch", &batch.to_string()])
            .args(["--warmup", self.warmup, "--batches", self.batches])
            .args(["--threads", &self.threads, "--device", &self.dev]);
        if side.no_grad {
            c.args(["--grad-mode", "no_grad"]);
        }
        if side.compile {
            // Inductor's cache directory, and TMPDIR for the headers it precompiles once.
            c.arg("--compile")
                .env("TORCHINDUCTOR_CACHE_DIR", cache.join("inductor"))
                .env("TMPDIR", cache.join("tmp"));
        }
        c
    }

    /// kiln at `precision`, each PyTorch side at `batch` and, with `onnx`, the ONNX Runtime
    /// probe, alternating; the runs of each, kiln's first and ONNX Runtime's last. A compiled
    /// side gets an inductor cache of its own, empty at its first run.
    fn runs(
        &self,
        precision: &str,
        batch: usize,
        sides: &[TorchSide],
        onnx: Option<&Path>,
    ) -> Result<Vec<Vec<Value>>> {
        let cache = std::env::temp_dir().join(format!(
            "kiln-bench-inductor-infer-{}-{precision}-{batch}",
            std::process::id()
        ));
        if sides.iter().any(|s| s.compile) {
            std::fs::create_dir_all(cache.join("tmp"))
                .map_err(|e| format!("{}: {e}", cache.display()))?;
        }
        let kiln = || self.kiln(precision, batch);
        let torch: Vec<Box<dyn Fn() -> Command + '_>> = sides
            .iter()
            .map(|&s| {
                let cache = cache.clone();
                Box::new(move || self.torch(s, batch, &cache)) as Box<dyn Fn() -> Command>
            })
            .collect();
        let ort = onnx.map(|path| move || self.onnxruntime(path, batch));
        let mut cmds: Vec<&dyn Fn() -> Command> = vec![&kiln];
        cmds.extend(torch.iter().map(|c| c.as_ref() as &dyn Fn() -> Command));
        if let Some(ort) = &ort {
            cmds.push(ort);
        }
        let runs = interleaved(self.repeats, &cmds);
        let _ = std::fs::remove_dir_all(&cache);
        runs
    }
}

/// The headline figure at `batch`: latency at batch 1, throughput otherwise.
fn headline(batch: usize) -> (&'static str, &'static str, &'static str, Better) {
    if batch == 1 {
        ("p50 latency", "p50_ms", "ms", Better::Lower)
    } else {
        ("throughput", "samples_per_s", "samples/s", Better::Higher)
    }
}

/// One infer row: kiln's runs `k` against PyTorch's `t`, each side's settings in details.
fn infer_row(
    name: String,
    batch: usize,
    (k, t): (&[Value], &[Value]),
    side: TorchSide,
    what: &str,
) -> Comparison {
    let (_, key, unit, better) = headline(batch);
    let other = if key == "p50_ms" {
        "samples_per_s"
    } else {
        "p50_ms"
    };
    Comparison::new(
        "infer",
        "inference",
        name,
        unit,
        better,
        (median_of(k, key), median_of(t, key)),
        format!("{} ({what})", side.describe()),
    )
    .detail("batch_size", json!(batch))
    .detail(
        "kiln",
        json!({"precision": k[0]["precision"], "path": kiln_path(&k[0]),
               "grad_mode": "no_grad", "threads": k[0]["threads"], "graphs": k[0]["graphs"]}),
    )
    .detail(
        "baseline",
        json!({"runs": side.describe(), "precision": side.precision,
               "grad_mode": t[0]["grad_mode"], "threads": t[0]["threads"]}),
    )
    .detail(
        other,
        json!({"kiln": median_of(k, other), "baseline": median_of(t, other)}),
    )
    .detail(
        "p95_ms",
        json!({"kiln": median_of(k, "p95_ms"), "baseline": median_of(t, "p95_ms")}),
    )
}

/// How kiln's engine computes at the precision of probe run `k`.
fn kiln_path(k: &Value) -> String {
    match k["precision"].as_str() {
        Some("fp32") | None => "fp32 weights and inputs".to_owned(),
        Some(p) => format!("weights converted to {p} once, inputs cast, no autocast"),
    }
}

/// kiln's first batch (building the engine: model, weights in precision, one warm-up batch)
/// against `torch.compile`'s (compiling the forward), from an empty inductor cache.
fn compile_time_row(name: &str, batch: usize, (k, t): (&[Value], &[Value])) -> Comparison {
    let cold: Vec<f64> = t
        .iter()
        .filter(|r| r["compile"]["inductor_cache"] == "cold")
        .filter_map(|r| r["compile"]["first_batch_s"].as_f64())
        .collect();
    let warm: Vec<f64> = t
        .iter()
        .filter(|r| r["compile"]["inductor_cache"] == "warm")
        .filter_map(|r| r["compile"]["first_batch_s"].as_f64())
        .collect();
    let first = if cold.is_empty() {
        median_of(t, "first_batch_s")
    } else {
        median(cold.clone())
    };
    Comparison::new(
        "infer",
        "compile time",
        name.replacen(headline(batch).0, "first batch (compile time)", 1),
        "s",
        Better::Lower,
        (median_of(k, "first_batch_s"), first),
        format!(
            "torch.compile first batch, {}",
            if cold.is_empty() {
                "inductor's caches warm"
            } else {
                "inductor's caches empty (a user's first compile here)"
            }
        ),
    )
    .detail("batch_size", json!(batch))
    .detail(
        "compile",
        json!({"mode": "default", "cold_first_batch_s": cold, "warm_first_batch_s": warm,
               "compile_s": t.iter().map(|r| r["compile"]["compile_s"].clone())
                   .collect::<Vec<_>>(),
               "kiln_first_batch": "building the engine (model, weights, a warm-up batch)"}),
    )
}

/// The `torch.compile` rows of `label` at `batch` (its step row and its compile-time row), or
/// why compile could not run here.
fn push_compile_rows(
    out: &mut SuiteOutput,
    label: &str,
    batch: usize,
    (k, t): (&[Value], &[Value]),
    side: TorchSide,
) {
    let name = format!(
        "{label} vs torch.compile {}, same computation",
        side.precision
    );
    if let Some(reason) = t.iter().find_map(|r| r["not_run"].as_str()) {
        out.skip(&name, &format!("not run: {reason}"));
        return;
    }
    out.push(infer_row(
        name.clone(),
        batch,
        (k, t),
        side,
        "kiln's precision and no_grad",
    ));
    out.push(compile_time_row(&name, batch, (k, t)));
}

pub(super) fn infer_suite(a: &SuiteArgs) -> Result<()> {
    let quick = a.quick;
    let device = a.device();
    let out_path = a.out_or("infer");
    let threads = a.threads_or(2).max(1);
    let mut o = InferOpts {
        quick,
        repeats: a.repeats_or(if quick { 1 } else { 3 }).max(1),
        threads: threads.to_string(),
        dev: device_name(device),
        python: a.python.clone(),
        me: std::env::current_exe().map_err(|e| e.to_string())?,
        warmup: if quick { "5" } else { "20" },
        batches: if quick { "30" } else { "200" },
        graphs: if device.is_cuda() { "on" } else { "off" },
        onnx: None,
    };
    let auto = auto_precision(device)?.as_str();
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
    // The onnxruntime rows' model: exported once, before the batches.
    match export_onnx(&out_path, "infer", device, threads, 64) {
        Ok(m) => {
            eprintln!(
                "infer: exported {} in {:.1} s ({}; max |Δ| vs libtorch at batch {}: {:.2e})",
                m.path.display(),
                m.export_s,
                m.status,
                m.check_batch,
                m.max_abs
            );
            o.onnx = Some(m);
        }
        Err(why) => out.skip("onnxruntime rows", &format!("not run: {why}")),
    }
    let mut runs = vec![];
    for batch in [64, 1] {
        runs.extend(infer_batch(&o, &mut out, auto, batch)?);
    }
    if !device.is_cuda() {
        out.skip(
            "CUDA-graph latency",
            "needs a CUDA GPU; this machine has none",
        );
    }
    if quick {
        out.skip(
            "torch.compile rows",
            "left out of --quick: compiling takes minutes",
        );
    }
    runs.extend(infer_sweep(&o, &mut out, a.batch_sizes())?);
    out.details = json!({"repeats": o.repeats, "warmup_batches": o.warmup,
                         "timed_batches": o.batches, "auto_precision": auto, "runs": runs,
                         "onnx": o.onnx.as_ref().map(OnnxModel::details)});
    out.write(&out_path)
}

/// The rows at one batch size: kiln fp32 and kiln at its automatic precision `auto`, each
/// against the same computation in PyTorch, PyTorch's default, and (not `--quick`)
/// `torch.compile` at kiln's automatic precision.
fn infer_batch(
    o: &InferOpts,
    out: &mut SuiteOutput,
    auto: &'static str,
    batch: usize,
) -> Result<Vec<Value>> {
    let (metric, ..) = headline(batch);
    let graphs = if o.graphs == "on" {
        ", CUDA graphs"
    } else {
        ""
    };
    let same = "the same computation as kiln's engine";
    let eager = |precision, no_grad| TorchSide {
        precision,
        no_grad,
        compile: false,
    };
    let compiled = TorchSide {
        compile: true,
        ..eager(auto, true)
    };
    let fp32_default = eager("fp32", false);
    let mut fp32_sides = vec![eager("fp32", true), fp32_default];
    if auto == "fp32" && !o.quick {
        fp32_sides.push(compiled);
    }
    let onnx = o.onnx.as_ref().filter(|_| ONNX_BATCHES.contains(&batch));
    let mut r = o.runs("fp32", batch, &fp32_sides, onnx.map(|m| m.path.as_path()))?;
    let ort = if onnx.is_some() { r.pop() } else { None };
    let fp32 = format!("mlp fp32 b={batch} {metric}{graphs}");
    out.push(infer_row(
        format!("{fp32}, same computation"),
        batch,
        (&r[0], &r[1]),
        fp32_sides[0],
        same,
    ));
    if let (Some(m), Some(ort)) = (onnx, &ort) {
        out.push(onnx_row(batch, (ort, &r[0], &r[1]), fp32_sides[0], m));
    }
    out.push(infer_row(
        format!("{fp32} (PyTorch default: inference_mode)"),
        batch,
        (&r[0], &r[2]),
        fp32_default,
        "PyTorch default",
    ));
    if auto == "fp32" {
        if let Some(t) = r.get(3) {
            push_compile_rows(out, &fp32, batch, (&r[0], t), compiled);
        }
        return Ok(vec![
            json!({"precision": "fp32", "batch": batch, "kiln": r[0], "torch": &r[1..],
                   "onnxruntime": ort}),
        ]);
    }
    let mut auto_sides = vec![eager(auto, true)];
    if !o.quick {
        auto_sides.push(compiled);
    }
    let a = o.runs(auto, batch, &auto_sides, None)?;
    let label = format!("mlp auto ({auto}) b={batch} {metric}{graphs}");
    out.push(infer_row(
        format!("{label} vs PyTorch {auto}, same computation"),
        batch,
        (&a[0], &a[1]),
        auto_sides[0],
        same,
    ));
    out.push(infer_row(
        format!("{label} vs PyTorch fp32 (PyTorch default: fp32, inference_mode)"),
        batch,
        (&a[0], &r[2]),
        fp32_default,
        "PyTorch default: fp32 unless the user converts the model",
    ));
    if let Some(t) = a.get(2) {
        push_compile_rows(out, &label, batch, (&a[0], t), compiled);
    }
    Ok(vec![
        json!({"precision": "fp32", "batch": batch, "kiln": r[0], "torch": &r[1..],
               "onnxruntime": ort}),
        json!({"precision": auto, "batch": batch, "kiln": a[0], "torch": &a[1..]}),
    ])
}

/// The batch sizes with an onnxruntime row.
const ONNX_BATCHES: [usize; 2] = [1, 64];

/// The onnxruntime row at `batch`: ONNX Runtime's probe runs `ort` against PyTorch eager's `t`
/// (the same computation), with the libtorch engine's runs `k` and the two engines' largest
/// output difference in details.
fn onnx_row(
    batch: usize,
    (ort, k, t): (&[Value], &[Value], &[Value]),
    side: TorchSide,
    onnx: &OnnxModel,
) -> Comparison {
    let (metric, key, ..) = headline(batch);
    let libtorch = median_of(k, key);
    let max_abs = ort
        .iter()
        .map(|r| r["max_abs_vs_libtorch"].as_f64().unwrap_or(f64::NAN))
        .fold(0.0_f64, |m, d| {
            if d.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(d)
            }
        });
    let row = infer_row(
        format!("mlp fp32 b={batch} {metric}, onnxruntime"),
        batch,
        (ort, t),
        side,
        "the same computation as the ONNX model",
    )
    .detail(
        "kiln",
        json!({"engine": ort[0]["engine"], "precision": "fp32",
               "path": "kiln's MLP exported to ONNX (opset 17), run by kiln's ONNX engine",
               "threads": ort[0]["threads"], "graphs": ort[0]["graphs"]}),
    )
    .detail(
        "libtorch",
        json!({key: libtorch, "onnxruntime_over_libtorch": median_of(ort, key) / libtorch,
               "runs": "kiln's libtorch engine, fp32, the same batches (its own row above)"}),
    )
    .detail(
        "same_function",
        json!({"max_abs_diff_vs_libtorch": max_abs, "batch": batch,
               "what": "ONNX Runtime's outputs against kiln's libtorch engine on the timed \
                        batch (the same weights); PyTorch eager runs the same MLP architecture \
                        in fp32 under no_grad"}),
    )
    .detail("onnx", onnx.details());
    eprintln!(
        "  onnxruntime b={batch}: libtorch {} {libtorch:.4}, onnxruntime/libtorch {:.2}×, \
         max |Δ| vs libtorch {max_abs:.2e}",
        key,
        median_of(ort, key) / libtorch
    );
    row
}

/// `--batch-sizes`: kiln fp32 against PyTorch's default (eager fp32, inference_mode).
fn infer_sweep(o: &InferOpts, out: &mut SuiteOutput, sizes: &[usize]) -> Result<Vec<Value>> {
    let side = TorchSide {
        precision: "fp32",
        no_grad: false,
        compile: false,
    };
    let mut runs = vec![];
    for &b in sizes {
        let r = o.runs("fp32", b, &[side], None)?;
        let (k, t) = (&r[0], &r[1]);
        let baseline = side.describe();
        out.push(
            Comparison::new(
                "infer",
                SWEEP_GROUP,
                format!("mlp fp32 b={b} throughput"),
                "samples/s",
                Better::Higher,
                (median_of(k, "samples_per_s"), median_of(t, "samples_per_s")),
                baseline.clone(),
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
    Ok(runs)
}
