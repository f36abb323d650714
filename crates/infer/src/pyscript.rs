//! Running one of kiln's embedded Python scripts (the export steps) with the provisioned
//! torch's Python: written to a temporary file, run, and its last stdout line returned, or the
//! last line of its stderr (where the scripts say what went wrong).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a script gave no result.
#[derive(Debug)]
pub(crate) enum ScriptError {
    /// The Python could not be started.
    CannotRun { python: PathBuf, why: String },
    /// It ran and failed; the last line of its stderr.
    Failed { python: PathBuf, last: String },
}

/// Runs the script `text` (named `name` in the temporary directory) with `args`, with
/// `pythonpath` as PYTHONPATH where given; returns its stdout, trimmed.
pub(crate) fn run(
    name: &str,
    text: &str,
    args: &[OsString],
    pythonpath: Option<&Path>,
) -> Result<String, ScriptError> {
    let python = kiln_train::python::python();
    let file = std::env::temp_dir().join(format!("kiln-{name}-{}.py", std::process::id()));
    std::fs::write(&file, text).map_err(|e| ScriptError::CannotRun {
        python: python.clone(),
        why: format!("cannot write {}: {e}", file.display()),
    })?;
    let mut cmd = Command::new(&python);
    cmd.arg(&file).args(args);
    if let Some(path) = pythonpath {
        cmd.env("PYTHONPATH", path);
    }
    let output = cmd.output();
    let _ = std::fs::remove_file(&file);
    let output = output.map_err(|e| ScriptError::CannotRun {
        python: python.clone(),
        why: e.to_string(),
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message")
            .trim()
            .trim_start_matches("kiln-export: ")
            .to_owned();
        return Err(ScriptError::Failed { python, last });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
