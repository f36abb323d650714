//! Datasets of several named arrays (manifest version 3): `prepare` keeps each array's type and
//! per-sample shape, `read_arrays` delivers them by name in the model's types (floating kept but
//! f64 as f32, integers as i64, booleans as bool) one read per run, and every inconsistency
//! (sample counts, names, shard files) is an error naming the file or key at fault. The loader
//! reads batches by name the same way, with and without workers, whole or in parts.

use std::path::{Path, PathBuf};

use half::f16;
use std::sync::Arc;

use kiln_data::{
    DType, Dataset, InMemory, Loader, LoaderConfig, MANIFEST_FILE, Normalize, PrepareOptions,
    PrepareSource, SamplerConfig, ShardFormat, ShardedDataset, Subset, TargetSlot, Transformed,
    prepare, write_npy,
};

const N: usize = 9;

/// One named test array: its stored type, per-sample shape, and element `j` of sample `i` as
/// an `f64` (exactly representable in every type used).
struct Spec {
    name: &'static str,
    dtype: DType,
    shape: &'static [usize],
}

const INPUTS: [Spec; 6] = [
    Spec {
        name: "x",
        dtype: DType::F32,
        shape: &[3],
    },
    Spec {
        name: "cat",
        dtype: DType::I16,
        shape: &[2],
    },
    Spec {
        name: "length",
        dtype: DType::U8,
        shape: &[],
    },
    Spec {
        name: "mask",
        dtype: DType::Bool,
        shape: &[2, 2],
    },
    Spec {
        name: "half",
        dtype: DType::F16,
        shape: &[2],
    },
    Spec {
        name: "wide",
        dtype: DType::F64,
        shape: &[1],
    },
];

fn value(name: &str, i: usize, j: usize) -> f64 {
    let (i, j) = (i as f64, j as f64);
    match name {
        "x" => i * 3.0 + j * 0.5,
        "cat" => i * 7.0 - 30.0 + j,
        "length" => i + 200.0,
        "mask" => ((i as usize + j as usize) % 2) as f64,
        "half" => i * 0.25 - j,
        "wide" => i * 1.5 - 4.0,
        _ => i * 10.0 + j + 0.5, // the target
    }
}

/// `value`'s elements of `name` for samples `indices`, as little-endian bytes of `dtype`.
fn bytes(name: &str, dtype: DType, numel: usize, indices: &[usize]) -> Vec<u8> {
    let values = indices
        .iter()
        .flat_map(|&i| (0..numel).map(move |j| value(name, i, j)));
    values
        .flat_map(|v| match dtype {
            DType::F64 => v.to_le_bytes().to_vec(),
            DType::F32 => (v as f32).to_le_bytes().to_vec(),
            DType::F16 => f16::from_f64(v).to_le_bytes().to_vec(),
            DType::I64 => (v as i64).to_le_bytes().to_vec(),
            DType::I16 => (v as i16).to_le_bytes().to_vec(),
            DType::U8 | DType::Bool => vec![v as u8],
            other => unreachable!("{other} is not used here"),
        })
        .collect()
}

fn write(dir: &Path, name: &str, dtype: DType, shape: &[usize], samples: usize) -> PathBuf {
    let path = dir.join(format!("{name}.npy"));
    let numel = shape.iter().product();
    let all: Vec<usize> = (0..samples).collect();
    let mut full = vec![samples];
    full.extend_from_slice(shape);
    write_npy(&path, dtype, &full, &bytes(name, dtype, numel, &all)).unwrap();
    path
}

/// The six inputs and a target `y` (f32 `[2]`) as `.npy` files in `dir`.
fn arrays_source(dir: &Path) -> PrepareSource {
    let inputs = INPUTS
        .iter()
        .map(|s| (s.name.to_owned(), write(dir, s.name, s.dtype, s.shape, N)))
        .collect();
    let target = ("y".to_owned(), write(dir, "y", DType::F32, &[2], N));
    PrepareSource::Arrays {
        inputs,
        target,
        classes: None,
    }
}

fn options(format: ShardFormat) -> PrepareOptions {
    PrepareOptions {
        shard_samples: 4,
        format,
        ..PrepareOptions::default()
    }
}

fn prepared(format: ShardFormat) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ds");
    prepare(&arrays_source(tmp.path()), &out, &options(format)).unwrap();
    (tmp, out)
}

