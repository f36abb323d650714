//! The train suite's exported-program rows: the reference transformer's PyTorch twin, exported
//! by `torch.export` and trained through kiln's compiled step (AOTInductor), against the same
//! module in PyTorch eager, under `torch.compile` (default mode) and through kiln's TorchScript
//! path; and kiln's compile time beside `torch.compile`'s first step.

use std::path::Path;
use std::process::Command;

use kiln_benches::report::{Better, Comparison};
use kiln_benches::{median, median_of, run_json};
use serde_json::{Value, json};

use super::cases::{StepCounts, compile_env, compile_summary};
use super::{Opts, Result};

/// What the exported-program rows' names begin with.
pub const PROGRAM_ROWS: &str = "your own model (transformer as an exported program)";

/// The program and the TorchScript twin of the reference transformer (dropout 0, the same seed
/// and so the same initial weights), written into `dir` by `train_step.py`.
fn export(o: &Opts, dir: &Path) -> Result<(String, String, Value)> {
    let program = dir.join("transformer.pt2").to_string_lossy().into_owned();
    let script = dir.join("transformer.pt").to_string_lossy().into_owned();
    let mut exported = json!(null);
    for (flag, path) in [("--export-program", &program), ("--export-script", &script)] {
        let mut c = o.torch();
        c.args(["--model", "transformer", "--dropout", "0", flag, path]);
        exported = run_json(c)?;
    }
    Ok((program, script, exported))
}

