//! A dataset of named arrays through `Trainer::fit`: a model that reads by name gets every
//! array, in the dataset's order, as a tensor of the type it reaches the model as (f16 kept,
//! integers as int64, bools as bool, f64 as f32), with the stored values, batch by batch.

use std::cell::RefCell;
use std::sync::Arc;

use half::f16;
use kiln_data::{
    DType, LoaderConfig, PrepareOptions, PrepareSource, SamplerConfig, ShardFormat, ShardedDataset,
    prepare, write_npy,
};
use kiln_train::TrainError;
use kiln_train::inputs::Inputs;
use kiln_train::model::Model;
use kiln_train::record::Silent;
use kiln_train::trainer::{FitData, FitOptions, TrainSettings, Trainer};
use tch::{Device, Kind, Tensor, nn};

const N: usize = 6;

/// One input as a model saw it: its name, kind and values.
type Seen = (String, Kind, Vec<f64>);

/// A linear model on `w` that records every batch of inputs it is given.
struct Recorder {
    weight: Tensor,
    seen: RefCell<Vec<Vec<Seen>>>,
}

impl Model for Recorder {
    fn forward(&self, _: &Tensor, _: bool) -> Result<Tensor, TrainError> {
        unreachable!("a model that reads by name gets forward_inputs")
    }

    fn reads_by_name(&self) -> bool {
        true
    }

    fn check_inputs(&self, _: &[kiln_data::ArraySpec]) -> Result<(), TrainError> {
        Ok(())
    }

    fn forward_inputs(&self, inputs: &Inputs, _: bool) -> Result<Tensor, TrainError> {
        let batch = inputs
            .iter()
            .map(|(n, t)| {
                let values = Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap();
                (n.to_owned(), t.kind(), values)
            })
            .collect();
        self.seen.borrow_mut().push(batch);
        Ok(inputs.get("w").unwrap().matmul(&self.weight))
    }
}

/// Element `j` of sample `i` of array `name`, exact in every type used.
fn value(name: &str, i: usize, j: usize) -> f64 {
    match name {
        "h" => i as f64 * 0.5 - j as f64,
        "ids" => (i * 3 + j) as f64 * 1000.0 - 5000.0,
        "m" => ((i + j) % 2) as f64,
        _ => i as f64 * 0.25 + j as f64, // w and y
    }
}

fn array(
    dir: &std::path::Path,
    name: &str,
    dtype: DType,
    per: usize,
) -> (String, std::path::PathBuf) {
    let bytes: Vec<u8> = (0..N)
        .flat_map(|i| (0..per).map(move |j| value(name, i, j)))
        .flat_map(|v| match dtype {
            DType::F16 => f16::from_f64(v).to_le_bytes().to_vec(),
            DType::I32 => (v as i32).to_le_bytes().to_vec(),
            DType::Bool => vec![v as u8],
            DType::F64 => v.to_le_bytes().to_vec(),
            _ => (v as f32).to_le_bytes().to_vec(),
        })
        .collect();
    let path = dir.join(format!("{name}.npy"));
    write_npy(&path, dtype, &[N, per], &bytes).unwrap();
    (name.to_owned(), path)
}

#[test]
fn named_arrays_reach_a_model_that_reads_by_name_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let source = PrepareSource::Arrays {
        inputs: vec![
            array(dir, "h", DType::F16, 2),
            array(dir, "ids", DType::I32, 3),
            array(dir, "m", DType::Bool, 2),
            array(dir, "w", DType::F64, 1),
        ],
        target: array(dir, "y", DType::F32, 1),
        classes: None,
    };
    let out = dir.join("ds");
    let options = PrepareOptions {
        shard_samples: 4,
        format: ShardFormat::Npy,
        ..PrepareOptions::default()
    };
    prepare(&source, &out, &options).unwrap();
    let data = Arc::new(ShardedDataset::open(&out).unwrap());

    let vs = nn::VarStore::new(Device::Cpu);
    let model = Recorder {
        weight: vs.root().ones("weight", &[1, 1]),
        seen: RefCell::new(vec![]),
    };
    // One epoch of kiln's defaults: what the model is given is all this test looks at.
    let settings = TrainSettings {
        epochs: 1,
        ..TrainSettings::default()
    };
    let mut trainer = Trainer::new(&model, "recorder", &vs, settings, Device::Cpu).unwrap();
    let loader = LoaderConfig {
        batch_size: 4,
        sampler: SamplerConfig::default(),
        ..LoaderConfig::default()
    };
    let fit = FitData::<ShardedDataset, ShardedDataset> {
        train: data,
        val: None,
        loader,
        workers_auto: false,
    };
    let summary = trainer
        .fit(fit, &mut Silent, FitOptions::default())
        .unwrap();
    assert_eq!(summary.steps, 2, "6 samples in batches of 4 and 2");

    let seen = model.seen.borrow();
    assert_eq!(seen.len(), 2);
    let want = [
        ("h", Kind::Half, 2),
        ("ids", Kind::Int64, 3),
        ("m", Kind::Bool, 2),
        ("w", Kind::Float, 1),
    ];
    for (k, batch) in seen.iter().enumerate() {
        assert_eq!(batch.len(), 4);
        let samples = k * 4..(k * 4 + 4).min(N);
        for ((name, kind, values), (want_name, want_kind, per)) in batch.iter().zip(want) {
            assert_eq!((name.as_str(), *kind), (want_name, want_kind));
            let expected: Vec<f64> = samples
                .clone()
                .flat_map(|i| (0..per).map(move |j| value(want_name, i, j)))
                .collect();
            assert_eq!(values, &expected, "batch {k} {name}");
        }
    }
}