/// Reads `indices` by name: one buffer per input, and the targets.
fn read(ds: &ShardedDataset, indices: &[usize]) -> (Vec<Vec<u8>>, Vec<f32>) {
    let mut inputs: Vec<Vec<u8>> = ds
        .inputs()
        .iter()
        .map(|a| vec![0xAA; indices.len() * a.numel() * a.dtype.model().size()])
        .collect();
    let mut targets = vec![f32::NAN; indices.len() * 2];
    let mut slots: Vec<&mut [u8]> = inputs.iter_mut().map(Vec::as_mut_slice).collect();
    ds.read_arrays(indices, &mut slots, TargetSlot::Values(&mut targets))
        .unwrap();
    (inputs, targets)
}

#[test]
fn named_arrays_keep_their_types_and_shapes_and_reach_the_model_by_name() {
    for format in [ShardFormat::Safetensors, ShardFormat::Npy] {
        let (_tmp, dir) = prepared(format);
        for release in [true, false] {
            let ds = ShardedDataset::open(&dir)
                .unwrap()
                .with_release_pages(release);
            let m = ds.manifest();
            assert_eq!((m.version, m.samples, m.shards.len()), (3, N, 3));
            assert_eq!(m.target.name(), "y");
            for (a, s) in m.inputs.iter().zip(&INPUTS) {
                assert_eq!(
                    (a.name.as_str(), a.dtype, &a.shape[..]),
                    (s.name, s.dtype, s.shape)
                );
            }
            // Runs inside and across shards (of 4), a repeat, a descending order, one, none.
            for indices in [vec![0, 1, 2, 3, 4, 5], vec![8, 7, 7, 2], vec![5], vec![]] {
                let (inputs, targets) = read(&ds, &indices);
                for (got, s) in inputs.iter().zip(&INPUTS) {
                    let numel = s.shape.iter().product();
                    let want = bytes(s.name, s.dtype.model(), numel, &indices);
                    assert_eq!(got, &want, "{format:?} {} {indices:?}", s.name);
                }
                let want = bytes("y", DType::F32, 2, &indices);
                assert_eq!(bytemuck::cast_slice::<f32, u8>(&targets), &want[..]);
            }
        }
    }
}

#[test]
fn model_types_are_f32_f16_i64_and_bool() {
    let models: Vec<DType> = INPUTS.iter().map(|s| s.dtype.model()).collect();
    assert_eq!(
        models,
        [
            DType::F32,
            DType::I64,
            DType::I64,
            DType::Bool,
            DType::F16,
            DType::F32
        ]
    );
}

#[test]
fn one_features_array_and_its_targets_still_make_a_version_2_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let source = PrepareSource::Arrays {
        inputs: vec![(
            "features".into(),
            write(tmp.path(), "x", DType::F32, &[3], N),
        )],
        target: (
            "targets".into(),
            write(tmp.path(), "y", DType::F32, &[2], N),
        ),
        classes: None,
    };
    let out = tmp.path().join("ds");
    let m = prepare(&source, &out, &options(ShardFormat::Npy)).unwrap();
    assert_eq!(m.version, 2);
    let text = std::fs::read_to_string(out.join(MANIFEST_FILE)).unwrap();
    assert!(
        text.contains("\"features\": \"shard-00000.features.npy\"") && !text.contains("inputs"),
        "{text}"
    );
    let ds = ShardedDataset::open(&out).unwrap();
    let mut features = vec![0f32; 3];
    let mut target = vec![0f32; 2];
    ds.read_sample(4, &mut features, TargetSlot::Values(&mut target))
        .unwrap();
    assert_eq!(
        bytemuck::cast_slice::<f32, u8>(&features),
        bytes("x", DType::F32, 3, &[4])
    );

    // A bool array is new in version 3: the same names with a mask make a version-3 dataset.
    let source = PrepareSource::Arrays {
        inputs: vec![(
            "features".into(),
            write(tmp.path(), "mask", DType::Bool, &[3], N),
        )],
        target: (
            "targets".into(),
            write(tmp.path(), "y", DType::F32, &[2], N),
        ),
        classes: None,
    };
    let m = prepare(
        &source,
        &tmp.path().join("bools"),
        &options(ShardFormat::Npy),
    )
    .unwrap();
    assert_eq!(m.version, 3);
}

