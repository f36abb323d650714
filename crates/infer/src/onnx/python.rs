//! The Python side of ONNX export: finding the provisioned torch's Python and the pinned
//! export packages (`onnx` and its closure, installed by `cargo xtask export`), and running the
//! embedded exporter script.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::InferError;

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

/// Exports the TorchScript file `script` to ONNX at `out`; returns the exporter's JSON line.
pub(crate) fn export(
    script: &Path,
    out: &Path,
    sample_shape: &[usize],
    opset: u32,
    meta: &[(String, String)],
) -> Result<String, InferError> {
    let (python, path) = python_and_path();
    let file = std::env::temp_dir().join(format!("kiln-export-onnx-{}.py", std::process::id()));
    std::fs::write(&file, SCRIPT).map_err(|e| InferError::file(&file, e))?;
    let shape: Vec<String> = sample_shape.iter().map(usize::to_string).collect();
    let mut cmd = Command::new(&python);
    cmd.arg(&file)
        .arg("--script")
        .arg(script)
        .arg("--out")
        .arg(out)
        .args(["--sample-shape", &shape.join(",")])
        .args(["--opset", &opset.to_string()]);
    for (k, v) in meta {
        cmd.arg("--meta").arg(format!("{k}={v}"));
    }
    if let Some(path) = &path {
        cmd.env("PYTHONPATH", path);
    }
    let output = cmd.output();
    let _ = std::fs::remove_file(&file);
    let output = output.map_err(|e| InferError::Model {
        model: script.display().to_string(),
        message: format!(
            "ONNX export needs the provisioned torch's Python, and {} cannot run ({e}); {HOW}",
            python.display()
        ),
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message")
            .trim();
        let hint = if last.contains("onnx package is missing") || last.contains("No module") {
            format!(
                "; the export packages (onnx 1.21 and its closure) were not found{}: {HOW}",
                path.as_ref()
                    .map_or_else(String::new, |p| format!(" in {}", p.display()))
            )
        } else {
            String::new()
        };
        return Err(InferError::Model {
            model: script.display().to_string(),
            message: format!(
                "the ONNX export ({}) failed: {}{hint}",
                python.display(),
                last.trim_start_matches("kiln-export: ")
            ),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
