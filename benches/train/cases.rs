//! The train suite's rows: each [`Case`] (a kiln precision against a PyTorch eager or
//! `torch.compile` baseline), how one runs, and the rows it gives (step time, machine limit,
//! compile time); and the user's-own-model rows (a TorchScript twin).

use std::process::Command;

use kiln_benches::report::{Better, Comparison};
use kiln_benches::{median, median_of, run_json};
use serde_json::{Value, json};

use super::suite::peak_for;
use super::{Opts, Result, f};

/// One comparison of the train suite: kiln's precision against PyTorch's, and the goal.
pub struct Case {
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
    pub compile: bool,
    /// The batch both sides train on.
    batch: CaseBatch,
}

/// A case's batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseBatch {
    Fixed(usize),
    /// The train batch size of the device's hardware profile (512 on an H200).
    Profile,
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
            batch: CaseBatch::Fixed(32),
        }
    }

    /// The same row against `torch.compile`.
    const fn compiled(self) -> Self {
        Self {
            compile: true,
            ..self
        }
    }

    /// The same row at another batch size.
    const fn at_batch(self, batch: CaseBatch) -> Self {
        Self { batch, ..self }
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
pub const CASES: [Case; 11] = [
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

/// The large transformer of the GPU rows: d_model 1024, 16 heads, 24 layers, ff 4096 (GPT-2
/// medium's body, 303 M parameters) over sequences of 512. Its GEMMs (M = 16 384 tokens at
/// batch 32, K and N 1024 to 4096) are big enough to keep a GPU's tensor cores busy, so its
/// model FLOP utilization says how close a step comes to the card's limit; the reference
/// transformer's (3.4 M parameters) mostly says how long kernel launches take.
pub const LARGE: &[&str] = &[
    "--seq",
    "512",
    "--d-model",
    "1024",
    "--heads",
    "16",
    "--layers",
    "24",
    "--ff",
    "4096",
];

/// The train rows on a CUDA GPU, all at bf16 (kiln's choice there) against PyTorch as a user
/// writes it (SDPA, `nn.Dropout` 0.1): the reference transformer at batch 32 and at the
/// hardware profile's batch size, and the large transformer; each against eager and
/// `torch.compile` (default mode). The MLP and the convnet keep their CPU rows' shapes.
pub const GPU_CASES: [Case; 8] = [
    Case::eager("mlp", ("fp32", "fp32"), Some(1.0), (&[], &[]), ""),
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
        Some(1.0),
        (&[], &[]),
        " at the profile's batch size",
    )
    .at_batch(CaseBatch::Profile),
    Case::eager(
        "transformer",
        ("auto", "bf16"),
        None,
        (&[], &[]),
        " at the profile's batch size",
    )
    .at_batch(CaseBatch::Profile)
    .compiled(),
    Case::eager(
        "transformer",
        ("auto", "bf16"),
        Some(1.0),
        (LARGE, &[]),
        ", large (303 M parameters, seq 512)",
    ),
    Case::eager(
        "transformer",
        ("auto", "bf16"),
        None,
        (LARGE, &[]),
        ", large (303 M parameters, seq 512)",
    )
    .compiled(),
    Case::eager(
        "convnet",
        ("fp32", "fp32"),
        None,
        (&["--channels-last"], &[]),
        " channels-last",
    ),
    Case::eager("transformer", ("fp32", "fp32"), None, (&[], &[]), ""),
];

/// The cases of the train suite on `device`.
pub fn cases_for(device: tch::Device) -> &'static [Case] {
    if device.is_cuda() { &GPU_CASES } else { &CASES }
}

/// What the user's-own-model rows' names begin with.
pub const SCRIPT_ROWS: &str = "your own model (transformer as TorchScript)";

