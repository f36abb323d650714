//! The batch-size sweep chart of one suite: one panel per unit, kiln (solid, filled dots) and
//! the baseline (dashed, open dots) against the batch size on a log2 axis, a pair of lines per
//! series (the comparison's name without its `b=N` token).

use kiln_train::plot::{FONT, tick_label, usable};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::canvas::{
    BOLD_LINE, Chart, FAINT, PANEL_HEIGHT, SERIES_COLORS, SWEEP_HEADER, draw_err, fit_label,
    header, line, mesh, panel, series_legend, solid_glyph, text_style,
};
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
    let words: Vec<&str> = name
        .split_whitespace()
        .filter(|t| token_batch(t).is_none())
        .collect();
    words.join(" ")
}

/// One series of a sweep: points `(log2 batch size, value)` for kiln and the baseline.
#[derive(Debug, Clone)]
pub struct SweepSeries {
    key: String,
    baseline_name: String,
    kiln: Vec<(f64, f64)>,
    baseline: Vec<(f64, f64)>,
}

impl SweepSeries {
    /// The series `key` of `rows`: the first baseline name given, and the points sorted by
    /// batch size, those without a usable batch size or value left out.
    fn of((key, rows): (String, Vec<&Comparison>)) -> Self {
        let points = |value: fn(&Comparison) -> f64| {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter_map(|r| {
                    let x = batch_size(r).map(f64::log2).filter(|x| usable(*x))?;
                    Some((x, number(value(r))?))
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            points
        };
        let mut names = rows.iter().map(|r| r.baseline_name.as_str());
        let name = names.find(|n| !n.is_empty()).unwrap_or("baseline");
        Self {
            key,
            baseline_name: name.to_owned(),
            kiln: points(|r| r.kiln),
            baseline: points(|r| r.baseline),
        }
    }
}

/// The sweep's series of one unit.
pub type SweepPanel = (String, Vec<SweepSeries>);

/// Groups the sweep comparisons by unit, then by name without `b=N`, in report order.
pub fn sweep_panels(rows: &[&Comparison]) -> Vec<SweepPanel> {
    let by_series = |rows: Vec<&Comparison>| {
        let series = grouped(&rows, |r| series_key(&r.name));
        series.into_iter().map(SweepSeries::of).collect()
    };
    let panels = grouped(rows, |r| r.unit.clone()).into_iter();
    panels.map(|(unit, rows)| (unit, by_series(rows))).collect()
}

/// A suite's batch-size sweep chart: titles and one panel per unit.
#[derive(Debug, Clone)]
pub struct SweepChart {
    pub title: String,
    pub subtitle: String,
    pub panels: Vec<SweepPanel>,
}

impl SweepChart {
    /// (rows, columns) of the panel grid: two panels side by side per row.
    fn grid(&self) -> (usize, usize) {
        let cols = self.panels.len().clamp(1, 2);
        (self.panels.len().div_ceil(cols).max(1), cols)
    }
}

impl Chart for SweepChart {
    fn height(&self) -> u32 {
        let rows = u32::try_from(self.grid().0).unwrap_or(u32::MAX);
        let panels = rows.saturating_mul(PANEL_HEIGHT);
        SWEEP_HEADER.saturating_add(panels).min(20_000)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> crate::Result<()> {
        let body = header(root, &self.title, &self.subtitle, SWEEP_HEADER)?;
        let areas = body.split_evenly(self.grid());
        for ((unit, series), area) in self.panels.iter().zip(&areas) {
            draw_sweep_panel(area, unit, series)?;
        }
        Ok(())
    }
}

/// The batch size of a sweep point: `details.batch_size`, else the name's `b=N`.
fn batch_size(c: &Comparison) -> Option<f64> {
    c.details["batch_size"]
        .as_f64()
        .and_then(number)
        .or_else(|| batch_token(&c.name))
        .filter(|b| *b > 0.0)
}

/// The x range (log2 batch sizes, a little wider) and y range (from 0, or below the smallest
/// value when negative, to above the largest) of a panel's points.
fn panel_ranges(series: &[SweepSeries]) -> ((f64, f64), (f64, f64)) {
    let points: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.kiln.iter().chain(&s.baseline).copied())
        .collect();
    let x = min_max(points.iter().map(|p| p.0)).map_or((0.0, 1.0), |(lo, hi)| (lo - 0.3, hi + 0.3));
    let (y_min, y_max) = points
        .iter()
        .fold((0f64, 0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let y_max = if y_max > y_min { y_max } else { y_min + 1.0 };
    let pad = (y_max - y_min) * 0.12;
    let y_lo = if y_min < 0.0 { y_min - pad } else { 0.0 };
    (x, (y_lo, y_max + pad))
}

/// One unit's panel: kiln solid with filled dots, the baseline dashed with open ones.
fn draw_sweep_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    unit: &str,
    all: &[SweepSeries],
) -> crate::Result<()> {
    let unit = Some(unit).filter(|u| !u.is_empty()).unwrap_or("(no unit)");
    let ((x_lo, x_hi), (y_lo, y_hi)) = panel_ranges(all);
    let mut chart = panel(area, unit, x_lo..x_hi, y_lo..y_hi)?;
    let octaves = (x_hi - x_lo).ceil() as usize;
    mesh(&mut chart, "batch size (log2 scale)", unit)
        .bold_line_style(BOLD_LINE)
        .x_labels(octaves.clamp(2, 16) + 1)
        .y_labels(8)
        .max_light_lines(4)
        .x_label_formatter(&|v| power_of_two_label(*v))
        .y_label_formatter(&|v| tick_label(*v, y_hi - y_lo))
        .draw()
        .map_err(draw_err)?;
    for (i, series) in all.iter().enumerate() {
        let color = SERIES_COLORS[i % SERIES_COLORS.len()];
        let (key, base) = (&series.key, &series.baseline_name);
        let (kiln, base) = match all.len() {
            1 => ("kiln".to_owned(), base.clone()),
            _ => (format!("{key} · kiln"), format!("{key} · {base}")),
        };
        let style = color.stroke_width(2);
        let sides = [
            (&series.kiln, None, kiln, color.filled()),
            (&series.baseline, Some((7, 5)), base, style),
        ];
        for (points, dash, label, dot) in sides.into_iter().filter(|s| !s.0.is_empty()) {
            let label = fit_label(area, &label, 60, 320);
            let series = line(&mut chart, points, style, dash)?.label(label);
            if dash.is_none() {
                series.legend(solid_glyph(color));
            } else {
                series.legend(move |(x, y)| {
                    let dash = |from, to| PathElement::new(vec![(from, 0), (to, 0)], style);
                    EmptyElement::at((x, y)) + dash(0, 7) + dash(12, 20)
                });
            }
            let dots = points.iter().map(|&p| Circle::new(p, 4, dot));
            chart.draw_series(dots).map_err(draw_err)?;
        }
    }
    let drawn = |s: &SweepSeries| !s.kiln.is_empty() || !s.baseline.is_empty();
    if all.iter().any(drawn) {
        series_legend(&mut chart, SeriesLabelPosition::UpperLeft)
    } else {
        let (w, h) = area.dim_in_pixel();
        let style = text_style((FONT, 16), &FAINT, HPos::Center, VPos::Center);
        area.draw_text("no data", &style, (w as i32 / 2, h as i32 / 2))
            .map_err(draw_err)
    }
}

/// The batch size at log2 position `v` if `v` is a whole number, else nothing (so only powers
/// of two are labelled).
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
