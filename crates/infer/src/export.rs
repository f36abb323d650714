//! `kiln export`: a model written as a TorchScript file that takes any batch size (a kiln
//! checkpoint's model traced, a TorchScript checkpoint's module saved in eval mode), checked
//! against kiln's own output at two batch sizes before it is published; an existing file is
//! never overwritten.

use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};

use crate::{InferError, LoadedModel};

/// The largest |Δ| between kiln's fp32 output and the exported model's that passes.
pub const TOLERANCE: f64 = 1e-4;

/// The batch a kiln model is traced at (neither of the batches it is checked at).
const TRACE_BATCH: i64 = 2;
/// The batch sizes the written file is checked at.
const CHECK_BATCHES: [i64; 2] = [3, 1];

/// What an export wrote and how it was checked.
#[derive(Debug, Clone)]
pub struct Exported {
    pub path: PathBuf,
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
    check_target(out)?;
    if model.kind() != Kind::Float || model.device() != Device::Cpu {
        return Err(InferError::Model {
            model: model.description().to_owned(),
            message: "export takes the model in fp32 on the CPU".to_owned(),
        });
    }
    let staging = staging_path(out);
    let result = write_and_check(model, sample_shape, &staging)
        .and_then(|checked| publish(&staging, out).map(|bytes| (checked, bytes)));
    let _ = std::fs::remove_file(&staging);
    let ((max_abs, samples_checked), bytes) = result?;
    Ok(Exported {
        path: out.to_owned(),
        bytes,
        sample_shape: sample_shape.to_vec(),
        max_abs,
        samples_checked,
    })
}

/// `<out>.partial-<pid>` beside `out`.
fn staging_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".partial-{}", std::process::id()));
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
fn publish(staging: &Path, out: &Path) -> Result<u64, InferError> {
    std::fs::hard_link(staging, out).map_err(|e| {
        InferError::file(
            out,
            format!("cannot write it ({e}); nothing was overwritten"),
        )
    })?;
    Ok(std::fs::metadata(out).map(|m| m.len()).unwrap_or(0))
}