#[test]
fn a_dataset_of_several_arrays_is_not_read_as_one_features_array() {
    let (_tmp, dir) = prepared(ShardFormat::Safetensors);
    let ds = ShardedDataset::open(&dir).unwrap();
    let mut features = vec![0f32; 3 * 2];
    let mut target = vec![0f32; 2 * 2];
    let e = ds
        .read_batch(&[0, 1], &mut features, TargetSlot::Values(&mut target))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("6 named arrays (x, cat, length, mask, half, wide)")
            && e.contains("read_arrays"),
        "{e}"
    );
}

#[test]
fn slots_of_the_wrong_size_are_named() {
    let (_tmp, dir) = prepared(ShardFormat::Safetensors);
    let ds = ShardedDataset::open(&dir).unwrap();
    let mut inputs: Vec<Vec<u8>> = ds.inputs().iter().map(|_| vec![0; 4]).collect();
    let mut slots: Vec<&mut [u8]> = inputs.iter_mut().map(Vec::as_mut_slice).collect();
    let mut targets = vec![0f32; 4];
    let e = ds
        .read_arrays(&[0, 1], &mut slots, TargetSlot::Values(&mut targets))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("x, cat, length") && e.contains("[24, 32, 16, 8, 8, 8]"),
        "{e}"
    );
}

fn prepare_err(source: &PrepareSource, dir: &Path) -> String {
    let out = dir.join("bad");
    let e = prepare(source, &out, &options(ShardFormat::Safetensors))
        .unwrap_err()
        .to_string();
    assert!(!out.exists(), "a failed prepare leaves nothing: {e}");
    e
}

#[test]
fn arrays_of_different_sample_counts_bad_names_and_duplicates_are_refused_by_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let x = write(dir, "x", DType::F32, &[3], N);
    let short = write(dir, "cat", DType::I16, &[2], N - 1);
    let y = ("y".to_owned(), write(dir, "y", DType::F32, &[2], N));
    let arrays = |inputs: Vec<(&str, &PathBuf)>, target| PrepareSource::Arrays {
        inputs: inputs
            .into_iter()
            .map(|(n, p)| (n.to_owned(), p.clone()))
            .collect(),
        target,
        classes: None,
    };
    let e = prepare_err(&arrays(vec![("x", &x), ("cat", &short)], y.clone()), dir);
    assert!(
        e.contains("cat.npy")
            && e.contains(&format!("holds {} samples", N - 1))
            && e.contains("x.npy holds 9"),
        "{e}"
    );
    let e = prepare_err(&arrays(vec![("x", &x), ("2nd", &x)], y.clone()), dir);
    assert!(
        e.contains("`2nd`") && e.contains("not a valid array name"),
        "{e}"
    );
    let e = prepare_err(&arrays(vec![("x", &x)], ("x".into(), y.1.clone())), dir);
    assert!(
        e.contains("y.npy") && e.contains("`x`") && e.contains("unique"),
        "{e}"
    );
    let e = prepare_err(&arrays(vec![], y.clone()), dir);
    assert!(e.contains("no input array"), "{e}");
    let two = arrays(vec![("x", &x), ("w", &x)], y);
    let e = prepare(
        &two,
        &dir.join("ids"),
        &PrepareOptions {
            integer_features: true,
            ..options(ShardFormat::Npy)
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("integer_features") && e.contains("int64"), "{e}");
}

