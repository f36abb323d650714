//! The batch-size sweep chart of one suite: one panel per unit, kiln (solid, filled dots) and
//! the baseline (dashed, open dots) against the batch size on a log2 axis, a pair of lines per
//! series (the comparison's name without its `b=N` token).

use kiln_train::plot::{FONT, clip, fits, tick_label, usable};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::canvas::{
    Chart, FAINT, PANEL_HEIGHT, Panel, SERIES_COLORS, SWEEP_HEADER, draw_err, header, panel,
    series_legend,
};
use super::number;
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
#[derive(Debug, Clone, Default)]
struct SweepSeries {
    key: String,
    baseline_name: String,
    kiln: Vec<(f64, f64)>,
    baseline: Vec<(f64, f64)>,
}

/// The sweep's series of one unit.
#[derive(Debug, Clone, Default)]
pub struct SweepPanel {
    unit: String,
    series: Vec<SweepSeries>,
}

/// Groups the sweep comparisons by unit, then by name without `b=N`, in report order; points
/// are sorted by batch size, those without a usable batch size or value left out.
pub fn sweep_panels(rows: &[&Comparison]) -> Vec<SweepPanel> {
    let mut panels: Vec<SweepPanel> = Vec::new();
    for row in rows {
        let p = panels
            .iter()
            .position(|p| p.unit == row.unit)
            .unwrap_or_else(|| {
                panels.push(SweepPanel {
                    unit: row.unit.clone(),
                    series: Vec::new(),
                });
                panels.len() - 1
            });
        let panel = &mut panels[p];
        let key = series_key(&row.name);
        let s = panel
            .series
            .iter()
            .position(|s| s.key == key)
            .unwrap_or_else(|| {
                panel.series.push(SweepSeries {
                    key,
                    ..SweepSeries::default()
                });
                panel.series.len() - 1
            });
        let series = &mut panel.series[s];
        if series.baseline_name.is_empty() {
            series.baseline_name.clone_from(&row.baseline_name);
        }
        let Some(x) = batch_size(row).map(f64::log2).filter(|x| usable(*x)) else {
            continue;
        };
        if let Some(k) = number(row.kiln) {
            series.kiln.push((x, k));
        }
        if let Some(b) = number(row.baseline) {
            series.baseline.push((x, b));
        }
    }
    for series in panels.iter_mut().flat_map(|p| p.series.iter_mut()) {
        series.kiln.sort_by(|a, b| a.0.total_cmp(&b.0));
        series.baseline.sort_by(|a, b| a.0.total_cmp(&b.0));
        if series.baseline_name.is_empty() {
            series.baseline_name = "baseline".to_owned();
        }
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
    let all = || {
        panel
            .series
            .iter()
            .flat_map(|s| s.kiln.iter().chain(&s.baseline).copied())
    };
    let x = match all().map(|p| p.0).fold(None, |acc: Option<(f64, f64)>, x| {
        Some(acc.map_or((x, x), |(lo, hi)| (lo.min(x), hi.max(x))))
    }) {
        Some((lo, hi)) => (lo - 0.3, hi + 0.3),
        None => (0.0, 1.0),
    };
    let (y_min, y_max) = all()
        .map(|p| p.1)
        .fold((0f64, 0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let y_max = if y_max > y_min { y_max } else { y_min + 1.0 };
    let pad = (y_max - y_min) * 0.12;
    (
        x,
        (if y_min < 0.0 { y_min - pad } else { 0.0 }, y_max + pad),
    )
}

fn draw_sweep_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel_data: &SweepPanel,
) -> crate::Result<()> {
    let unit = if panel_data.unit.is_empty() {
        "(no unit)"
    } else {
        panel_data.unit.as_str()
    };
    let ((x_lo, x_hi), (y_lo, y_hi)) = panel_ranges(panel_data);
    let mut chart = panel(area, unit, x_lo..x_hi, y_lo..y_hi)?;
    let octaves = (x_hi - x_lo).ceil() as usize;
    chart
        .configure_mesh()
        .x_desc("batch size (log2 scale)")
        .y_desc(unit)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .light_line_style(RGBColor(240, 240, 240))
        .bold_line_style(RGBColor(215, 215, 215))
        .x_labels(octaves.clamp(2, 16) + 1)
        .y_labels(8)
        .max_light_lines(4)
        .x_label_formatter(&|v| power_of_two_label(*v))
        .y_label_formatter(&|v| tick_label(*v, y_hi - y_lo))
        .draw()
        .map_err(draw_err)?;

    let several = panel_data.series.len() > 1;
    let label_style = TextStyle::from((FONT, 13).into_font());
    let mut any_points = false;
    for (i, series) in panel_data.series.iter().enumerate() {
        let color = SERIES_COLORS[i % SERIES_COLORS.len()];
        let (kiln_label, base_label) = if several {
            (
                format!("{} · kiln", series.key),
                format!("{} · {}", series.key, series.baseline_name),
            )
        } else {
            ("kiln".to_owned(), series.baseline_name.clone())
        };
        let fit = |t: &str| clip(t, 60, |t| fits(area, t, &label_style, 320));
        any_points |= draw_series(
            &mut chart,
            series,
            color,
            (fit(&kiln_label), fit(&base_label)),
        )?;
    }
    if any_points {
        series_legend(&mut chart, SeriesLabelPosition::UpperLeft, label_style)
    } else {
        let (w, h) = area.dim_in_pixel();
        let style = TextStyle::from((FONT, 16).into_font())
            .color(&FAINT)
            .pos(Pos::new(HPos::Center, VPos::Center));
        area.draw_text("no data", &style, (w as i32 / 2, h as i32 / 2))
            .map_err(draw_err)
    }
}

/// Draws one series' kiln line (solid, filled dots) and baseline line (dashed, open dots) with
/// their legend entries; returns whether it had any points.
fn draw_series<'a, DB: DrawingBackend + 'a>(
    chart: &mut Panel<'a, DB>,
    series: &SweepSeries,
    color: RGBColor,
    (kiln_label, base_label): (String, String),
) -> crate::Result<bool> {
    if !series.kiln.is_empty() {
        chart
            .draw_series(LineSeries::new(
                series.kiln.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(kiln_label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                series
                    .kiln
                    .iter()
                    .map(|&p| Circle::new(p, 4, color.filled())),
            )
            .map_err(draw_err)?;
    }
    if !series.baseline.is_empty() {
        chart
            .draw_series(DashedLineSeries::new(
                series.baseline.iter().copied(),
                7,
                5,
                color.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(base_label)
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (7, 0)], color.stroke_width(2))
                    + PathElement::new(vec![(12, 0), (20, 0)], color.stroke_width(2))
            });
        chart
            .draw_series(
                series
                    .baseline
                    .iter()
                    .map(|&p| Circle::new(p, 4, color.stroke_width(2))),
            )
            .map_err(draw_err)?;
    }
    Ok(!series.kiln.is_empty() || !series.baseline.is_empty())
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