/// The sides' runs by name: kiln's compiled step (`kiln`; its compile cache empty at the first
/// run: a cold compile, warm after), PyTorch eager (`eager`), kiln's TorchScript path
/// (`torchscript`), on CUDA the compiled step replayed as one CUDA graph (`graph`), and (not in
/// `--quick`) `torch.compile` in default mode (`compile`, its inductor cache empty at its first
/// run) and on CUDA in reduce-overhead mode (`reduce-overhead`).
type Sides = Vec<(&'static str, Vec<Value>)>;

fn sides(o: &Opts, n: &StepCounts, dir: &Path) -> Result<(Sides, Value)> {
    let (program, script, exported) = export(o, dir)?;
    let precision = if o.device.is_cuda() { "bf16" } else { "fp32" };
    let common = |c: &mut Command| {
        c.args(["--model", "transformer", "--precision", precision])
            .args(["--dropout", "0", "--batch", "32"])
            .args(["--warmup", &n.warm, "--steps", &n.timed])
            .args(["--breakdown-steps", &n.split]);
    };
    let kiln_cache = dir.join("kiln-cache");
    let torch_cache = dir.join("inductor");
    std::fs::create_dir_all(torch_cache.join("tmp"))
        .map_err(|e| format!("{}: {e}", torch_cache.display()))?;
    let compiled = |graphs: bool| {
        let mut c = o.kiln("probe");
        common(&mut c);
        c.args(["--program", &program])
            .env("KILN_COMPILE_CACHE", &kiln_cache)
            .env("KILN_PYTHON", &o.python);
        if graphs {
            c.arg("--cuda-graphs");
        }
        c
    };
    let torch = |mode: Option<&str>| {
        let mut c = o.torch();
        common(&mut c);
        if let Some(mode) = mode {
            compile_env(&mut c, &torch_cache);
            c.args(["--compile-mode", mode]);
        }
        c
    };
    let scripted = || {
        let mut c = o.kiln("probe");
        common(&mut c);
        c.args(["--script", &script]);
        c
    };
    let (kiln, graph) = (|| compiled(false), || compiled(true));
    let (eager, default, overhead) = (
        || torch(None),
        || torch(Some("default")),
        || torch(Some("reduce-overhead")),
    );
    let mut named: Vec<(&'static str, &dyn Fn() -> Command)> = vec![
        ("kiln", &kiln),
        ("eager", &eager),
        ("torchscript", &scripted),
    ];
    if o.device.is_cuda() {
        named.push(("graph", &graph));
    }
    if !o.quick {
        named.push(("compile", &default));
        if o.device.is_cuda() {
            named.push(("reduce-overhead", &overhead));
        }
    }
    let cmds: Vec<&dyn Fn() -> Command> = named.iter().map(|(_, c)| *c).collect();
    let runs = o.interleaved(&cmds)?;
    if runs.iter().any(|s| s[0]["params"] != exported["params"]) {
        return Err(format!(
            "exported-program case: the sides trained different models ({} exported parameters)",
            exported["params"]
        ));
    }
    let sides = named.iter().map(|(name, _)| *name).zip(runs).collect();
    Ok((sides, exported))
}

/// The exported-program rows (step time against eager, `torch.compile` and kiln's TorchScript
/// path; on CUDA the step in one CUDA graph; compile time) and their runs.
pub fn program_case(o: &Opts, n: &StepCounts) -> Result<(Vec<Comparison>, Value)> {
    let dir = std::env::temp_dir().join(format!("kiln-bench-program-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = sides(o, n, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let (sides, _) = result?;
    let side = |name: &str| {
        sides
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, r)| r.as_slice())
    };
    let k = side("kiln").unwrap_or_default();
    let precision = k
        .first()
        .and_then(|r| r["precision"].as_str())
        .unwrap_or("?")
        .to_owned();
    let row = |ours: &[Value], what: &str, runs: &[Value], baseline: &str, goal: Option<f64>| {
        let c = Comparison::new(
            "train",
            "step time",
            format!("{PROGRAM_ROWS} {precision} {what} vs {baseline}"),
            "ms/step",
            Better::Lower,
            (
                median_of(ours, "step_s_median") * 1e3,
                median_of(runs, "step_s_median") * 1e3,
            ),
            format!("{baseline}, training the same Python module (fused AdamW)"),
        )
        .detail("batch_size", json!(32))
        .detail("dropout", json!(0.0))
        .detail(
            "breakdown",
            json!({"kiln": ours.last().map(|r| r["breakdown"].clone()),
                   "baseline": runs.last().map(|r| r["breakdown"].clone())}),
        );
        match goal {
            Some(g) => c.at_most(g),
            None => c,
        }
    };
    let step = "step";
    let mut rows = vec![];
    if let Some(eager) = side("eager") {
        rows.push(row(k, step, eager, "PyTorch eager", Some(0.95)));
    }
    if let Some(script) = side("torchscript") {
        rows.push(row(k, step, script, "kiln's TorchScript path", None));
    }
    if let Some(compiled) = side("compile") {
        rows.push(row(
            k,
            step,
            compiled,
            "torch.compile (default mode)",
            Some(1.0),
        ));
        rows.push(compile_row(k, compiled, &precision));
    }
    if let Some(graph) = side("graph") {
        let what = "step in one CUDA graph";
        if let Some(eager) = side("eager") {
            rows.push(row(graph, what, eager, "PyTorch eager", None));
        }
        if let Some(compiled) = side("compile") {
            rows.push(row(
                graph,
                what,
                compiled,
                "torch.compile (default mode)",
                Some(0.8),
            ));
        }
        if let Some(overhead) = side("reduce-overhead") {
            rows.push(row(
                graph,
                what,
                overhead,
                "torch.compile (reduce-overhead)",
                None,
            ));
        }
    }
    let run: serde_json::Map<String, Value> = sides
        .iter()
        .map(|(n, r)| ((*n).to_owned(), json!(r)))
        .collect();
    Ok((
        rows,
        json!({"case": "exported-program transformer", "sides": run}),
    ))
}

/// kiln's compile (its cache empty: the first run's load) beside `torch.compile`'s first step
/// (its inductor cache empty); the warm figures in the details.
fn compile_row(k: &[Value], compiled: &[Value], precision: &str) -> Comparison {
    let summary = compile_summary(compiled);
    let cold = k
        .first()
        .map_or(f64::NAN, |r| r["load_s"].as_f64().unwrap_or(f64::NAN));
    let warm: Vec<f64> = k[1..].iter().filter_map(|r| r["load_s"].as_f64()).collect();
    Comparison::new(
        "train",
        "compile time",
        format!("{PROGRAM_ROWS} {precision} compile vs torch.compile's first step"),
        "s",
        Better::Lower,
        (
            cold,
            summary["cold_first_step_s"]
                .as_f64()
                .unwrap_or_else(|| median_of(compiled, "first_step_s")),
        ),
        "torch.compile (default mode) first step, inductor's caches empty",
    )
    .detail(
        "kiln_cache_hit_load_s",
        json!((!warm.is_empty()).then(|| median(warm))),
    )
    .detail("compile", summary)
}
