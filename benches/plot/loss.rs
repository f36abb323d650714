//! The loss-curve chart of a same-learning row: both sides' loss per step, then their difference.

use plotters::prelude::*;
use serde::Deserialize;

use super::canvas::{FAINT, Line, LineChart, LinePanel, PANEL_HEIGHT, SERIES_COLORS};
use super::{joined, min_max, number, slug};
use crate::report::Comparison;

/// A row's `details.loss_curves`: each side's loss per step (`null`: none), the baseline's name.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct LossCurves {
    kiln: Vec<Option<f64>>,
    baseline: Vec<Option<f64>>,
    baseline_name: Option<String>,
}

/// Points `(step, loss)` of a curve, unusable values left out.
fn curve(v: &[Option<f64>]) -> Vec<(f64, f64)> {
    let point = |(i, l): (usize, &Option<f64>)| Some((i as f64, number((*l)?)?));
    v.iter().enumerate().filter_map(point).collect()
}

/// The chart of `c` if it has (well-formed) loss curves, with its file stem:
/// `<suite>-loss-<model>-<precision>` (or the row's name when the details do not say).
pub fn loss_chart(c: &Comparison, subtitle: &str) -> Option<(String, LineChart)> {
    let curves = LossCurves::deserialize(c.details.get("loss_curves")?).ok()?;
    let (kiln, baseline) = (curve(&curves.kiln), curve(&curves.baseline));
    if kiln.is_empty() && baseline.is_empty() {
        return None;
    }
    let which = match (c.details["model"].as_str(), c.details["precision"].as_str()) {
        (Some(m), Some(p)) => format!("{m} {p}"),
        _ => c.name.clone(),
    };
    let base = curves.baseline_name.unwrap_or(c.baseline_name.clone());
    let chart = LineChart {
        title: format!("{which}: training loss per step, kiln and baseline"),
        subtitle: joined(&[c.name.as_str(), subtitle]),
        cols: 1,
        heights: vec![PANEL_HEIGHT, PANEL_HEIGHT * 2 / 3],
        panels: loss_panels(kiln, baseline, base),
    };
    Some((format!("{}-loss-{}", slug(&c.suite), slug(&which)), chart))
}

/// Both sides' loss per step (the baseline's dashed); below, kiln − baseline and the zero line.
fn loss_panels(kiln: Vec<(f64, f64)>, baseline: Vec<(f64, f64)>, base: String) -> Vec<LinePanel> {
    let pairs = kiln.iter().zip(&baseline).filter(|(k, b)| k.0 == b.0);
    let difference: Vec<(f64, f64)> = pairs.map(|(k, b)| (k.0, k.1 - b.1)).collect();
    let both = || kiln.iter().chain(&baseline);
    let last = both().map(|p| p.0).fold(1.0, f64::max);
    let losses = value_range(both().map(|p| p.1));
    let differences = value_range(difference.iter().map(|p| p.1).chain([0.0]));
    let caption = if difference.iter().all(|p| p.1 == 0.0) {
        "kiln − baseline (nats): 0 at every step"
    } else {
        "kiln − baseline (nats)"
    };
    let [kc, bc, red] = [0, 1, 3].map(|i| SERIES_COLORS[i].stroke_width(2));
    let top = vec![
        Line::solid(kiln, kc, "kiln"),
        Line::dashed(baseline, bc, &base),
    ];
    let zero = Line::unlabelled(vec![(0.0, 0.0), (last, 0.0)], FAINT.stroke_width(1));
    let bottom = vec![zero, Line::unlabelled(difference, red)];
    vec![
        step_panel("loss (nats)", last, losses, "loss", top),
        step_panel(caption, last, differences, "difference", bottom),
    ]
}

/// `(lo, hi)` of the values in `points` with a little room, never an empty range.
fn value_range(points: impl Iterator<Item = f64>) -> (f64, f64) {
    let Some((lo, hi)) = min_max(points) else {
        return (0.0, 1.0);
    };
    let least = (hi.abs().max(lo.abs()) * 1e-6).max(1e-12);
    let pad = ((hi - lo) * 0.08).max(least);
    (lo - pad, hi + pad)
}

/// A panel of `lines` over training steps `0..last`, whole steps labelled on x, `y_desc` on y.
fn step_panel(
    caption: &str,
    last: f64,
    (lo, hi): (f64, f64),
    y_desc: &str,
    lines: Vec<Line>,
) -> LinePanel {
    LinePanel {
        caption: caption.to_owned(),
        x_desc: "step",
        y_desc: y_desc.to_owned(),
        x: 0.0..last,
        y: lo..hi,
        x_label: |v| {
            if (v - v.round()).abs() < 1e-9 {
                format!("{v:.0}")
            } else {
                String::new()
            }
        },
        grid: None,
        lines,
        legend: SeriesLabelPosition::UpperRight,
        label_chars: 90,
        label_pixels: 700,
    }
}
