//! `kiln data prepare` with targets other than one class label: CSV regression columns, and
//! bad targets refused with the file, line and column named.

mod common;

use common::{kiln, stderr, stdout};

#[test]
fn data_prepare_takes_csv_target_columns_for_regression() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("sales.csv");
    std::fs::write(
        &csv,
        "day,temp,next1,next2\n1,20.5,3.25,4\n2,18,5,-6.5\n3,22,7.75,8\n",
    )
    .unwrap();
    let out = tmp.path().join("ds");
    let (csv_s, out_s) = (csv.to_str().unwrap(), out.to_str().unwrap());
    let o = kiln(&[
        "data",
        "prepare",
        "--csv",
        csv_s,
        "--target-columns",
        "next1,next2",
        "--out",
        out_s,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("target    regression: f32 [2] per sample")
            && stdout(&o).contains("features  f32 [2] per sample"),
        "{}",
        stdout(&o)
    );

    let o = kiln(&["data", "inspect", out_s, "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let target = &v["manifest"]["target"];
    assert_eq!(v["manifest"]["version"], 2);
    assert_eq!(target["task"], "regression");
    assert_eq!(target["dtype"], "f32");
    assert_eq!(target["shape"], serde_json::json!([2]));
    assert!(target.get("classes").is_none(), "{target}");
}

#[test]
fn data_prepare_names_bad_targets_and_exits_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("bad.csv");
    std::fs::write(&csv, "a,b,y\n1,2,0.5\n3,4,NaN\n").unwrap();
    let out = tmp.path().join("ds");
    let (csv_s, out_s) = (csv.to_str().unwrap(), out.to_str().unwrap());
    let prepare = |targets: &str| {
        kiln(&[
            "data",
            "prepare",
            "--csv",
            csv_s,
            "--target-columns",
            targets,
            "--out",
            out_s,
        ])
    };
    let o = prepare("y");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("bad.csv") && err.contains("line 3") && err.contains("`y`"),
        "{err}"
    );
    assert!(err.contains("not a finite number"), "{err}");
    assert!(!out.exists());

    let o = prepare("y,z");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no column `z`") && err.contains("a, b, y"),
        "{err}"
    );

    // A label column and target columns together are refused by the argument parser.
    let o = kiln(&[
        "data",
        "prepare",
        "--csv",
        csv_s,
        "--label-column",
        "y",
        "--target-columns",
        "y",
        "--out",
        out_s,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--target-columns"), "{}", stderr(&o));
}
