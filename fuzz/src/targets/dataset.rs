//! `kiln-dataset.json`, a prepared dataset's manifest: opening the dataset it describes
//! (`ShardedDataset::open`: the manifest's checks, then every shard against it) and reading
//! its first samples by name. The shards are real ones `kiln data prepare` wrote: four
//! datasets (manifest versions 1 to 3, `.npy` and safetensors shards, one and several named
//! arrays, class and value targets) side by side, each manifest a seed naming its own files.

use std::path::{Path, PathBuf};

use kiln_data::{
    ColumnGroup, DType, Dataset, PrepareOptions, PrepareSource, ShardFormat, ShardedDataset,
    TargetSlot, TargetSpec,
};
use serde_json::Value;

use super::{npy_bytes, read, text, write};
use crate::{Grammar, Harness, Outcome, Target};

pub const TARGET: Target = Target {
    name: "dataset-manifest",
    about: "kiln-dataset.json bytes → ShardedDataset::open over real shards, then \
            read_arrays of its first samples",
    grammar: Grammar::Json,
    dictionary: &[
        b"\"kiln-dataset\"",
        b"\"version\"",
        b"\"samples\"",
        b"\"inputs\"",
        b"\"features\"",
        b"\"labels\"",
        b"\"targets\"",
        b"\"target\"",
        b"\"shards\"",
        b"\"files\"",
        b"\"name\"",
        b"\"dtype\"",
        b"\"shape\"",
        b"\"ids\"",
        b"\"task\"",
        b"\"classes\"",
        b"\"class_names\"",
        b"\"classification\"",
        b"\"dense_classification\"",
        b"\"regression\"",
        b"\"f32\"",
        b"\"i64\"",
        b"\"u8\"",
        b"\"bool\"",
        b"\"bf16\"",
        b"\"../kiln-dataset.json\"",
        b"\"/dev/zero\"",
        b"\"npy/shard-00000.features.npy\"",
        b"\"st/shard-00000.safetensors\"",
    ],
    fixup: None,
    make,
    selftest: false,
};

struct DatasetManifest {
    root: PathBuf,
    manifest: PathBuf,
    seeds: Vec<Vec<u8>>,
}

/// The sources of the fixture datasets: (directory name, source, shard format).
fn sources(scratch: &Path) -> Result<Vec<(&'static str, PrepareSource, ShardFormat)>, String> {
    let file = |name: &str, dtype: DType, shape: &[usize]| -> Result<PathBuf, String> {
        let path = scratch.join(name);
        write(&path, &npy_bytes(dtype, shape)?)?;
        Ok(path)
    };
    let csv = scratch.join("groups.csv");
    write(
        &csv,
        b"a,b,c,label\n1,2,0.5,cat\n3,4,1.5,dog\n5,6,2.5,cat\n",
    )?;
    Ok(vec![
        (
            "npy",
            PrepareSource::Npy {
                features: file("f.npy", DType::F32, &[6, 4])?,
                labels: file("l.npy", DType::I64, &[6])?,
            },
            ShardFormat::Npy,
        ),
        (
            "st",
            PrepareSource::NpyTargets {
                features: file("g.npy", DType::U8, &[5, 2, 2])?,
                targets: file("t.npy", DType::F32, &[5, 3])?,
                classes: None,
            },
            ShardFormat::Safetensors,
        ),
        (
            "arrays",
            PrepareSource::Arrays {
                inputs: vec![
                    ("x".into(), file("x.npy", DType::F16, &[7, 3])?),
                    ("ids".into(), file("ids.npy", DType::I32, &[7, 2])?),
                ],
                target: ("mask".into(), file("m.npy", DType::U8, &[7, 2, 2])?),
                classes: Some(3),
            },
            ShardFormat::Npy,
        ),
        (
            "csv",
            PrepareSource::CsvArrays {
                path: csv,
                inputs: vec![ColumnGroup {
                    name: "ab".into(),
                    columns: vec!["a".into(), "b".into()],
                }],
                target: ColumnGroup {
                    name: "label".into(),
                    columns: vec!["label".into()],
                },
                classes: None,
                delimiter: b',',
            },
            ShardFormat::Safetensors,
        ),
    ])
}

/// `manifest` with each shard file's name prefixed by `dir/`.
fn prefixed(manifest: &[u8], dir: &str) -> Result<Vec<u8>, String> {
    let mut v: Value = serde_json::from_slice(manifest).map_err(text)?;
    let prefix = |s: &mut Value| {
        if let Value::String(name) = s {
            *name = format!("{dir}/{name}");
        }
    };
    for shard in v["shards"].as_array_mut().into_iter().flatten() {
        for (key, value) in shard.as_object_mut().into_iter().flatten() {
            match key.as_str() {
                "files" => value
                    .as_object_mut()
                    .into_iter()
                    .flatten()
                    .for_each(|f| prefix(f.1)),
                "samples" => {}
                _ => prefix(value),
            }
        }
    }
    serde_json::to_vec_pretty(&v).map_err(text)
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    let root = scratch.join("datasets");
    std::fs::create_dir_all(&root).map_err(text)?;
    let mut seeds = vec![];
    for (name, source, format) in sources(scratch)? {
        let options = PrepareOptions {
            shard_samples: 3,
            format,
            integer_features: false,
        };
        let dir = root.join(name);
        kiln_data::prepare(&source, &dir, &options).map_err(text)?;
        seeds.push(prefixed(&read(&dir.join(kiln_data::MANIFEST_FILE))?, name)?);
    }
    Ok(Box::new(DatasetManifest {
        manifest: root.join(kiln_data::MANIFEST_FILE),
        root,
        seeds,
    }))
}

/// Reads the first samples of `dataset` by name, into slots sized as it describes them.
pub(crate) fn read_first(dataset: &dyn Dataset) -> Result<(), String> {
    let n = dataset.len().min(4);
    let indices: Vec<usize> = (0..n).collect();
    let mut inputs: Vec<Vec<u8>> = dataset
        .inputs()
        .iter()
        .map(|a| vec![0u8; n * a.numel() * a.dtype.model().size()])
        .collect();
    let mut slots: Vec<&mut [u8]> = inputs.iter_mut().map(Vec::as_mut_slice).collect();
    let target = dataset.target();
    let per = n * target.numel();
    let read = match target {
        TargetSpec::Classes { .. } => {
            dataset.read_arrays(&indices, &mut slots, TargetSlot::Classes(&mut vec![0; per]))
        }
        TargetSpec::Values { .. } => dataset.read_arrays(
            &indices,
            &mut slots,
            TargetSlot::Values(&mut vec![0.0; per]),
        ),
    };
    read.map_err(text)
}

impl Harness for DatasetManifest {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        write(&self.manifest, input)?;
        let dataset = ShardedDataset::open(&self.root).map_err(text)?;
        read_first(&dataset)
    }
}
