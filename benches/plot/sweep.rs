//! The batch-size sweep chart of one suite: one panel per unit, kiln (solid, filled dots) and
//! the baseline (dashed, open dots) against the batch size on a log2 axis, a pair of lines per
//! series (the comparison's name without its `b=N` token).

use kiln_train::plot::{FONT, clip, fits, tick_label, usable};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::canvas::{
    BOLD_LINE, Chart, FAINT, PANEL_HEIGHT, SERIES_COLORS, SWEEP_HEADER, draw_err, header, line,
    mesh, panel, series_legend, solid_glyph, text_style,
};
use super::{grouped, min_max, number};
use crate::report::Comparison;

/// The `N` of a `b=N` token in `name`.
pub fn batch_token(name: &str) -> Option<f64> {
    name.split_whitespace()
        .find_map(|t| t.strip_prefix("b=")?.parse::<f64>().ok())
        .filter(|b| usable(*b))
}

/// `name` without its `b=N` token: the series a sweep point belongs to.
pub fn series_key(name: &str) -> String {
    name.split_whitespace()
        .filter(|t| {
            t.strip_prefix("b=")
                .is_none_or(|n| n.parse::<f64>().is_err())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One series of a sweep: points `(log2 batch size, value)` for kiln and the baseline.
#[derive(Debug, Clone)]
struct SweepSeries {
    key: String,
    baseline_name: String,
    kiln: Vec<(f64, f64)>,
    baseline: Vec<(f64, f64)>,
}

impl SweepSeries {
    /// The series `key` of `rows`: the first baseline name given, and the points sorted by
    /// batch size, those without a usable batch size or value left out.
    fn of(key: String, rows: &[&Comparison]) -> Self {
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
        let name = rows
            .iter()
            .map(|r| &r.baseline_name)
            .find(|n| !n.is_empty());
        Self {
            key,
            baseline_name: name.map_or("baseline", String::as_str).to_owned(),
            kiln: points(|r| r.kiln),
            baseline: points(|r| r.baseline),
        }
    }
}

/// The sweep's series of one unit.
#[derive(Debug, Clone)]
pub struct SweepPanel {
    unit: String,
    series: Vec<SweepSeries>,
}

/// Groups the sweep comparisons by unit, then by name without `b=N`, in report order.
pub fn sweep_panels(rows: &[&Comparison]) -> Vec<SweepPanel> {
    let mut panels = vec![];
    for (unit, rows) in grouped(rows, |r| r.unit.clone()) {
        let series = grouped(&rows, |r| series_key(&r.name)).into_iter();
        let series = series
            .map(|(key, rows)| SweepSeries::of(key, &rows))
            .collect();
        panels.push(SweepPanel { unit, series });
    }
    panels
}

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
        SWEEP_HEADER
            .saturating_add(rows.saturating_mul(PANEL_HEIGHT))
            .min(20_000)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> crate::Result<()> {
        // The panels' legends tell kiln (solid, filled dots) from the baseline (dashed, open).
        let body = header(root, &self.title, &self.subtitle, SWEEP_HEADER)?;
        let areas = body.split_evenly(self.grid());
        for (panel, area) in self.panels.iter().zip(&areas) {
            draw_sweep_panel(area, panel)?;
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
fn panel_ranges(panel: &SweepPanel) -> ((f64, f64), (f64, f64)) {
    let points: Vec<(f64, f64)> = panel
        .series
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

fn draw_sweep_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    data: &SweepPanel,
) -> crate::Result<()> {
    let unit = Some(data.unit.as_str()).filter(|u| !u.is_empty());
    let unit = unit.unwrap_or("(no unit)");
    let ((x_lo, x_hi), (y_lo, y_hi)) = panel_ranges(data);
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

    let label_style = TextStyle::from((FONT, 13).into_font());
    let fit = |t: &str| clip(t, 60, |t| fits(area, t, &label_style, 320));
    for (i, series) in data.series.iter().enumerate() {
        let color = SERIES_COLORS[i % SERIES_COLORS.len()];
        let (kiln, base) = if data.series.len() > 1 {
            let key = &series.key;
            (
                format!("{key} · kiln"),
                format!("{key} · {}", series.baseline_name),
            )
        } else {
            ("kiln".to_owned(), series.baseline_name.clone())
        };
        // kiln solid with filled dots, the baseline dashed with open ones.
        let style = color.stroke_width(2);
        let sides = [
            (&series.kiln, None, kiln, color.filled()),
            (&series.baseline, Some((7, 5)), base, style),
        ];
        for (points, dash, label, dot) in sides.into_iter().filter(|s| !s.0.is_empty()) {
            let series = line(&mut chart, points, style, dash)?.label(fit(&label));
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
    if data
        .series
        .iter()
        .any(|s| !s.kiln.is_empty() || !s.baseline.is_empty())
    {
        series_legend(&mut chart, SeriesLabelPosition::UpperLeft, label_style)
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
