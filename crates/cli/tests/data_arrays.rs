//! `kiln data prepare --array NAME=FILE … --target NAME=FILE`: named arrays of their own types
//! and shapes, shown by `kiln data inspect`; bad names, counts and `NAME=FILE` values refused;
//! a single named array trains as features, several only with a model that takes them by name
//! (tests/named_inputs.rs).

mod common;

use std::path::{Path, PathBuf};

use common::{kiln, stderr, stdout};
use kiln_data::{DType, write_npy};

const N: usize = 40;

fn npy(dir: &Path, name: &str, dtype: DType, shape: &[usize], bytes: Vec<u8>) -> String {
    let path: PathBuf = dir.join(format!("{name}.npy"));
    write_npy(&path, dtype, shape, &bytes).unwrap();
    path.to_str().unwrap().to_owned()
}

/// `x` f32 [N, 3] (class = sign of the first value), `cat` i16 [N, 2], labels `y` i64 [N].
fn arrays(dir: &Path) -> (String, String, String) {
    let x: Vec<u8> = (0..N * 3)
        .flat_map(|k| {
            let (i, j) = (k / 3, k % 3);
            let v = if j == 0 {
                (i % 2) as f32 * 2.0 - 1.0
            } else {
                (k % 7) as f32 * 0.1
            };
            v.to_le_bytes()
        })
        .collect();
    let cat: Vec<u8> = (0..N * 2)
        .flat_map(|k| (k as i16 - 5).to_le_bytes())
        .collect();
    let y: Vec<u8> = (0..N)
        .flat_map(|i| ((i % 2) as i64).to_le_bytes())
        .collect();
    (
        npy(dir, "x", DType::F32, &[N, 3], x),
        npy(dir, "cat", DType::I16, &[N, 2], cat),
        npy(dir, "y", DType::I64, &[N], y),
    )
}

#[test]
fn named_arrays_are_prepared_inspected_and_refused_by_a_model_of_one_input() {
    let tmp = tempfile::tempdir().unwrap();
    let (x, cat, y) = arrays(tmp.path());
    let out = tmp.path().join("ds");
    let out_s = out.to_str().unwrap();
    let o = kiln(&[
        "data",
        "prepare",
        "--array",
        &format!("x={x}"),
        "--array",
        &format!("cat={cat}"),
        "--target",
        &format!("y={y}"),
        "--shard-samples",
        "16",
        "--out",
        out_s,
    ]);
    let text = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    for want in [
        "input     x: f32 [3] per sample",
        "input     cat: i16 [2] per sample, reaching the model as i64",
        "target    classification (array `y`): i64, 2 classes",
        "shards    3",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    let o = kiln(&["data", "inspect", out_s, "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let m = &v["manifest"];
    assert_eq!(
        (m["version"].as_u64(), m["target"]["name"].as_str()),
        (Some(3), Some("y"))
    );
    assert_eq!(
        m["inputs"][1],
        serde_json::json!({"name": "cat", "dtype": "i16", "shape": [2]})
    );
    assert_eq!(m["shards"][2]["files"]["cat"], "shard-00002.safetensors");

    // A built-in model takes one tensor: refused before a run directory exists.
    let runs = tmp.path().join("runs");
    let o = kiln(&[
        "train",
        "--model",
        "mlp",
        "--data",
        out_s,
        "--epochs",
        "1",
        "--set",
        &format!("run.output_dir={}", runs.display()),
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("one input array") && err.contains("2 named arrays (x, cat)"),
        "{err}"
    );
    assert!(!runs.exists(), "nothing is written");
}

#[test]
fn one_named_array_trains_as_the_features() {
    let tmp = tempfile::tempdir().unwrap();
    let (x, _, y) = arrays(tmp.path());
    let ds = tmp.path().join("ds");
    let o = kiln(&[
        "data",
        "prepare",
        "--array",
        &format!("x={x}"),
        "--target",
        &format!("labels={y}"),
        "--out",
        ds.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let runs = tmp.path().join("runs");
    let o = kiln(&[
        "train",
        "--model",
        "mlp",
        "--data",
        ds.to_str().unwrap(),
        "--epochs",
        "2",
        "--set",
        &format!("run.output_dir={}", runs.display()),
        "--set",
        "data.val_fraction=0",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains(&format!("{N} samples of [3]")), "{err}");
}

#[test]
fn bad_array_options_are_named_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (x, cat, y) = arrays(tmp.path());
    let short = npy(
        tmp.path(),
        "short",
        DType::F32,
        &[N - 1],
        vec![0; (N - 1) * 4],
    );
    let out = tmp.path().join("ds");
    let out_s = out.to_str().unwrap();
    let prepare = |arrays: &[String], target: &str| {
        let mut args = vec!["data", "prepare", "--target", target, "--out", out_s];
        for a in arrays {
            args.extend(["--array", a.as_str()]);
        }
        kiln(&args)
    };
    let cases = [
        (
            vec![x.clone()],
            format!("y={y}"),
            "--array `".to_owned() + &x + "` is not NAME=FILE",
        ),
        (
            vec![format!("x={x}")],
            y.clone(),
            format!("--target `{y}` is not NAME=FILE"),
        ),
        (
            vec![format!("x={x}"), format!("s={short}")],
            format!("y={y}"),
            format!("holds {} samples", N - 1),
        ),
        (
            vec![format!("x={x}"), format!("x={cat}")],
            format!("y={y}"),
            "array names are unique".into(),
        ),
        (
            vec![format!("enc-cont={x}")],
            format!("y={y}"),
            "`enc-cont`, which is not a valid array name".into(),
        ),
        (
            vec![],
            format!("y={y}"),
            "give --array NAME=FILE for each input".into(),
        ),
    ];
    for (arrays, target, want) in cases {
        let o = prepare(&arrays, &target);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{want}: {err}");
        assert!(err.contains(&want), "{want}: {err}");
        assert!(!out.exists(), "{want}: nothing is written");
    }
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep"), "mine").unwrap();
    let o = prepare(&[format!("x={x}")], &format!("y={y}"));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("never overwrites"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(out.join("keep")).unwrap(), "mine");
}

#[test]
fn csv_column_groups_are_prepared_as_named_arrays() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("sales.csv");
    std::fs::write(
        &csv,
        "store,day,temp,humidity,kind\n3,1,20.5,0.25,cake\n1,2,18,0.5,bread\n2,3,-1.25,1,cake\n",
    )
    .unwrap();
    let out = tmp.path().join("ds");
    let prepare = |arrays: &[&str]| {
        let mut args = vec!["data", "prepare", "--csv", csv.to_str().unwrap()];
        for a in arrays {
            args.extend(["--array", a]);
        }
        args.extend(["--target", "kind=kind", "--out", out.to_str().unwrap()]);
        kiln(&args)
    };
    let o = prepare(&["cat=store,day", "cont=temp, humidity"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for want in [
        "input     cat: i64 [2] per sample",
        "input     cont: f32 [2] per sample",
        "target    classification (array `kind`): i64, 2 classes (bread, cake)",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    std::fs::remove_dir_all(&out).unwrap();
    let o = prepare(&["cat=store,", "cont=temp"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("`cat=store,` names an empty column"),
        "{}",
        stderr(&o)
    );
    let o = prepare(&["cat=store,weekday"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no column `weekday`"), "{}", stderr(&o));
    assert!(!out.exists());
}
