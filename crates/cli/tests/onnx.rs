//! ONNX models through the CLI as a user runs them, on the fixtures of `kiln-infer` (made by
//! PyTorch): `kiln infer`, `kiln serve` and `kiln profile-model` on an `.onnx` file with its
//! input shape from the model, and the errors a user meets: no onnxruntime (with how to get
//! it), a damaged file, the wrong engine for a model, a reduced precision ONNX Runtime cannot
//! run.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{free_port, kiln, read_tensor, stderr, stdout};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../infer/tests/data")
        .join(name)
}

/// The fixture's three inputs as a .npy file, and PyTorch's outputs for them.
fn inputs(dir: &Path) -> (PathBuf, Vec<f32>) {
    let text = std::fs::read_to_string(fixture("tiny_mlp_io.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let flat = |key: &str| -> Vec<f32> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r.as_array().unwrap().iter())
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    let path = dir.join("x.npy");
    let bytes = kiln_data::npy_f32_bytes(&[3, 4], &flat("inputs")).unwrap();
    std::fs::write(&path, bytes).unwrap();
    (path, flat("outputs"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn kiln_infers_an_onnx_file_with_pytorchs_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let (x, expected) = inputs(tmp.path());
    let out = tmp.path().join("y.safetensors");
    let o = kiln(&[
        "infer",
        "--model",
        s(&fixture("tiny_mlp.onnx")),
        "--inputs",
        s(&x),
        "--output",
        s(&out),
        "--device",
        "cpu",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    // Not exported by kiln: onnxruntime is the only engine, and it says so.
    assert!(
        err.contains("engine auto: onnxruntime, the only engine for this file"),
        "{err}"
    );
    assert!(stdout(&o).contains("onnxruntime 1.31"), "{}", stdout(&o));
    let (shape, values) = read_tensor(&out, "outputs");
    assert_eq!(shape, [3, 3]);
    let gap = values
        .iter()
        .zip(&expected)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(gap < 1e-5, "{values:?} vs {expected:?}");
}

#[test]
fn without_onnxruntime_the_error_says_how_to_get_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (x, _) = inputs(tmp.path());
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["infer", "--model", s(&fixture("tiny_mlp.onnx")), "--inputs"])
        .arg(&x)
        .args(["--device", "cpu"])
        .env_remove("ORT_DYLIB_PATH")
        .env("KILN_ONNXRUNTIME", tmp.path().join("nonexistent"))
        .env("KILN_CACHE_DIR", tmp.path())
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("ONNX Runtime 1.31 was not found")
            && err.contains("cargo xtask setup")
            && err.contains("ORT_DYLIB_PATH")
            && err.contains("nonexistent"),
        "{err}"
    );
}

#[test]
fn wrong_engines_files_and_precisions_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (x, _) = inputs(tmp.path());
    let infer = |model: &Path, extra: &[&str]| {
        let mut args = vec![
            "infer",
            "--model",
            s(model),
            "--inputs",
            s(&x),
            "--device",
            "cpu",
        ];
        args.extend_from_slice(extra);
        let o = kiln(&args);
        assert!(!o.status.success(), "{}", stderr(&o));
        stderr(&o)
    };
    let onnx = fixture("tiny_mlp.onnx");
    let err = infer(&onnx, &["--engine", "libtorch"]);
    assert!(
        err.contains("infer.engine") && err.contains("it was not exported by kiln"),
        "{err}"
    );
    let err = infer(&onnx, &["--engine", "onnxruntime", "--precision", "bf16"]);
    assert!(
        err.contains("infer.precision") && err.contains("onnxruntime runs the ONNX file in fp32"),
        "{err}"
    );
    let err = infer(&fixture("tiny_mlp.pt"), &["--engine", "onnxruntime"]);
    assert!(err.contains("kiln export"), "{err}");
    let err = infer(&fixture("tiny_mlp.pt"), &["--engine", "compiled"]);
    assert!(
        err.contains("infer.engine") && err.contains("compiled runs an exported program"),
        "{err}"
    );
    let damaged = tmp.path().join("damaged.onnx");
    let bytes = std::fs::read(&onnx).unwrap();
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let err = infer(&damaged, &[]);
    assert!(
        err.contains("damaged.onnx") && err.contains("not a loadable ONNX model"),
        "{err}"
    );
    let five = tmp.path().join("five.npy");
    std::fs::write(
        &five,
        kiln_data::npy_f32_bytes(&[2, 5], &[0.0; 10]).unwrap(),
    )
    .unwrap();
    let o = kiln(&[
        "infer",
        "--model",
        s(&onnx),
        "--inputs",
        s(&five),
        "--device",
        "cpu",
    ]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("[5]") && err.contains("[batch, 4]"), "{err}");
}

#[test]
fn kiln_serves_an_onnx_file_with_its_own_input_shape() {
    let port = free_port().to_string();
    let (mut child, seen, lines) = start_server(&fixture("tiny_mlp.onnx"), &port);
    assert_eq!(seen.last().map(String::as_str), Some("ready"), "{seen:#?}");
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/v1/predict");
    let answer: serde_json::Value = client
        .post(&url)
        .json(&serde_json::json!({ "inputs": [[1.0, 2.0, -3.0, 0.5]] }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let first = answer["outputs"][0][0].as_f64().unwrap();
    assert!((first - (-0.395_201_15)).abs() < 1e-5, "{answer}");
    let bad = client
        .post(&url)
        .json(&serde_json::json!({ "inputs": [[1.0, 2.0]] }))
        .send()
        .unwrap();
    assert_eq!(bad.status().as_u16(), 422);
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{rest:#?}");
    assert!(
        rest.iter()
            .any(|l| l.contains("1 ok, 0 failed, 1 rejected")),
        "{rest:#?}"
    );
}

/// Starts `kiln serve --model model --port port` and waits for "ready" (or an error line);
/// returns the child and the lines seen.
fn start_server(model: &Path, port: &str) -> (std::process::Child, Vec<String>, Lines) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--model", s(model)])
        .args(["--port", port, "--device", "cpu"])
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line == "ready" || line.starts_with("error") {
            break;
        }
    }
    (child, seen, lines)
}

type Lines = std::io::Lines<BufReader<std::process::ChildStderr>>;

#[test]
fn a_fixed_batch_onnx_model_caps_the_servers_requests() {
    let port = free_port().to_string();
    let (mut child, seen, _) = start_server(&fixture("tiny_mlp_batch2.onnx"), &port);
    assert_eq!(seen.last().map(String::as_str), Some("ready"), "{seen:#?}");
    assert!(
        seen.iter()
            .any(|l| l.contains("takes batches of exactly 2")),
        "{seen:#?}"
    );
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/v1/predict");
    let one = client
        .post(&url)
        .json(&serde_json::json!({ "inputs": [[1.0, 2.0, -3.0, 0.5]] }))
        .send()
        .unwrap();
    assert_eq!(one.status().as_u16(), 200);
    let three = client
        .post(&url)
        .json(&serde_json::json!({ "inputs": vec![[0.0_f32; 4]; 3] }))
        .send()
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        three.status().as_u16(),
        413,
        "more samples than the model's batch"
    );
}

#[test]
fn profile_model_times_an_onnx_file_in_onnxruntime() {
    let o = kiln(&[
        "profile-model",
        "--model",
        s(&fixture("tiny_mlp.onnx")),
        "--batch-size",
        "8",
        "--iterations",
        "3",
        "--device",
        "cpu",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(
        report["model"].as_str().unwrap().contains("onnxruntime"),
        "{report}"
    );
    assert_eq!(report["input_shape"], serde_json::json!([4]));
    assert_eq!(report["precision"], "fp32");
    assert!(report["parameters"].is_null());
    assert!(report["samples_per_s"].as_f64().unwrap() > 0.0);
    let fixed = kiln(&[
        "profile-model",
        "--model",
        s(&fixture("tiny_mlp_batch2.onnx")),
        "--batch-size",
        "8",
        "--device",
        "cpu",
    ]);
    assert!(!fixed.status.success());
    assert!(
        stderr(&fixed).contains("--batch-size 2"),
        "{}",
        stderr(&fixed)
    );
}
