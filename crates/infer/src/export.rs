//! `kiln export`: a model written as a TorchScript file that takes any batch size (a kiln
//! checkpoint's model traced, a TorchScript module saved in eval mode), or as ONNX (that
//! TorchScript file through PyTorch's exporter, in the provisioned Python), checked against
//! kiln's own output at two batch sizes (ONNX in ONNX Runtime) before it is published; and an
//! exported program's run as the program with its trained weights (`.pt2`, read back and
//! compared tensor by tensor). An existing file is never overwritten.

use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};

use crate::{InferError, LoadedModel};

/// The largest |Δ| between kiln's fp32 output and the exported model's that passes.
pub const TOLERANCE: f64 = 1e-4;

/// The batch a kiln model is traced at (neither of the batches it is checked at).
const TRACE_BATCH: i64 = 2;
/// The batch sizes the written file is checked at.
const CHECK_BATCHES: [i64; 2] = [3, 1];

/// The ONNX opset exports use (supported by every onnxruntime kiln runs, 1.31 included).
pub const OPSET: u32 = 17;

/// What an export wrote and how it was checked.
#[derive(Debug, Clone)]
pub struct Exported {
    pub path: PathBuf,
    /// "TorchScript", or "ONNX opset 17".
    pub format: String,
    /// What checked it ("libtorch", "onnxruntime 1.31.1 (CPU build)").
    pub checked_in: String,
    pub bytes: u64,
    pub sample_shape: Vec<usize>,
    /// The largest |Δ| against kiln's output over the checked batches.
    pub max_abs: f64,
    pub samples_checked: i64,
}

/// Refuses an `out` that exists or whose directory does not.
pub fn check_target(out: &Path) -> Result<(), InferError> {
    if out.exists() {
        return Err(InferError::file(
            out,
            "exists already; kiln never overwrites an export (choose another --out, or delete it)",
        ));
    }
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(InferError::file(out, "its directory does not exist"));
    }
    Ok(())
}

/// Writes `model` (fp32, on the CPU) to `out` as TorchScript, checks the file against the
/// model on random batches of `sample_shape`, and publishes it only if they agree within
/// [`TOLERANCE`].
pub fn to_torchscript(
    model: &LoadedModel,
    sample_shape: &[usize],
    out: &Path,
) -> Result<Exported, InferError> {
    check_exportable(model, out)?;
    let staging = staging_path(out);
    let result = write_and_check(model, sample_shape, &staging)
        .and_then(|checked| publish(&staging, out).map(|bytes| (checked, bytes)));
    let _ = std::fs::remove_file(&staging);
    let ((max_abs, samples_checked), bytes) = result?;
    Ok(Exported {
        path: out.to_owned(),
        format: "TorchScript".to_owned(),
        checked_in: "libtorch".to_owned(),
        bytes,
        sample_shape: sample_shape.to_vec(),
        max_abs,
        samples_checked,
    })
}

/// Refuses an `out` that cannot be written ([`check_target`]) and a model not in fp32 on the
/// CPU.
fn check_exportable(model: &LoadedModel, out: &Path) -> Result<(), InferError> {
    check_target(out)?;
    if model.is_program() {
        return Err(InferError::Model {
            model: model.description().to_owned(),
            message: "an exported program is written as a program (--format program, from \
                      its run or checkpoint, with the trained weights), not as TorchScript or \
                      ONNX"
                .to_owned(),
        });
    }
    if model.kind() != Kind::Float || model.device() != Device::Cpu {
        return Err(InferError::Model {
            model: model.description().to_owned(),
            message: "export takes the model in fp32 on the CPU".to_owned(),
        });
    }
    Ok(())
}

/// `<out>.partial-<pid>` beside `out`.
pub(crate) fn staging_path(out: &Path) -> PathBuf {
    staging_with(out, "")
}

/// `<out>.partial-<pid><suffix>` beside `out`.
fn staging_with(out: &Path, suffix: &str) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".partial-{}{suffix}", std::process::id()));
    out.with_file_name(name)
}

fn batch(n: i64, sample_shape: &[usize]) -> Result<Tensor, InferError> {
    let mut shape = vec![n];
    shape.extend(sample_shape.iter().map(|&d| d as i64));
    Ok(Tensor::f_randn(&shape, (Kind::Float, Device::Cpu))?)
}

