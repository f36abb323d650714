//! The data edge of training: loader settings from the plan, and the device feeder's CPU path
//! (its pinned side-stream CUDA path in an `#[ignore]`d test that `cargo xtask test --cuda` runs).

use std::sync::Arc;

use kiln_config::{ConfigRequest, Machine, load, simulated_machine};
use kiln_data::{DataError, Dataset, Loader, SamplerConfig, SyntheticClassification};
use kiln_device::CpuFacts;
use kiln_profiles::ProfileSet;
use kiln_train::feed::{DeviceFeeder, PinnedBuffers, loader_config};
use tch::{Device, Kind};

fn cpu(cores: usize) -> CpuFacts {
    CpuFacts {
        model: "test".into(),
        physical_cores: cores,
        logical_cores: cores,
        total_memory_bytes: 64 << 30,
        available_memory_bytes: 60 << 30,
        avx512: false,
        avx512_bf16: false,
        amx_bf16: false,
    }
}

fn plan_on(cores: usize, sets: &[&str]) -> kiln_config::RunPlan {
    let set = ProfileSet::builtin().unwrap();
    let facts = simulated_machine(
        &set,
        Some("NVIDIA H100 80GB HBM3"),
        None,
        None,
        None,
        cpu(cores),
    )
    .unwrap();
    let mut req = ConfigRequest::new(Machine::Simulated(facts));
    req.sets = sets.iter().map(|s| (*s).to_owned()).collect();
    load(&req).unwrap().plan
}

#[test]
fn worker_count_defaults_from_the_profile_capped_by_cores_and_the_user_wins() {
    let h100 = ProfileSet::builtin()
        .unwrap()
        .get("h100")
        .unwrap()
        .num_workers;
    let roomy = loader_config(&plan_on(256, &[]), SamplerConfig::default(), false).unwrap();
    assert_eq!(roomy.num_workers, h100 as usize);
    let small = loader_config(&plan_on(2, &[]), SamplerConfig::default(), false).unwrap();
    assert_eq!(small.num_workers, 2, "capped by the machine's cores");
    let plan = plan_on(2, &["data.num_workers=0", "train.batch_size=48"]);
    let user = loader_config(&plan, SamplerConfig::default(), true).unwrap();
    assert_eq!(
        (user.num_workers, user.batch_size, user.drop_last),
        (0, 48, true)
    );
    assert_eq!(user.prefetch_factor as u64, plan.data.prefetch_factor);
}

#[test]
fn the_cpu_feeder_yields_every_batch_in_order_with_its_data_one_ahead() {
    let ds = Arc::new(SyntheticClassification::new(50, vec![2, 3], 4, 7, 0.1).unwrap());
    let config = kiln_data::LoaderConfig {
        batch_size: 8,
        num_workers: 2,
        ..kiln_data::LoaderConfig::default()
    };
    let mut loader = Loader::new(Arc::clone(&ds), config).unwrap();
    let mut feeder = DeviceFeeder::new(loader.epoch(0), Device::Cpu);
    assert!(!feeder.pinned(), "no pinning for the CPU");
    let mut numbers = Vec::new();
    let mut buf = [0f32; 6];
    while let Some(batch) = feeder.next() {
        let batch = batch.unwrap();
        // After handing out a batch the next one is already staged, except after the last.
        assert_eq!(
            feeder.has_batch_ahead(),
            batch.number < 6,
            "batch {}",
            batch.number
        );
        assert_eq!(batch.inputs.single().unwrap().size()[1..], [2, 3]);
        assert_eq!(batch.inputs.single().unwrap().kind(), Kind::Float);
        assert_eq!(batch.targets.kind(), Kind::Int64);
        for (k, &i) in batch.indices.iter().enumerate() {
            let label = ds.read(i, &mut buf).unwrap();
            assert_eq!(batch.targets.int64_value(&[k as i64]), label);
            let row: Vec<f32> =
                Vec::try_from(batch.inputs.single().unwrap().get(k as i64).flatten(0, -1)).unwrap();
            assert_eq!(row, buf);
        }
        numbers.push(batch.number);
    }
    assert_eq!(numbers, (0..7).collect::<Vec<_>>());
}

#[test]
fn a_failing_batch_reaches_the_consumer_after_the_good_ones() {
    let good = |n: usize| kiln_data::Batch {
        shape: vec![1, 2],
        features: vec![n as f32, 0.0].into(),
        arrays: vec![],
        integer_features: false,
        targets: kiln_data::Targets::Classes(vec![0]),
        target_shape: vec![1],
        indices: vec![n],
        number: n,
    };
    let source = vec![
        Ok(good(0)),
        Ok(good(1)),
        Err(DataError::Sample {
            index: 17,
            message: "corrupt".to_owned(),
        }),
    ];
    let out: Vec<_> = DeviceFeeder::new(source.into_iter(), Device::Cpu).collect();
    assert_eq!(out.len(), 3);
    assert!(out[0].is_ok() && out[1].is_ok());
    let e = out[2].as_ref().unwrap_err().to_string();
    assert!(e.contains("sample 17") && e.contains("corrupt"), "{e}");
}

