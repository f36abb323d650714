//! Targets of any fixed per-sample shape: regression values and class maps go through `prepare`,
//! the shards and the loader unchanged; version-1 datasets still open; bad targets and integer
//! ids are named by file and sample.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_data::{
    CsvDataset, CsvOptions, DType, Dataset, InMemory, Loader, LoaderConfig, MANIFEST_FILE,
    Manifest, PrepareOptions, PrepareSource, SamplerConfig, ShardFormat, ShardedDataset,
    TargetSlot, TargetSpec, Targets, Task, prepare, write_npy,
};

const N: usize = 7;

fn f32_le(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn feature(i: usize, j: usize) -> f32 {
    i as f32 * 3.0 + j as f32 * 0.5
}

/// `x.npy`: f32 `[N, 3]`, sample i element j = `feature(i, j)`.
fn features_npy(dir: &Path) -> PathBuf {
    let values: Vec<f32> = (0..N)
        .flat_map(|i| (0..3).map(move |j| feature(i, j)))
        .collect();
    let path = dir.join("x.npy");
    write_npy(&path, DType::F32, &[N, 3], &f32_le(&values)).unwrap();
    path
}

fn horizon(i: usize, h: usize) -> f32 {
    i as f32 * 10.0 + h as f32 + 0.25
}

fn mask(i: usize, r: usize, c: usize) -> u8 {
    ((i + 2 * r + c) % 3) as u8
}

fn source(features: PathBuf, targets: PathBuf, classes: Option<usize>) -> PrepareSource {
    PrepareSource::NpyTargets {
        features,
        targets,
        classes,
    }
}

fn options(format: ShardFormat) -> PrepareOptions {
    PrepareOptions {
        shard_samples: 3,
        format,
        ..PrepareOptions::default()
    }
}

fn loader<D: Dataset>(ds: D) -> Loader<D> {
    let config = LoaderConfig {
        batch_size: 3,
        num_workers: 2,
        sampler: SamplerConfig {
            shuffle: true,
            seed: 4,
            ..SamplerConfig::default()
        },
        ..LoaderConfig::default()
    };
    Loader::new(Arc::new(ds), config).unwrap()
}

fn prepare_err(source: &PrepareSource, dir: &Path) -> String {
    prepare(source, &dir.join("out"), &PrepareOptions::default())
        .expect_err("prepare should fail")
        .to_string()
}

#[test]
fn regression_targets_of_a_horizon_round_trip_through_shards_and_the_loader() {
    for (format, dtype) in [
        (ShardFormat::Safetensors, DType::F32),
        (ShardFormat::Npy, DType::F64),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let y = tmp.path().join("y.npy");
        let values: Vec<f64> = (0..N)
            .flat_map(|i| (0..4).map(move |h| f64::from(horizon(i, h))))
            .collect();
        let bytes: Vec<u8> = match dtype {
            DType::F64 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => f32_le(&values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        };
        write_npy(&y, dtype, &[N, 4], &bytes).unwrap();
        let out = tmp.path().join("ds");
        let src = source(features_npy(tmp.path()), y, None);
        let m = prepare(&src, &out, &options(format)).unwrap();
        assert_eq!(
            (
                m.version,
                m.target.task,
                m.target.dtype,
                &m.target.shape[..]
            ),
            (2, Task::Regression, dtype, &[4][..])
        );
        assert_eq!(m.target.classes, None);

        let ds = ShardedDataset::open(&out).unwrap();
        assert_eq!(ds.target(), TargetSpec::Values { shape: vec![4] });
        assert_eq!(ds.classes(), None);
        let e = ds.read(0, &mut [0.0; 3]).unwrap_err().to_string();
        assert!(e.contains("read_sample"), "{e}");

        let mut seen = 0;
        for batch in loader(ds).epoch(0) {
            let batch = batch.unwrap();
            let k = batch.indices.len();
            assert_eq!(batch.target_shape, [k, 4]);
            let Targets::Values(got) = &batch.targets else {
                panic!("value targets expected, got {:?}", batch.targets)
            };
            for (b, &i) in batch.indices.iter().enumerate() {
                let want: Vec<f32> = (0..4).map(|h| horizon(i, h)).collect();
                assert_eq!(&got[b * 4..b * 4 + 4], &want[..], "{format:?} sample {i}");
                assert_eq!(batch.features[b * 3 + 2], feature(i, 2));
            }
            seen += k;
        }
        assert_eq!(seen, N);
    }
}

fn write_masks(path: &Path, bad: Option<(usize, usize, usize, u8)>) {
    let mut bytes: Vec<u8> = (0..N)
        .flat_map(|i| (0..2).flat_map(move |r| (0..3).map(move |c| mask(i, r, c))))
        .collect();
    if let Some((i, r, c, v)) = bad {
        bytes[i * 6 + r * 3 + c] = v;
    }
    write_npy(path, DType::U8, &[N, 2, 3], &bytes).unwrap();
}

#[test]
fn class_maps_round_trip_as_dense_classification() {
    for format in [ShardFormat::Safetensors, ShardFormat::Npy] {
        let tmp = tempfile::tempdir().unwrap();
        let y = tmp.path().join("masks.npy");
        write_masks(&y, None);
        let out = tmp.path().join("ds");
        let m = prepare(
            &source(features_npy(tmp.path()), y, None),
            &out,
            &options(format),
        )
        .unwrap();
        assert_eq!(
            (
                m.target.task,
                m.target.dtype,
                &m.target.shape[..],
                m.target.classes
            ),
            (Task::DenseClassification, DType::U8, &[2, 3][..], Some(3))
        );
        let ds = ShardedDataset::open(&out).unwrap();
        assert_eq!(
            ds.target(),
            TargetSpec::Classes {
                classes: 3,
                shape: vec![2, 3]
            }
        );
        let mut seen = 0;
        for batch in loader(ds).epoch(1) {
            let batch = batch.unwrap();
            let k = batch.indices.len();
            assert_eq!(batch.target_shape, [k, 2, 3]);
            let got = batch.targets.classes().expect("class targets");
            for (b, &i) in batch.indices.iter().enumerate() {
                let want: Vec<i64> = (0..2)
                    .flat_map(|r| (0..3).map(move |c| i64::from(mask(i, r, c))))
                    .collect();
                assert_eq!(&got[b * 6..b * 6 + 6], &want[..], "{format:?} sample {i}");
            }
            seen += k;
        }
        assert_eq!(seen, N);
    }

    // A class count given explicitly is kept (classes absent from the data still count).
    let tmp = tempfile::tempdir().unwrap();
    let y = tmp.path().join("masks.npy");
    write_masks(&y, None);
    let out = tmp.path().join("ds");
    let m = prepare(
        &source(features_npy(tmp.path()), y, Some(5)),
        &out,
        &options(ShardFormat::Npy),
    )
    .unwrap();
    assert_eq!(m.target.classes, Some(5));
}

#[test]
fn an_out_of_range_or_negative_class_in_a_mask_is_named_by_file_sample_and_position() {
    let tmp = tempfile::tempdir().unwrap();
    let x = features_npy(tmp.path());
    let y = tmp.path().join("masks.npy");
    write_masks(&y, Some((2, 1, 0, 3)));
    let e = prepare_err(&source(x.clone(), y.clone(), Some(3)), tmp.path());
    assert!(
        e.contains("masks.npy")
            && e.contains("class 3 at [1, 0] of sample 2")
            && e.contains("0..3"),
        "{e}"
    );

    let y = tmp.path().join("signed.npy");
    let mut bytes = vec![0u8; N * 6];
    bytes[4 * 6 + 5] = 0xFF; // -1 as i8
    write_npy(&y, DType::I8, &[N, 2, 3], &bytes).unwrap();
    let e = prepare_err(&source(x, y, None), tmp.path());
    assert!(
        e.contains("signed.npy")
            && e.contains("class -1 at [1, 2] of sample 4")
            && e.contains("negative"),
        "{e}"
    );
}

#[test]
fn a_class_out_of_range_in_a_shard_is_named_when_the_dataset_opens() {
    let tmp = tempfile::tempdir().unwrap();
    let y = tmp.path().join("masks.npy");
    write_masks(&y, None);
    let out = tmp.path().join("ds");
    prepare(
        &source(features_npy(tmp.path()), y, None),
        &out,
        &options(ShardFormat::Npy),
    )
    .unwrap();
    // Shard 1 holds samples 3..6; put class 7 into its sample 1 (global sample 4) at [0, 2].
    let mut bytes: Vec<u8> = (3..6)
        .flat_map(|i| (0..2).flat_map(move |r| (0..3).map(move |c| mask(i, r, c))))
        .collect();
    bytes[6 + 2] = 7;
    write_npy(
        &out.join("shard-00001.targets.npy"),
        DType::U8,
        &[3, 2, 3],
        &bytes,
    )
    .unwrap();
    let e = ShardedDataset::open(&out).unwrap_err().to_string();
    assert!(
        e.contains("shard-00001.targets.npy")
            && e.contains("class 7 at [0, 2] of sample 1 in this file")
            && e.contains("0..3"),
        "{e}"
    );
}

#[test]
fn a_nan_regression_target_is_named_by_file_and_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let x = features_npy(tmp.path());
    let y = tmp.path().join("y.npy");
    let mut values: Vec<f32> = (0..N * 2).map(|v| v as f32).collect();
    values[5 * 2 + 1] = f32::NAN;
    write_npy(&y, DType::F32, &[N, 2], &f32_le(&values)).unwrap();
    let e = prepare_err(&source(x.clone(), y, None), tmp.path());
    assert!(
        e.contains("y.npy") && e.contains("NaN at [1] of sample 5") && e.contains("finite"),
        "{e}"
    );
    assert!(!tmp.path().join("out").exists());

    // And in a shard, when the dataset opens.
    let y = tmp.path().join("good.npy");
    let mut values: Vec<f32> = (0..N).map(|v| v as f32).collect();
    write_npy(&y, DType::F32, &[N], &f32_le(&values)).unwrap();
    let out = tmp.path().join("ds");
    prepare(&source(x, y, None), &out, &options(ShardFormat::Npy)).unwrap();
    values[2] = f32::INFINITY;
    write_npy(
        &out.join("shard-00000.targets.npy"),
        DType::F32,
        &[3],
        &f32_le(&values[..3]),
    )
    .unwrap();
    let e = ShardedDataset::open(&out).unwrap_err().to_string();
    assert!(
        e.contains("shard-00000.targets.npy") && e.contains("inf of sample 2 in this file"),
        "{e}"
    );
}

#[test]
fn a_wrong_target_count_names_both_files_and_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let y = tmp.path().join("short.npy");
    write_npy(&y, DType::F32, &[N - 1, 4], &[0u8; (N - 1) * 16]).unwrap();
    let e = prepare_err(&source(features_npy(tmp.path()), y, None), tmp.path());
    assert!(
        e.contains("short.npy")
            && e.contains("holds 6 targets")
            && e.contains("x.npy")
            && e.contains("7 samples"),
        "{e}"
    );
}

