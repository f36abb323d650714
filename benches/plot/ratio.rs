//! The ratio chart of one suite: a horizontal bar per comparison (kiln / baseline), coloured
//! by its goal's verdict, with a tick at the goal and a dashed line at parity.

use kiln_train::plot::{FONT, clip, fits, tick_label, usable};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::canvas::{
    BOLD_LINE, Chart, FAINT, Glyph, HEADER, INK, LIGHT_LINE, MAX_LABEL_SHARE, MET, MISSED, NO_GOAL,
    ROW_HEIGHT, WIDTH, draw_err, header, legend, short, text_style,
};
use super::{min_max, number};
use crate::report::{Better, Comparison, GoalOp};

/// Each verdict (`meets_goal`; none: no goal or verdict) with its bars' colour and legend words.
const VERDICTS: [(Option<bool>, RGBColor, &str); 3] = [
    (Some(true), MET, "goal met"),
    (Some(false), MISSED, "goal missed"),
    (None, NO_GOAL, "no goal"),
];

/// One bar: its label, ratio, goal and verdict.
#[derive(Debug, Clone)]
pub struct Bar {
    label: String,
    ratio: Option<f64>,
    goal: Option<(GoalOp, f64)>,
    verdict: Option<bool>,
}

impl Bar {
    /// The bar of comparison `c`.
    pub fn of(c: &Comparison) -> Self {
        let name = Some(c.name.as_str()).filter(|n| !n.is_empty());
        let better = match c.better {
            Better::Lower => "lower",
            Better::Higher => "higher",
        };
        Self {
            label: format!("{} ({better} is better)", name.unwrap_or("(unnamed)")),
            ratio: ratio_of(c),
            goal: c.goal.as_ref().and_then(|g| Some((g.op, number(g.value)?))),
            verdict: c.meets_goal,
        }
    }

    fn color(&self) -> RGBColor {
        let verdict = VERDICTS.iter().find(|(v, ..)| *v == self.verdict);
        verdict.map_or(NO_GOAL, |(_, color, _)| *color)
    }

    /// The text at the end of the bar: the ratio, and the goal if there is one.
    fn value_text(&self) -> String {
        match (self.ratio, self.goal) {
            (None, _) => "no value".to_owned(),
            (Some(ratio), Some((op, g))) => {
                let op = if op == GoalOp::AtMost { "≤" } else { "≥" };
                format!("{} (goal {op} {})", short(ratio), short(g))
            }
            (Some(ratio), None) => short(ratio),
        }
    }

    /// Where the value text starts: after the bar, or after the goal's tick if further right.
    fn end(&self, zero: f64) -> f64 {
        let goal = self.goal.map_or(zero, |g| g.1);
        self.ratio.map_or(zero, |r| r.max(goal).max(zero))
    }
}

/// A suite's ratio chart: titles and one bar per comparison.
#[derive(Debug, Clone)]
pub struct RatioChart {
    pub title: String,
    pub subtitle: String,
    pub bars: Vec<Bar>,
}

impl RatioChart {
    /// The legend: the verdicts drawn, the goal's tick if any bar has a goal, parity.
    fn legend(&self) -> Vec<(Glyph, String)> {
        let drawn = |b: &&Bar| b.ratio.is_some();
        let mut entries: Vec<(Glyph, String)> = VERDICTS
            .iter()
            .filter(|(v, ..)| self.bars.iter().filter(drawn).any(|b| b.verdict == *v))
            .map(|(_, color, label)| (Glyph::Swatch(*color), (*label).to_owned()))
            .collect();
        if self.bars.iter().any(|b| b.goal.is_some()) {
            entries.push((Glyph::Tick, "goal".to_owned()));
        }
        entries.push((Glyph::Dashed, "parity (1.0)".to_owned()));
        entries
    }
}