#[test]
fn inconsistent_version_3_manifests_are_named() {
    let (_tmp, dir) = prepared(ShardFormat::Npy);
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let cases = [
        (
            "\"cat\": \"shard-00001.cat.npy\",",
            "",
            "`shards[1].files` has no file for array `cat`",
        ),
        (
            "\"cat\": \"shard-00001.cat.npy\"",
            "\"dog\": \"shard-00001.cat.npy\", \"cat\": \"shard-00001.cat.npy\"",
            "`shards[1].files` names `dog`",
        ),
        (
            "\"name\": \"half\"",
            "\"name\": \"x\"",
            "`inputs[4].name` \"x\" is already the name of `inputs[0]`",
        ),
        (
            "\"name\": \"y\"",
            "\"name\": \"wide\"",
            "`target.name` \"wide\" is already the name of `inputs[5]`",
        ),
        (
            "\"name\": \"cat\"",
            "\"name\": \"X\"",
            "`inputs[1].name` \"X\" is already the name of `inputs[0]`",
        ),
        (
            "\"name\": \"mask\"",
            "\"name\": \"a mask\"",
            "`inputs[3].name` \"a mask\" is not a valid array name",
        ),
        ("\"name\": \"y\",", "", "`target.name` is missing"),
    ];
    for (from, to, want) in cases {
        assert!(text.contains(from), "{from} in {text}");
        std::fs::write(&path, text.replace(from, to)).unwrap();
        let e = ShardedDataset::open(&dir).unwrap_err().to_string();
        assert!(e.contains(MANIFEST_FILE) && e.contains(want), "{want}: {e}");
    }
    // A shard whose array disagrees with the manifest names the file and the array.
    std::fs::write(&path, &text).unwrap();
    write_npy(
        &dir.join("shard-00002.cat.npy"),
        DType::I32,
        &[1, 2],
        &[0; 8],
    )
    .unwrap();
    let e = ShardedDataset::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("shard-00002.cat.npy") && e.contains("the values of array `cat` are i32"),
        "{e}"
    );
}

fn by_name(batch_size: usize, num_workers: usize, inline_threads: usize) -> LoaderConfig {
    LoaderConfig {
        batch_size,
        num_workers,
        sampler: SamplerConfig {
            shuffle: true,
            seed: 3,
            ..SamplerConfig::default()
        },
        inline_threads,
        by_name: true,
        ..LoaderConfig::default()
    }
}

#[test]
fn the_loader_reads_batches_by_name_with_and_without_workers() {
    let (_tmp, dir) = prepared(ShardFormat::Safetensors);
    let ds = Arc::new(ShardedDataset::open(&dir).unwrap());
    for (workers, inline) in [(0, 1), (0, 3), (2, 1)] {
        let mut loader = Loader::new(Arc::clone(&ds), by_name(4, workers, inline)).unwrap();
        let mut seen = vec![];
        for batch in loader.epoch(1) {
            let batch = batch.unwrap();
            let n = batch.indices.len();
            assert!(batch.features.is_empty() && batch.shape == [n]);
            assert_eq!(batch.arrays.len(), INPUTS.len());
            for (a, s) in batch.arrays.iter().zip(&INPUTS) {
                assert_eq!((a.name.as_str(), a.dtype), (s.name, s.dtype.model()));
                assert_eq!(a.shape, [&[n][..], s.shape].concat());
                let numel = s.shape.iter().product();
                let want = bytes(s.name, s.dtype.model(), numel, &batch.indices);
                assert_eq!(
                    a.data, want,
                    "{workers} workers {inline} threads {}",
                    s.name
                );
            }
            let want = bytes("y", DType::F32, 2, &batch.indices);
            let kiln_data::Targets::Values(got) = &batch.targets else {
                panic!("value targets")
            };
            assert_eq!(bytemuck::cast_slice::<f32, u8>(got), &want[..]);
            seen.extend(batch.indices);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..N).collect::<Vec<_>>());
    }
}

#[test]
fn a_split_of_named_arrays_reads_by_name_through_its_indices() {
    let (_tmp, dir) = prepared(ShardFormat::Npy);
    let ds = Arc::new(ShardedDataset::open(&dir).unwrap());
    let (train, val) = Subset::split(ds, 0.3, 5).unwrap();
    for part in [train, val] {
        let want: Vec<usize> = part.indices().to_vec();
        let mut loader = Loader::new(Arc::new(part), by_name(16, 0, 1)).unwrap();
        let batch = loader.epoch(0).next().unwrap().unwrap();
        let inner: Vec<usize> = batch.indices.iter().map(|&i| want[i]).collect();
        assert_eq!(batch.arrays[1].data, bytes("cat", DType::I64, 2, &inner));
    }
}

