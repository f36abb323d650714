//! The charts drawn from reports: files, names, colours, odd values.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::canvas::{MET, MISSED, NO_GOAL, SVG_FONT_FAMILY, short};
use super::ratio::ratio_range;
use super::sweep::{batch_token, power_of_two_label, series_key};
use super::{SWEEP_STEM, slug, unique, write_plots};
use crate::report::{Better, Comparison, MS_STEP, Report, SWEEP_GROUP, Unit};
use kiln_train::plot::{FONT, tick_label};

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

/// A comparison against "PyTorch eager fp32" without a goal; `kbr`: kiln, baseline, ratio.
fn comparison(suite: &str, name: &str, group: &str, unit: Unit, kbr: [f64; 3]) -> Comparison {
    let [kiln, baseline, ratio] = kbr;
    let eager = "PyTorch eager fp32";
    let c = Comparison::new(suite, group, name, unit, (kiln, baseline), eager);
    Comparison { ratio, ..c }
}

/// A step-time row of `suite` at `ratio` (a goal added by `at_most`/`at_least` is judged on it).
fn row(suite: &str, name: &str, ratio: f64) -> Comparison {
    let kbr = [ratio * 10.0, 10.0, ratio];
    comparison(suite, name, "step time", MS_STEP, kbr).detail("batch_size", json!(8))
}

/// `comparisons` in a report as `report.json` holds it (non-finite numbers as null).
fn report_json(comparisons: Vec<Comparison>) -> Value {
    json!({
        "schema": "kiln-bench/1", "created": "2026-11-21T10:00:00Z", "quick": false,
        "machine": {"cpus": 2, "device": "cpu"}, "comparisons": comparisons
    })
}

fn report(comparisons: Vec<Comparison>) -> Report {
    Report::from_value(&report_json(comparisons)).expect("a well-formed report")
}

fn sweep_point(name: &str, unit: &'static str, batch: u64, kiln: f64, baseline: f64) -> Comparison {
    let kbr = [kiln, baseline, kiln / baseline];
    let point = comparison("train", name, SWEEP_GROUP, (unit, Better::Higher), kbr);
    point.detail("batch_size", json!(batch))
}

/// Draws `report` and checks it wrote just `stems` as PNG and SVG, each SVG holding its `texts`;
/// returns the SVGs. Copies the charts to `$PLOT_SAMPLE_DIR` if set, for eyeballing.
fn draws(report: &Report, stems: &[&str], texts: &[&[&str]]) -> Vec<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths: Vec<PathBuf> = write_plots(report, dir.path()).expect("plots written");
    let names: Vec<String> = paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let files = stems
        .iter()
        .flat_map(|s| [format!("{s}.png"), format!("{s}.svg")]);
    assert_eq!(names, files.collect::<Vec<_>>());
    let mut svgs = vec![];
    for p in &paths {
        assert!(p.starts_with(dir.path()));
        if p.extension().unwrap() == "png" {
            let bytes = std::fs::read(p).expect("read PNG");
            assert!(bytes.len() > 1000, "{} is too small", p.display());
            assert!(bytes.starts_with(PNG_MAGIC), "{} is no PNG", p.display());
        } else {
            let text = std::fs::read_to_string(p).expect("read SVG");
            assert!(text.contains("<svg"), "{} is no SVG", p.display());
            assert!(!text.contains(FONT), "the internal font name leaked");
            svgs.push(text);
        }
        if let Ok(sample) = std::env::var("PLOT_SAMPLE_DIR") {
            std::fs::copy(p, Path::new(&sample).join(p.file_name().unwrap())).unwrap();
        }
    }
    for ((svg, stem), texts) in svgs.iter().zip(stems).zip(texts) {
        for text in *texts {
            assert!(svg.contains(text), "{stem}.svg lacks {text:?}");
        }
    }
    svgs
}

#[test]
fn one_chart_per_suite_in_png_and_svg_its_bars_coloured_by_goal() {
    let mut higher = row("data", "loader samples/s", 1.4).at_least(1.0);
    higher.better = Better::Higher;
    let report = report(vec![
        row("train", "transformer fp32 step", 0.91).at_most(1.0),
        row("train", "mlp bf16 step", 1.25).at_most(1.1),
        row("train", "resnet step", 1.02),
        row("data", "loader epoch", 0.5).at_most(1.0),
        higher,
    ]);
    let train = [
        "transformer fp32 step",
        "mlp bf16 step",
        "resnet step",
        "lower is better",
        "ratio kiln / baseline",
    ];
    let data = [
        "loader epoch",
        "loader samples/s",
        "higher is better",
        "goal ≥ 1.00",
    ];
    let svgs = draws(&report, &["train", "data"], &[&train, &data]);
    assert!(!svgs[0].contains("loader epoch"));
    for c in [MET, MISSED, NO_GOAL] {
        let color = format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
        assert!(
            svgs[0].to_uppercase().contains(&color),
            "no {color} in the SVG"
        );
    }
    assert!(svgs[1].contains(SVG_FONT_FAMILY));
}

