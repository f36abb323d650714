//! Sharded datasets on disk: `prepare` from `.npy` and CSV, reading back exactly what was
//! written, and every broken-dataset case failing with an error that names the file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_data::{
    CsvOptions, DType, DataError, Dataset, Loader, LoaderConfig, MANIFEST_FILE, PrepareOptions,
    PrepareSource, SamplerConfig, ShardFormat, ShardedDataset, TargetSlot, prepare, write_npy,
};

const SAMPLES: usize = 10;
const SHAPE: [usize; 2] = [3, 4];

fn value(i: usize, j: usize) -> f32 {
    (i * 100 + j) as f32 * 0.5
}

/// `features.npy` (f32 `[10, 3, 4]`, sample i value j = (100i + j) / 2) and `labels.npy`
/// (i32, label = i % 3).
fn npy_inputs(dir: &Path) -> (PathBuf, PathBuf) {
    let numel: usize = SHAPE.iter().product();
    let features: Vec<u8> = (0..SAMPLES)
        .flat_map(|i| (0..numel).map(move |j| value(i, j)))
        .flat_map(f32::to_le_bytes)
        .collect();
    let labels: Vec<u8> = (0..SAMPLES as i32)
        .flat_map(|i| (i % 3).to_le_bytes())
        .collect();
    let (f, l) = (dir.join("features.npy"), dir.join("labels.npy"));
    write_npy(&f, DType::F32, &[SAMPLES, SHAPE[0], SHAPE[1]], &features).unwrap();
    write_npy(&l, DType::I32, &[SAMPLES], &labels).unwrap();
    (f, l)
}

fn prepared(format: ShardFormat) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (features, labels) = npy_inputs(tmp.path());
    let out = tmp.path().join("ds");
    let options = PrepareOptions {
        shard_samples: 4,
        format,
        ..PrepareOptions::default()
    };
    prepare(&PrepareSource::Npy { features, labels }, &out, &options).unwrap();
    (tmp, out)
}

/// Cuts the last `bytes` bytes off the file at `path`.
fn truncate(path: &Path, bytes: u64) {
    let len = std::fs::metadata(path).unwrap().len();
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len - bytes)
        .unwrap();
}

fn error_text(e: DataError) -> String {
    e.to_string()
}

fn open_err(dir: &Path) -> String {
    error_text(ShardedDataset::open(dir).expect_err("opening should fail"))
}

#[test]
fn prepared_shards_read_back_exactly_in_both_formats() {
    for format in [ShardFormat::Safetensors, ShardFormat::Npy] {
        let (_tmp, dir) = prepared(format);
        let ds = ShardedDataset::open(&dir).unwrap();
        let m = ds.manifest();
        assert_eq!(m.samples, SAMPLES);
        assert_eq!(m.shards.len(), 3, "10 samples at 4 per shard");
        assert_eq!(
            m.shards.iter().map(|s| s.samples).collect::<Vec<_>>(),
            [4, 4, 2]
        );
        assert_eq!(
            (m.inputs[0].dtype, &m.inputs[0].shape[..]),
            (DType::F32, &SHAPE[..])
        );
        assert_eq!(m.target.classes, Some(3));
        let mut out = vec![0f32; 12];
        for i in 0..SAMPLES {
            let label = ds.read(i, &mut out).unwrap();
            assert_eq!(label, (i % 3) as i64, "{format:?} sample {i}");
            let want: Vec<f32> = (0..12).map(|j| value(i, j)).collect();
            assert_eq!(out, want, "{format:?} sample {i}");
        }
        let e = error_text(ds.read(SAMPLES, &mut out).unwrap_err());
        assert!(e.contains("sample 10") && e.contains("out of range"), "{e}");
    }
}

#[test]
fn a_batch_read_by_runs_equals_its_samples_read_one_by_one() {
    // Runs inside a shard and across shard boundaries (shards of 4), repeats, a descending
    // order, one sample, none.
    let batches = [
        (0..SAMPLES).collect::<Vec<_>>(),
        vec![3, 4, 5, 9, 8, 2, 2, 0],
        vec![7],
        vec![],
    ];
    for format in [ShardFormat::Safetensors, ShardFormat::Npy] {
        let (_tmp, dir) = prepared(format);
        for release in [true, false] {
            let ds = ShardedDataset::open(&dir)
                .unwrap()
                .with_release_pages(release);
            for indices in &batches {
                let n = indices.len();
                let (mut features, mut labels) = (vec![f32::NAN; n * 12], vec![-5i64; n]);
                ds.read_batch(indices, &mut features, TargetSlot::Classes(&mut labels))
                    .unwrap();
                for (k, &i) in indices.iter().enumerate() {
                    let want: Vec<f32> = (0..12).map(|j| value(i, j)).collect();
                    assert_eq!(features[k * 12..(k + 1) * 12], want[..], "{indices:?}");
                    assert_eq!(labels[k], (i % 3) as i64, "{indices:?}");
                }
            }
            let mut labels = [0i64; 2];
            let e = ds
                .read_batch(&[0, 1], &mut [0f32; 12], TargetSlot::Classes(&mut labels))
                .unwrap_err();
            assert!(error_text(e).contains("24 feature and 2 target elements"));
            let e = ds
                .read_batch(&[9, 10], &mut [0f32; 24], TargetSlot::Classes(&mut labels))
                .unwrap_err();
            let e = error_text(e);
            assert!(e.contains("sample 10") && e.contains("out of range"), "{e}");
            let mut values = [0f32; 2];
            let e = ds
                .read_batch(&[0, 1], &mut [0f32; 24], TargetSlot::Values(&mut values))
                .unwrap_err();
            assert!(error_text(e).contains("target slot holds"));
        }
    }
}