#[test]
fn a_dataset_of_one_features_array_reads_by_name_as_f32_or_int64_ids() {
    let features: Vec<f32> = (0..12).map(|v| v as f32 * 0.5).collect();
    let data = InMemory::new(features.clone(), vec![0, 1, 0, 1], vec![3]).unwrap();
    let mut loader = Loader::new(Arc::new(data.clone()), by_name(4, 0, 1)).unwrap();
    let batch = loader.epoch(0).next().unwrap().unwrap();
    let [a] = &batch.arrays[..] else {
        panic!("one array: {:?}", batch.arrays)
    };
    assert_eq!(
        (a.name.as_str(), a.dtype, &a.shape[..]),
        ("features", DType::F32, &[4, 3][..])
    );
    let want: Vec<f32> = batch
        .indices
        .iter()
        .flat_map(|&i| features[i * 3..i * 3 + 3].to_vec())
        .collect();
    assert_eq!(a.data, bytemuck::cast_slice::<f32, u8>(&want));

    // Normalized: the transformed f32 values, under the inner array's name.
    let norm = Normalize::fit(&data, 4).unwrap();
    let normalized = Arc::new(Transformed::new(data, norm));
    let mut plain = normalized.target().batch(2);
    let mut values = vec![0f32; 6];
    normalized
        .read_batch(&[2, 0], &mut values, plain.all())
        .unwrap();
    let mut out = vec![0u8; 24];
    let mut targets = normalized.target().batch(2);
    normalized
        .read_arrays(&[2, 0], &mut [&mut out[..]], targets.all())
        .unwrap();
    assert_eq!(out, bytemuck::cast_slice::<f32, u8>(&values));
}

#[test]
fn a_transform_over_several_named_arrays_is_refused_by_name() {
    let (_tmp, dir) = prepared(ShardFormat::Safetensors);
    let ds = ShardedDataset::open(&dir).unwrap();
    let numbers = InMemory::new(vec![0.0; 6], vec![0, 1], vec![3]).unwrap();
    let transformed = Transformed::new(ds, Normalize::fit(&numbers, 2).unwrap());
    let mut loader = Loader::new(Arc::new(transformed), by_name(4, 0, 1)).unwrap();
    let e = loader.epoch(0).next().unwrap().unwrap_err().to_string();
    assert!(
        e.contains("transform") && e.contains("x, cat, length, mask, half, wide"),
        "{e}"
    );
}

/// Named arrays whose sample 5 cannot be read: reading it panics.
struct Corrupt(ShardedDataset);

impl Dataset for Corrupt {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn sample_shape(&self) -> &[usize] {
        self.0.sample_shape()
    }

    fn target(&self) -> kiln_data::TargetSpec {
        self.0.target()
    }

    fn inputs(&self) -> Vec<kiln_data::ArraySpec> {
        self.0.inputs()
    }

    fn read_arrays(
        &self,
        indices: &[usize],
        inputs: &mut [&mut [u8]],
        targets: TargetSlot<'_>,
    ) -> Result<(), kiln_data::DataError> {
        assert!(!indices.contains(&5), "corrupt record");
        self.0.read_arrays(indices, inputs, targets)
    }
}

#[test]
fn a_panic_reading_by_name_names_the_sample() {
    let (_tmp, dir) = prepared(ShardFormat::Safetensors);
    for workers in [0, 2] {
        let config = LoaderConfig {
            sampler: SamplerConfig::default(),
            ..by_name(4, workers, 1)
        };
        let mut loader = Loader::new(
            Arc::new(Corrupt(ShardedDataset::open(&dir).unwrap())),
            config,
        )
        .unwrap();
        let e = loader
            .epoch(0)
            .find_map(Result::err)
            .expect("the batch of sample 5 fails")
            .to_string();
        assert!(
            e.contains("sample 5") && e.contains("corrupt record"),
            "{e}"
        );
    }
}

