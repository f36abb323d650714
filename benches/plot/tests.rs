//! The charts drawn from reports: files, names, colours, odd values.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use plotters::style::RGBColor;
use serde_json::{Value, json};

use super::canvas::{MET, MISSED, NO_GOAL, SVG_FONT_FAMILY, short};
use super::ratio::ratio_range;
use super::sweep::{batch_token, power_of_two_label, series_key};
use super::{SWEEP_STEM, slug, unique, write_plots};
use crate::report::{Report, SWEEP_GROUP};
use kiln_train::plot::{FONT, tick_label};

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

fn comparison(suite: &str, name: &str, ratio: f64, goal: Value, meets: Value) -> Value {
    json!({
        "suite": suite, "name": name, "group": "step time",
        "kiln": ratio * 10.0, "baseline": 10.0, "baseline_name": "PyTorch eager fp32",
        "unit": "ms/step", "better": "lower", "ratio": ratio,
        "goal": goal, "meets_goal": meets, "details": {"batch_size": 8}
    })
}

fn report_json(comparisons: Vec<Value>) -> Value {
    json!({
        "schema": "kiln-bench/1", "created": "2026-11-21T10:00:00Z", "quick": false,
        "machine": {"cpus": 2, "device": "cpu"},
        "comparisons": comparisons
    })
}

fn report(comparisons: Vec<Value>) -> Report {
    Report::from_value(&report_json(comparisons)).expect("a well-formed report")
}

fn sweep_point(name: &str, unit: &str, batch: u64, kiln: f64, baseline: f64) -> Value {
    json!({
        "suite": "train", "name": name, "group": SWEEP_GROUP,
        "kiln": kiln, "baseline": baseline, "baseline_name": "PyTorch eager fp32",
        "unit": unit, "better": "higher", "ratio": kiln / baseline,
        "goal": null, "meets_goal": null, "details": {"batch_size": batch}
    })
}

fn file_names(paths: &[PathBuf]) -> Vec<String> {
    paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).expect("read PNG");
    assert!(bytes.len() > 1000, "{} is too small", path.display());
    assert!(bytes.starts_with(PNG_MAGIC), "{} is no PNG", path.display());
}

fn read_svg(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read SVG");
    assert!(text.contains("<svg"), "{} is no SVG", path.display());
    assert!(!text.contains(FONT), "the internal font name leaked");
    text
}

/// Also copies the charts to `$PLOT_SAMPLE_DIR` when that variable is set, for eyeballing.
fn sample(paths: &[PathBuf]) {
    if let Ok(dir) = std::env::var("PLOT_SAMPLE_DIR") {
        for p in paths {
            std::fs::copy(p, Path::new(&dir).join(p.file_name().unwrap())).unwrap();
        }
    }
}