#[test]
fn a_loader_over_shards_yields_each_sample_once_across_ranks() {
    let (_tmp, dir) = prepared(ShardFormat::Safetensors);
    let ds = Arc::new(ShardedDataset::open(&dir).unwrap());
    let mut seen = Vec::new();
    for rank in 0..3 {
        let config = LoaderConfig {
            batch_size: 3,
            num_workers: 2,
            sampler: SamplerConfig {
                shuffle: true,
                seed: 9,
                rank,
                world_size: 3,
            },
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(Arc::clone(&ds), config).unwrap();
        for batch in loader.epoch(1) {
            let batch = batch.unwrap();
            for (k, &i) in batch.indices.iter().enumerate() {
                assert_eq!(batch.features[k * 12 + 5], value(i, 5));
                assert_eq!(batch.targets.classes().unwrap()[k], (i % 3) as i64);
            }
            seen.extend(batch.indices);
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..SAMPLES).collect::<Vec<_>>());
}

#[test]
fn u8_features_keep_their_type_on_disk_and_read_as_floats() {
    let tmp = tempfile::tempdir().unwrap();
    let (f, l) = (tmp.path().join("x.npy"), tmp.path().join("y.npy"));
    write_npy(&f, DType::U8, &[2, 3], &[0, 128, 255, 1, 2, 3]).unwrap();
    write_npy(&l, DType::U8, &[2], &[4, 0]).unwrap();
    let out = tmp.path().join("ds");
    let source = PrepareSource::Npy {
        features: f,
        labels: l,
    };
    prepare(&source, &out, &PrepareOptions::default()).unwrap();
    let ds = ShardedDataset::open(&out).unwrap();
    assert_eq!(ds.manifest().inputs[0].dtype, DType::U8);
    assert_eq!(ds.manifest().target.classes, Some(5));
    assert!(!ds.integer_features(), "u8 pixels are numbers, not ids");
    let mut buf = [0f32; 3];
    assert_eq!(ds.read(0, &mut buf).unwrap(), 4);
    assert_eq!(buf, [0.0, 128.0, 255.0]);
}

#[test]
fn a_missing_shard_is_named() {
    let (_tmp, dir) = prepared(ShardFormat::Safetensors);
    std::fs::remove_file(dir.join("shard-00001.safetensors")).unwrap();
    let e = open_err(&dir);
    assert!(
        e.contains("shard-00001.safetensors") && e.contains("missing shard"),
        "{e}"
    );
}

#[test]
fn truncated_shards_are_named_in_both_formats() {
    let (_tmp, dir) = prepared(ShardFormat::Safetensors);
    truncate(&dir.join("shard-00002.safetensors"), 10);
    let e = open_err(&dir);
    assert!(
        e.contains("shard-00002.safetensors") && e.contains("truncated"),
        "{e}"
    );

    let (_tmp, dir) = prepared(ShardFormat::Npy);
    truncate(&dir.join("shard-00000.features.npy"), 4);
    let e = open_err(&dir);
    assert!(
        e.contains("shard-00000.features.npy") && e.contains("truncated"),
        "{e}"
    );
}

#[test]
fn a_shard_of_another_dtype_or_shape_is_named() {
    let (_tmp, dir) = prepared(ShardFormat::Npy);
    let path = dir.join("shard-00001.features.npy");
    write_npy(&path, DType::F64, &[4, 3, 4], &[0u8; 4 * 12 * 8]).unwrap();
    let e = open_err(&dir);
    assert!(
        e.contains("shard-00001.features.npy") && e.contains("f64") && e.contains("f32"),
        "{e}"
    );

    write_npy(&path, DType::F32, &[4, 4, 3], &[0u8; 4 * 12 * 4]).unwrap();
    let e = open_err(&dir);
    assert!(
        e.contains("shard-00001.features.npy")
            && e.contains("[4, 4, 3]")
            && e.contains("[4, 3, 4]"),
        "{e}"
    );
}

#[test]
fn manifest_problems_are_named() {
    let (_tmp, dir) = prepared(ShardFormat::Safetensors);
    let manifest = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&manifest).unwrap();

    std::fs::write(
        &manifest,
        text.replace("\"samples\": 10", "\"samples\": 11"),
    )
    .unwrap();
    let e = open_err(&dir);
    assert!(
        e.contains(MANIFEST_FILE) && e.contains("hold 10 samples"),
        "{e}"
    );

    std::fs::write(
        &manifest,
        text.replace("\"dtype\": \"f32\"", "\"dtype\": \"f4\""),
    )
    .unwrap();
    let e = open_err(&dir);
    assert!(e.contains(MANIFEST_FILE) && e.contains("f4"), "{e}");

    std::fs::write(&manifest, text.replace("\"classes\": 3", "\"classes\": 2")).unwrap();
    let e = open_err(&dir);
    assert!(
        e.contains("shard-00000.safetensors") && e.contains("label 2") && e.contains("0..2"),
        "{e}"
    );

    std::fs::remove_file(&manifest).unwrap();
    let e = open_err(&dir);
    assert!(
        e.contains(MANIFEST_FILE) && e.contains("kiln data prepare"),
        "{e}"
    );
}

