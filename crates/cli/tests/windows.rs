//! `kiln data prepare --windows` from a long-format CSV: what it writes and `kiln data inspect`
//! reports, its command-line errors; against pytorch-forecasting's `TimeSeriesDataSet` (pinned
//! with the bench peers), the same windows with the same contents, with and without per-series
//! target normalisation; and `kiln train` of a TorchScript forecaster taking a window's arrays as
//! a dict, learning as PyTorch eager does on the same windows.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::own_data::{assert_same_losses, make_reference, train};
use common::{kiln, only_run, python, stderr, stdout, step_losses};
use kiln_data::{Dataset, TargetSlot, WindowedDataset, Windows};
use serde_json::Value;

const E: usize = 8;
const H: usize = 3;
const V: usize = 6;

/// Six series ending at time 39: `a`–`e` of 40 steps, `f` of 7 (too short for a window).
fn write_csv(path: &Path) {
    let mut text = String::from("series,t,y,price,temp,region\n");
    for (k, name) in ["c", "a", "e", "b", "d", "f"].iter().enumerate() {
        let first = if *name == "f" { 33 } else { 0 };
        for t in first..40 {
            let y = (k as f64 + 1.0) * 2.0 * (0.3 * t as f64 + k as f64).sin() + 10.0 * k as f64;
            let region = if k % 2 == 0 { "north" } else { "south" };
            let temp = ((t * 7 + k) % 11) as f64 * 0.5;
            text += &format!(
                "{name},{t},{y},{},{temp},{region}\n",
                0.25 * t as f64 + k as f64
            );
        }
    }
    std::fs::write(path, text).unwrap();
}

/// What every windowed dataset of these tests is: series of `series`, time `t`, target `y`.
const SERIES: [&str; 7] = [
    "--windows",
    "--time",
    "t",
    "--group",
    "series",
    "--target",
    "y",
];

/// [`SERIES`], then `extra`.
fn windowed<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    [&SERIES[..], extra].concat()
}

fn prepare(dir: &Path, normalize: &str) -> (PathBuf, std::process::Output) {
    prepare_min(dir, normalize, None)
}

/// [`prepare`], with histories down to `min_encoder` steps where given.
fn prepare_min(
    dir: &Path,
    normalize: &str,
    min_encoder: Option<usize>,
) -> (PathBuf, std::process::Output) {
    let csv = dir.join("long.csv");
    if !csv.exists() {
        write_csv(&csv);
    }
    let min = min_encoder.map(|m| m.to_string());
    let out = dir.join(format!(
        "windows-{normalize}-{}",
        min.as_deref().unwrap_or("full")
    ));
    let (e, h) = (E.to_string(), H.to_string());
    let mut args = vec!["data", "prepare", "--csv", csv.to_str().unwrap()];
    if let Some(min) = &min {
        args.extend(["--min-encoder-length", min]);
    }
    args.extend(windowed(&[
        "--known",
        "price",
        "--unknown",
        "temp,y",
        "--static",
        "region",
        "--encoder-length",
        &e,
        "--horizon",
        &h,
        "--normalize",
        normalize,
        "--out",
        out.to_str().unwrap(),
    ]));
    let o = kiln(&args);
    (out, o)
}

#[test]
fn prepare_windows_writes_the_series_and_inspect_reports_the_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, o) = prepare(tmp.path(), "group");
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("series    6 by series (207 rows; 1 too short"),
        "{text}"
    );
    // 5 series × (40 − 3 − 8 − 3 + 1) training windows, 5 × 1 validating.
    assert!(
        text.contains("encoder 8 + horizon 3 steps of `t`: 135 train, 5 validate"),
        "{text}"
    );
    for input in [
        "encoder_cont: f32 [8, 3] per window",
        "encoder_target: f32 [8] per window",
        "decoder_cont: f32 [3, 1] per window",
        "static_cat: i64 [1] per window",
        "target_scale: f32 [2] per window",
    ] {
        assert!(text.contains(input), "{input} in {text}");
    }
    let o = kiln(&["data", "inspect", out.to_str().unwrap(), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["default_split"]["train"], 135);
    assert_eq!(
        v["windows"]["series"][0]["key"][0], "a",
        "series sorted by key"
    );
    assert_eq!(v["windows"]["categories"]["region"][1], "south");
    let again = prepare(tmp.path(), "group").1;
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("never overwrites"),
        "{}",
        stderr(&again)
    );
}