impl Chart for RatioChart {
    fn height(&self) -> u32 {
        let rows = u32::try_from(self.bars.len()).unwrap_or(u32::MAX);
        let bars = rows.saturating_mul(ROW_HEIGHT);
        let height = HEADER.saturating_add(90).saturating_add(bars);
        height.clamp(320, 20_000)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> crate::Result<()> {
        let body = header(root, &self.title, &self.subtitle, HEADER)?;
        legend(root, 74, &self.legend())?;
        // The bars' labels, cut to fit and right-aligned left of the y axis.
        let label_style = text_style((FONT, 14), &INK, HPos::Right, VPos::Center);
        let max_label = (f64::from(WIDTH) * MAX_LABEL_SHARE) as u32;
        let clipped = |b: &Bar| clip(&b.label, 120, |t| fits(root, t, &label_style, max_label));
        let labels: Vec<String> = self.bars.iter().map(clipped).collect();
        let width = |l: &String| root.estimate_text_size(l, &label_style).map_or(0, |s| s.0);
        let widest = labels.iter().map(width).max().unwrap_or(0);
        let label_width = widest.clamp(40, max_label) + 16;
        let ratios = self.bars.iter().filter_map(|b| b.ratio);
        let goals = self.bars.iter().filter_map(|b| b.goal.map(|g| g.1));
        let (x_lo, x_hi) = ratio_range(ratios.chain(goals));
        // Bar `i` is centred at y = rows - i - 0.5, so the report's first comparison is on top.
        let rows = self.bars.len() as f64;
        let centre = |i: usize| rows - i as f64 - 0.5;
        let mut chart = ChartBuilder::on(&body)
            .margin(12)
            .margin_right(30)
            .x_label_area_size(44)
            .y_label_area_size(label_width)
            .build_cartesian_2d(x_lo..x_hi, 0.0..rows)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(10)
            .max_light_lines(4)
            .x_label_formatter(&|v| tick_label(*v, x_hi - x_lo))
            .x_desc("kiln / baseline")
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .light_line_style(LIGHT_LINE)
            .bold_line_style(BOLD_LINE)
            .draw()
            .map_err(draw_err)?;
        for (i, label) in labels.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(x_lo, centre(i)));
            root.draw_text(label, &label_style, (x - 8, y))
                .map_err(draw_err)?;
        }
        let zero = 0f64.clamp(x_lo, x_hi);
        let bars = self.bars.iter().enumerate().filter_map(|(i, b)| {
            let corners = [(zero, centre(i) - 0.31), (b.ratio?, centre(i) + 0.31)];
            Some(Rectangle::new(corners, b.color().filled()))
        });
        chart.draw_series(bars).map_err(draw_err)?;
        if (x_lo..=x_hi).contains(&1.0) {
            let parity =
                DashedLineSeries::new([(1.0, 0.0), (1.0, rows)], 6, 5, FAINT.stroke_width(2));
            chart.draw_series(parity).map_err(draw_err)?;
        }
        let ticks = self.bars.iter().enumerate().filter_map(|(i, b)| {
            let (g, c) = (b.goal?.1, centre(i));
            let ends = vec![(g, c - 0.42), (g, c + 0.42)];
            Some(PathElement::new(ends, INK.stroke_width(3)))
        });
        chart.draw_series(ticks).map_err(draw_err)?;
        let value_style = text_style((FONT, 13), &INK, HPos::Left, VPos::Center);
        let texts = self.bars.iter().enumerate().map(|(i, b)| {
            EmptyElement::at((b.end(zero), centre(i)))
                + Text::new(b.value_text(), (8, 0), value_style.clone())
        });
        chart.draw_series(texts).map_err(draw_err)?;
        Ok(())
    }
}

/// A ratio chart's x range: from 0 (or below) past 1.0 and the values, with room for the texts.
pub fn ratio_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let values = values.filter(|v| usable(*v)).chain([0.0, 1.0]);
    let (lo, hi) = min_max(values).unwrap_or_default();
    let width = hi - lo;
    let lo = if lo < 0.0 { lo - width * 0.05 } else { lo };
    (lo, hi + width * 0.3)
}

/// kiln / baseline: the report's, else computed from the two values; `None` where unusable.
fn ratio_of(c: &Comparison) -> Option<f64> {
    number(c.ratio).or_else(|| match (number(c.kiln), number(c.baseline)) {
        (Some(k), Some(b)) if b != 0.0 => Some(k / b).filter(|r| usable(*r)),
        _ => None,
    })
}