#[test]
fn the_target_kind_follows_the_dtype_and_a_class_count_needs_integers() {
    let tmp = tempfile::tempdir().unwrap();
    let x = features_npy(tmp.path());
    let y = tmp.path().join("y.npy");
    write_npy(&y, DType::F32, &[N], &f32_le(&[1.0; N])).unwrap();
    let e = prepare_err(&source(x.clone(), y.clone(), Some(2)), tmp.path());
    assert!(
        e.contains("y.npy") && e.contains("f32") && e.contains("integer"),
        "{e}"
    );

    // As labels, floats are refused with a pointer to targets.
    let e = prepare_err(
        &PrepareSource::Npy {
            features: x,
            labels: y,
        },
        tmp.path(),
    );
    assert!(e.contains("y.npy") && e.contains("targets"), "{e}");
}

#[test]
fn integer_features_become_ids_only_when_asked_and_must_be_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let x = tmp.path().join("tokens.npy");
    let ids: Vec<i32> = (0..N as i32 * 4).map(|v| v * 1000).collect();
    let bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_npy(&x, DType::I32, &[N, 4], &bytes).unwrap();
    let y = tmp.path().join("y.npy");
    write_npy(&y, DType::I64, &[N], &[0u8; N * 8]).unwrap();
    let ids_options = PrepareOptions {
        integer_features: true,
        ..options(ShardFormat::Safetensors)
    };
    let out = tmp.path().join("ds");
    let m = prepare(&source(x.clone(), y.clone(), None), &out, &ids_options).unwrap();
    assert!(m.inputs[0].ids && m.inputs[0].dtype == DType::I32);
    let ds = ShardedDataset::open(&out).unwrap();
    assert!(ds.integer_features());
    for batch in loader(ds).epoch(0) {
        let batch = batch.unwrap();
        assert!(batch.integer_features);
        for (b, &i) in batch.indices.iter().enumerate() {
            assert_eq!(batch.features[b * 4 + 3], ids[i * 4 + 3] as f32);
        }
    }
    let plain = tmp.path().join("plain");
    prepare(
        &source(x.clone(), y.clone(), None),
        &plain,
        &options(ShardFormat::Npy),
    )
    .unwrap();
    assert!(!ShardedDataset::open(&plain).unwrap().integer_features());

    // An id f32 cannot hold exactly is named by file and sample.
    let mut too_big = ids.clone();
    too_big[5 * 4 + 1] = (1 << 24) + 1;
    let bytes: Vec<u8> = too_big.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_npy(&x, DType::I32, &[N, 4], &bytes).unwrap();
    let e = prepare(
        &source(x, y.clone(), None),
        &tmp.path().join("o2"),
        &ids_options,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("tokens.npy") && e.contains("16777217 at [1] of sample 5"),
        "{e}"
    );

    // Float features cannot be ids.
    let e = prepare(
        &source(features_npy(tmp.path()), y, None),
        &tmp.path().join("o3"),
        &ids_options,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("x.npy") && e.contains("integer features") && e.contains("f32"),
        "{e}"
    );
}