#[test]
fn windows_too_long_for_the_default_split_are_written_and_inspected_without_validation() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("long.csv");
    write_csv(&csv);
    let out = tmp.path().join("long-windows");
    let mut args = vec!["data", "prepare", "--csv", csv.to_str().unwrap()];
    args.extend(windowed(&["--encoder-length", "30", "--horizon", "8"]));
    args.extend(["--out", out.to_str().unwrap()]);
    let o = kiln(&args);
    let text = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    // 40 steps hold 3 windows of 38, but none before the last 8.
    assert!(
        text.contains("15 train, 0 validate with data.val_steps = 0"),
        "{text}"
    );
    let o = kiln(&["data", "inspect", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Windows of variable length: histories from `--min-encoder-length` up, with a mask; a minimum
/// above the encoder length is refused, naming it, and nothing is written.
#[test]
fn prepare_windows_of_variable_length_adds_a_mask_and_refuses_a_minimum_too_long() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, o) = prepare_min(tmp.path(), "group", Some(3));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = kiln(&["data", "inspect", dir.to_str().unwrap()]);
    let out = stdout(&o);
    assert!(out.contains("encoder 3 to 8 + horizon 3"), "{out}");
    assert!(out.contains("encoder_mask: bool [8]"), "{out}");
    assert!(
        out.contains("0 too short for a window"),
        "series f has 7 steps: {out}"
    );
    let bad = tmp.path().join("bad");
    let csv = tmp.path().join("long.csv");
    let mut args = vec!["data", "prepare", "--csv", csv.to_str().unwrap()];
    args.extend(windowed(&["--encoder-length", "4", "--horizon", "2"]));
    args.extend(["--min-encoder-length", "5", "--out", bad.to_str().unwrap()]);
    let o = kiln(&args);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("`min_encoder_length` = 5"),
        "{}",
        stderr(&o)
    );
    assert!(!bad.exists());
}

/// `kiln infer` of a windowed dataset writes forecasts as CSV only, and needs windows after the
/// cutoff: both refused with the flag or key to change, before any model runs.
#[test]
fn forecasts_refuse_another_output_format_and_a_split_with_nothing_to_forecast() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, o) = prepare(tmp.path(), "none");
    assert!(o.status.success(), "{}", stderr(&o));
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-run");
    let infer = |extra: &[&str]| {
        let mut args = vec!["infer", "--model", model.to_str().unwrap()];
        args.extend(["--inputs", dir.to_str().unwrap(), "--device", "cpu"]);
        args.extend(extra);
        kiln(&args)
    };
    let npy = tmp.path().join("f.npy");
    let o = infer(&["--output", npy.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("forecasts are written as CSV"),
        "{}",
        stderr(&o)
    );
    let o = infer(&["--set", "data.val_steps=0"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("data.val_steps = 0") && err.contains("at least the horizon (3)"),
        "{err}"
    );
    assert!(!npy.exists());
}

#[test]
fn prepare_windows_refuses_a_bad_command_line_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("long.csv");
    write_csv(&csv);
    let out = tmp.path().join("out");
    let base = |extra: &[&str]| {
        let mut args = vec!["data", "prepare", "--csv", csv.to_str().unwrap()];
        args.extend_from_slice(&["--out", out.to_str().unwrap()]);
        args.extend_from_slice(extra);
        kiln(&args)
    };
    let o = base(&SERIES);
    assert!(
        !o.status.success() && stderr(&o).contains("--encoder-length"),
        "{}",
        stderr(&o)
    );
    let o = base(&["--horizon", "3"]);
    assert!(
        !o.status.success() && stderr(&o).contains("--windows"),
        "{}",
        stderr(&o)
    );
    let mut named = windowed(&["--encoder-length", "4", "--horizon", "2"]);
    named[6] = "y=y.npy";
    let o = base(&named);
    assert!(stderr(&o).contains("not NAME=FILE"), "{}", stderr(&o));
    let o = base(&windowed(&[
        "--known",
        "humidity",
        "--encoder-length",
        "4",
        "--horizon",
        "2",
    ]));
    assert!(
        stderr(&o).contains("has no column `humidity`"),
        "{}",
        stderr(&o)
    );
    let mut args = vec!["data", "prepare"];
    args.extend(windowed(&["--encoder-length", "4", "--horizon", "2"]));
    args.extend(["--out", out.to_str().unwrap()]);
    let o = kiln(&args);
    let err = stderr(&o);
    assert!(err.contains("give --csv FILE or --parquet FILE"), "{err}");
    assert!(!out.exists());
}

