//! The infer suite's int8 rows: `kiln export --quantize int8` of a briefly trained MLP and
//! transformer against their fp32 ONNX export, both in ONNX Runtime on the same held-out samples.

use std::sync::Arc;

use super::infer::InferOpts;
use super::*;
use kiln_benches::or_skip;
use kiln_benches::report::{PERCENT, SAMPLES_S};
use kiln_benches::run_cli::{kiln_exe, kiln_train, read_summary, run};
use kiln_data::{Dataset, Subset};

/// The held-out samples both files run on: more for the MLP, whose batches take microseconds.
fn held_out(kind: ModelKind) -> usize {
    if kind == ModelKind::Mlp { 8192 } else { 1024 }
}

/// One model's files: fp32 ONNX, int8 ONNX and the held-out samples, prepared.
type Files = (PathBuf, PathBuf, PathBuf);

/// Pushes the rows (or says why they were not run); returns the runs for the details.
pub(super) fn rows(o: &InferOpts, out: &mut SuiteOutput, work: &Path) -> Result<Vec<Value>> {
    let Some(kiln) = or_skip(out, "int8 rows", kiln_exe("infer")) else {
        return Ok(vec![]);
    };
    let mut details = vec![];
    for kind in [ModelKind::Mlp, ModelKind::Transformer] {
        let dir = work.join(format!("int8-{kind}"));
        std::fs::create_dir_all(&dir).at(&dir)?;
        let (name, files) = (format!("{kind} int8 rows"), prepare(&kiln, o, kind, &dir));
        if let Some(files) = or_skip(out, &name, files) {
            details.push(measure(&kiln, o, kind, &files, out)?);
        }
    }
    Ok(details)
}

/// Trains `kind` on synthetic data and exports it as fp32 and as int8 (checked) ONNX.
fn prepare(kiln: &Path, o: &InferOpts, kind: ModelKind, dir: &Path) -> Result<Files> {
    let train_samples = match (kind, o.quick) {
        (ModelKind::Transformer, true) => 512,
        (ModelKind::Transformer, false) => 4096,
        (_, true) => 2048,
        (_, false) => 8192,
    };
    let all = train_samples + held_out(kind);
    let data = Arc::new(kiln_train::models::synthetic_dataset(kind, all, 7).msg()?);
    let write = |name: &str, from: usize, to: usize| -> Result<PathBuf> {
        let part = Subset::new(Arc::clone(&data), (from..to).collect());
        let sub = dir.join(name);
        std::fs::create_dir_all(&sub).at(&sub)?;
        let part: &dyn Dataset = &part.msg()?;
        kiln_benches::datasets::write_prepared(&sub, "prepared", part, None, false)?;
        Ok(sub.join("prepared"))
    };
    let train = write("train", 0, train_samples)?;
    let held_out = write("held-out", train_samples, all)?;
    let runs = dir.join("runs");
    let sets = [
        format!("model.name={kind}"),
        format!("train.epochs={}", if o.quick { 1 } else { 3 }),
        "train.amp=fp32".to_owned(),
        format!("performance.intra_op_threads={}", o.threads),
        format!("run.output_dir={}", runs.display()),
    ];
    run(kiln_train("infer", &train, &sets)?)?;
    let (run_dir, _) = read_summary(&runs)?;
    let (fp32, int8) = (dir.join("fp32.onnx"), dir.join("int8.onnx"));
    for (file, int8_args) in [(&fp32, None), (&int8, Some(&held_out))] {
        let mut cmd = command(kiln, &["export", "--model"]);
        cmd.arg(&run_dir).arg("--out").arg(file);
        if let Some(check) = int8_args {
            cmd.args(["--quantize", "int8", "--check-data"]).arg(check);
        }
        run(cmd)?;
    }
    Ok((fp32, int8, held_out))
}

/// Times both files at batches 64 and 1, alternating, and pushes the rows.
fn measure(
    kiln: &Path,
    o: &InferOpts,
    kind: ModelKind,
    (fp32, int8, held): &Files,
    out: &mut SuiteOutput,
) -> Result<Value> {
    let bytes = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let sizes = json!({"fp32": bytes(fp32), "int8": bytes(int8)});
    let mut details = json!({"model": kind.to_string(), "bytes": sizes});
    for (batch, what) in [(64, "throughput"), (1, "latency")] {
        let runs = alternating(o.repeats, &[int8, fp32], |_, file| {
            // The file itself, not the checkpoint it records (which `auto` may pick).
            let batch_size = format!("infer.batch_size={batch}");
            let sets = ["infer.engine=onnxruntime".to_owned(), batch_size];
            let report = kiln_infer(kiln, (file, held), &[], &sets, &o.threads)?;
            let (path, engine) = (file.display(), &report["engine"]);
            match engine.as_str() {
                Some(e) if e.starts_with("onnxruntime") => Ok(Some(report)),
                _ => Err(format!("kiln infer ran {path} in {engine}")),
            }
        })?;
        let (figure, unit): (fn(&Value) -> f64, _) = match batch {
            1 => (|v| num(&v["batch_latency_ms"]["p50"]), MS),
            _ => (|v| num(&v["samples_per_second"]), SAMPLES_S),
        };
        let medians = |r: &[Value]| median(r.iter().map(figure).collect());
        let name = format!("{kind} int8 b={batch} {what}, onnxruntime");
        let baseline = "the same checkpoint's fp32 ONNX export in ONNX Runtime";
        let figures = (medians(&runs[0]), medians(&runs[1]));
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
