//! Charts of a benchmark report (`kiln-bench/1`), each written as PNG and SVG.
//!
//! Per suite, `<suite>.png`/`.svg`: every comparison's ratio kiln / baseline as a horizontal bar,
//! coloured by whether it meets its goal, with a tick at the goal and a dashed line at parity
//! (1.0). Comparisons of the group [`SWEEP_GROUP`] are drawn instead in `<suite>-batch-sweep.png`/`.svg`:
//! one panel per unit, kiln and baseline against the batch size on a log2 axis, one pair of
//! lines per series (the name without its `b=N` token).
//!
//! A comparison whose details hold `loss_curves` (`{"kiln": [...], "baseline": [...]}` and
//! optionally the baseline's `baseline_name`: the same-learning rows) also gets
//! `<suite>-loss-<model>-<precision>.png`/`.svg`: both sides' training loss per step, and
//! below it their difference.
//!
//! Missing and non-finite values are left out of the drawing (a bar without a value reads
//! "no value"); nothing here panics on odd input. Text uses the DejaVu Sans embedded in
//! `kiln-train`, so no system fonts are needed; the SVGs name the family "DejaVu Sans" with a
//! sans-serif fallback.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use kiln_train::plot::{FONT, clip, encode_png, fits, register_fonts, tick_label, usable};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

use crate::report::SWEEP_GROUP;

/// The ratio charts' reading guide, before the report's facts in their second line.
const RATIO_NOTE: &str = "bar = kiln / baseline, 1.0 = parity";

/// The file stem of the batch-size sweep chart.
const SWEEP_STEM: &str = "batch-sweep";

/// Width of every chart, in pixels.
const WIDTH: u32 = 1200;
/// Height of the title, subtitle and legend band of a ratio chart.
const HEADER: u32 = 96;
/// Height of the title and subtitle band of the sweep chart.
const SWEEP_HEADER: u32 = 70;
/// Height of one bar's row in a ratio chart.
const ROW_HEIGHT: u32 = 36;
/// Height of one row of panels in the sweep chart.
const PANEL_HEIGHT: u32 = 480;

/// Bar labels take at most this share of the chart's width; longer ones are cut short.
const MAX_LABEL_SHARE: f64 = 0.45;
const MAX_TITLE_PIXELS: u32 = WIDTH - 40;

/// The font family the SVGs ask for in place of the name the font is registered under.
const SVG_FONT_FAMILY: &str = "DejaVu Sans, sans-serif";

const MET: RGBColor = RGBColor(44, 160, 44);
const MISSED: RGBColor = RGBColor(214, 39, 40);
const NO_GOAL: RGBColor = RGBColor(140, 150, 165);
const INK: RGBColor = RGBColor(30, 30, 30);
const FAINT: RGBColor = RGBColor(110, 110, 110);