#[test]
fn prepare_never_overwrites_and_leaves_nothing_behind_on_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let (features, labels) = npy_inputs(tmp.path());
    let out = tmp.path().join("existing");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "precious").unwrap();
    let source = PrepareSource::Npy {
        features: features.clone(),
        labels,
    };
    let e = error_text(prepare(&source, &out, &PrepareOptions::default()).unwrap_err());
    assert!(
        e.contains("existing") && e.contains("already exists"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).unwrap(),
        "precious"
    );

    // Labels of the wrong length: fails, names the file, and leaves no partial output.
    let short = tmp.path().join("short.npy");
    write_npy(&short, DType::I64, &[3], &[0u8; 24]).unwrap();
    let fresh = tmp.path().join("fresh");
    let source = PrepareSource::Npy {
        features,
        labels: short,
    };
    let e = error_text(prepare(&source, &fresh, &PrepareOptions::default()).unwrap_err());
    assert!(e.contains("short.npy") && e.contains("3 labels"), "{e}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("fresh"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn csv_with_named_labels_becomes_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("iris.csv");
    std::fs::write(
        &csv,
        "sepal, petal ,species\n1.0,2.5,setosa\n3,4e-1,virginica\n-1.5,0,setosa\n",
    )
    .unwrap();
    let out = tmp.path().join("ds");
    let source = PrepareSource::Csv {
        path: csv,
        options: CsvOptions {
            label_column: "species".to_owned(),
            ..CsvOptions::default()
        },
    };
    let options = PrepareOptions {
        shard_samples: 2,
        format: ShardFormat::Npy,
        ..PrepareOptions::default()
    };
    let m = prepare(&source, &out, &options).unwrap();
    assert_eq!(m.shards.len(), 2);
    assert_eq!(
        m.target.class_names.as_deref(),
        Some(&["setosa".to_owned(), "virginica".to_owned()][..])
    );
    let ds = ShardedDataset::open(&out).unwrap();
    assert_eq!(ds.sample_shape(), [2]);
    let mut buf = [0f32; 2];
    assert_eq!(ds.read(1, &mut buf).unwrap(), 1);
    assert_eq!(buf, [3.0, 0.4]);
    assert_eq!(ds.read(2, &mut buf).unwrap(), 0);
    assert_eq!(buf, [-1.5, 0.0]);
}

#[test]
fn bad_csv_is_named_by_line_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("bad.csv");
    let options = CsvOptions::default();
    let open = |text: &str| {
        std::fs::write(&csv, text).unwrap();
        error_text(kiln_data::CsvDataset::open(&csv, &options).unwrap_err())
    };
    let e = open("a,b,label\n1,2,0\n3,x,1\n");
    assert!(
        e.contains("bad.csv") && e.contains("line 3") && e.contains("`b`"),
        "{e}"
    );
    let e = open("a,b,label\n1,2,0\n3,1\n");
    assert!(e.contains("line 3") && e.contains("2 fields"), "{e}");
    let e = open("a,b,target\n1,2,0\n");
    assert!(
        e.contains("no column `label`") && e.contains("target"),
        "{e}"
    );
    let e = open("a,b,label\n1,2,-1\n");
    assert!(e.contains("line 2") && e.contains("negative"), "{e}");
    let e = open("a,b,label\n");
    assert!(e.contains("no rows"), "{e}");
}
