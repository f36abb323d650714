//! The loss-curve chart of a same-learning row: both sides' training loss per step, and below
//! it their difference.

use kiln_train::plot::tick_label;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;

use super::canvas::{
    Chart, FAINT, PANEL_HEIGHT, Panel, SERIES_COLORS, SWEEP_HEADER, draw_err, fit_label, header,
    line, mesh, panel, series_legend, solid_glyph,
};
use super::{joined, min_max, number, slug};
use crate::report::Comparison;

/// Both sides' loss per training step (`details.loss_curves` of a row) and their difference.
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
    let point = |(i, l): (usize, &Option<f64>)| Some((i as f64, number((*l)?)?));
    v.iter().enumerate().filter_map(point).collect()
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
        let pairs = kiln.iter().zip(&baseline).filter(|(k, b)| k.0 == b.0);
        let chart = LossChart {
            title: format!("{which}: training loss per step, kiln and baseline"),
            subtitle: joined(&[c.name.as_str(), subtitle]),
            baseline_name: curves.baseline_name.unwrap_or(c.baseline_name.clone()),
            difference: pairs.map(|(k, b)| (k.0, k.1 - b.1)).collect(),
            kiln,
            baseline,
        };
        out.push((format!("{}-loss-{}", slug(&c.suite), slug(&which)), chart));
    }
    out
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

/// A panel over training steps `0..last` on `area`, whole steps labelled on x, `y_desc` on y.
fn step_panel<'a, DB: DrawingBackend + 'a>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    last: f64,
    (lo, hi): (f64, f64),
    y_desc: &str,
) -> crate::Result<Panel<'a, DB>> {
    let mut chart = panel(area, caption, 0.0..last, lo..hi)?;
    let whole = |v: &f64| ((v - v.round()).abs() < 1e-9).then(|| format!("{v:.0}"));
    mesh(&mut chart, "step", y_desc)
        .x_label_formatter(&|v| whole(v).unwrap_or_default())
        .y_label_formatter(&|v| tick_label(*v, hi - lo))
        .draw()
        .map_err(draw_err)?;
    Ok(chart)
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
        let range = value_range(both().map(|p| p.1));
        let mut chart = step_panel(&top, "loss (nats)", last, range, "loss")?;
        // Both sides' legend entries are solid lines, the baseline's curve dashed.
        let (kc, bc) = (SERIES_COLORS[0], SERIES_COLORS[1]);
        line(&mut chart, &self.kiln, kc.stroke_width(2), None)?
            .label("kiln")
            .legend(solid_glyph(kc));
        line(&mut chart, &self.baseline, bc.stroke_width(2), Some((7, 5)))?
            .label(fit_label(&top, &self.baseline_name, 90, 700))
            .legend(solid_glyph(bc));
        series_legend(&mut chart, SeriesLabelPosition::UpperRight)?;

        // Below: kiln − baseline per step, with the zero line.
        let range = value_range(self.difference.iter().map(|p| p.1).chain([0.0]));
        let caption = if self.difference.iter().all(|p| p.1 == 0.0) {
            "kiln − baseline (nats): 0 at every step"
        } else {
            "kiln − baseline (nats)"
        };
        let mut chart = step_panel(&bottom, caption, last, range, "difference")?;
        let zero = [(0.0, 0.0), (last, 0.0)];
        line(&mut chart, &zero, FAINT.stroke_width(1), None)?;
        let red = SERIES_COLORS[3].stroke_width(2);
        line(&mut chart, &self.difference, red, None)?;
        Ok(())
    }
}