/// The user's-own-model rows: kiln training the reference transformer's TorchScript twin
/// (scripted by `train_step.py --export-script` from the same Python module, dropout 0, same
/// seed and so the same initial weights) against PyTorch eager training that module, as a user
/// writes it (goal: at most 1.05× its step), and against PyTorch training the same TorchScript
/// file, as by default and with the graph optimization off that kiln turns off on the CPU;
/// fp32, batch 32.
pub fn script_case(
    o: &Opts,
    warm: &str,
    timed: &str,
    split: &str,
) -> Result<(Vec<Comparison>, Value)> {
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
            format!("{SCRIPT_ROWS} fp32 step vs {baseline}"),
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
pub struct StepCounts {
    pub warm: String,
    pub timed: String,
    pub split: String,
}

/// What one case gave: its rows, or why its PyTorch side could not run here; and its runs.
pub struct Outcome {
    pub name: String,
    pub rows: Vec<Comparison>,
    pub not_run: Option<String>,
    pub run: Value,
}

/// The batch size `case` runs at on the suite's device.
fn case_batch(o: &Opts, case: &Case) -> Result<usize> {
    match case.batch {
        CaseBatch::Fixed(b) => Ok(b),
        CaseBatch::Profile => usize::try_from(super::resolved(o.device)?.plan.train.batch_size)
            .map_err(|e| e.to_string()),
    }
}

/// The row name `case` will have on the suite's device (kiln's `auto` as the profile chooses).
pub fn planned_name(o: &Opts, case: &Case) -> Result<String> {
    let auto = super::resolved(o.device)?.plan.train.amp;
    let precision = auto.as_str();
    Ok(case_name(case, precision, case_batch(o, case)?))
}

/// The row name of `case` (kiln's `auto` resolved to `kiln_precision`) at `batch`.
fn case_name(case: &Case, kiln_precision: &str, batch: usize) -> String {
    let name = case_name_of(case, kiln_precision);
    match case.batch {
        CaseBatch::Fixed(32) => name,
        _ => name.replacen(" step", &format!(" b={batch} step"), 1),
    }
}

fn case_name_of(case: &Case, kiln_precision: &str) -> String {
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
pub(crate) fn compile_env(c: &mut Command, cache: &std::path::Path) {
    c.arg("--compile")
        .env("TORCHINDUCTOR_CACHE_DIR", cache.join("inductor"))
        .env("TMPDIR", cache.join("tmp"));
}

/// Runs one case, kiln and PyTorch alternating; a `torch.compile` case in its own inductor
/// cache, empty at its first run (a cold compile) and reused by the later ones (warm).
pub fn run_case(
    o: &Opts,
    (i, case): (usize, &Case),
    n: &StepCounts,
    peaks: &Value,
) -> Result<Outcome> {
    let batch = case_batch(o, case)?;
    let batch_text = batch.to_string();
    let common = |c: &mut Command, precision: &str| {
        c.args(["--model", case.model, "--precision", precision])
            .args([
                "--batch",
                &batch_text,
                "--warmup",
                &n.warm,
                "--steps",
                &n.timed,
            ])
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
    let name = case_name(case, &kiln_precision, batch);
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
    let mut rows = vec![step_row(case, &name, (k, t), peaks, batch)];
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
fn step_row(
    case: &Case,
    name: &str,
    (k, t): (&[Value], &[Value]),
    peaks: &Value,
    batch: usize,
) -> Comparison {
    let samples = batch as f64;
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
    .detail("batch_size", json!(batch))
    .detail("params", k[0]["params"].clone())
    .detail("samples_per_s", json!(samples / ks))
    .detail("baseline_samples_per_s", json!(samples / ts))
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
pub(crate) fn compile_summary(t: &[Value]) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_names_are_unique_and_name_their_baseline() {
        for cases in [&CASES[..], &GPU_CASES[..]] {
            names_are_unique_and_name_their_baseline(cases);
        }
    }

    fn names_are_unique_and_name_their_baseline(cases: &[Case]) {
        let names: Vec<String> = cases.iter().map(|c| case_name(c, "bf16", 512)).collect();
        for (i, name) in names.iter().enumerate() {
            assert!(!names[..i].contains(name), "`{name}` names two rows");
        }
        for (case, name) in cases.iter().zip(&names) {
            assert_eq!(
                case.batch == CaseBatch::Profile,
                name.contains(" b=512 "),
                "{name}"
            );
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