/// A version-1 dataset as kiln wrote it before targets: `labels` in the manifest and shards.
fn write_v1(dir: &Path, classes: usize) {
    std::fs::create_dir(dir).unwrap();
    let x: Vec<f32> = (0..4).map(|v| v as f32).collect();
    write_npy(&dir.join("f0.npy"), DType::F32, &[2, 2], &f32_le(&x)).unwrap();
    write_npy(
        &dir.join("l0.npy"),
        DType::I32,
        &[2],
        &[1, 0, 0, 0, 2, 0, 0, 0],
    )
    .unwrap();
    let labels =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I32, vec![1], &[1, 0, 0, 0])
            .unwrap();
    let feats = f32_le(&[9.0, 8.0]);
    let features =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1, 2], &feats).unwrap();
    safetensors::serialize_to_file(
        [("features", features), ("labels", labels)],
        None,
        &dir.join("s1.safetensors"),
    )
    .unwrap();
    let manifest = format!(
        r#"{{
  "format": "kiln-dataset",
  "version": 1,
  "samples": 3,
  "features": {{ "dtype": "f32", "shape": [2] }},
  "labels": {{ "dtype": "i32", "classes": {classes} }},
  "shards": [
    {{ "features": "f0.npy", "labels": "l0.npy", "samples": 2 }},
    {{ "features": "s1.safetensors", "labels": "s1.safetensors", "samples": 1 }}
  ]
}}"#
    );
    std::fs::write(dir.join(MANIFEST_FILE), manifest).unwrap();
}

