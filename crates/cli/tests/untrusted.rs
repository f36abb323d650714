//! Model files crafted to run code when loaded: a TorchScript module whose pickle calls
//! `os.system`, and an exported program whose sample inputs (which PyTorch's loader unpickles
//! with `torch.load`) do the same. `kiln train`, `kiln infer` and `kiln export` refuse both
//! before libtorch or Python sees them, name the file and what in it is refused, exit non-zero,
//! and the command the pickle carries never runs (it would create a marker file).

mod common;

use std::io::Write;
use std::path::Path;

use common::{kiln, stderr};
use serde_json::json;

/// A protocol-2 pickle of `os.system("touch MARKER")`, as `pickle.dumps` of an object whose
/// `__reduce__` returns that call writes it.
fn evil_pickle(marker: &Path) -> Vec<u8> {
    let command = format!("touch {}", marker.display());
    let mut p = b"\x80\x02cos\nsystem\nq\x00X".to_vec();
    p.extend_from_slice(&(command.len() as u32).to_le_bytes());
    p.extend_from_slice(command.as_bytes());
    p.extend_from_slice(b"q\x01\x85q\x02Rq\x03.");
    p
}

/// A zip archive of `entries` (stored, as PyTorch writes them).
fn archive(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored =
        zip::write::FileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in entries {
        zip.start_file(*name, stored).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

/// A TorchScript module's layout (`torch.jit.save`) with the evil pickle as its `data.pkl`.
fn evil_script(path: &Path, marker: &Path) {
    let bytes = archive(&[
        ("evil/data.pkl", &evil_pickle(marker)),
        (
            "evil/code/__torch__/evil.py",
            b"class Evil(Module):\n  pass\n",
        ),
        ("evil/version", b"3\n"),
    ]);
    std::fs::write(path, bytes).unwrap();
}

/// An exported program's layout (`torch.export.save`) whose sample inputs are a `torch.save`
/// archive holding the evil pickle.
fn evil_program(path: &Path, marker: &Path) {
    let inputs = archive(&[
        ("archive/data.pkl", &evil_pickle(marker)),
        ("archive/version", b"3\n"),
    ]);
    let bytes = archive(&[
        ("evil/archive_format", b"pt2"),
        ("evil/models/model.json", b"{}"),
        ("evil/data/sample_inputs/model.pt", &inputs),
    ]);
    std::fs::write(path, bytes).unwrap();
}

/// A dataset of 8 samples of 4 features, 2 classes.
fn dataset(dir: &Path) -> std::path::PathBuf {
    let x: Vec<f64> = (0..32).map(|i| f64::from(i) / 32.0).collect();
    let y: Vec<f64> = (0..8).map(|i| f64::from(i % 2)).collect();
    let x = json!({"shape": [8, 4], "values": x});
    let y = json!({"shape": [8], "values": y});
    common::own_data::prepare(dir, "data", &x, &y, true)
}

/// Runs `args`, and checks it failed refusing `model` for its `os.system` pickle, the marker
/// never made.
fn assert_refused(args: &[&str], model: &Path, marker: &Path) {
    let o = kiln(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} succeeded: {err}");
    assert!(
        err.contains(&model.display().to_string()) && err.contains("refused before loading"),
        "{args:?}: the error names neither the file nor the refusal: {err}"
    );
    assert!(
        err.contains("os") && err.contains("system"),
        "{args:?}: the error does not name the import: {err}"
    );
    assert!(!marker.exists(), "{args:?}: the file's code ran");
}

#[test]
fn model_files_that_would_run_code_are_refused_by_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path());
    let marker = tmp.path().join("the-pickle-ran");
    let script = tmp.path().join("evil.pt");
    let program = tmp.path().join("evil.pt2");
    evil_script(&script, &marker);
    evil_program(&program, &marker);
    let inputs = tmp.path().join("data.x.npy");
    let runs = tmp.path().join("runs");
    let out = tmp.path().join("out.npy");
    for model in [&script, &program] {
        let m = model.to_str().unwrap();
        let train = [
            "train",
            "--model",
            m,
            "--data",
            data.to_str().unwrap(),
            "--device",
            "cpu",
            "--set",
            &format!("run.output_dir={}", runs.display()),
        ];
        assert_refused(&train, model, &marker);
        let infer = [
            "infer",
            "--model",
            m,
            "--inputs",
            inputs.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ];
        assert_refused(&infer, model, &marker);
    }
    assert!(!out.exists(), "infer wrote an output for a refused model");
    assert!(
        !runs.exists(),
        "train made a run directory for a refused model"
    );
}