#[test]
#[ignore = "needs CUDA; `cargo xtask test --cuda` runs it"]
fn on_cuda_batches_arrive_pinned_and_intact() {
    assert!(
        kiln_torch_ext::cuda::device_count().unwrap() > 0,
        "this test needs a CUDA device and this machine has none (run it on one with a GPU)"
    );
    let ds = Arc::new(SyntheticClassification::new(300, vec![64, 64], 10, 3, 0.5).unwrap());
    let config = kiln_data::LoaderConfig {
        batch_size: 32,
        num_workers: 2,
        ..kiln_data::LoaderConfig::default()
    };
    // Batches in the loader's own memory (copied into pinned memory by the feeder), and
    // batches the loader wrote into pinned memory in the first place.
    let pinned = Arc::new(PinnedBuffers::default());
    let loaders = [
        Loader::new(Arc::clone(&ds), config).unwrap(),
        Loader::with_buffers(Arc::clone(&ds), config, pinned.clone()).unwrap(),
    ];
    for mut loader in loaders {
        let mut feeder = DeviceFeeder::new(loader.epoch(0), Device::Cuda(0));
        let mut buf = vec![0f32; 64 * 64];
        let mut batches = 0;
        for batch in feeder.by_ref() {
            let batch = batch.unwrap();
            assert_eq!(batch.inputs.single().unwrap().device(), Device::Cuda(0));
            let last = *batch.indices.last().unwrap();
            ds.read(last, &mut buf).unwrap();
            let k = batch.indices.len() as i64 - 1;
            let want: f64 = buf.iter().map(|v| f64::from(*v)).sum();
            let got = batch
                .inputs
                .single()
                .unwrap()
                .get(k)
                .sum(Kind::Double)
                .double_value(&[]);
            assert!(
                (got - want).abs() < 1e-3 * want.abs().max(1.0),
                "{got} vs {want}"
            );
            batches += 1;
        }
        assert!(feeder.pinned(), "{:?}", feeder.unpinned_because());
        assert_eq!(batches, 10);
    }
    assert_eq!(pinned.refused(), None, "pinned batch buffers were refused");
}

#[test]
fn pinned_buffers_give_the_same_batches_and_without_cuda_say_why_they_are_heap_memory() {
    let cuda = kiln_torch_ext::cuda::device_count().unwrap_or(0) > 0;
    let ds = Arc::new(SyntheticClassification::new(50, vec![2, 3], 4, 7, 0.1).unwrap());
    let config = kiln_data::LoaderConfig {
        batch_size: 8,
        ..kiln_data::LoaderConfig::default()
    };
    let pinned = Arc::new(PinnedBuffers::default());
    let mut plain = Loader::new(Arc::clone(&ds), config).unwrap();
    let mut with = Loader::with_buffers(Arc::clone(&ds), config, pinned.clone()).unwrap();
    let a: Vec<_> = plain.epoch(0).map(Result::unwrap).collect();
    let b: Vec<_> = with.epoch(0).map(Result::unwrap).collect();
    assert_eq!(a, b);
    assert_eq!(pinned.refused().is_some(), !cuda, "{:?}", pinned.refused());
}

#[test]
fn on_the_cpu_a_batch_becomes_a_tensor_over_its_own_memory() {
    let values = vec![1.0f32, 2.0, 3.0, 4.0];
    let at = values.as_ptr() as usize;
    let batch = kiln_data::Batch {
        shape: vec![2, 2],
        features: values.into(),
        arrays: vec![],
        integer_features: false,
        targets: kiln_data::Targets::Classes(vec![0, 1]),
        target_shape: vec![2],
        indices: vec![0, 1],
        number: 0,
    };
    let mut feeder = DeviceFeeder::new(std::iter::once(Ok(batch)), Device::Cpu);
    let fed = feeder.next().unwrap().unwrap();
    assert_eq!(
        fed.inputs.single().unwrap().data_ptr() as usize,
        at,
        "no copy on the CPU"
    );
    assert_eq!(
        Vec::<f32>::try_from(fed.inputs.single().unwrap().flatten(0, -1)).unwrap(),
        [1.0, 2.0, 3.0, 4.0]
    );
}

#[test]
fn token_ids_reach_the_model_as_int64_and_value_targets_as_f32() {
    // Two samples of three ids, each with a [2] regression target.
    let ids = vec![3.0, 70_000.0, 16_777_216.0, 0.0, 1.0, 2.0];
    let data = kiln_data::InMemory::with_targets(
        ids,
        vec![3],
        kiln_data::TargetSpec::Values { shape: vec![2] },
        kiln_data::Targets::Values(vec![0.5, -1.5, 2.0, 4.0]),
    )
    .unwrap()
    .with_integer_features()
    .unwrap();
    let mut loader = Loader::new(
        Arc::new(data),
        kiln_data::LoaderConfig {
            batch_size: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let batch = DeviceFeeder::new(loader.epoch(0), Device::Cpu)
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(batch.inputs.single().unwrap().kind(), Kind::Int64);
    assert_eq!(
        Vec::<i64>::try_from(batch.inputs.single().unwrap().flatten(0, -1)).unwrap(),
        [3, 70_000, 16_777_216, 0, 1, 2]
    );
    assert_eq!(batch.targets.kind(), Kind::Float);
    assert_eq!(batch.targets.size(), [2, 2]);
    assert_eq!(
        Vec::<f32>::try_from(batch.targets.flatten(0, -1)).unwrap(),
        [0.5, -1.5, 2.0, 4.0]
    );
}