/// A window's key: its series, first decoder time and encoder length.
type WindowKey = (String, i64, usize);

/// Every window of `d` by [`WindowKey`]: its arrays as `f64`s.
fn kiln_windows(d: &WindowedDataset) -> BTreeMap<WindowKey, BTreeMap<String, Vec<f64>>> {
    let specs = d.inputs();
    let n = d.len();
    let mut slots: Vec<Vec<u8>> = specs
        .iter()
        .map(|s| vec![0u8; n * s.numel() * s.dtype.model().size()])
        .collect();
    let mut targets = vec![0f32; n * d.target().numel()];
    let mut views: Vec<&mut [u8]> = slots.iter_mut().map(|s| &mut s[..]).collect();
    let indices: Vec<usize> = (0..n).collect();
    d.read_arrays(&indices, &mut views, TargetSlot::Values(&mut targets))
        .unwrap();
    let mut out = BTreeMap::new();
    for k in 0..n {
        let mut w = BTreeMap::new();
        for (spec, slot) in specs.iter().zip(&slots) {
            let (size, numel) = (spec.dtype.model().size(), spec.numel());
            let bytes = &slot[k * numel * size..(k + 1) * numel * size];
            let values: Vec<f64> = bytes
                .chunks_exact(size)
                .map(|b| match size {
                    1 => f64::from(b[0]),
                    8 => i64::from_ne_bytes(b.try_into().unwrap()) as f64,
                    _ => f32::from_ne_bytes(b.try_into().unwrap()) as f64,
                })
                .collect();
            w.insert(spec.name.clone(), values);
        }
        let t = &targets[k * H..(k + 1) * H];
        w.insert("target".into(), t.iter().map(|v| *v as f64).collect());
        let series = d.window(k).unwrap().0;
        let key = d.manifest().series[series].key[0].clone();
        let e = w["encoder_length"][0] as usize;
        out.insert((key, w["decoder_time"][0] as i64, e), w);
    }
    out
}