#[test]
fn a_version_1_dataset_still_opens_as_single_labels() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("v1");
    write_v1(&dir, 3);
    let ds = ShardedDataset::open(&dir).unwrap();
    let m = ds.manifest();
    assert_eq!(
        (m.version, m.target.task, m.target.dtype),
        (1, Task::Classification, DType::I32)
    );
    assert_eq!(ds.target(), TargetSpec::label(3));
    let mut x = [0f32; 2];
    assert_eq!(ds.read(1, &mut x).unwrap(), 2);
    assert_eq!(x, [2.0, 3.0]);
    assert_eq!(ds.read(2, &mut x).unwrap(), 1);
    assert_eq!(x, [9.0, 8.0]);
    let mut label = [0i64];
    ds.read_sample(0, &mut x, TargetSlot::Classes(&mut label))
        .unwrap();
    assert_eq!(label, [1]);

    // It serializes back in its own layout.
    let text = serde_json::to_string(m).unwrap();
    assert!(
        text.contains("\"labels\":{") && !text.contains("\"target\""),
        "{text}"
    );
    let back: Manifest = serde_json::from_str(&text).unwrap();
    assert_eq!(&back, m);

    // Its label checks still name the file.
    let dir = tmp.path().join("v1-bad");
    write_v1(&dir, 2);
    let e = ShardedDataset::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("l0.npy") && e.contains("label 2 of sample 1") && e.contains("0..2"),
        "{e}"
    );
}