const SERIES_COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Writes the charts of `report` (a `kiln-bench/1` report) into `dir`, creating it if needed,
/// and returns the paths written: `<suite>.png` and `<suite>.svg` per suite with comparisons
/// outside [`SWEEP_GROUP`], and `<suite>-batch-sweep.png`/`.svg` per suite with comparisons in it. File stems
/// are slugs of the suite names (`[a-z0-9-]`, made unique). A report without comparisons writes
/// nothing.
pub fn write_plots(report: &Value, dir: &Path) -> Result<Vec<PathBuf>, String> {
    let comparisons = report
        .get("comparisons")
        .and_then(Value::as_array)
        .ok_or_else(|| "benchmark report has no `comparisons` array".to_owned())?;
    let rows: Vec<Comparison> = comparisons.iter().map(Comparison::from_json).collect();
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    if !register_fonts() {
        return Err("plots: the embedded font could not be loaded".to_owned());
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("plots: cannot create {}: {e}", dir.display()))?;

    let subtitle = subtitle(report);
    let (sweep, plain): (Vec<&Comparison>, Vec<&Comparison>) =
        rows.iter().partition(|r| r.group == SWEEP_GROUP);
    let mut stems = HashSet::new();
    let mut written = Vec::new();
    for (suite, members) in by_suite(&plain) {
        let chart = RatioChart {
            title: format!("{suite}: ratio kiln / baseline"),
            subtitle: [RATIO_NOTE, subtitle.as_str()]
                .iter()
                .filter(|s| !s.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(" · "),
            bars: members.iter().map(|r| Bar::of(r)).collect(),
        };
        let stem = unique(slug(suite), &mut stems);
        write_chart(dir, &stem, &chart, &mut written)?;
    }
    for (suite, members) in by_suite(&sweep) {
        let chart = SweepChart {
            title: format!("{suite}: batch-size sweep, kiln and baseline against batch size"),
            subtitle: subtitle.clone(),
            panels: sweep_panels(&members),
        };
        let stem = unique(format!("{}-{SWEEP_STEM}", slug(suite)), &mut stems);
        write_chart(dir, &stem, &chart, &mut written)?;
    }
    for (stem, chart) in loss_charts(comparisons, &subtitle) {
        let stem = unique(stem, &mut stems);
        write_chart(dir, &stem, &chart, &mut written)?;
    }
    Ok(written)
}

// ---------------------------------------------------------------------------------------------
// The report, as far as the charts need it.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Better {
    Lower,
    Higher,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GoalOp {
    AtMost,
    AtLeast,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Met,
    Missed,
    /// No goal, or no verdict on it.
    NoGoal,
}

impl Verdict {
    fn color(self) -> RGBColor {
        match self {
            Self::Met => MET,
            Self::Missed => MISSED,
            Self::NoGoal => NO_GOAL,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Met => "goal met",
            Self::Missed => "goal missed",
            Self::NoGoal => "no goal",
        }
    }
}

/// One comparison; text fields are empty and numbers `None` where the report has nothing usable.
#[derive(Debug, Clone)]
struct Comparison {
    suite: String,
    name: String,
    group: String,
    kiln: Option<f64>,
    baseline: Option<f64>,
    baseline_name: String,
    unit: String,
    better: Option<Better>,
    /// kiln / baseline: the report's, else computed from the two values.
    ratio: Option<f64>,
    goal: Option<(GoalOp, f64)>,
    verdict: Verdict,
    batch_size: Option<f64>,
}

impl Comparison {
    fn from_json(v: &Value) -> Self {
        let text = |key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
        let kiln = number(v.get("kiln"));
        let baseline = number(v.get("baseline"));
        let ratio = number(v.get("ratio")).or_else(|| match (kiln, baseline) {
            (Some(k), Some(b)) if b != 0.0 => Some(k / b).filter(|r| usable(*r)),
            _ => None,
        });
        let goal = v.get("goal").and_then(|g| {
            let op = match g.get("op").and_then(Value::as_str)? {
                "<=" | "<" => GoalOp::AtMost,
                ">=" | ">" => GoalOp::AtLeast,
                _ => return None,
            };
            Some((op, number(g.get("value"))?))
        });
        let verdict = match v.get("meets_goal").and_then(Value::as_bool) {
            Some(true) => Verdict::Met,
            Some(false) => Verdict::Missed,
            None => Verdict::NoGoal,
        };
        let better = match v.get("better").and_then(Value::as_str) {
            Some("lower") => Some(Better::Lower),
            Some("higher") => Some(Better::Higher),
            _ => None,
        };
        let name = text("name");
        let batch_size = number(v.get("details").and_then(|d| d.get("batch_size")))
            .or_else(|| batch_token(&name))
            .filter(|b| *b > 0.0);
        Self {
            suite: text("suite"),
            name,
            group: text("group"),
            kiln,
            baseline,
            baseline_name: text("baseline_name"),
            unit: text("unit"),
            better,
            ratio,
            goal,
            verdict,
            batch_size,
        }
    }
}

/// A usable number: finite and at most [`kiln_train::plot::MAX_MAGNITUDE`].
fn number(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64).filter(|x| usable(*x))
}

/// The `N` of a `b=N` token in `name`.
fn batch_token(name: &str) -> Option<f64> {
    name.split_whitespace()
        .find_map(|t| t.strip_prefix("b=")?.parse::<f64>().ok())
        .filter(|b| usable(*b))
}

