//! A trained program written back for PyTorch (`kiln export`): the program with a checkpoint's
//! weights put in by name, as a `.pt2` ExportedProgram (in eval mode, or as it was exported;
//! read back and compared tensor by tensor) or in eval mode as ONNX through PyTorch's exporter
//! for exported programs, by the compiler script in the provisioned Python.

use std::ffi::OsString;
use std::path::Path;

use crate::TrainError;

/// What is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// A `.pt2` ExportedProgram (`torch.export.load`).
    Program,
    /// ONNX (the eval-mode program; needs the onnx export packages on `pythonpath`).
    Onnx { opset: u32 },
}

/// Which mode the written program is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramMode {
    /// Dropout off, batch norm on its running statistics (for inference).
    Eval,
    /// As it was exported (to train further).
    Train,
}

/// What to write, and where.
#[derive(Debug, Clone)]
pub struct ExportRequest<'a> {
    /// The checkpoint's `model.pt2` and `model.safetensors`.
    pub program: &'a Path,
    pub weights: &'a Path,
    pub out: &'a Path,
    pub format: ExportFormat,
    pub mode: ProgramMode,
    /// ONNX metadata (`key`, `value`).
    pub meta: &'a [(String, String)],
    /// Where the onnx export packages are (PYTHONPATH), for ONNX.
    pub pythonpath: Option<&'a Path>,
}

/// Writes `r.out`; returns the script's facts (JSON: `tensors`, `mode`, `seconds`, and for
/// ONNX `opset` and `nodes`).
pub fn write(r: &ExportRequest<'_>) -> Result<serde_json::Value, TrainError> {
    let mut args: Vec<OsString> = vec!["export".into(), "--program".into(), r.program.into()];
    args.extend(["--weights".into(), r.weights.into()]);
    args.extend(["--out".into(), r.out.into()]);
    let mode = match r.mode {
        ProgramMode::Eval => "eval",
        ProgramMode::Train => "train",
    };
    args.extend(["--mode".into(), mode.into()]);
    if let ExportFormat::Onnx { opset } = r.format {
        args.extend(["--format".into(), "onnx".into()]);
        args.extend(["--opset".into(), opset.to_string().into()]);
    }
    for (k, v) in r.meta {
        args.extend(["--meta".into(), format!("{k}={v}").into()]);
    }
    let mut log = r.out.as_os_str().to_owned();
    log.push(".log");
    args.extend(["--log".into(), log]);
    let env: Vec<(&str, OsString)> = r
        .pythonpath
        .map(|p| ("PYTHONPATH", p.as_os_str().to_owned()))
        .into_iter()
        .collect();
    let script = std::env::temp_dir().join(format!("kiln-export-{}.py", std::process::id()));
    let line = super::compile::run_script(r.program, &script, &args, &env);
    let _ = std::fs::remove_file(&script);
    Ok(serde_json::from_str(&line?).unwrap_or_default())
}
