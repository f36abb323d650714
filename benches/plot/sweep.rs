//! The batch-size sweep chart of one suite: per unit a panel, per series (the name without `b=N`)
//! kiln (solid, filled dots) and the baseline (dashed, open dots) against log2 batch size.

use kiln_train::plot::usable;
use plotters::prelude::*;

use super::canvas::{Line, LineChart, LinePanel, PANEL_HEIGHT, SERIES_COLORS};
use super::{grouped, min_max, number};
use crate::report::Comparison;

/// The `N` of a `b=N` token.
fn token_batch(token: &str) -> Option<f64> {
    token.strip_prefix("b=")?.parse().ok()
}

/// The `N` of a `b=N` token in `name`.
pub fn batch_token(name: &str) -> Option<f64> {
    name.split_whitespace()
        .find_map(token_batch)
        .filter(|b| usable(*b))
}

/// `name` without its `b=N` token: the series a sweep point belongs to.
pub fn series_key(name: &str) -> String {
    let words = name.split_whitespace().filter(|t| token_batch(t).is_none());
    words.collect::<Vec<_>>().join(" ")
}

/// A suite's batch-size sweep chart: one panel per unit, two side by side per row.
pub fn sweep_chart(title: String, subtitle: String, rows: &[&Comparison]) -> LineChart {
    let units = grouped(rows, |r| r.unit.clone());
    let panels: Vec<LinePanel> = units.iter().map(|(unit, rows)| panel(unit, rows)).collect();
    let cols = panels.len().clamp(1, 2);
    let heights = vec![PANEL_HEIGHT; panels.len().div_ceil(cols).max(1)];
    LineChart {
        title,
        subtitle,
        cols,
        heights,
        panels,
    }
}

/// One unit's panel: per series, kiln's line solid, the baseline's (first name given) dashed.
fn panel(unit: &str, rows: &[&Comparison]) -> LinePanel {
    let series = grouped(rows, |r| series_key(&r.name));
    let mut lines = vec![];
    for (i, (key, rows)) in series.iter().enumerate() {
        let style = SERIES_COLORS[i % SERIES_COLORS.len()].stroke_width(2);
        let mut names = rows.iter().map(|r| r.baseline_name.as_str());
        let base = names.find(|n| !n.is_empty()).unwrap_or("baseline");
        let (kiln, base) = match series.len() {
            1 => ("kiln".to_owned(), base.to_owned()),
            _ => (format!("{key} · kiln"), format!("{key} · {base}")),
        };
        let kiln = Line::solid(points(rows, |r| r.kiln), style, &kiln);
        let base = Line::dashed(points(rows, |r| r.baseline), style, &base);
        lines.extend([kiln, base].into_iter().filter(|l| !l.points.is_empty()));
    }
    let ((x_lo, x_hi), (y_lo, y_hi)) = panel_ranges(&lines);
    let unit = Some(unit).filter(|u| !u.is_empty()).unwrap_or("(no unit)");
    let octaves = (x_hi - x_lo).ceil() as usize;
    LinePanel {
        caption: unit.to_owned(),
        x_desc: "batch size (log2 scale)",
        y_desc: unit.to_owned(),
        x: x_lo..x_hi,
        y: y_lo..y_hi,
        x_label: power_of_two_label,
        grid: Some(octaves.clamp(2, 16) + 1),
        lines,
        legend: SeriesLabelPosition::UpperLeft,
        label_chars: 60,
        label_pixels: 320,
    }
}

/// The usable points `(log2 batch size, value)` of `rows`, sorted by batch size.
fn points(rows: &[&Comparison], value: fn(&Comparison) -> f64) -> Vec<(f64, f64)> {
    let point = |r: &&Comparison| Some((batch_size(r)?.log2(), number(value(r))?));
    let mut points: Vec<(f64, f64)> = rows.iter().filter_map(point).collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

/// The batch size of a sweep point: `details.batch_size`, else the name's `b=N` (usable, > 0).
fn batch_size(c: &Comparison) -> Option<f64> {
    c.details["batch_size"]
        .as_f64()
        .and_then(number)
        .or_else(|| batch_token(&c.name))
        .filter(|b| *b > 0.0)
}

/// A panel's x range (log2 batch sizes, widened) and y range (from 0 or below, past the top).
fn panel_ranges(lines: &[Line]) -> ((f64, f64), (f64, f64)) {
    let points: Vec<(f64, f64)> = lines
        .iter()
        .flat_map(|l| l.points.iter().copied())
        .collect();
    let x = min_max(points.iter().map(|p| p.0)).map_or((0.0, 1.0), |(lo, hi)| (lo - 0.3, hi + 0.3));
    let (y_min, y_max) = min_max(points.iter().map(|p| p.1).chain([0.0])).unwrap_or_default();
    let y_max = if y_max > y_min { y_max } else { y_min + 1.0 };
    let pad = (y_max - y_min) * 0.12;
    let y_lo = if y_min < 0.0 { y_min - pad } else { 0.0 };
    (x, (y_lo, y_max + pad))
}

/// The batch size at log2 position `v` if whole, else nothing: only powers of two are labelled.
pub fn power_of_two_label(v: f64) -> String {
    let r = v.round();
    if (v - r).abs() > 1e-9 || !(-60.0..=1000.0).contains(&r) {
        return String::new();
    }
    let n = r.exp2();
    if (1.0..1e15).contains(&n) {
        format!("{n:.0}")
    } else {
        format!("2^{r:.0}")
    }
}