/// Writes the file and returns the largest |Δ| and the samples compared.
fn write_and_check(
    model: &LoadedModel,
    sample_shape: &[usize],
    staging: &Path,
) -> Result<(f64, i64), InferError> {
    model.save_torchscript(staging, &batch(TRACE_BATCH, sample_shape)?)?;
    let mut written = tch::CModule::load(staging)
        .map_err(|e| InferError::file(staging, format!("the written file does not load: {e}")))?;
    written.f_set_eval()?;
    let _guard = tch::no_grad_guard();
    let mut max_abs = 0.0_f64;
    for n in CHECK_BATCHES {
        let x = batch(n, sample_shape)?;
        let ours = model.forward(&x)?;
        let theirs = written.forward_ts(&[&x])?;
        if theirs.size() != ours.size() {
            return Err(mismatch(
                model,
                format!(
                    "at batch {n} the exported model gives shape {:?}, kiln {:?} (the trace kept a \
                 size it should not have)",
                    theirs.size(),
                    ours.size()
                ),
            ));
        }
        let gap = theirs.f_sub(&ours)?.f_abs()?.f_max()?.f_double_value(&[])?;
        max_abs = max_abs.max(gap);
    }
    if max_abs.is_nan() || max_abs > TOLERANCE {
        return Err(mismatch(
            model,
            format!(
                "the exported model's outputs differ from kiln's by up to {max_abs:.3e} (more than \
             {TOLERANCE:e})"
            ),
        ));
    }
    Ok((max_abs, CHECK_BATCHES.iter().sum()))
}

fn mismatch(model: &LoadedModel, message: String) -> InferError {
    InferError::Model {
        model: model.description().to_owned(),
        message: format!("export check failed: {message}; nothing was written"),
    }
}

/// Moves `staging` to `out` without ever replacing a file (a hard link fails if `out`
/// appeared meanwhile); returns its size.
pub(crate) fn publish(staging: &Path, out: &Path) -> Result<u64, InferError> {
    std::fs::hard_link(staging, out).map_err(|e| {
        InferError::file(
            out,
            format!("cannot write it ({e}); nothing was overwritten"),
        )
    })?;
    Ok(std::fs::metadata(out).map(|m| m.len()).unwrap_or(0))
}

/// Writes `model` (fp32, on the CPU) to `out` as ONNX: traced to TorchScript, exported by
/// PyTorch in the provisioned Python (`meta` goes into the model's metadata), then run in ONNX
/// Runtime on random batches of `sample_shape` and published only if it agrees with the model
/// within [`TOLERANCE`] and its batch dimension is dynamic.
pub fn to_onnx(
    model: &LoadedModel,
    sample_shape: &[usize],
    out: &Path,
    meta: &[(String, String)],
) -> Result<Exported, InferError> {
    check_exportable(model, out)?;
    let script = staging_with(out, ".pt");
    let staging = staging_path(out);
    let result = (|| -> Result<_, InferError> {
        model.save_torchscript(&script, &batch(TRACE_BATCH, sample_shape)?)?;
        let facts = crate::onnx::python::export(&script, &staging, sample_shape, OPSET, meta)?;
        tracing::debug!("exporter: {facts}");
        publish_checked_onnx(model, sample_shape, &staging, out, OPSET)
    })();
    let _ = std::fs::remove_file(&script);
    let _ = std::fs::remove_file(&staging);
    result
}

/// Checks the ONNX file `staging` against `model` ([`check_onnx`]) and publishes it as `out`.
fn publish_checked_onnx(
    model: &LoadedModel,
    sample_shape: &[usize],
    staging: &Path,
    out: &Path,
    opset: u32,
) -> Result<Exported, InferError> {
    let (max_abs, samples_checked, checked_in) = check_onnx(model, sample_shape, staging)?;
    let bytes = publish(staging, out)?;
    Ok(Exported {
        path: out.to_owned(),
        format: format!("ONNX opset {opset}"),
        checked_in,
        bytes,
        sample_shape: sample_shape.to_vec(),
        max_abs,
        samples_checked,
    })
}