fn groups(spec: &[(&str, &[&str])]) -> Vec<kiln_data::ColumnGroup> {
    spec.iter()
        .map(|(name, columns)| kiln_data::ColumnGroup {
            name: (*name).to_owned(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
        })
        .collect()
}

fn csv_arrays(path: &Path, inputs: &[(&str, &[&str])], target: (&str, &[&str])) -> PrepareSource {
    PrepareSource::CsvArrays {
        path: path.to_owned(),
        inputs: groups(inputs),
        target: groups(&[target]).remove(0),
        classes: None,
        delimiter: b',',
    }
}

fn with_classes(n: usize, mut source: PrepareSource) -> PrepareSource {
    if let PrepareSource::CsvArrays { classes, .. } = &mut source {
        *classes = Some(n);
    }
    source
}

const SALES: &str = "store,day,temp,humidity,kind,sold\n\
                     3,1,20.5,0.25,cake,4\n\
                     1,2,18,0.5,bread,7.5\n\
                     2,3,-1.25,1,cake,0\n";

#[test]
fn csv_column_groups_become_named_arrays_of_integers_or_reals() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("sales.csv");
    std::fs::write(&csv, SALES).unwrap();
    let out = tmp.path().join("ds");
    let inputs: [(&str, &[&str]); 2] =
        [("cat", &["store", "day"]), ("cont", &["temp", "humidity"])];
    let m = prepare(
        &csv_arrays(&csv, &inputs, ("kind", &["kind"])),
        &out,
        &options(ShardFormat::Npy),
    )
    .unwrap();
    let specs: Vec<_> = m
        .inputs
        .iter()
        .map(|a| (a.name.as_str(), a.dtype, a.shape.clone()))
        .collect();
    assert_eq!(
        specs,
        [("cat", DType::I64, vec![2]), ("cont", DType::F32, vec![2])]
    );
    assert_eq!((m.target.name(), m.target.classes), ("kind", Some(2)));
    assert_eq!(
        m.target.class_names,
        Some(vec!["bread".to_owned(), "cake".to_owned()])
    );
    let ds = ShardedDataset::open(&out).unwrap();
    let (mut cat, mut cont, mut kind) = (vec![0u8; 48], vec![0u8; 24], vec![0i64; 3]);
    ds.read_arrays(
        &[0, 1, 2],
        &mut [&mut cat[..], &mut cont[..]],
        TargetSlot::Classes(&mut kind),
    )
    .unwrap();
    assert_eq!(
        bytemuck::pod_read_unaligned::<[i64; 6]>(&cat),
        [3, 1, 1, 2, 2, 3]
    );
    assert_eq!(
        bytemuck::pod_read_unaligned::<[f32; 6]>(&cont),
        [20.5, 0.25, 18.0, 0.5, -1.25, 1.0]
    );
    assert_eq!(kind, [1, 0, 1]);

    // A real-valued target column is a regression value per row.
    let out = tmp.path().join("sold");
    let m = prepare(
        &csv_arrays(&csv, &inputs, ("sold", &["sold"])),
        &out,
        &options(ShardFormat::Npy),
    )
    .unwrap();
    assert_eq!(
        (m.target.dtype, m.target.classes, &m.target.shape[..]),
        (DType::F32, None, &[][..])
    );
}

#[test]
fn bad_csv_column_groups_are_named_by_file_line_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("sales.csv");
    std::fs::write(&csv, SALES).unwrap();
    let bad = tmp.path().join("bad.csv");
    std::fs::write(&bad, "a,b,y\n1,x,0.5\n2,3,inf\n").unwrap();
    let cont: (&str, &[&str]) = ("cont", &["temp"]);
    let cases: Vec<(PrepareSource, &str)> = vec![
        (
            csv_arrays(&csv, &[("x", &["tmp"])], ("kind", &["kind"])),
            "no column `tmp` (for array `x`; its columns: store, day",
        ),
        (
            csv_arrays(
                &csv,
                &[("x", &["temp"]), ("w", &["temp"])],
                ("kind", &["kind"]),
            ),
            "column `temp` is given to both `x` and `w`",
        ),
        (
            csv_arrays(&csv, &[cont], ("cont2", &["kind", "day"])),
            "class names need a single target column",
        ),
        (
            csv_arrays(&csv, &[("x y", &["temp"])], ("kind", &["kind"])),
            "array `x y` is not a valid array name",
        ),
        (
            csv_arrays(&csv, &[cont], ("cont", &["kind"])),
            "array `cont` is given twice",
        ),
        (
            csv_arrays(&bad, &[("ab", &["a", "b"])], ("y", &["y"])),
            "line 2, column `b`: `x` is not a number",
        ),
        (
            csv_arrays(&bad, &[("a", &["a"])], ("y", &["y"])),
            "line 3, column `y`: target `inf` is not a finite number",
        ),
        (
            with_classes(3, csv_arrays(&csv, &[cont], ("sold", &["sold"]))),
            "real values, which are regression targets, but a class count (3)",
        ),
        (
            with_classes(2, csv_arrays(&csv, &[cont], ("store", &["store"]))),
            "line 2, column `store`: class 3 is outside 0..2",
        ),
    ];
    for (source, want) in cases {
        let e = prepare_err(&source, tmp.path());
        assert!(e.contains("csv") && e.contains(want), "{want}: {e}");
    }
}