#[test]
fn inconsistent_v2_manifests_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let y = tmp.path().join("y.npy");
    write_npy(&y, DType::F32, &[N, 2], &[0u8; N * 8]).unwrap();
    let out = tmp.path().join("ds");
    prepare(
        &source(features_npy(tmp.path()), y, None),
        &out,
        &options(ShardFormat::Npy),
    )
    .unwrap();
    let path = out.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"task\": \"regression\""), "{text}");

    let cases = [
        (
            "\"task\": \"regression\"",
            "\"task\": \"classification\"",
            "`target.task`",
        ),
        (
            "\"task\": \"regression\"",
            "\"task\": \"regression\", \"classes\": 2",
            "`target.dtype` is f32",
        ),
        ("\"version\": 2", "\"version\": 4", "versions 1 to 3"),
        (
            "\"version\": 2",
            "\"version\": 3",
            "a version-3 manifest has `inputs` and `target`",
        ),
        (
            "\"targets\": \"shard-00000.targets.npy\"",
            "\"labels\": \"x.npy\"",
            "`shards[0]`",
        ),
    ];
    for (from, to, want) in cases {
        std::fs::write(&path, text.replace(from, to)).unwrap();
        let e = ShardedDataset::open(&out).unwrap_err().to_string();
        assert!(e.contains(MANIFEST_FILE) && e.contains(want), "{want}: {e}");
    }
}

#[test]
fn csv_target_columns_round_trip_as_regression() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("sales.csv");
    std::fs::write(
        &csv,
        "day,temp,next1,next2\n1,20.5,3.25,4\n2,18,5,-6.5\n3,22,7.75,8\n",
    )
    .unwrap();
    let csv_options = CsvOptions {
        target_columns: Some(vec!["next1".to_owned(), "next2".to_owned()]),
        ..CsvOptions::default()
    };
    let direct = CsvDataset::open(&csv, &csv_options).unwrap();
    assert_eq!(direct.feature_columns(), ["day", "temp"]);
    assert_eq!(direct.target(), TargetSpec::Values { shape: vec![2] });
    let (mut x, mut y) = ([0f32; 2], [0f32; 2]);
    direct
        .read_sample(1, &mut x, TargetSlot::Values(&mut y))
        .unwrap();
    assert_eq!((x, y), ([2.0, 18.0], [5.0, -6.5]));

    let out = tmp.path().join("ds");
    let source = PrepareSource::Csv {
        path: csv.clone(),
        options: csv_options.clone(),
    };
    let m = prepare(&source, &out, &options(ShardFormat::Safetensors)).unwrap();
    assert_eq!(
        (m.target.task, m.target.dtype, &m.target.shape[..]),
        (Task::Regression, DType::F32, &[2][..])
    );
    let ds = ShardedDataset::open(&out).unwrap();
    let want = [[3.25, 4.0], [5.0, -6.5], [7.75, 8.0]];
    for (i, w) in want.iter().enumerate() {
        ds.read_sample(i, &mut x, TargetSlot::Values(&mut y))
            .unwrap();
        assert_eq!(&y, w, "sample {i}");
    }

    std::fs::write(&csv, "day,temp,next1,next2\n1,2,3,4\n2,3,nan,5\n").unwrap();
    let e = CsvDataset::open(&csv, &csv_options)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sales.csv")
            && e.contains("line 3")
            && e.contains("`next1`")
            && e.contains("finite"),
        "{e}"
    );
    let both = CsvOptions {
        feature_columns: Some(vec!["day".to_owned(), "next2".to_owned()]),
        ..csv_options
    };
    let e = CsvDataset::open(&csv, &both).unwrap_err().to_string();
    assert!(
        e.contains("`next2` is both a feature and the target"),
        "{e}"
    );
}