/// pytorch-forecasting's windows, as `pf_windows.py` writes them.
fn pf_windows(dir: &Path, normalize: &str, min_encoder: Option<usize>) -> Value {
    let Some(peers) = std::env::var_os("KILN_BENCH_PEERS") else {
        panic!(
            "KILN_BENCH_PEERS names the installed bench peers (pytorch-forecasting): `cargo \
             xtask test` installs them and sets it ({})",
            std::env::var("KILN_BENCH_PEERS_ERROR").unwrap_or_else(|_| "not set".into())
        );
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/pf_windows.py");
    let min = min_encoder.unwrap_or(E).to_string();
    let out = dir.join(format!("pf-{normalize}-{min}.json"));
    let o = std::process::Command::new(python())
        .arg(&script)
        .args(["--csv", dir.join("long.csv").to_str().unwrap()])
        .args(["--time", "t", "--group", "series", "--target", "y"])
        .args([
            "--known",
            "price",
            "--unknown",
            "temp,y",
            "--static",
            "region",
        ])
        .args([
            "--encoder-length",
            &E.to_string(),
            "--horizon",
            &H.to_string(),
        ])
        .args(["--val-steps", &V.to_string(), "--normalize", normalize])
        .args(["--min-encoder-length", &min])
        .args(["--out", out.to_str().unwrap()])
        .env("PYTHONPATH", peers)
        .output()
        .unwrap();
    assert!(o.status.success(), "pf_windows.py failed: {}", stderr(&o));
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(items) => items.iter().flat_map(flat).collect(),
        other => vec![other.as_f64().unwrap()],
    }
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and the bench peers' pytorch-forecasting \
            (KILN_BENCH_PEERS); `cargo xtask test` runs it"]
fn windows_match_pytorch_forecasting_time_series_data_set_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    for (normalize, min) in [("group", None), ("none", None), ("group", Some(3))] {
        let (dir, o) = prepare_min(tmp.path(), normalize, min);
        assert!(o.status.success(), "{}", stderr(&o));
        let (train, val) = Windows::open(&dir).unwrap().split(V).unwrap();
        let pf = pf_windows(tmp.path(), normalize, min);
        let normalize = format!("{normalize}, encoder {}–{E}", min.unwrap_or(E));
        for (split, ours) in [("train", kiln_windows(&train)), ("val", kiln_windows(&val))] {
            let theirs = pf[split].as_array().unwrap();
            assert_eq!(ours.len(), theirs.len(), "{normalize}: {split} windows");
            if min.is_some() {
                assert!(
                    ours.keys().any(|k| k.2 < E),
                    "{normalize}: {split} shorter windows"
                );
            }
            for w in theirs {
                let key = (
                    w["group"].as_str().unwrap().to_owned(),
                    w["decoder_start"].as_i64().unwrap(),
                    w["encoder_length"].as_u64().unwrap() as usize,
                );
                let mine = ours
                    .get(&key)
                    .unwrap_or_else(|| panic!("{split} window {key:?}"));
                // A series with one step before its cutoff: pytorch-forecasting's scale is
                // undefined (NaN), kiln's 1; the scaled history is not compared.
                let undefined = w["target_scale"][1].is_null();
                if undefined {
                    assert_eq!(mine["target_scale"][1], 1.0, "{normalize} {key:?}");
                }
                let scaled = ["encoder_cont", "target_scale"];
                for (name, pf_name) in [
                    ("encoder_cont", "encoder_cont"),
                    ("decoder_cont", "decoder_known"),
                    ("encoder_target", "encoder_target"),
                    ("target", "target"),
                    ("target_scale", "target_scale"),
                    ("static_cat", "static_cat"),
                ] {
                    if undefined && scaled.contains(&name) {
                        continue;
                    }
                    // A shorter history is padded to the encoder length with zeros.
                    let (a, b) = (&mine[name], flat(&w[pf_name]));
                    let (a, padding) = a.split_at(b.len().min(a.len()));
                    assert!(
                        padding.iter().all(|&v| v == 0.0),
                        "{normalize} {key:?} {name}"
                    );
                    assert_eq!(a.len(), b.len(), "{normalize} {split} {key:?} {name}");
                    for (x, y) in a.iter().zip(&b) {
                        assert!(
                            (x - y).abs() <= 2e-6 * y.abs().max(1.0),
                            "{normalize} {split} {key:?} {name}: kiln {a:?}, pytorch-forecasting {b:?}"
                        );
                    }
                }
            }
        }
    }
}

/// `d`'s windows as JSON tensors by name (`{"shape", "values"}`), the targets as `target`.
fn windows_json(d: &WindowedDataset) -> Value {
    let n = d.len();
    let mut by_key = kiln_windows(d).into_values().collect::<Vec<_>>();
    let mut out = serde_json::Map::new();
    let mut specs = d.inputs();
    specs.push(kiln_data::ArraySpec {
        name: "target".into(),
        dtype: kiln_data::DType::F32,
        shape: d.target().shape().to_vec(),
        ids: false,
    });
    for spec in specs {
        let values: Vec<f64> = by_key
            .iter_mut()
            .flat_map(|w| w.remove(&spec.name).unwrap())
            .collect();
        let shape: Vec<usize> = [&[n][..], &spec.shape].concat();
        out.insert(
            spec.name.clone(),
            serde_json::json!({"shape": shape, "values": values}),
        );
    }
    Value::Object(out)
}

