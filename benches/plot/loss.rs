//! The loss-curve chart of a same-learning row: both sides' training loss per step, and below
//! it their difference.

use kiln_train::plot::{FONT, clip, fits, tick_label};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;

use super::canvas::{
    Chart, FAINT, PANEL_HEIGHT, Panel, SERIES_COLORS, SWEEP_HEADER, draw_err, header, line, mesh,
    panel, series_legend, solid_glyph,
};
use super::{joined, min_max, number, slug};
use crate::report::Comparison;

/// Both sides' loss per training step and the difference, for a comparison whose details hold
/// `loss_curves: {"kiln": [...], "baseline": [...]}`.
#[derive(Debug, Clone)]
pub struct LossChart {
    title: String,
    subtitle: String,
    baseline_name: String,
    kiln: Vec<(f64, f64)>,
    baseline: Vec<(f64, f64)>,
    /// kiln − baseline per step where both have a usable value.
    difference: Vec<(f64, f64)>,
}

/// A row's `details.loss_curves`: each side's loss per step (`null` where a step had none) and
/// optionally the baseline's name.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct LossCurves {
    kiln: Vec<Option<f64>>,
    baseline: Vec<Option<f64>>,
    baseline_name: Option<String>,
}

/// Points `(step, loss)` of a curve, unusable values left out.
fn curve(v: &[Option<f64>]) -> Vec<(f64, f64)> {
    v.iter()
        .enumerate()
        .filter_map(|(i, l)| l.and_then(number).map(|l| (i as f64, l)))
        .collect()
}

/// One chart per comparison with (well-formed) loss curves, each with its file stem:
/// `<suite>-loss-<model>-<precision>` (or the row's name when the details do not say).
pub fn loss_charts(comparisons: &[Comparison], subtitle: &str) -> Vec<(String, LossChart)> {
    let mut out = vec![];
    for c in comparisons {
        let curves = c.details.get("loss_curves").map(LossCurves::deserialize);
        let Some(Ok(curves)) = curves else {
            continue;
        };
        let (kiln, baseline) = (curve(&curves.kiln), curve(&curves.baseline));
        if kiln.is_empty() && baseline.is_empty() {
            continue;
        }
        let which = match (c.details["model"].as_str(), c.details["precision"].as_str()) {
            (Some(m), Some(p)) => format!("{m} {p}"),
            _ => c.name.clone(),
        };
        let difference = kiln
            .iter()
            .zip(&baseline)
            .filter(|(k, b)| k.0 == b.0)
            .map(|(k, b)| (k.0, k.1 - b.1))
            .collect();
        let chart = LossChart {
            title: format!("{which}: training loss per step, kiln and baseline"),
            subtitle: joined(&[c.name.as_str(), subtitle]),
            baseline_name: curves
                .baseline_name
                .unwrap_or_else(|| c.baseline_name.clone()),
            kiln,
            baseline,
            difference,
        };
        out.push((format!("{}-loss-{}", slug(&c.suite), slug(&which)), chart));
    }
    out
}

/// A whole step number, or nothing between steps.
fn step_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

/// `(lo, hi)` of the values in `points` with a little room, never an empty range.
fn value_range(points: impl Iterator<Item = f64>) -> (f64, f64) {
    let Some((lo, hi)) = min_max(points) else {
        return (0.0, 1.0);
    };
    let pad = ((hi - lo) * 0.08)
        .max(hi.abs().max(lo.abs()) * 1e-6)
        .max(1e-12);
    (lo - pad, hi + pad)
}

/// The mesh of a panel over training steps: whole steps labelled on x, `y_desc` on y.
fn step_mesh<'a, DB: DrawingBackend + 'a>(
    chart: &mut Panel<'a, DB>,
    y_desc: &str,
    y_span: f64,
) -> crate::Result<()> {
    mesh(chart, "step", y_desc)
        .x_label_formatter(&|v| step_label(*v))
        .y_label_formatter(&|v| tick_label(*v, y_span))
        .draw()
        .map_err(draw_err)
}

impl Chart for LossChart {
    fn height(&self) -> u32 {
        SWEEP_HEADER + PANEL_HEIGHT + PANEL_HEIGHT * 2 / 3
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> crate::Result<()> {
        let body = header(root, &self.title, &self.subtitle, SWEEP_HEADER)?;
        let (top, bottom) = body.split_vertically(PANEL_HEIGHT);
        let both = || self.kiln.iter().chain(&self.baseline);
        let last = both().map(|p| p.0).fold(1.0, f64::max);
        let (lo, hi) = value_range(both().map(|p| p.1));
        let mut chart = panel(&top, "loss (nats)", 0.0..last, lo..hi)?;
        step_mesh(&mut chart, "loss", hi - lo)?;
        // Both sides' legend entries are solid lines, the baseline's curve dashed.
        let (kc, bc) = (SERIES_COLORS[0], SERIES_COLORS[1]);
        line(&mut chart, &self.kiln, kc.stroke_width(2), None)?
            .label("kiln")
            .legend(solid_glyph(kc));
        let label_style = TextStyle::from((FONT, 13).into_font());
        let base = clip(&self.baseline_name, 90, |t| {
            fits(&top, t, &label_style, 700)
        });
        line(&mut chart, &self.baseline, bc.stroke_width(2), Some((7, 5)))?
            .label(base)
            .legend(solid_glyph(bc));
        series_legend(&mut chart, SeriesLabelPosition::UpperRight, label_style)?;

        // Below: kiln − baseline per step, with the zero line.
        let (lo, hi) = value_range(self.difference.iter().map(|p| p.1).chain([0.0]));
        let caption = if self.difference.iter().all(|p| p.1 == 0.0) {
            "kiln − baseline (nats): 0 at every step"
        } else {
            "kiln − baseline (nats)"
        };
        let mut chart = panel(&bottom, caption, 0.0..last, lo..hi)?;
        step_mesh(&mut chart, "difference", hi - lo)?;
        line(
            &mut chart,
            &[(0.0, 0.0), (last, 0.0)],
            FAINT.stroke_width(1),
            None,
        )?;
        line(
            &mut chart,
            &self.difference,
            SERIES_COLORS[3].stroke_width(2),
            None,
        )?;
        Ok(())
    }
}
