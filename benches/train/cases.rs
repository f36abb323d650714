//! The train suite's cases (a kiln precision against PyTorch eager or `torch.compile`), how one
//! runs, and its rows (step time, machine limit, compile time).

use kiln_benches::report::{Better, Comparison, MS_STEP, SECONDS, SuiteOutput};
use kiln_benches::{Msg, compile_env, in_temp_dir, interleaved, median, median_of, num};
use kiln_benches::{cold_first, not_run, resolve_for};
use serde_json::{Value, json};

use super::{Opts, Result, at_most, peak_for, words};

/// One comparison of the train suite: kiln's precision against PyTorch's, and the goal.
pub struct Case {
    model: &'static str,
    kiln: &'static str,
    torch: &'static str,
    goal: Option<f64>,
    /// Extra words for both sides, and for the PyTorch side alone (a same-computation baseline).
    args: (&'static str, &'static str),
    /// What the row's name adds.
    label: &'static str,
    /// The PyTorch side is `torch.compile(model)` (default mode) rather than eager.
    pub compile: bool,
    /// Both sides train at the device profile's train batch size (512 on an H200), not 32.
    profile_batch: bool,
}

impl Case {
    /// kiln at precision `kiln` against PyTorch eager at `torch`, batch 32.
    const fn new(
        model: &'static str,
        kiln: &'static str,
        torch: &'static str,
        goal: Option<f64>,
    ) -> Self {
        Self {
            model,
            kiln,
            torch,
            goal,
            args: ("", ""),
            label: "",
            compile: false,
            profile_batch: false,
        }
    }

    const fn args(mut self, both: &'static str, torch: &'static str) -> Self {
        self.args = (both, torch);
        self
    }

    const fn label(self, label: &'static str) -> Self {
        Self { label, ..self }
    }

    const fn compiled(mut self) -> Self {
        self.compile = true;
        self
    }

    const fn at_profile_batch(mut self) -> Self {
        self.profile_batch = true;
        self
    }
}

/// PyTorch given kiln's attention choice (explicit matmul–softmax on the CPU in bf16, else SDPA).
const KILN_ATTENTION: &str = "--attention kiln";

/// kiln's automatic precision (bf16) against PyTorch bf16 as a user writes it: on both devices.
const AUTO_SDPA: Case =
    Case::new("transformer", "auto", "bf16", Some(1.0)).label(" (PyTorch default: SDPA)");
/// The convnet in channels-last: on both devices.
const CONVNET: Case = Case::new("convnet", "fp32", "fp32", None)
    .args("--channels-last", "")
    .label(" channels-last");

/// The CPU rows: PyTorch as a user writes it (SDPA, `nn.Dropout`), or where a row says "same
/// computation" or "dropout 0", PyTorch making kiln's choices, to show what each choice is worth.
pub const CASES: [Case; 11] = [
    Case::new("mlp", "fp32", "fp32", Some(0.7)),
    Case::new("transformer", "fp32", "fp32", Some(1.0)),
    Case::new("transformer", "fp32", "fp32", Some(1.0))
        .args("--dropout 0", "")
        .label(", dropout 0 on both sides"),
    AUTO_SDPA,
    Case::new("transformer", "auto", "bf16", Some(0.9))
        .args("", KILN_ATTENTION)
        .label(", same computation (PyTorch with kiln's attention choice)"),
    Case::new("transformer", "auto", "bf16", Some(0.9))
        .args("--dropout 0", KILN_ATTENTION)
        .label(", same computation, dropout 0 on both sides"),
    Case::new("transformer", "auto", "fp32", Some(0.5)),
    CONVNET,
    Case::new("transformer", "auto", "bf16", Some(1.0))
        .args("", KILN_ATTENTION)
        .label(", same computation (kiln's attention choice)")
        .compiled(),
    Case::new("transformer", "fp32", "fp32", Some(1.0))
        .label(" vs torch.compile fp32, same computation (SDPA, kiln's fp32 choice)")
        .compiled(),
    Case::new("transformer", "auto", "bf16", None)
        .label(" (PyTorch default: SDPA, nn.Dropout)")
        .compiled(),
];

/// The GPU rows' large transformer (GPT-2 medium's body, 303 M parameters): GEMMs big enough
/// for its MFU to say how close a step comes to the card's limit, not how long launches take.
pub const LARGE: &str = "--seq 512 --d-model 1024 --heads 16 --layers 24 --ff 4096";