/// `name` without its `b=N` token: the series a sweep point belongs to.
fn series_key(name: &str) -> String {
    name.split_whitespace()
        .filter(|t| {
            t.strip_prefix("b=")
                .is_none_or(|n| n.parse::<f64>().is_err())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Comparisons grouped by suite, suites and members in report order.
fn by_suite<'a>(rows: &[&'a Comparison]) -> Vec<(&'a str, Vec<&'a Comparison>)> {
    let mut out: Vec<(&str, Vec<&Comparison>)> = Vec::new();
    for row in rows {
        let suite = if row.suite.is_empty() {
            "unnamed suite"
        } else {
            row.suite.as_str()
        };
        match out.iter_mut().find(|(s, _)| *s == suite) {
            Some((_, members)) => members.push(row),
            None => out.push((suite, vec![row])),
        }
    }
    out
}

/// What the report says about where and when it was measured, for the charts' second line.
fn subtitle(report: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(created) = report.get("created").and_then(Value::as_str) {
        parts.push(created.to_owned());
    }
    let machine = report.get("machine");
    if let Some(device) = machine
        .and_then(|m| m.get("device"))
        .and_then(Value::as_str)
    {
        parts.push(format!("device {device}"));
    }
    if let Some(cpus) = machine.and_then(|m| m.get("cpus")).and_then(Value::as_u64) {
        parts.push(format!("{cpus} CPUs"));
    }
    if report.get("quick").and_then(Value::as_bool) == Some(true) {
        parts.push("quick run".to_owned());
    }
    parts.join(" · ")
}

/// `s` lowercased with every run of other characters than `[a-z0-9]` turned into one `-`.
fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_end_matches('-');
    if out.is_empty() {
        "suite".to_owned()
    } else {
        out.to_owned()
    }
}

/// `stem`, or `stem-2`, `stem-3`, … if taken; records the result as taken.
fn unique(stem: String, taken: &mut HashSet<String>) -> String {
    let mut candidate = stem.clone();
    let mut n = 2;
    while taken.contains(&candidate) {
        candidate = format!("{stem}-{n}");
        n += 1;
    }
    taken.insert(candidate.clone());
    candidate
}

// ---------------------------------------------------------------------------------------------
// Writing a chart as PNG and SVG.

/// A chart drawable on any plotters backend.
trait Chart {
    fn height(&self) -> u32;
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// Draws `chart` into `<dir>/<stem>.png` and `<dir>/<stem>.svg` and appends both paths.
fn write_chart(
    dir: &Path,
    stem: &str,
    chart: &impl Chart,
    written: &mut Vec<PathBuf>,
) -> Result<(), String> {
    let height = chart.height();
    let png_path = dir.join(format!("{stem}.png"));
    let mut rgb = vec![255u8; WIDTH as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (WIDTH, height)).into_drawing_area();
        chart
            .draw(&root)
            .and_then(|()| root.present().map_err(|e| e.to_string()))
            .map_err(|e| format!("plot {}: drawing failed: {e}", png_path.display()))?;
    }
    let png = encode_png(&rgb, WIDTH, height)
        .map_err(|e| format!("plot {}: PNG encoding failed: {e}", png_path.display()))?;
    write_file(&png_path, &png)?;
    written.push(png_path);

    let svg_path = dir.join(format!("{stem}.svg"));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        chart
            .draw(&root)
            .and_then(|()| root.present().map_err(|e| e.to_string()))
            .map_err(|e| format!("plot {}: drawing failed: {e}", svg_path.display()))?;
    }
    let svg = svg.replace(
        &format!("font-family=\"{FONT}\""),
        &format!("font-family=\"{SVG_FONT_FAMILY}\""),
    );
    write_file(&svg_path, svg.as_bytes())?;
    written.push(svg_path);
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("plot {}: cannot write: {e}", path.display()))
}

fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    e.to_string()
}