#[test]
fn one_chart_per_suite_in_png_and_svg() {
    let goal = |op: &str, v: f64| json!({"op": op, "value": v});
    let mut higher = comparison(
        "data",
        "loader samples/s",
        1.4,
        goal(">=", 1.0),
        json!(true),
    );
    higher["better"] = json!("higher");
    let report = report(vec![
        comparison(
            "train",
            "transformer fp32 step",
            0.91,
            goal("<=", 1.0),
            json!(true),
        ),
        comparison(
            "train",
            "mlp bf16 step",
            1.25,
            goal("<=", 1.1),
            json!(false),
        ),
        comparison("train", "resnet step", 1.02, Value::Null, Value::Null),
        comparison("data", "loader epoch", 0.5, goal("<=", 1.0), json!(true)),
        higher,
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_plots(&report, dir.path()).expect("plots written");
    sample(&paths);
    assert_eq!(
        file_names(&paths),
        ["train.png", "train.svg", "data.png", "data.svg"]
    );
    for p in &paths {
        assert!(p.starts_with(dir.path()));
    }
    assert_png(&paths[0]);
    assert_png(&paths[2]);
    let train = read_svg(&paths[1]);
    for name in [
        "transformer fp32 step",
        "mlp bf16 step",
        "resnet step",
        "lower is better",
        "ratio kiln / baseline",
    ] {
        assert!(train.contains(name), "train.svg lacks {name:?}");
    }
    assert!(!train.contains("loader epoch"));
    let data = read_svg(&paths[3]);
    for name in [
        "loader epoch",
        "loader samples/s",
        "higher is better",
        "goal ≥ 1.00",
    ] {
        assert!(data.contains(name), "data.svg lacks {name:?}");
    }
    assert!(data.contains(SVG_FONT_FAMILY));
}

#[test]
fn reports_assembled_by_the_report_module_are_drawn() {
    use crate::report::{Better, Comparison as Row};
    let rows = [
        Row::new(
            "serve",
            "latency",
            "p95 latency",
            "ms",
            Better::Lower,
            (4.0, 5.0),
            "TorchServe",
        )
        .at_most(1.0),
        Row::new(
            "serve",
            SWEEP_GROUP,
            "mlp b=16 throughput",
            "req/s",
            Better::Higher,
            (900.0, 800.0),
            "TorchServe",
        )
        .detail("batch_size", json!(16)),
    ];
    let mut report = report(vec![]);
    report.comparisons = rows.to_vec();
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_plots(&report, dir.path()).expect("plots written");
    assert_eq!(
        file_names(&paths),
        [
            "serve.png",
            "serve.svg",
            "serve-batch-sweep.png",
            "serve-batch-sweep.svg"
        ]
    );
    let serve = read_svg(&paths[1]);
    assert!(serve.contains("p95 latency") && serve.contains("0.80 (goal ≤ 1.00)"));
    let sweep = read_svg(&paths[3]);
    assert!(sweep.contains("req/s") && sweep.contains("TorchServe"));
}

#[test]
fn bars_are_coloured_by_goal() {
    let report = report(vec![
        comparison(
            "t",
            "met",
            0.5,
            json!({"op": "<=", "value": 1.0}),
            json!(true),
        ),
        comparison(
            "t",
            "missed",
            1.5,
            json!({"op": "<=", "value": 1.0}),
            json!(false),
        ),
        comparison("t", "none", 1.0, Value::Null, Value::Null),
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_plots(&report, dir.path()).expect("plots written");
    let svg = read_svg(&paths[1]);
    let hex = |c: RGBColor| format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
    for color in [MET, MISSED, NO_GOAL] {
        assert!(
            svg.to_uppercase().contains(&hex(color)),
            "no {} in the SVG",
            hex(color)
        );
    }
}

#[test]
fn a_sweep_gets_its_own_chart() {
    let mut rows = Vec::new();
    for b in [8u64, 16, 32, 64, 128] {
        let f = b as f64;
        rows.push(sweep_point(
            &format!("transformer fp32 b={b} throughput"),
            "samples/s",
            b,
            100.0 * f.sqrt(),
            90.0 * f.sqrt(),
        ));
        rows.push(sweep_point(
            &format!("mlp bf16 b={b} throughput"),
            "samples/s",
            b,
            300.0 * f.sqrt(),
            200.0 * f.sqrt(),
        ));
        rows.push(sweep_point(
            &format!("transformer fp32 b={b} peak memory"),
            "MiB",
            b,
            50.0 + f,
            60.0 + 1.5 * f,
        ));
    }
    rows.push(comparison(
        "train",
        "transformer fp32 step",
        0.9,
        Value::Null,
        Value::Null,
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_plots(&report(rows), dir.path()).expect("plots written");
    sample(&paths);
    assert_eq!(
        file_names(&paths),
        [
            "train.png",
            "train.svg",
            "train-batch-sweep.png",
            "train-batch-sweep.svg"
        ]
    );
    let train = read_svg(&paths[1]);
    assert!(!train.contains("b=8"), "sweep points are not ratio bars");
    assert_png(&paths[2]);
    let sweep = read_svg(&paths[3]);
    for text in [
        "samples/s",
        "MiB",
        "transformer fp32 throughput · kiln",
        "mlp bf16 throughput · PyTorch eager fp32",
        "batch size (log2 scale)",
    ] {
        assert!(sweep.contains(text), "train-batch-sweep.svg lacks {text:?}");
    }
}

#[test]
fn a_sweep_alone_writes_only_the_sweep() {
    let rows = [8u64, 32]
        .iter()
        .map(|&b| sweep_point(&format!("mlp b={b}"), "samples/s", b, 1.0, 2.0))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_plots(&report(rows), dir.path()).expect("plots written");
    assert_eq!(
        file_names(&paths),
        ["train-batch-sweep.png", "train-batch-sweep.svg"]
    );
    // One series: the legend says just kiln and the baseline's name.
    let svg = read_svg(&paths[1]);
    assert!(svg.contains("kiln") && !svg.contains(" · kiln"));
    assert!(svg.contains("PyTorch eager fp32"));
}

#[test]
fn rows_with_loss_curves_get_a_loss_chart_each() {
    let mut row = comparison(
        "learning",
        "transformer fp32: largest |Δloss|",
        0.0,
        json!(null),
        json!(null),
    );
    row["details"] = json!({"model": "transformer", "precision": "fp32",
        "loss_curves": {"kiln": [4.6, 3.1, 2.2, null], "baseline": [4.6, 3.1, 2.25, 1.9],
                        "baseline_name": "PyTorch twin fp32"}});
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_plots(&report(vec![row]), dir.path()).expect("plots written");
    assert_eq!(
        file_names(&paths),
        [
            "learning.png",
            "learning.svg",
            "learning-loss-transformer-fp32.png",
            "learning-loss-transformer-fp32.svg"
        ]
    );
    assert_png(&paths[2]);
    let svg = read_svg(&paths[3]);
    for text in [
        "transformer fp32: training loss per step",
        "kiln − baseline",
        "PyTorch twin fp32",
    ] {
        assert!(svg.contains(text), "the loss chart lacks {text:?}");
    }
    sample(&paths);
}

#[test]
fn nan_and_missing_values_do_not_panic() {
    let nan = f64::NAN;
    // serde_json writes non-finite floats as null, which reads back as NaN; empty names and
    // absent details stand for the other odd things a report might hold.
    let row = |suite: &str, name: &str, group: &str, (kiln, baseline, ratio): (f64, f64, f64)| {
        json!({"suite": suite, "name": name, "group": group, "kiln": kiln,
               "baseline": baseline, "baseline_name": "", "unit": "", "better": "lower",
               "ratio": ratio, "goal": null, "meets_goal": null})
    };
    let rows = vec![
        comparison(
            "train",
            "all nan",
            nan,
            json!({"op": "<=", "value": nan}),
            json!(false),
        ),
        row("", "no suite at all", "g", (1.0, 1.0, 1.0)),
        row("train", "huge", "g", (1e300, 1.0, 1e300)),
        row("train", "negative", "g", (-2.0, 1.0, -2.0)),
        row("train", "computed", "g", (3.0, 2.0, nan)),
        row("train", "zero baseline", "g", (3.0, 0.0, nan)),
        sweep_point("mlp b=8 throughput", "samples/s", 8, nan, nan),
        row("train", "no batch size", SWEEP_GROUP, (1.0, 2.0, 0.5)),
        {
            let mut r = row("train", "mlp b=16 throughput", SWEEP_GROUP, (1.0, nan, nan));
            r["details"] = json!({"batch_size": -4});
            r
        },
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_plots(&report(rows), dir.path()).expect("plots written");
    sample(&paths);
    assert_eq!(
        file_names(&paths),
        [
            "train.png",
            "train.svg",
            "unnamed-suite.png",
            "unnamed-suite.svg",
            "train-batch-sweep.png",
            "train-batch-sweep.svg"
        ]
    );
    for p in paths.iter().filter(|p| p.extension().unwrap() == "png") {
        assert_png(p);
    }
    let train = read_svg(&paths[1]);
    assert!(train.contains("all nan") && train.contains("no value"));
    assert!(train.contains("1.50"), "the computed ratio 3 / 2 is drawn");
}

#[test]
fn a_malformed_report_is_an_error_before_drawing() {
    let mut bad = report_json(vec![comparison("t", "x", 1.0, Value::Null, Value::Null)]);
    bad["comparisons"][0]["ratio"] = json!("fast");
    let err = Report::from_value(&bad).unwrap_err();
    assert!(err.contains("not a kiln-bench/1 report"), "{err}");
    bad["comparisons"][0]["ratio"] = json!(1.0);
    bad["comparisons"][0]["goal"] = json!({"op": "~", "value": 1.0});
    assert!(
        Report::from_value(&bad).is_err(),
        "an unknown goal op is refused"
    );
    let err = Report::from_value(&json!({"schema": "kiln-bench/1"})).unwrap_err();
    assert!(err.contains("comparisons"), "{err}");
}

#[test]
fn the_fixture_report_is_drawn() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/report/report.json");
    let report = Report::read(&fixture).expect("the fixture reads");
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_plots(&report, dir.path()).expect("plots written");
    assert_eq!(
        file_names(&paths),
        [
            "train.png",
            "train.svg",
            "learning.png",
            "learning.svg",
            "train-batch-sweep.png",
            "train-batch-sweep.svg",
            "learning-loss-mlp-fp32.png",
            "learning-loss-mlp-fp32.svg"
        ]
    );
    let svg = read_svg(&paths[1]);
    assert!(
        svg.contains("(goal ≤ 1.00)") && svg.contains("(goal ≥ 0.70)"),
        "{svg}"
    );
}

#[test]
fn a_report_without_comparisons_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("plots");
    let paths = write_plots(&report(vec![]), &target).expect("nothing to do");
    assert!(paths.is_empty());
    assert!(!target.exists(), "no directory for no plots");
}

#[test]
fn unwritable_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let report = report(vec![comparison("t", "x", 1.0, Value::Null, Value::Null)]);
    let err = write_plots(&report, &file).unwrap_err();
    assert!(err.contains(&file.display().to_string()), "{err}");
}

#[test]
fn slugs_are_file_safe_and_unique() {
    assert_eq!(slug("train"), "train");
    assert_eq!(slug("Train / Serve (fp32)"), "train-serve-fp32");
    assert_eq!(slug("  --ünï--  "), "n");
    assert_eq!(slug("日本"), "suite");
    assert_eq!(slug(""), "suite");
    let mut taken = HashSet::from([SWEEP_STEM.to_owned()]);
    assert_eq!(unique(slug("Batch sweep"), &mut taken), "batch-sweep-2");
    assert_eq!(unique(slug("batch_sweep"), &mut taken), "batch-sweep-3");
    assert_eq!(unique(slug("x"), &mut taken), "x");
}

#[test]
fn sweep_names_lose_only_their_batch_token() {
    assert_eq!(
        series_key("transformer fp32 b=8 throughput"),
        "transformer fp32 throughput"
    );
    assert_eq!(series_key("b=128 mlp"), "mlp");
    assert_eq!(series_key("b=x mlp"), "b=x mlp");
    assert_eq!(batch_token("transformer b=32 memory"), Some(32.0));
    assert_eq!(batch_token("transformer memory"), None);
}

#[test]
fn labels_are_tidy() {
    assert_eq!(power_of_two_label(3.0), "8");
    assert_eq!(power_of_two_label(0.0), "1");
    assert_eq!(power_of_two_label(3.5), "");
    assert_eq!(power_of_two_label(-1.0), "2^-1");
    assert_eq!(short(0.912), "0.91");
    assert_eq!(short(12.34), "12.3");
    assert_eq!(short(1234.0), "1234");
    assert_eq!(short(1e300), "1.00e300");
    assert_eq!(tick_label(0.5, 2.0), "0.5");
    assert_eq!(ratio_range([0.5, 2.0].into_iter()), (0.0, 2.6));
    assert_eq!(ratio_range(std::iter::empty()), (0.0, 1.3));
}