/// The CUDA rows: bf16 transformers (reference, at the profile's batch, large) against PyTorch
/// as a user writes it, eager and `torch.compile`; the MLP and convnet as on the CPU.
pub const GPU_CASES: [Case; 8] = [
    Case::new("mlp", "fp32", "fp32", Some(1.0)),
    AUTO_SDPA,
    Case::new("transformer", "auto", "bf16", Some(1.0))
        .label(" at the profile's batch size")
        .at_profile_batch(),
    Case::new("transformer", "auto", "bf16", None)
        .label(" at the profile's batch size")
        .at_profile_batch()
        .compiled(),
    Case::new("transformer", "auto", "bf16", Some(1.0))
        .args(LARGE, "")
        .label(", large (303 M parameters, seq 512)"),
    Case::new("transformer", "auto", "bf16", None)
        .args(LARGE, "")
        .label(", large (303 M parameters, seq 512)")
        .compiled(),
    CONVNET,
    Case::new("transformer", "fp32", "fp32", None),
];

/// The cases of the train suite on `device`.
pub fn cases_for(device: tch::Device) -> &'static [Case] {
    if device.is_cuda() { &GPU_CASES } else { &CASES }
}

/// The batch size `case` runs at on the suite's device.
fn case_batch(o: &Opts, case: &Case) -> Result<usize> {
    if !case.profile_batch {
        return Ok(32);
    }
    usize::try_from(resolve_for(o.device)?.plan.train.batch_size).msg()
}

/// The row name `case` will have on the suite's device (kiln's `auto` as the profile chooses).
pub fn planned_name(o: &Opts, case: &Case) -> Result<String> {
    let auto = resolve_for(o.device)?.plan.train.amp;
    Ok(case_name(case, auto.as_str(), case_batch(o, case)?))
}

/// The row name of `case` (kiln's `auto` resolved to `kiln_precision`) at `batch`.
fn case_name(case: &Case, kiln_precision: &str, batch: usize) -> String {
    let (model, torch, label) = (case.model, case.torch, case.label);
    let who = ["PyTorch", "torch.compile"][usize::from(case.compile)];
    let name = match case.kiln {
        "auto" => format!("{model} auto ({kiln_precision}) step vs {who} {torch}{label}"),
        p => format!("{model} {p} step{label}"),
    };
    if case.profile_batch {
        name.replacen(" step", &format!(" b={batch} step"), 1)
    } else {
        name
    }
}

/// What the baseline of `case` runs, from its first run's JSON `t`.
fn baseline_name(case: &Case, t: &Value) -> String {
    let (who, eager) = if case.compile {
        ("torch.compile(model), default mode,", " eager")
    } else {
        ("PyTorch eager", "")
    };
    let fp32 = case.torch == "fp32";
    let autocast = if fp32 { "" } else { " autocast" };
    let attention = t["config"]["attention"].as_str().unwrap_or("-");
    let dropout = &t["config"]["dropout"];
    let torch = case.torch;
    format!(
        "{who} {torch}{autocast} (fused AdamW{eager}; attention: {attention}; dropout {dropout})"
    )
}

/// Runs one case, the sides alternating (`torch.compile` in its own inductor cache, cold at the
/// first run), and adds its rows (or why PyTorch could not run) to `out`; returns its runs.
pub fn run_case(o: &Opts, out: &mut SuiteOutput, (i, case): (usize, &Case)) -> Result<Value> {
    let batch = case_batch(o, case)?;
    let args = |precision, extra: &str| {
        let step = o.step_args(case.model, precision, batch, o.steps.2);
        [step, words(case.args.0), words(extra)].concat()
    };
    let (kiln_args, torch_args) = (args(case.kiln, ""), args(case.torch, case.args.1));
    let sides = in_temp_dir(&format!("inductor-{i}"), |cache| {
        interleaved(o.repeats, 2, |i| match i {
            0 => o.kiln("probe", &kiln_args),
            _ => {
                let mut c = o.torch(&torch_args);
                if case.compile {
                    compile_env(&mut c, cache);
                }
                c
            }
        })
    })?;
    let (k, t) = (&sides[0], &sides[1]);
    let name = case_name(case, k[0]["precision"].as_str().unwrap_or("?"), batch);
    let run = json!({"case": name, "kiln": k, "torch": t});
    if let Some(reason) = not_run(t) {
        out.skip(&name, &format!("not run: {reason}"));
        return Ok(run);
    }
    if k[0]["params"] != t[0]["params"] {
        return Err(format!(
            "{}: the two sides built different models ({} vs {} parameters)",
            case.model, k[0]["params"], t[0]["params"]
        ));
    }
    case_rows(case, &name, (k, t), out);
    Ok(run)
}