#[test]
fn a_sweep_gets_its_own_chart() {
    let mut rows = Vec::new();
    for b in [8u64, 16, 32, 64, 128] {
        let (f, name) = (b as f64, |s: &str| s.replace("{b}", &b.to_string()));
        let speed = |series: &str, k: f64, t: f64| {
            sweep_point(&name(series), "samples/s", b, k * f.sqrt(), t * f.sqrt())
        };
        rows.push(speed("transformer fp32 b={b} throughput", 100.0, 90.0));
        rows.push(speed("mlp bf16 b={b} throughput", 300.0, 200.0));
        let memory = name("transformer fp32 b={b} peak memory");
        rows.push(sweep_point(&memory, "MiB", b, 50.0 + f, 60.0 + 1.5 * f));
    }
    rows.push(row("train", "transformer fp32 step", 0.9));
    let sweep = [
        "samples/s",
        "MiB",
        "transformer fp32 throughput · kiln",
        "mlp bf16 throughput · PyTorch eager fp32",
        "batch size (log2 scale)",
    ];
    let stems = ["train", "train-batch-sweep"];
    let svgs = draws(&report(rows), &stems, &[&[], &sweep]);
    assert!(!svgs[0].contains("b=8"), "sweep points are not ratio bars");
    // A sweep alone writes only the sweep; with one series, the legend says just kiln and the
    // baseline's name.
    let rows = [8u64, 32].map(|b| sweep_point(&format!("mlp b={b}"), "samples/s", b, 1.0, 2.0));
    let texts: &[&str] = &["kiln", "PyTorch eager fp32"];
    let svgs = draws(&report(rows.to_vec()), &["train-batch-sweep"], &[texts]);
    assert!(!svgs[0].contains(" · kiln"));
}

#[test]
fn rows_with_loss_curves_get_a_loss_chart_each() {
    let mut loss = row("learning", "transformer fp32: largest |Δloss|", 0.0);
    loss.details = json!({"model": "transformer", "precision": "fp32",
        "loss_curves": {"kiln": [4.6, 3.1, 2.2, null], "baseline": [4.6, 3.1, 2.25, 1.9],
                        "baseline_name": "PyTorch twin fp32"}});
    let stems = ["learning", "learning-loss-transformer-fp32"];
    let texts = [
        "transformer fp32: training loss per step",
        "kiln − baseline",
        "PyTorch twin fp32",
    ];
    draws(&report(vec![loss]), &stems, &[&[], &texts]);
}

#[test]
fn nan_and_missing_values_do_not_panic() {
    let nan = f64::NAN;
    // serde_json writes non-finite floats as null, which reads back as NaN; empty names and
    // absent details stand for the other odd things a report might hold.
    let odd = |suite: &str, name: &str, group: &str, kbr: [f64; 3]| Comparison {
        baseline_name: String::new(),
        details: Value::Null,
        ..comparison(suite, name, group, ("", Better::Lower), kbr)
    };
    let mut no_batch = odd("train", "mlp b=16 throughput", SWEEP_GROUP, [1.0, nan, nan]);
    no_batch.details = json!({"batch_size": -4});
    let rows = vec![
        row("train", "all nan", nan).at_most(nan),
        odd("", "no suite at all", "g", [1.0, 1.0, 1.0]),
        odd("train", "huge", "g", [1e300, 1.0, 1e300]),
        odd("train", "negative", "g", [-2.0, 1.0, -2.0]),
        odd("train", "computed", "g", [3.0, 2.0, nan]),
        odd("train", "zero baseline", "g", [3.0, 0.0, nan]),
        sweep_point("mlp b=8 throughput", "samples/s", 8, nan, nan),
        odd("train", "no batch size", SWEEP_GROUP, [1.0, 2.0, 0.5]),
        no_batch,
    ];
    // "1.50": the computed ratio 3 / 2 drawn.
    let train: &[&str] = &["all nan", "no value", "1.50"];
    let stems = ["train", "unnamed-suite", "train-batch-sweep"];
    draws(&report(rows), &stems, &[train]);
}

#[test]
fn a_malformed_report_is_an_error_before_drawing() {
    let mut bad = report_json(vec![row("t", "x", 1.0)]);
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
    let stems = [
        "train",
        "learning",
        "train-batch-sweep",
        "learning-loss-mlp-fp32",
    ];
    draws(&report, &stems, &[&["(goal ≤ 1.00)", "(goal ≥ 0.70)"]]);
}

#[test]
fn no_comparisons_write_nothing_and_an_unwritable_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("plots");
    let paths = write_plots(&report(vec![]), &target).expect("nothing to do");
    assert!(paths.is_empty());
    assert!(!target.exists(), "no directory for no plots");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let err = write_plots(&report(vec![row("t", "x", 1.0)]), &file).unwrap_err();
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
fn sweep_names_lose_only_their_batch_token_and_labels_are_tidy() {
    let key = series_key("transformer fp32 b=8 throughput");
    assert_eq!(key, "transformer fp32 throughput");
    assert_eq!(series_key("b=128 mlp"), "mlp");
    assert_eq!(series_key("b=x mlp"), "b=x mlp");
    assert_eq!(batch_token("transformer b=32 memory"), Some(32.0));
    assert_eq!(batch_token("transformer memory"), None);
    for (v, label) in [(3.0, "8"), (0.0, "1"), (3.5, ""), (-1.0, "2^-1")] {
        assert_eq!(power_of_two_label(v), label);
    }
    assert_eq!(short(0.912), "0.91");
    assert_eq!(short(12.34), "12.3");
    assert_eq!(short(1234.0), "1234");
    assert_eq!(short(1e300), "1.00e300");
    assert_eq!(tick_label(0.5, 2.0), "0.5");
    assert_eq!(ratio_range([0.5, 2.0].into_iter()), (0.0, 2.6));
    assert_eq!(ratio_range(std::iter::empty()), (0.0, 1.3));
}