/// The windowed dataset (normalised per series) in `dir`, every window training: its directory,
/// its window count, and what `script` (`make`) computed in eager PyTorch on its windows.
fn eager_on_windows(dir: &Path, script: &str) -> (PathBuf, usize, Value) {
    let (windows, o) = prepare(dir, "group");
    assert!(o.status.success(), "{}", stderr(&o));
    let (train_windows, _) = Windows::open(&windows).unwrap().split(0).unwrap();
    let json = windows_json(&train_windows);
    std::fs::write(dir.join("windows.json"), json.to_string()).unwrap();
    (windows, train_windows.len(), make_reference(script, dir))
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON); `cargo xtask test` runs it"]
fn a_forecaster_taking_a_dict_learns_from_windows_as_pytorch_eager_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, n, reference) = eager_on_windows(tmp.path(), "windows_model.py");
    let runs = tmp.path().join("runs");
    let args = ["--epochs", "20", "--set", "data.val_steps=0"];
    let o = train(&tmp.path().join("forecaster.pt"), &dir, &runs, n, &args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains(&format!("{n} train, 0 validate")), "{err}");
    let ours = step_losses(&only_run(&runs));
    assert_same_losses(&ours, &reference["losses"], 1e-4);
    assert!(ours[19] < 0.5 * ours[0], "learned: {ours:?}");
    // A point forecast is judged per horizon step; with one batch an epoch, the MSE loss is
    // the square of the RMSE over the horizon.
    let s = summary(&only_run(&runs));
    let (loss, rmse) = (
        number(&s, "final_train_loss"),
        number(&s, "final_train_rmse"),
    );
    assert!((rmse * rmse - loss).abs() < 1e-5 * loss.max(1.0), "{s}");
    let per_step = |m: &str| -> Vec<f64> {
        (1..=H)
            .map(|h| number(&s, &format!("final_train_{m}_h{h}")))
            .collect()
    };
    let mean_sq: f64 = per_step("rmse").iter().map(|r| r * r).sum::<f64>() / H as f64;
    assert!((mean_sq - loss).abs() < 1e-5 * loss.max(1.0), "{s}");
    assert!(per_step("mae").iter().all(|&v| v > 0.0), "{s}");
    assert!(s.get("final_train_quantile_loss").is_none(), "{s}");
    // Its forecasts, at the profile's inference precision (bf16 on some CPUs): a point
    // forecast per window and step.
    let csv = tmp.path().join("forecasts.csv");
    let o = kiln(&[
        "infer",
        "--model",
        only_run(&runs).to_str().unwrap(),
        "--inputs",
        dir.to_str().unwrap(),
        "--output",
        csv.to_str().unwrap(),
        "--device",
        "cpu",
        // Levels named for a model that forecasts one value: still a point forecast.
        "--set",
        "model.quantiles=0.1,0.5,0.9",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("series,t,step,y,y_forecast\n"), "{text}");
    assert_eq!(text.lines().count(), 1 + 5 * H, "{text}");
    assert!(
        stdout(&o).contains("over the horizon: mae "),
        "{}",
        stdout(&o)
    );
}

