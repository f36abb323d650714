//! The `train` suite: the GEMM peaks, every case of [`CASES`] kiln against PyTorch, the
//! your-own-model rows (TorchScript, exported program), and with `--batch-sizes` the
//! throughput and peak-memory sweep.

use kiln_benches::report::SuiteOutput;
use kiln_benches::{SuiteArgs, device_name, interleaved, num, run_json};
use serde_json::{Value, json};

use super::cases::{cases_for, planned_name, run_case};
use super::program::{PROGRAM_ROWS, SCRIPT_ROWS, program_case, script_case};
use super::{Opts, Result};

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
        let v = run_json(o.kiln("gemm", &["--precision", p]))?;
        eprintln!(
            "{p} GEMM peak through libtorch on {}: {:.0} GFLOP/s",
            device_name(o.device),
            num(&v["gemm_gflops"])
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
    let peak = num(&peaks[format!("{key}_gemm_gflops")]);
    (peak, format!("{key} GEMM"))
}

pub fn train_suite(a: &SuiteArgs) -> Result<()> {
    let o = Opts::new(a)?;
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
    let mut runs = vec![];
    for (i, case) in cases_for(o.device).iter().enumerate() {
        // The row's name (which resolves the configuration) only where a filter reads it.
        let filtered = a.filter.is_some() && !a.selects(&planned_name(&o, case)?);
        if (case.compile && o.quick) || filtered {
            continue;
        }
        runs.push(run_case(&o, &mut out, (i, case))?);
    }
    if o.quick {
        let why = "left out of --quick: compiling takes minutes";
        out.skip("torch.compile rows", why);
    }
    if a.selects(SCRIPT_ROWS) {
        runs.push(script_case(&o, &mut out)?);
    }
    if a.selects(PROGRAM_ROWS) {
        runs.push(program_case(&o, &mut out)?);
    }
    for &b in a.batch_sizes() {
        runs.push(sweep_rows(&o, &mut out, b)?);
    }
    let (warmup, steps, breakdown) = o.steps;
    out.details = json!({"repeats": o.repeats, "warmup_steps": warmup, "timed_steps": steps,
                         "breakdown_steps": breakdown, "runs": runs});
    out.write(&a.out_or("train"))
}

/// The batch-size sweep's two rows at batch size `b` (throughput and peak memory); returns
/// their runs.
fn sweep_rows(o: &Opts, out: &mut SuiteOutput, b: usize) -> Result<Value> {
    let precision = if o.device.is_cuda() { "bf16" } else { "fp32" };
    let args = o.step_args("transformer", precision, b, 0);
    let sides = interleaved(o.repeats, 2, |i| match i {
        0 => o.kiln("probe", &args),
        _ => o.torch(&args),
    })?;
    let (k, t) = (&sides[0], &sides[1]);
    let base = format!("PyTorch eager {precision}");
    out.push_sweep(&format!("transformer {precision}"), b, (k, t), &base);
    Ok(json!({"sweep_batch": b, "kiln": k, "torch": t}))
}
