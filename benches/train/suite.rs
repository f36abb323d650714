//! The `train` suite: the GEMM peaks, every case of [`CASES`] kiln against PyTorch, the
//! TorchScript rows, and with `--batch-sizes` the throughput and peak-memory sweep.

use kiln_benches::report::{Better, Comparison, SWEEP_GROUP, SuiteOutput};
use kiln_benches::{SuiteArgs, device_name, median_of, run_json};
use serde_json::{Value, json};

use super::cases::{SCRIPT_ROWS, StepCounts, cases_for, planned_name, run_case, script_case};
use super::program::{PROGRAM_ROWS, program_case};
use super::{Opts, Result, f};

/// The GEMM peaks the train-step results are measured against: fp32 and bf16 on the CPU;
/// fp32, TF32, bf16 and fp16 on a GPU.
pub fn peaks(o: &Opts) -> Result<Value> {
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
pub fn peak_for(peaks: &Value, precision: &str, tf32: bool) -> (f64, String) {
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

pub fn train_suite(a: &SuiteArgs) -> Result<()> {
    let o = Opts::new(a)?;
    let (warmup, steps, breakdown) = if o.quick { (2, 5, 3) } else { (5, 20, 10) };
    let mut out = SuiteOutput::new(
        "train",
        &format!(
            "train step (forward, cross-entropy, backward, fused AdamW, loss read) on one fixed \
             batch (32 unless the row says) on {}, {} threads: kiln against PyTorch eager and \
             torch.compile; MFU against this machine's measured GEMM peak",
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
    for (i, case) in cases_for(o.device).iter().enumerate() {
        // The row's name (which resolves the configuration) only where a filter reads it.
        let filtered = a.filter.is_some() && !a.selects(&planned_name(&o, case)?);
        if (case.compile && o.quick) || filtered {
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
    if a.selects(SCRIPT_ROWS) {
        let (comparisons, run) = script_case(&o, warm, timed, split)?;
        for c in comparisons {
            out.push(c);
        }
        runs.push(run);
    }
    if a.selects(PROGRAM_ROWS) {
        let (comparisons, run) = program_case(&o, &n)?;
        for c in comparisons {
            out.push(c);
        }
        runs.push(run);
    }
    for &b in a.batch_sizes() {
        runs.push(sweep_rows(&o, &mut out, b, &n)?);
    }
    out.details = json!({"repeats": o.repeats, "warmup_steps": warmup, "timed_steps": steps,
                         "breakdown_steps": breakdown, "runs": runs});
    out.write(&a.out_or("train"))
}

/// The batch-size sweep's two rows at batch size `b` (throughput and peak memory); returns
/// their runs.
fn sweep_rows(o: &Opts, out: &mut SuiteOutput, b: usize, n: &StepCounts) -> Result<Value> {
    let (warm, timed) = (&n.warm, &n.timed);
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
    Ok(json!({"sweep_batch": b, "kiln": k, "torch": t}))
}
