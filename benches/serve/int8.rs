//! The infer suite's int8 rows: on the Linear-heavy reference models (the MLP and the
//! transformer), trained briefly by `kiln train` on kiln's synthetic data, the int8 ONNX file
//! `kiln export --quantize int8` writes (checked on held-out data before it is written) against
//! the fp32 ONNX export of the same checkpoint, both run by `kiln infer` in ONNX Runtime on the
//! same held-out samples: throughput at batch 64, latency at batch 1, and both accuracies.

use std::sync::Arc;

use super::infer::InferOpts;
use super::*;
use kiln_benches::or_skip;
use kiln_benches::report::{PERCENT, SAMPLES_S};
use kiln_benches::run_cli::{kiln_exe, kiln_train, read_summary, run};
use kiln_data::{Dataset, Subset};

/// The models of the rows, with the samples kiln trains on and the epochs.
const MODELS: [ModelKind; 2] = [ModelKind::Mlp, ModelKind::Transformer];
/// The held-out samples both files run on: more for the MLP, whose batches take microseconds.
fn held_out(kind: ModelKind) -> usize {
    if kind == ModelKind::Mlp { 8192 } else { 1024 }
}
const SEED: u64 = 7;

/// One model's files and data.
struct Files {
    fp32: PathBuf,
    int8: PathBuf,
    /// The held-out samples, prepared (`kiln infer` reports accuracy on them).
    held_out: PathBuf,
}

/// Pushes the rows (or says why they were not run); returns the runs for the details.
pub(super) fn int8_rows(o: &InferOpts, out: &mut SuiteOutput, work: &Path) -> Result<Vec<Value>> {
    let Some(kiln) = or_skip(out, "int8 rows", kiln_exe("infer")) else {
        return Ok(vec![]);
    };
    let mut details = vec![];
    for kind in MODELS {
        let dir = work.join(format!("int8-{kind}"));
        std::fs::create_dir_all(&dir).at(&dir)?;
        let name = format!("{kind} int8 rows");
        if let Some(files) = or_skip(out, &name, prepare(&kiln, o, kind, &dir)) {
            details.push(measure(&kiln, o, kind, &files, out)?);
        }
    }
    Ok(details)
}

/// Trains `kind` on kiln's synthetic data, then exports its checkpoint as fp32 ONNX and as int8
/// ONNX (checked by kiln on the held-out samples).
fn prepare(kiln: &Path, o: &InferOpts, kind: ModelKind, dir: &Path) -> Result<Files> {
    let train_samples = match (kind, o.quick) {
        (ModelKind::Transformer, true) => 512,
        (ModelKind::Transformer, false) => 4096,
        (_, true) => 2048,
        (_, false) => 8192,
    };
    let held = held_out(kind);
    let data = kiln_train::models::synthetic_dataset(kind, train_samples + held, SEED).msg()?;
    let data = Arc::new(data);
    let part = |from: usize, to: usize| Subset::new(Arc::clone(&data), (from..to).collect());
    let write = |name: &str, part: &dyn Dataset| -> Result<PathBuf> {
        let sub = dir.join(name);
        std::fs::create_dir_all(&sub).at(&sub)?;
        kiln_benches::datasets::write_prepared(&sub, "prepared", part, None, false)?;
        Ok(sub.join("prepared"))
    };
    let train = write("train", &part(0, train_samples).msg()?)?;
    let held_out = write(
        "held-out",
        &part(train_samples, train_samples + held).msg()?,
    )?;
    let runs = dir.join("runs");
    let epochs = if o.quick { "1" } else { "3" };
    let sets = [
        format!("model.name={kind}"),
        format!("train.epochs={epochs}"),
        "train.amp=fp32".to_owned(),
        format!("performance.intra_op_threads={}", o.threads),
        format!("run.output_dir={}", runs.display()),
    ];
    run(kiln_train("infer", &train, &sets)?)?;
    let (run_dir, _) = read_summary(&runs)?;
    let (fp32, int8) = (dir.join("fp32.onnx"), dir.join("int8.onnx"));
    for (file, int8_args) in [(&fp32, None), (&int8, Some(&held_out))] {
        let mut cmd = Command::new(kiln);
        cmd.args(["export", "--model"]).arg(&run_dir);
        cmd.arg("--out").arg(file);
        if let Some(check) = int8_args {
            cmd.args(["--quantize", "int8", "--check-data"]).arg(check);
        }
        run(cmd)?;
    }
    Ok(Files {
        fp32,
        int8,
        held_out,
    })
}

/// Times both files at batches 64 and 1, alternating, and pushes the rows.
fn measure(
    kiln: &Path,
    o: &InferOpts,
    kind: ModelKind,
    files: &Files,
    out: &mut SuiteOutput,
) -> Result<Value> {
    // The file itself, not the checkpoint it records (which `auto` may pick).
    let infer = |file: &Path, batch: usize| {
        let sets = [
            "infer.engine=onnxruntime".to_owned(),
            format!("infer.batch_size={batch}"),
            format!("performance.intra_op_threads={}", o.threads),
        ];
        kiln_infer(kiln, (file, &files.held_out), &[], &sets)
    };
    let bytes = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let sizes = json!({"fp32": bytes(&files.fp32), "int8": bytes(&files.int8)});
    let mut details = json!({"model": kind.to_string(), "bytes": sizes});
    for (batch, key, what) in [
        (64, "samples_per_second", "throughput"),
        (1, "p50", "latency"),
    ] {
        let runs = alternating(o.repeats, &[true, false], |_, int8| {
            let file = if int8 { &files.int8 } else { &files.fp32 };
            let report = infer(file, batch)?;
            match report["engine"].as_str() {
                Some(engine) if engine.starts_with("onnxruntime") => Ok(Some(report)),
                _ => Err(format!(
                    "kiln infer ran {} in {}",
                    file.display(),
                    report["engine"]
                )),
            }
        })?;
        let figure = |r: &[Value]| match key {
            "p50" => median(
                r.iter()
                    .map(|v| num(&v["batch_latency_ms"]["p50"]))
                    .collect(),
            ),
            _ => median_of(r, key),
        };
        let unit = if batch == 1 { MS } else { SAMPLES_S };
        let name = format!("{kind} int8 b={batch} {what}, onnxruntime");
        let baseline = "the same checkpoint's fp32 ONNX export in ONNX Runtime";
        let figures = (figure(&runs[0]), figure(&runs[1]));
        let row = out.row("int8", name, unit, figures, baseline);
        out.push(row.detail("bytes", sizes.clone()));
        if batch == 64 {
            let accuracy = |r: &[Value]| 100.0 * median_of(r, "accuracy");
            let name = format!("{kind} int8 held-out accuracy ({} samples)", held_out(kind));
            let figures = (accuracy(&runs[0]), accuracy(&runs[1]));
            let baseline = "the fp32 ONNX export (kiln refuses int8 below fp32 − 1 point)";
            out.push(out.row("int8", name, PERCENT, figures, baseline));
        }
        details[what] = json!({"int8": runs[0], "fp32": runs[1]});
    }
    Ok(details)
}