/// Draws the white background, the title and the subtitle; returns the area below the top
/// `band` pixels.
fn header<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
    band: u32,
) -> Result<DrawingArea<DB, Shift>, String> {
    root.fill(&WHITE).map_err(draw_err)?;
    let title_style = TextStyle::from((FONT, 24, FontStyle::Bold).into_font())
        .color(&INK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    let sub_style = TextStyle::from((FONT, 15).into_font())
        .color(&FAINT)
        .pos(Pos::new(HPos::Center, VPos::Top));
    let centre = WIDTH as i32 / 2;
    let title = clip(title, 160, |t| {
        fits(root, t, &title_style, MAX_TITLE_PIXELS)
    });
    root.draw_text(&title, &title_style, (centre, 10))
        .map_err(draw_err)?;
    let subtitle = clip(subtitle, 200, |t| {
        fits(root, t, &sub_style, MAX_TITLE_PIXELS)
    });
    root.draw_text(&subtitle, &sub_style, (centre, 42))
        .map_err(draw_err)?;
    Ok(root.margin(band, 0, 0, 0))
}

/// How a legend entry's glyph looks.
#[derive(Debug, Clone, Copy)]
enum Glyph {
    Swatch(RGBColor),
    Tick,
    /// A vertical dashed line.
    Dashed,
}

/// Draws a one-line legend centred at height `y` of `root`.
fn legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    y: i32,
    entries: &[(Glyph, String)],
) -> Result<(), String> {
    let style = TextStyle::from((FONT, 14).into_font())
        .color(&INK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    let glyph_w = 18;
    let gap = 30;
    let widths: Vec<i32> = entries
        .iter()
        .map(|(_, text)| {
            root.estimate_text_size(text, &style)
                .map_or(0, |(w, _)| w as i32)
        })
        .collect();
    let total: i32 = widths.iter().map(|w| glyph_w + 6 + w).sum::<i32>()
        + gap * (entries.len() as i32 - 1).max(0);
    let mut x = (WIDTH as i32 - total).max(0) / 2;
    for ((glyph, text), w) in entries.iter().zip(&widths) {
        match *glyph {
            Glyph::Swatch(color) => root
                .draw(&Rectangle::new(
                    [(x, y - 7), (x + glyph_w, y + 7)],
                    color.filled(),
                ))
                .map_err(draw_err)?,
            Glyph::Tick => root
                .draw(&PathElement::new(
                    vec![(x + glyph_w / 2, y - 9), (x + glyph_w / 2, y + 9)],
                    INK.stroke_width(3),
                ))
                .map_err(draw_err)?,
            Glyph::Dashed => {
                for dy in [-9, -2, 5] {
                    root.draw(&PathElement::new(
                        vec![(x + glyph_w / 2, y + dy), (x + glyph_w / 2, y + dy + 4)],
                        FAINT.stroke_width(2),
                    ))
                    .map_err(draw_err)?;
                }
            }
        }
        root.draw_text(text, &style, (x + glyph_w + 6, y))
            .map_err(draw_err)?;
        x += glyph_w + 6 + w + gap;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The ratio chart of one suite.

/// One bar: its label, ratio, goal and colour.
#[derive(Debug, Clone)]
struct Bar {
    label: String,
    ratio: Option<f64>,
    goal: Option<(GoalOp, f64)>,
    verdict: Verdict,
}

impl Bar {
    fn of(c: &Comparison) -> Self {
        let name = if c.name.is_empty() {
            "(unnamed)"
        } else {
            c.name.as_str()
        };
        let label = match c.better {
            Some(Better::Lower) => format!("{name} (lower is better)"),
            Some(Better::Higher) => format!("{name} (higher is better)"),
            None => name.to_owned(),
        };
        Self {
            label,
            ratio: c.ratio,
            goal: c.goal,
            verdict: c.verdict,
        }
    }

    /// The text at the end of the bar: the ratio, and the goal if there is one.
    fn value_text(&self) -> String {
        let Some(ratio) = self.ratio else {
            return "no value".to_owned();
        };
        match self.goal {
            Some((GoalOp::AtMost, g)) => format!("{} (goal ≤ {})", short(ratio), short(g)),
            Some((GoalOp::AtLeast, g)) => format!("{} (goal ≥ {})", short(ratio), short(g)),
            None => short(ratio),
        }
    }
}

#[derive(Debug, Clone)]
struct RatioChart {
    title: String,
    subtitle: String,
    bars: Vec<Bar>,
}

impl Chart for RatioChart {
    fn height(&self) -> u32 {
        let rows = u32::try_from(self.bars.len()).unwrap_or(u32::MAX);
        HEADER
            .saturating_add(90)
            .saturating_add(rows.saturating_mul(ROW_HEIGHT))
            .clamp(320, 20_000)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let body = header(root, &self.title, &self.subtitle, HEADER)?;
        let mut entries = Vec::new();
        for verdict in [Verdict::Met, Verdict::Missed, Verdict::NoGoal] {
            if self
                .bars
                .iter()
                .any(|b| b.ratio.is_some() && b.verdict == verdict)
            {
                entries.push((Glyph::Swatch(verdict.color()), verdict.label().to_owned()));
            }
        }
        if self.bars.iter().any(|b| b.goal.is_some()) {
            entries.push((Glyph::Tick, "goal".to_owned()));
        }
        entries.push((Glyph::Dashed, "parity (1.0)".to_owned()));
        legend(root, 74, &entries)?;

        let n = self.bars.len();
        let label_style = TextStyle::from((FONT, 14).into_font());
        let max_label = (f64::from(WIDTH) * MAX_LABEL_SHARE) as u32;
        let labels: Vec<String> = self
            .bars
            .iter()
            .map(|b| clip(&b.label, 120, |t| fits(root, t, &label_style, max_label)))
            .collect();
        let label_width = labels
            .iter()
            .filter_map(|l| root.estimate_text_size(l, &label_style).ok())
            .map(|(w, _)| w)
            .max()
            .unwrap_or(0)
            .clamp(40, max_label)
            + 16;

        let values = self
            .bars
            .iter()
            .flat_map(|b| [b.ratio, b.goal.map(|g| g.1)])
            .flatten();
        let (x_lo, x_hi) = ratio_range(values);
        // Bar `i` is centred at y = rows - i - 0.5, so the report's first comparison is on top.
        let rows = n as f64;
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
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(215, 215, 215))
            .draw()
            .map_err(draw_err)?;
        // The bars' labels, right-aligned left of the y axis.
        let label_style = label_style
            .color(&INK)
            .pos(Pos::new(HPos::Right, VPos::Center));
        for (i, label) in labels.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(x_lo, centre(i)));
            root.draw_text(label, &label_style, (x - 8, y))
                .map_err(draw_err)?;
        }

        let zero = 0f64.clamp(x_lo, x_hi);
        chart
            .draw_series(self.bars.iter().enumerate().filter_map(|(i, b)| {
                let r = b.ratio?;
                let c = centre(i);
                Some(Rectangle::new(
                    [(zero, c - 0.31), (r, c + 0.31)],
                    b.verdict.color().filled(),
                ))
            }))
            .map_err(draw_err)?;
        if (x_lo..=x_hi).contains(&1.0) {
            chart
                .draw_series(DashedLineSeries::new(
                    [(1.0, 0.0), (1.0, rows)],
                    6,
                    5,
                    FAINT.stroke_width(2),
                ))
                .map_err(draw_err)?;
        }
        chart
            .draw_series(self.bars.iter().enumerate().filter_map(|(i, b)| {
                let (_, g) = b.goal?;
                let c = centre(i);
                Some(PathElement::new(
                    vec![(g, c - 0.42), (g, c + 0.42)],
                    INK.stroke_width(3),
                ))
            }))
            .map_err(draw_err)?;
        let value_style = TextStyle::from((FONT, 13).into_font())
            .color(&INK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        chart
            .draw_series(self.bars.iter().enumerate().map(|(i, b)| {
                // After the bar, or after the goal's tick if that is further right.
                let end = match (b.ratio, b.goal) {
                    (Some(r), Some((_, g))) => r.max(g),
                    (Some(r), None) => r,
                    (None, _) => zero,
                }
                .max(zero);
                EmptyElement::at((end, centre(i)))
                    + Text::new(b.value_text(), (8, 0), value_style.clone())
            }))
            .map_err(draw_err)?;
        Ok(())
    }
}

/// The x range of a ratio chart: from 0 (or the smallest value) past the largest of the values
/// and 1.0, with room on the right for the value texts.
fn ratio_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| usable(*v))
        .fold((0f64, 1f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let width = hi - lo;
    let lo = if lo < 0.0 { lo - width * 0.05 } else { lo };
    (lo, hi + width * 0.3)
}

// ---------------------------------------------------------------------------------------------
// The batch-size sweep.

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
struct SweepPanel {
    unit: String,
    series: Vec<SweepSeries>,
}

/// Groups the sweep comparisons by unit, then by name without `b=N`, in report order; points
/// are sorted by batch size, those without a usable batch size or value left out.
fn sweep_panels(rows: &[&Comparison]) -> Vec<SweepPanel> {
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
        let Some(x) = row.batch_size.map(f64::log2).filter(|x| usable(*x)) else {
            continue;
        };
        if let Some(k) = row.kiln {
            series.kiln.push((x, k));
        }
        if let Some(b) = row.baseline {
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
struct SweepChart {
    title: String,
    subtitle: String,
    panels: Vec<SweepPanel>,
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

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        // The panels' legends tell kiln (solid, filled dots) from the baseline (dashed, open).
        let body = header(root, &self.title, &self.subtitle, SWEEP_HEADER)?;
        let areas = body.split_evenly(self.grid());
        for (panel, area) in self.panels.iter().zip(&areas) {
            draw_sweep_panel(area, panel)?;
        }
        Ok(())
    }
}

fn draw_sweep_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &SweepPanel,
) -> Result<(), String> {
    let unit = if panel.unit.is_empty() {
        "(no unit)"
    } else {
        panel.unit.as_str()
    };
    let all = || {
        panel
            .series
            .iter()
            .flat_map(|s| s.kiln.iter().chain(&s.baseline).copied())
    };
    let (x_lo, x_hi) = match all().map(|p| p.0).fold(None, |acc: Option<(f64, f64)>, x| {
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
    let (y_lo, y_hi) = (if y_min < 0.0 { y_min - pad } else { 0.0 }, y_max + pad);

    let mut chart = ChartBuilder::on(area)
        .caption(unit, (FONT, 18))
        .margin(14)
        .margin_right(28)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)
        .map_err(draw_err)?;
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

    let several = panel.series.len() > 1;
    let label_style = TextStyle::from((FONT, 13).into_font());
    let mut any_points = false;
    for (i, series) in panel.series.iter().enumerate() {
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
        if !series.kiln.is_empty() {
            any_points = true;
            chart
                .draw_series(LineSeries::new(
                    series.kiln.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(draw_err)?
                .label(fit(&kiln_label))
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
            any_points = true;
            chart
                .draw_series(DashedLineSeries::new(
                    series.baseline.iter().copied(),
                    7,
                    5,
                    color.stroke_width(2),
                ))
                .map_err(draw_err)?
                .label(fit(&base_label))
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
    }
    if any_points {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(label_style)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(draw_err)?;
    } else {
        let (w, h) = area.dim_in_pixel();
        let style = TextStyle::from((FONT, 16).into_font())
            .color(&FAINT)
            .pos(Pos::new(HPos::Center, VPos::Center));
        area.draw_text("no data", &style, (w as i32 / 2, h as i32 / 2))
            .map_err(draw_err)?;
    }
    Ok(())
}

/// The batch size at log2 position `v` if `v` is a whole number, else nothing (so only powers
/// of two are labelled).
fn power_of_two_label(v: f64) -> String {
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

// ---------------------------------------------------------------------------------------------
// Loss curves of the same-learning rows.

/// Both sides' loss per training step and the difference, for a comparison whose details hold
/// `loss_curves: {"kiln": [...], "baseline": [...]}`.
#[derive(Debug, Clone)]
struct LossChart {
    title: String,
    subtitle: String,
    baseline_name: String,
    kiln: Vec<(f64, f64)>,
    baseline: Vec<(f64, f64)>,
    /// kiln − baseline per step where both have a usable value.
    difference: Vec<(f64, f64)>,
}

/// Points `(step, loss)` of a curve, unusable values left out.
fn curve(v: &Value) -> Vec<(f64, f64)> {
    v.as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, l)| number(Some(l)).map(|l| (i as f64, l)))
        .collect()
}

/// One chart per comparison with loss curves, each with its file stem:
/// `<suite>-loss-<model>-<precision>` (or the row's name when the details do not say).
fn loss_charts(comparisons: &[Value], subtitle: &str) -> Vec<(String, LossChart)> {
    let mut out = vec![];
    for c in comparisons {
        let curves = &c["details"]["loss_curves"];
        let (kiln, baseline) = (curve(&curves["kiln"]), curve(&curves["baseline"]));
        if kiln.is_empty() && baseline.is_empty() {
            continue;
        }
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let name = text(&c["name"]);
        let which = match (
            c["details"]["model"].as_str(),
            c["details"]["precision"].as_str(),
        ) {
            (Some(m), Some(p)) => format!("{m} {p}"),
            _ => name.clone(),
        };
        let difference = kiln
            .iter()
            .zip(&baseline)
            .filter(|(k, b)| k.0 == b.0)
            .map(|(k, b)| (k.0, k.1 - b.1))
            .collect();
        let chart = LossChart {
            title: format!("{which}: training loss per step, kiln and baseline"),
            subtitle: [name.as_str(), subtitle]
                .iter()
                .filter(|s| !s.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(" · "),
            baseline_name: curves["baseline_name"]
                .as_str()
                .map_or_else(|| text(&c["baseline_name"]), str::to_owned),
            kiln,
            baseline,
            difference,
        };
        out.push((
            format!("{}-loss-{}", slug(&text(&c["suite"])), slug(&which)),
            chart,
        ));
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
    let (lo, hi) = points.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.08)
        .max(hi.abs().max(lo.abs()) * 1e-6)
        .max(1e-12);
    (lo - pad, hi + pad)
}

impl Chart for LossChart {
    fn height(&self) -> u32 {
        SWEEP_HEADER + PANEL_HEIGHT + PANEL_HEIGHT * 2 / 3
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let body = header(root, &self.title, &self.subtitle, SWEEP_HEADER)?;
        let (top, bottom) = body.split_vertically(PANEL_HEIGHT);
        let last = self
            .kiln
            .iter()
            .chain(&self.baseline)
            .map(|p| p.0)
            .fold(1.0, f64::max);
        let (lo, hi) = value_range(self.kiln.iter().chain(&self.baseline).map(|p| p.1));
        let mut chart = ChartBuilder::on(&top)
            .caption("loss (nats)", (FONT, 18))
            .margin(14)
            .margin_right(28)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(0.0..last, lo..hi)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("loss")
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .light_line_style(RGBColor(240, 240, 240))
            .x_label_formatter(&|v| step_label(*v))
            .y_label_formatter(&|v| tick_label(*v, hi - lo))
            .draw()
            .map_err(draw_err)?;
        let (kc, bc) = (SERIES_COLORS[0], SERIES_COLORS[1]);
        chart
            .draw_series(LineSeries::new(
                self.kiln.iter().copied(),
                kc.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label("kiln")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], kc.stroke_width(2)));
        let label_style = TextStyle::from((FONT, 13).into_font());
        let base = clip(&self.baseline_name, 90, |t| {
            fits(&top, t, &label_style, 700)
        });
        chart
            .draw_series(DashedLineSeries::new(
                self.baseline.iter().copied(),
                7,
                5,
                bc.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(base)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], bc.stroke_width(2)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(label_style)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(draw_err)?;
        self.draw_difference(&bottom, last)
    }
}

impl LossChart {
    /// The lower panel: kiln − baseline per step, with the zero line.
    fn draw_difference<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        last: f64,
    ) -> Result<(), String> {
        let (lo, hi) = value_range(self.difference.iter().map(|p| p.1).chain([0.0]));
        let caption = if self.difference.iter().all(|p| p.1 == 0.0) {
            "kiln − baseline (nats): 0 at every step"
        } else {
            "kiln − baseline (nats)"
        };
        let mut chart = ChartBuilder::on(area)
            .caption(caption, (FONT, 18))
            .margin(14)
            .margin_right(28)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(0.0..last, lo..hi)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("difference")
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .light_line_style(RGBColor(240, 240, 240))
            .x_label_formatter(&|v| step_label(*v))
            .y_label_formatter(&|v| tick_label(*v, hi - lo))
            .draw()
            .map_err(draw_err)?;
        chart
            .draw_series(LineSeries::new(
                [(0.0, 0.0), (last, 0.0)],
                FAINT.stroke_width(1),
            ))
            .map_err(draw_err)?;
        chart
            .draw_series(LineSeries::new(
                self.difference.iter().copied(),
                SERIES_COLORS[3].stroke_width(2),
            ))
            .map_err(draw_err)?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Text helpers.

/// A value in about three significant digits.
fn short(v: f64) -> String {
    let mag = v.abs();
    if mag != 0.0 && !(1e-3..1e6).contains(&mag) {
        format!("{v:.2e}")
    } else if mag >= 100.0 {
        format!("{v:.0}")
    } else if mag >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

    fn comparison(suite: &str, name: &str, ratio: f64, goal: Value, meets: Value) -> Value {
        json!({
            "suite": suite, "name": name, "group": "step time",
            "kiln": ratio * 10.0, "baseline": 10.0, "baseline_name": "PyTorch eager fp32",
            "unit": "ms/step", "better": "lower", "ratio": ratio,
            "goal": goal, "meets_goal": meets, "details": {"batch_size": 8}
        })
    }

    fn report(comparisons: Vec<Value>) -> Value {
        json!({
            "schema": "kiln-bench/1", "created": "2026-11-21T10:00:00Z", "quick": false,
            "machine": {"cpus": 2, "device": "cpu"},
            "comparisons": comparisons
        })
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
        report["comparisons"] = serde_json::to_value(rows).expect("rows serialise");
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
        // serde_json turns non-finite floats into null; strings and absent fields stand for
        // the other odd things a report might hold.
        let rows = vec![
            comparison(
                "train",
                "all nan",
                nan,
                json!({"op": "<=", "value": nan}),
                Value::Null,
            ),
            json!({"suite": "train", "name": "strings", "ratio": "fast", "kiln": "x",
                   "goal": {"op": "~", "value": 1.0}, "meets_goal": "yes"}),
            json!({"name": "no suite at all"}),
            json!(null),
            json!({"suite": "train", "name": "huge", "ratio": 1e300, "kiln": 1e300,
                   "baseline": 1.0, "better": "lower"}),
            json!({"suite": "train", "name": "negative", "ratio": -2.0, "better": "lower"}),
            json!({"suite": "train", "name": "computed", "kiln": 3.0, "baseline": 2.0}),
            json!({"suite": "train", "name": "zero baseline", "kiln": 3.0, "baseline": 0.0}),
            sweep_point("mlp b=8 throughput", "samples/s", 8, nan, nan),
            json!({"suite": "train", "name": "no batch size", "group": SWEEP_GROUP,
                   "kiln": 1.0, "baseline": 2.0, "unit": "samples/s"}),
            json!({"suite": "train", "name": "mlp b=16 throughput", "group": SWEEP_GROUP,
                   "kiln": 1.0, "details": {"batch_size": -4}}),
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
    fn a_report_without_comparisons_writes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("plots");
        let paths = write_plots(&report(vec![]), &target).expect("nothing to do");
        assert!(paths.is_empty());
        assert!(!target.exists(), "no directory for no plots");
        let err = write_plots(&json!({"schema": "kiln-bench/1"}), &target).unwrap_err();
        assert!(err.contains("comparisons"), "{err}");
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
}