/// A run's `summary.json`.
fn summary(run: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

/// `key` of `v` as a number.
fn number(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {key} in {v}"))
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and a C++ compiler; `cargo xtask test` runs it"]
fn an_exported_forecaster_taking_a_dict_learns_from_windows_as_pytorch_eager_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, n, reference) = eager_on_windows(tmp.path(), "windows_program.py");
    let args = [
        "--epochs",
        "50",
        "--loss",
        "module",
        "--set",
        "data.val_steps=0",
        "--set",
        "model.quantiles=0.1,0.5,0.9",
        "--set",
        "model.output=1",
    ];
    let runs = tmp.path().join("runs");
    let o = train(&tmp.path().join("forecaster.pt2"), &dir, &runs, n, &args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let ours = step_losses(&only_run(&runs));
    assert_same_losses(&ours, &reference["losses"], 1e-4);
    assert!(ours[49] < 0.65 * ours[0], "learned: {ours:?}");
    // The module's own pinball loss is kiln's quantile loss: one batch an epoch, the same
    // forward; and per horizon step, in the original units.
    let s = summary(&only_run(&runs));
    let loss = number(&s, "final_train_loss");
    let ql = number(&s, "final_train_quantile_loss");
    assert!((ql - loss).abs() < 1e-5 * loss.max(1.0), "{s}");
    let steps: f64 = (1..=H)
        .map(|h| number(&s, &format!("final_train_quantile_loss_h{h}")))
        .sum();
    assert!(
        (steps / H as f64 - loss).abs() < 1e-5 * loss.max(1.0),
        "{s}"
    );
    assert!(number(&s, "final_train_mae_h1") > 0.0, "{s}");
    assert!(
        !err.contains("mae_h1"),
        "per-step values stay out of the log: {err}"
    );
    forecasts_are_written_in_original_units(tmp.path(), &only_run(&runs), &dir);
    // An input whose dtype is not its array's is named before anything compiles.
    let bad = tmp.path().join("bad-runs");
    let o = train(&tmp.path().join("mismatched.pt2"), &dir, &bad, n, &args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("input `static_cat` takes [batch, 1] float32; the array is [1] int64"),
        "{err}"
    );
    assert!(!bad.exists(), "nothing is written: {err}");
}

/// `kiln infer` of the trained forecaster `run` over `windows`: the last horizon of each series
/// as CSV (group, time, step, the actual value from the source table, a column per quantile),
/// its report's metrics those of the CSV's rows.
fn forecasts_are_written_in_original_units(tmp: &Path, run: &Path, windows: &Path) {
    let csv = tmp.join("forecasts.csv");
    let args = [
        "infer",
        "--model",
        run.to_str().unwrap(),
        "--inputs",
        windows.to_str().unwrap(),
        "--output",
        csv.to_str().unwrap(),
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--format",
        "json",
    ];
    let o = kiln(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("series,t,step,y,y_q0.1,y_q0.5,y_q0.9"));
    let source = std::fs::read_to_string(tmp.join("long.csv")).unwrap();
    let truth: BTreeMap<(String, i64), f64> = source
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                (f[0].to_owned(), f[1].parse().unwrap()),
                f[2].parse().unwrap(),
            )
        })
        .collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    // Series a–e (f is too short for a window), each its last H steps, 37 to 39.
    assert_eq!(rows.len(), 5 * H, "{text}");
    let (mut abs, mut pinball) = (0.0, 0.0);
    for row in &rows {
        let (t, step): (i64, usize) = (row[1].parse().unwrap(), row[2].parse().unwrap());
        assert_eq!(t, 40 - H as i64 + step as i64 - 1, "{row:?}");
        let y: f64 = row[3].parse().unwrap();
        assert!((y - truth[&(row[0].to_owned(), t)]).abs() < 1e-4, "{row:?}");
        let q: Vec<f64> = row[4..7].iter().map(|v| v.parse().unwrap()).collect();
        abs += (q[1] - y).abs();
        pinball += [0.1, 0.5, 0.9]
            .iter()
            .zip(&q)
            .map(|(l, p)| (l * (y - p)).max((l - 1.0) * (y - p)))
            .sum::<f64>()
            / 3.0;
    }
    let n = rows.len() as f64;
    let metric = |k: &str| number(&report["metrics"], k);
    assert!(
        (metric("mae") - abs / n).abs() < 1e-3 * metric("mae").max(1.0),
        "{report}"
    );
    assert!(
        (metric("quantile_loss") - pinball / n).abs() < 1e-3,
        "{report}"
    );
    assert!(
        report["metrics"]["quantile_loss_h3"].is_number(),
        "{report}"
    );
    // Never overwritten: a second run names the file and leaves it.
    let o = kiln(&args);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("exists already"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&csv).unwrap(), text);
}