#[test]
fn in_memory_tensor_targets_are_validated_and_read_back() {
    let features: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let spec = TargetSpec::Values { shape: vec![2] };
    let ds = InMemory::with_targets(
        features.clone(),
        vec![2],
        spec.clone(),
        Targets::Values(vec![0.5, 1.5, 2.5, 3.5, 4.5, 5.5]),
    )
    .unwrap();
    assert_eq!((ds.len(), ds.target()), (3, spec.clone()));
    let batch = loader(ds).epoch(0).next().unwrap().unwrap();
    let Targets::Values(got) = &batch.targets else {
        panic!("value targets expected")
    };
    for (b, &i) in batch.indices.iter().enumerate() {
        assert_eq!(
            got[2 * b..2 * b + 2],
            [i as f32 * 2.0 + 0.5, i as f32 * 2.0 + 1.5]
        );
    }

    let e = InMemory::with_targets(
        features.clone(),
        vec![2],
        spec.clone(),
        Targets::Classes(vec![0; 6]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("targets") && e.contains("class values"), "{e}");
    let e = InMemory::with_targets(
        features.clone(),
        vec![2],
        spec,
        Targets::Values(vec![0.0, 1.0, 2.0, f32::NAN, 4.0, 5.0]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("sample 1") && e.contains("NaN") && e.contains("[1]"),
        "{e}"
    );
    let classes = TargetSpec::Classes {
        classes: 2,
        shape: vec![1, 2],
    };
    let e = InMemory::with_targets(
        features.clone(),
        vec![2],
        classes,
        Targets::Classes(vec![0, 1, 1, 0, 2, 1]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("sample 2") && e.contains("class 2") && e.contains("[0, 0]"),
        "{e}"
    );

    let ids = InMemory::new(features, vec![0, 1, 0], vec![2])
        .unwrap()
        .with_integer_features()
        .unwrap();
    assert!(ids.integer_features());
    let e = InMemory::new(vec![1.0, 2.5], vec![0], vec![2])
        .unwrap()
        .with_integer_features()
        .unwrap_err()
        .to_string();
    assert!(e.contains("sample 0") && e.contains("2.5"), "{e}");
}

/// Every sample reads the same with positioned reads (the default: f32 features straight
/// into the buffer, u8 class maps and f32 horizons through a scratch buffer) as through the
/// memory map, in both shard formats.
#[test]
fn positioned_reads_and_mapped_reads_give_the_same_samples() {
    for format in [ShardFormat::Safetensors, ShardFormat::Npy] {
        let tmp = tempfile::tempdir().unwrap();
        let masks = tmp.path().join("masks.npy");
        write_masks(&masks, None);
        let horizons = tmp.path().join("horizons.npy");
        let values: Vec<f32> = (0..N * 4).map(|k| horizon(k / 4, k % 4)).collect();
        write_npy(&horizons, DType::F32, &[N, 4], &f32_le(&values)).unwrap();
        let bytes = tmp.path().join("x8.npy");
        let pixels: Vec<u8> = (0..N * 3).map(|k| (k * 7 + 1) as u8).collect();
        write_npy(&bytes, DType::U8, &[N, 3], &pixels).unwrap();
        let f32s = features_npy(tmp.path());
        let cases = [
            ("maps", &f32s, &masks),
            ("values", &f32s, &horizons),
            ("u8 features", &bytes, &masks),
        ];
        for (name, features, targets) in cases {
            let out = tmp.path().join(name);
            prepare(
                &source(features.clone(), targets.clone(), None),
                &out,
                &options(format),
            )
            .unwrap();
            let (read, mapped) = (
                ShardedDataset::open(&out).unwrap(),
                ShardedDataset::open(&out)
                    .unwrap()
                    .with_release_pages(false),
            );
            for i in 0..read.len() {
                let (a, b) = (sample(&read, i), sample(&mapped, i));
                assert_eq!(a, b, "{name} sample {i} ({format:?})");
                assert!(a.0.iter().any(|&v| v != 0.0), "sample {i} was read");
            }
        }
    }
}

/// Sample `i`'s features and target (classes as floats) through `read_sample`.
fn sample(ds: &ShardedDataset, i: usize) -> (Vec<f32>, Vec<f32>) {
    let mut features = vec![f32::NAN; ds.sample_numel()];
    let spec = ds.target();
    let mut targets = spec.batch(1);
    ds.read_sample(i, &mut features, targets.slot(0, spec.numel()))
        .unwrap();
    let target = match targets {
        Targets::Classes(v) => v.iter().map(|&c| c as f32).collect(),
        Targets::Values(v) => v,
    };
    (features, target)
}
