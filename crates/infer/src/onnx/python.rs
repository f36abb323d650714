//! The Python side of ONNX export: finding the provisioned torch's Python and the pinned
//! export packages (`onnx` and its closure, installed by `cargo xtask export`), and running the
//! embedded exporter script.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::InferError;
use crate::pyscript::ScriptError;

/// The exporter script, written to a temporary file when it runs.
const SCRIPT: &str = include_str!("../../python/export_onnx.py");

const HOW: &str = "`cargo xtask export …` installs them (or run `cargo xtask setup`, then \
     `cargo xtask export`); KILN_PYTHON and KILN_ONNX_PYTHONPATH name them by hand";

/// The Python (see [`kiln_train::python::python`]) and the packages' directory:
/// `KILN_ONNX_PYTHONPATH`, else the record `<kiln cache>/onnx-export.json` that xtask writes.
fn python_and_path() -> (PathBuf, Option<PathBuf>) {
    let path = std::env::var_os("KILN_ONNX_PYTHONPATH")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| kiln_train::python::recorded("onnx-export.json", "pythonpath"));
    (kiln_train::python::python(), path)
}

/// Where the onnx export packages are, if anywhere (see `python_and_path`).
pub(crate) fn export_packages() -> Option<PathBuf> {
    python_and_path().1
}

/// The quantizer script (`kiln export --quantize int8`).
const QUANTIZE: &str = include_str!("../../python/quantize_onnx.py");

/// Quantizes the ONNX file `model` to `out` (int8 Linear/MatMul weights, dynamic activations)
/// with ONNX Runtime's own tool, in the provisioned Python with the export packages and the
/// onnxruntime wheel kiln loads; returns the quantizer's JSON line.
pub(crate) fn quantize(model: &Path, out: &Path) -> Result<String, InferError> {
    let (_, packages) = python_and_path();
    let wheel = crate::onnx::runtime::python_package_dir();
    let dirs: Vec<PathBuf> = packages.into_iter().chain(wheel).collect();
    let path = std::env::join_paths(&dirs).ok().map(PathBuf::from);
    let args: Vec<OsString> = vec!["--model".into(), model.into(), "--out".into(), out.into()];
    let what = model.display().to_string();
    crate::pyscript::run("quantize-onnx", QUANTIZE, &args, path.as_deref()).map_err(|e| {
        let message = match e {
            ScriptError::CannotRun { python, why } => format!(
                "int8 quantization needs the provisioned torch's Python, and {} cannot run \
                 ({why}); {HOW}",
                python.display()
            ),
            ScriptError::Failed { python, last } => {
                let hint = if last.contains("cannot be imported") {
                    format!(
                        " (PYTHONPATH {}); it needs the export packages and the onnxruntime \
                         wheel that `cargo xtask setup` installs",
                        path.as_deref().unwrap_or(Path::new("")).display()
                    )
                } else {
                    String::new()
                };
                format!(
                    "int8 quantization ({}) failed: {last}{hint}",
                    python.display()
                )
            }
        };
        InferError::Model {
            model: what,
            message,
        }
    })
}

/// Exports the TorchScript file `script` to ONNX at `out`; returns the exporter's JSON line.
pub(crate) fn export(
    script: &Path,
    out: &Path,
    sample_shape: &[usize],
    opset: u32,
    meta: &[(String, String)],
) -> Result<String, InferError> {
    kiln_train::program::archive::vet_file(script)?;
    let (_, path) = python_and_path();
    let shape: Vec<String> = sample_shape.iter().map(usize::to_string).collect();
    let mut args: Vec<OsString> = vec!["--script".into(), script.into(), "--out".into()];
    args.extend([out.into(), "--sample-shape".into(), shape.join(",").into()]);
    args.extend(["--opset".into(), opset.to_string().into()]);
    for (k, v) in meta {
        args.extend(["--meta".into(), format!("{k}={v}").into()]);
    }
    let model = script.display().to_string();
    crate::pyscript::run("export-onnx", SCRIPT, &args, path.as_deref()).map_err(|e| match e {
        ScriptError::CannotRun { python, why } => InferError::Model {
            model,
            message: format!(
                "ONNX export needs the provisioned torch's Python, and {} cannot run ({why});                  {HOW}",
                python.display()
            ),
        },
        ScriptError::Failed { python, last } => {
            let hint = if last.contains("onnx package is missing") || last.contains("No module") {
                format!(
                    "; the export packages (onnx 1.21 and its closure) were not found{}: {HOW}",
                    path.as_ref()
                        .map_or_else(String::new, |p| format!(" in {}", p.display()))
                )
            } else {
                String::new()
            };
            InferError::Model {
                model,
                message: format!(
                    "the ONNX export ({}) failed: {last}{hint}",
                    python.display()
                ),
            }
        }
    })
}