/// The kiln and baseline breakdowns of the last runs.
pub(crate) fn breakdowns(k: &[Value], t: &[Value]) -> Value {
    json!({"kiln": k.last().map(|r| r["breakdown"].clone()),
           "baseline": t.last().map(|r| r["breakdown"].clone())})
}

/// Adds a case's rows: step time; for kiln's fp32 transformer against eager, the GEMM peak;
/// against `torch.compile`, the time to the first step.
fn case_rows(case: &Case, name: &str, (k, t): (&[Value], &[Value]), out: &mut SuiteOutput) {
    let (ks, ts) = (median_of(k, "step_s_median"), median_of(t, "step_s_median"));
    let kiln_precision = k[0]["precision"].as_str().unwrap_or("?");
    let (flops, batch) = (num(&k[0]["flops_per_step"]), num(&k[0]["batch"]));
    let (peak, peak_name) = peak_for(&out.peaks, kiln_precision, k[0]["tf32"] == true);
    let (torch_peak, _) = peak_for(&out.peaks, case.torch, false);
    let base = baseline_name(case, &t[0]);
    let mut step = out.row("step time", name, MS_STEP, (ks * 1e3, ts * 1e3), base);
    step.details = json!({
        "mfu": flops / ks / 1e9 / peak, "baseline_mfu": flops / ts / 1e9 / torch_peak,
        "peak": peak_name, "kiln_precision": kiln_precision, "batch_size": k[0]["batch"],
        "params": k[0]["params"], "samples_per_s": batch / ks,
        "baseline_samples_per_s": batch / ts, "breakdown": breakdowns(k, t),
    });
    if case.compile {
        step.details["compile"] = compile_summary(t);
    }
    out.push(at_most(step, case.goal));
    if case.compile {
        out.push(compile_time_row(case, name, (k, t)));
    } else if case.model == "transformer" && case.kiln == "fp32" && case.args.0.is_empty() {
        // kiln's fp32 transformer step against this machine's GEMM peak.
        let name = format!("{name}: achieved vs {peak_name} peak");
        let (figures, unit) = ((flops / ks / 1e9, peak), ("GFLOP/s", Better::Higher));
        let base = format!("measured {peak_name} peak");
        let limit = out
            .row("machine limit", name, unit, figures, base)
            .at_least(0.7);
        let limit = limit.detail("baseline_achieved_gflops", json!(flops / ts / 1e9));
        out.push(limit.detail("breakdown", breakdowns(k, t)));
    }
}

/// The compile figures of `torch.compile` runs: the cold runs' and the warm ones' medians.
pub(crate) fn compile_summary(t: &[Value]) -> Value {
    let (cold, warm): (Vec<&Value>, Vec<&Value>) = t
        .iter()
        .partition(|r| r["compile"]["inductor_cache"] == "cold");
    let pick = |runs: &[&Value], key: &str| median_or_null(runs.iter().map(|r| &r["compile"][key]));
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

/// The median of the numbers among `values`, or null where there are none.
pub(crate) fn median_or_null<'a>(values: impl Iterator<Item = &'a Value>) -> Value {
    let v: Vec<f64> = values.filter_map(Value::as_f64).collect();
    json!((!v.is_empty()).then(|| median(v)))
}

/// The compile-time row's name, from its step row's.
fn compile_time_name(step_row: &str) -> String {
    step_row.replacen(" step", " first step (compile time)", 1)
}

/// Time to the first step: kiln's against `torch.compile`'s (compiling), its cache cold if any.
fn compile_time_row(case: &Case, name: &str, (k, t): (&[Value], &[Value])) -> Comparison {
    let (first, caches) = cold_first(t, "first_step_s");
    let figures = (median_of(k, "first_step_s"), first);
    let base = format!("torch.compile {} first step, {caches}", case.torch);
    let name = compile_time_name(name);
    Comparison::new("train", "compile time", name, SECONDS, figures, base)
        .detail("compile", compile_summary(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_names_are_unique_and_name_their_baseline() {
        for cases in [&CASES[..], &GPU_CASES[..]] {
            let names: Vec<String> = cases.iter().map(|c| case_name(c, "bf16", 512)).collect();
            for (i, name) in names.iter().enumerate() {
                assert!(!names[..i].contains(name), "`{name}` names two rows");
            }
            for (case, name) in cases.iter().zip(&names) {
                assert_eq!(case.profile_batch, name.contains(" b=512 "), "{name}");
                assert_eq!(case.compile, name.contains("vs torch.compile"), "{name}");
                if case.compile {
                    let first = compile_time_name(name);
                    let expected = " first step (compile time) vs torch.compile ";
                    assert!(first.contains(expected), "{first}");
                }
            }
        }
    }
}
