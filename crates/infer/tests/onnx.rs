//! ONNX models through ONNX Runtime (the library `cargo xtask setup` provisions), against
//! fixtures made by PyTorch (`tests/data/make_fixture.py`): the facts read from the model's
//! metadata, outputs equal to PyTorch's, a fixed-batch model padded, damaged files and wrong
//! shapes refused by name, the server answering as it does for the same model in libtorch, and
//! the automatic engine choice over both.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln_config::CudaGraphs;
use kiln_device::settings::AmpDtype;
use kiln_infer::choose::{AutoEngine, EngineKind};
use kiln_infer::onnx::{OnnxEngine, OnnxOptions};
use kiln_infer::serve::{BatchRunner, ServeConfig, Server};
use kiln_infer::{Engine, EngineOptions, InferError, LoadedModel, Runner};
use reqwest::StatusCode;
use reqwest::blocking::Client;
use serde_json::{Value, json};
use tch::Device;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn options(max_batch: usize) -> OnnxOptions {
    OnnxOptions {
        max_batch,
        threads: 1,
        device: Device::Cpu,
        input_shape: None,
    }
}

/// The fixture's inputs and PyTorch's outputs for them, flattened.
fn expected() -> (Vec<f32>, Vec<f32>) {
    let text = std::fs::read_to_string(data("tiny_mlp_io.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let flat = |key: &str| -> Vec<f32> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| row.as_array().unwrap().iter())
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    (flat("inputs"), flat("outputs"))
}

fn max_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn the_input_comes_from_the_models_metadata() {
    let engine = OnnxEngine::open(&data("tiny_mlp.onnx"), &options(16)).unwrap();
    assert_eq!(engine.sample_shape(), [4]);
    assert_eq!(engine.max_batch(), 16);
    assert!(
        engine.status().contains("onnxruntime 1.31"),
        "{}",
        engine.status()
    );
    let fixed = OnnxEngine::open(&data("tiny_mlp_batch2.onnx"), &options(16)).unwrap();
    assert_eq!(fixed.sample_shape(), [4]);
    assert_eq!(fixed.max_batch(), 2, "a fixed batch caps the batch size");
}

#[test]
fn outputs_equal_pytorchs_at_every_batch_size() {
    let (x, y) = expected();
    let mut engine = OnnxEngine::open(&data("tiny_mlp.onnx"), &options(16)).unwrap();
    let (all, shape) = engine.run(&x, 3).unwrap();
    assert_eq!(shape, [3]);
    assert!(max_gap(&all, &y) < 1e-6, "{all:?} vs {y:?}");
    let (one, _) = engine.run(&x[4..8], 1).unwrap();
    assert!(max_gap(&one, &y[3..6]) < 1e-6);
    // The fixed-batch model pads one sample to its batch of 2 and drops the padding.
    let mut fixed = OnnxEngine::open(&data("tiny_mlp_batch2.onnx"), &options(16)).unwrap();
    let (padded, _) = fixed.run(&x[..4], 1).unwrap();
    assert!(max_gap(&padded, &y[..3]) < 1e-6);
    let err = fixed.run(&x, 3).unwrap_err().to_string();
    assert!(err.contains("1 to 2 fit"), "{err}");
}

#[test]
fn damaged_files_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let whole = std::fs::read(data("tiny_mlp.onnx")).unwrap();
    let cases = [
        ("truncated.onnx", whole[..whole.len() / 2].to_vec()),
        (
            "random.onnx",
            (0..997u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
        ("text.onnx", b"this is not a model\n".to_vec()),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let err = OnnxEngine::open(&path, &options(4)).unwrap_err();
        assert!(matches!(err, InferError::File { .. }), "{name}: {err:?}");
        let text = err.to_string();
        assert!(
            text.contains(name) && text.contains("not a loadable ONNX model"),
            "{text}"
        );
    }
}

#[test]
fn a_shape_the_model_does_not_take_is_named() {
    let mut given = options(4);
    given.input_shape = Some(vec![5]);
    let err = OnnxEngine::open(&data("tiny_mlp.onnx"), &given)
        .unwrap_err()
        .to_string();
    assert!(err.contains("[batch, 4]") && err.contains("[5]"), "{err}");

    let mut engine = OnnxEngine::open(&data("tiny_mlp.onnx"), &options(4)).unwrap();
    let inputs = kiln_infer::io::Inputs {
        description: "five.npy".to_owned(),
        sample_shape: vec![5],
        len: 2,
        values: vec![0.0; 10],
        targets: None,
    };
    let err = kiln_infer::offline::run(&mut engine, None, &inputs, "fp32")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("five.npy") && err.contains("[5]") && err.contains("[4]"),
        "{err}"
    );
}

fn libtorch_engine(max_batch: usize) -> Engine {
    let model =
        LoadedModel::torchscript(&data("tiny_mlp.pt"), Device::Cpu, AmpDtype::None).unwrap();
    let options = EngineOptions {
        max_batch,
        cuda_graphs: CudaGraphs::Auto,
    };
    Engine::new(model, vec![4], options).unwrap()
}

/// A server whose runner `make` builds on the worker thread.
fn serve(make: impl FnOnce() -> Box<dyn BatchRunner> + Send + 'static) -> Server {
    let config = ServeConfig {
        port: 0,
        max_batch: 4,
        max_wait: Duration::from_millis(2),
        http_threads: 2,
        ..ServeConfig::default()
    };
    let factory: kiln_infer::serve::RunnerFactory = Box::new(move || Ok(make()));
    let server = Server::start(config, factory).unwrap();
    server.wait_ready().unwrap();
    server
}

/// Posts `body` and returns the status and the answer (JSON; an `.npy` answer's values as
/// `{"outputs": [...]}`).
fn predict(server: &Server, content_type: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let client = Client::builder().no_proxy().build().unwrap();
    let response = client
        .post(format!("http://{}/v1/predict", server.local_addr()))
        .header("content-type", content_type)
        .body(body)
        .send()
        .unwrap();
    let status = response.status();
    let npy = response.headers()["content-type"] == "application/x-npy";
    let bytes = response.bytes().unwrap();
    if npy {
        let header = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
        let values: Vec<f32> = bytes[10 + header..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        return (status, json!({ "outputs": [values] }));
    }
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn npy(shape: &[usize], values: &[f32]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        dims.join(", ")
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    out
}

fn outputs_of(answer: &Value) -> Vec<f32> {
    answer["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter())
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn serving_an_onnx_file_answers_like_the_libtorch_server() {
    let (x, y) = expected();
    let servers = [
        serve(|| Box::new(libtorch_engine(4))),
        serve(|| Box::new(OnnxEngine::open(&data("tiny_mlp.onnx"), &options(4)).unwrap())),
    ];
    let rows: Vec<Value> = x.chunks(4).map(|r| json!(r)).collect();
    let mut answers = Vec::new();
    for server in &servers {
        let (status, json_answer) = predict(
            server,
            "application/json",
            serde_json::to_vec(&json!({ "inputs": rows })).unwrap(),
        );
        assert_eq!(status, StatusCode::OK, "{json_answer}");
        let (status, npy_answer) = predict(server, "application/x-npy", npy(&[3, 4], &x));
        assert_eq!(status, StatusCode::OK, "{npy_answer}");
        assert_eq!(outputs_of(&json_answer), outputs_of(&npy_answer));
        assert!(max_gap(&outputs_of(&json_answer), &y) < 1e-5);
        // A sample of the wrong shape is the client's error, named, on both.
        let (status, bad) = predict(
            server,
            "application/json",
            serde_json::to_vec(&json!({ "inputs": [[1.0, 2.0, 3.0]] })).unwrap(),
        );
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        answers.push((outputs_of(&json_answer), bad["error"].to_string()));
    }
    assert!(max_gap(&answers[0].0, &answers[1].0) < 1e-5);
    assert_eq!(answers[0].1, answers[1].1, "the same 422 message");
    for server in servers {
        server.shutdown().unwrap();
    }
}

#[test]
fn auto_runs_each_batch_on_the_engine_measured_faster_and_caches_the_choice() {
    let cache = tempfile::tempdir().unwrap();
    let onnx = OnnxEngine::open(&data("tiny_mlp.onnx"), &options(8)).unwrap();
    let mut auto = AutoEngine::new(libtorch_engine(8), onnx, "tiny", Some(cache.path())).unwrap();
    assert_eq!(
        auto.choice().keys().copied().collect::<Vec<_>>(),
        [1, 2, 4, 8]
    );
    assert!(auto.note().contains("measured now"), "{}", auto.note());
    let (x, y) = expected();
    let (out, _) = Runner::run(&mut auto, &x, 3).unwrap();
    assert!(max_gap(&out, &y) < 1e-5);
    // The second time the answer comes from the cache, with the same picks.
    let onnx = OnnxEngine::open(&data("tiny_mlp.onnx"), &options(8)).unwrap();
    let again = AutoEngine::new(libtorch_engine(8), onnx, "tiny", Some(cache.path())).unwrap();
    assert!(again.note().contains("cached from"), "{}", again.note());
    assert_eq!(again.choice(), auto.choice());
    assert!(matches!(
        again.engine_for(3),
        EngineKind::Libtorch | EngineKind::Onnxruntime
    ));
    assert_eq!(again.engine_for(3), again.choice()[&4]);
}
