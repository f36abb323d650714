//! Inference over a kiln checkpoint against outputs computed by hand from the checkpoint's own
//! weights; reduced precision against fp32; the engine's batch limits and its CUDA-graph
//! fallback on a machine without CUDA.

use kiln_config::{ConfigRequest, CudaGraphs, Machine, simulated_machine};
use kiln_device::CpuFacts;
use kiln_device::settings::AmpDtype;
use kiln_infer::io::Inputs;
use kiln_infer::model::{self, ModelSource};
use kiln_infer::{Engine, EngineOptions, GraphStatus};
use kiln_profiles::ProfileSet;
use tch::{Device, Kind, Tensor};

fn request(sets: &[String]) -> ConfigRequest {
    let profiles = ProfileSet::builtin().unwrap();
    let cpu = CpuFacts {
        model: "test".into(),
        physical_cores: 2,
        logical_cores: 2,
        total_memory_bytes: 16 << 30,
        available_memory_bytes: 8 << 30,
        avx512: false,
        avx512_bf16: false,
        amx_bf16: false,
    };
    let facts = simulated_machine(&profiles, None, None, None, Some(2), cpu).unwrap();
    let mut req = ConfigRequest::new(Machine::Simulated(facts));
    req.sets = sets.to_vec();
    req
}

/// Trains a small MLP on synthetic data for one epoch; returns the run directory.
fn trained_run(out: &std::path::Path) -> std::path::PathBuf {
    let sets: Vec<String> = [
        "model.name=mlp",
        "model.hidden=24,12",
        "train.epochs=1",
        "train.amp=none",
        "data.synthetic_samples=512",
        "data.num_workers=0",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([format!("run.output_dir={}", out.display())])
    .collect();
    let plan = kiln_config::load(&request(&sets)).unwrap().plan;
    let outcome = kiln_train::run::train(
        &plan,
        kiln_device::Device::Cpu,
        None,
        kiln_train::run::RunControl::default(),
        &mut kiln_train::record::Silent,
    )
    .unwrap();
    outcome.run_dir
}

fn inputs(n: usize, features: usize) -> Inputs {
    let values: Vec<f32> = (0..n * features)
        .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    Inputs {
        values,
        sample_shape: vec![features],
        len: n,
        targets: None,
        description: "test inputs".into(),
    }
}

#[test]
fn checkpoint_outputs_match_a_hand_computed_forward_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_run(tmp.path());
    let source = ModelSource::detect(&run).unwrap();
    let ckpt = model::open_checkpoint(&run).unwrap();
    let mut req = request(&[]);
    req.checkpoint = Some(("test".into(), model::model_settings(&ckpt)));
    let plan = kiln_config::load(&req).unwrap().plan;
    assert_eq!(
        plan.model.hidden,
        vec![24, 12],
        "settings come from the checkpoint"
    );

    let loaded = model::load(&source, Some(&ckpt), &plan, Device::Cpu, AmpDtype::None).unwrap();
    assert_eq!(loaded.sample_shape(), Some(&[64usize][..]));
    let options = EngineOptions {
        max_batch: 16,
        cuda_graphs: CudaGraphs::Auto,
    };
    let mut engine = Engine::new(loaded, vec![64], options).unwrap();
    let status = engine.graph_status().to_string();
    assert!(
        matches!(engine.graph_status(), GraphStatus::Off(why) if why.contains("CPU")),
        "{status}"
    );
    let data = inputs(40, 64);
    let outcome = kiln_infer::offline::run(&mut engine, None, &data, "fp32").unwrap();
    assert_eq!(outcome.shape, vec![40, 10]);
    assert_eq!(outcome.report.batches, 3);

    // By hand: relu(relu(x W0ᵀ + b0) W1ᵀ + b1) Whᵀ + bh, from the checkpoint's tensors.
    let w = |name: &str| {
        ckpt.model
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .1
            .shallow_clone()
    };
    let x = Tensor::from_slice(&data.values).view([40, 64]);
    let h = x.matmul(&w("fc0.weight").tr()) + w("fc0.bias");
    let h = h.relu().matmul(&w("fc1.weight").tr()) + w("fc1.bias");
    let want = h.relu().matmul(&w("head.weight").tr()) + w("head.bias");
    let want = Vec::<f32>::try_from(&want.view([-1])).unwrap();
    let diff = outcome
        .outputs
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-5, "max |Δ| {diff} from the hand-computed outputs");

    // bf16: close to fp32, and the report measures exactly how close.
    let bf16 = model::load(&source, Some(&ckpt), &plan, Device::Cpu, AmpDtype::Bf16).unwrap();
    assert_eq!(bf16.kind(), Kind::BFloat16);
    let mut bf16 = Engine::new(bf16, vec![64], options).unwrap();
    let low = kiln_infer::offline::run(&mut bf16, Some(&mut engine), &data, "bf16").unwrap();
    let dev = low.report.deviation_from_fp32.unwrap();
    let measured = low
        .outputs
        .iter()
        .zip(&want)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0f64, f64::max);
    assert!(dev.max_abs > 0.0 && dev.max_abs < 0.2, "{dev:?}");
    assert!(
        (dev.max_abs - measured).abs() < 1e-5,
        "{dev:?} vs {measured}"
    );
}

#[test]
fn the_engine_refuses_what_does_not_fit_and_graphs_on_without_cuda() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_run(tmp.path());
    let ckpt = model::open_checkpoint(&run).unwrap();
    let mut req = request(&[]);
    req.checkpoint = Some(("test".into(), model::model_settings(&ckpt)));
    let plan = kiln_config::load(&req).unwrap().plan;
    let source = ModelSource::Checkpoint(run.clone());
    let load = || model::load(&source, Some(&ckpt), &plan, Device::Cpu, AmpDtype::None).unwrap();
    let options = EngineOptions {
        max_batch: 8,
        cuda_graphs: CudaGraphs::Auto,
    };
    let err = Engine::new(load(), vec![32], options)
        .unwrap_err()
        .to_string();
    assert!(err.contains("[32]") && err.contains("[64]"), "{err}");
    let err = Engine::new(
        load(),
        vec![64],
        EngineOptions {
            cuda_graphs: CudaGraphs::On,
            ..options
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("infer.cuda_graphs") && err.contains("CUDA device"),
        "{err}"
    );
    let mut engine = Engine::new(load(), vec![64], options).unwrap();
    let err = engine.run(&[0.0; 9 * 64], 9).unwrap_err().to_string();
    assert!(err.contains("1 to 8 fit"), "{err}");
    let err = engine.run(&[0.0; 63], 1).unwrap_err().to_string();
    assert!(err.contains("63 values"), "{err}");
    let (out, shape) = engine.run(&[0.5; 3 * 64], 3).unwrap();
    assert_eq!((out.len(), shape), (30, vec![10]));
}