/// Runs the written ONNX file in ONNX Runtime at the check batches and compares with `model`;
/// returns the largest |Δ|, the samples compared and the runtime that ran it.
fn check_onnx(
    model: &LoadedModel,
    sample_shape: &[usize],
    file: &Path,
) -> Result<(f64, i64, String), InferError> {
    let options = crate::onnx::OnnxOptions {
        max_batch: CHECK_BATCHES.iter().copied().max().unwrap_or(1) as usize,
        threads: usize::try_from(tch::get_num_threads()).unwrap_or(1),
        device: Device::Cpu,
        input_shape: Some(sample_shape.to_vec()),
    };
    let mut engine = crate::onnx::OnnxEngine::open(file, &options)?;
    if let Some(fixed) = engine.fixed_batch() {
        return Err(mismatch(
            model,
            format!(
                "the exported model's batch dimension is fixed at {fixed}: the model reads the \
                 batch size as a number while traced (use -1 for it in reshapes)"
            ),
        ));
    }
    let _guard = tch::no_grad_guard();
    let mut max_abs = 0.0_f64;
    for n in CHECK_BATCHES {
        let x = batch(n, sample_shape)?;
        let ours = model.forward(&x)?.f_contiguous()?.f_view([-1])?;
        let ours = Vec::<f32>::try_from(&ours)?;
        let values = Vec::<f32>::try_from(&x.f_contiguous()?.f_view([-1])?)?;
        let (theirs, _) = engine.run(&values, n as usize)?;
        if theirs.len() != ours.len() {
            return Err(mismatch(
                model,
                format!(
                    "at batch {n} the exported model gives {} values, kiln {}",
                    theirs.len(),
                    ours.len()
                ),
            ));
        }
        for (a, b) in theirs.iter().zip(&ours) {
            let gap = f64::from((a - b).abs());
            max_abs = if gap.is_nan() {
                f64::NAN
            } else {
                max_abs.max(gap)
            };
        }
    }
    if max_abs.is_nan() || max_abs > TOLERANCE {
        return Err(InferError::ExportMismatch {
            max_abs,
            tolerance: TOLERANCE,
        });
    }
    Ok((max_abs, CHECK_BATCHES.iter().sum(), engine.status()))
}

/// A trained program's checkpoint files (`model.pt2` and `model.safetensors`).
#[derive(Debug, Clone, Copy)]
pub struct ProgramFiles<'a> {
    pub program: &'a Path,
    pub weights: &'a Path,
}

/// Writes the trained program `files` to `out` as a `.pt2` ExportedProgram that PyTorch loads
/// with `torch.export.load`, in `mode`; the file is read back and every tensor compared, bit
/// for bit, with the checkpoint's before it is published. Returns how many tensors it holds.
pub fn to_program(
    files: ProgramFiles<'_>,
    mode: kiln_train::program::export::ProgramMode,
    out: &Path,
) -> Result<usize, InferError> {
    use kiln_train::program::export::{ExportFormat, ExportRequest};
    check_target(out)?;
    let staging = staging_with(out, ".pt2");
    let request = ExportRequest {
        program: files.program,
        weights: files.weights,
        out: &staging,
        format: ExportFormat::Program,
        mode,
        meta: &[],
        pythonpath: None,
    };
    let result = kiln_train::program::export::write(&request)
        .map_err(InferError::from)
        .and_then(|facts| {
            publish(&staging, out)?;
            Ok(facts["tensors"].as_u64().unwrap_or(0) as usize)
        });
    let _ = std::fs::remove_file(&staging);
    result
}

/// Writes the trained program `files` in eval mode to `out` as ONNX, through PyTorch's
/// exporter for exported programs, then checks it in ONNX Runtime against `model` (the
/// program's compiled eval forward with the same weights) as [`to_onnx`] does.
pub fn program_to_onnx(
    model: &LoadedModel,
    files: ProgramFiles<'_>,
    sample_shape: &[usize],
    out: &Path,
    meta: &[(String, String)],
) -> Result<Exported, InferError> {
    use kiln_train::program::export::{ExportFormat, ExportRequest, ProgramMode};
    check_target(out)?;
    let staging = staging_path(out);
    let pythonpath = crate::onnx::python::export_packages();
    let request = ExportRequest {
        program: files.program,
        weights: files.weights,
        out: &staging,
        format: ExportFormat::Onnx {
            opset: PROGRAM_OPSET,
        },
        mode: ProgramMode::Eval,
        meta,
        pythonpath: pythonpath.as_deref(),
    };
    let result = kiln_train::program::export::write(&request)
        .map_err(InferError::from)
        .and_then(|_| publish_checked_onnx(model, sample_shape, &staging, out, PROGRAM_OPSET));
    let _ = std::fs::remove_file(&staging);
    result
}

/// The ONNX opset of programs (PyTorch's exporter for exported programs starts at 18).
pub const PROGRAM_OPSET: u32 = 18;
