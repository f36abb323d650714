//! What every chart shares: the canvas (size, colours, font), writing a chart as PNG and SVG,
//! the title band, the one-line legend, and the line charts' panels (axes, mesh, lines, legend).

use std::ops::Range;
use std::path::{Path, PathBuf};

use kiln_train::plot::{FONT, clip, encode_png, fits, tick_label};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Width of every chart, in pixels.
pub const WIDTH: u32 = 1200;
/// Heights: a ratio chart's title, subtitle and legend band; the line charts' title and
/// subtitle band; one bar's row of a ratio chart; one row of line-chart panels.
pub const HEADER: u32 = 96;
pub const SWEEP_HEADER: u32 = 70;
pub const ROW_HEIGHT: u32 = 36;
pub const PANEL_HEIGHT: u32 = 480;

/// Bar labels take at most this share of the chart's width; longer ones are cut short.
pub const MAX_LABEL_SHARE: f64 = 0.45;

/// The font family the SVGs ask for in place of the name the font is registered under.
pub const SVG_FONT_FAMILY: &str = "DejaVu Sans, sans-serif";

/// Bar colours by verdict, text, and the mesh's light and bold lines.
pub const MET: RGBColor = RGBColor(44, 160, 44);
pub const MISSED: RGBColor = RGBColor(214, 39, 40);
pub const NO_GOAL: RGBColor = RGBColor(140, 150, 165);
pub const INK: RGBColor = RGBColor(30, 30, 30);
pub const FAINT: RGBColor = RGBColor(110, 110, 110);
pub const LIGHT_LINE: RGBColor = RGBColor(240, 240, 240);
pub const BOLD_LINE: RGBColor = RGBColor(215, 215, 215);

/// The line charts' colours, one per series.
pub const SERIES_COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A chart drawable on any plotters backend.
pub trait Chart {
    fn height(&self) -> u32;
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> crate::Result<()>;
}

/// Draws `chart` into `<dir>/<stem>.png` and `<dir>/<stem>.svg`; returns both paths.
pub fn write_chart(dir: &Path, stem: &str, chart: &impl Chart) -> crate::Result<[PathBuf; 2]> {
    let size = (WIDTH, chart.height());
    let path = |ext: &str| dir.join(format!("{stem}.{ext}"));
    let (png_path, svg_path) = (path("png"), path("svg"));
    let mut rgb = vec![255u8; size.0 as usize * size.1 as usize * 3];
    render(chart, BitMapBackend::with_buffer(&mut rgb, size), &png_path)?;
    let png = encode_png(&rgb, size.0, size.1)
        .map_err(|e| format!("plot {}: PNG encoding failed: {e}", png_path.display()))?;
    write_file(&png_path, &png)?;
    let mut svg = String::new();
    render(chart, SVGBackend::with_string(&mut svg, size), &svg_path)?;
    let family = |name: &str| format!("font-family=\"{name}\"");
    let svg = svg.replace(&family(FONT), &family(SVG_FONT_FAMILY));
    write_file(&svg_path, svg.as_bytes())?;
    Ok([png_path, svg_path])
}

/// Draws `chart` on `backend` and presents it; errors name `path`, the file it is for.
fn render<DB: DrawingBackend>(chart: &impl Chart, backend: DB, path: &Path) -> crate::Result<()> {
    let root = backend.into_drawing_area();
    chart
        .draw(&root)
        .and_then(|()| root.present().map_err(|e| e.to_string()))
        .map_err(|e| format!("plot {}: drawing failed: {e}", path.display()))
}

fn write_file(path: &Path, bytes: &[u8]) -> crate::Result<()> {
    std::fs::write(path, bytes).map_err(|e| format!("plot {}: cannot write: {e}", path.display()))
}

/// A drawing error as text.
pub fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    e.to_string()
}

/// `font` (of the embedded family) in `color`, anchored at `h`, `v`.
pub fn text_style<'a>(
    font: impl IntoFont<'a>,
    color: &'a RGBColor,
    h: HPos,
    v: VPos,
) -> TextStyle<'a> {
    font.into_font().color(color).pos(Pos::new(h, v))
}

/// Draws the background, title and subtitle; returns the area below the top `band` pixels.
pub fn header<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
    band: u32,
) -> crate::Result<DrawingArea<DB, Shift>> {
    root.fill(&WHITE).map_err(draw_err)?;
    let title_style = text_style((FONT, 24, FontStyle::Bold), &INK, HPos::Center, VPos::Top);
    let sub_style = text_style((FONT, 15), &FAINT, HPos::Center, VPos::Top);
    for (text, style, max_chars, y) in [
        (title, title_style, 160, 10),
        (subtitle, sub_style, 200, 42),
    ] {
        let text = clip(text, max_chars, |t| fits(root, t, &style, WIDTH - 40));
        let at = (WIDTH as i32 / 2, y);
        root.draw_text(&text, &style, at).map_err(draw_err)?;
    }
    Ok(root.margin(band, 0, 0, 0))
}

/// How a legend entry's glyph looks: a colour swatch, the goal's tick, or parity's dashes.
#[derive(Debug, Clone, Copy)]
pub enum Glyph {
    Swatch(RGBColor),
    Tick,
    Dashed,
}

/// Draws a one-line legend centred at height `y` of `root`.
pub fn legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    y: i32,
    entries: &[(Glyph, String)],
) -> crate::Result<()> {
    let style = text_style((FONT, 14), &INK, HPos::Left, VPos::Center);
    let (glyph_w, gap) = (18, 30);
    let width = |text: &String| {
        root.estimate_text_size(text, &style)
            .map_or(0, |s| s.0 as i32)
    };
    let widths: Vec<i32> = entries.iter().map(|(_, text)| width(text)).collect();
    let total = widths.iter().map(|w| glyph_w + 6 + w + gap).sum::<i32>() - gap;
    let mut x = (WIDTH as i32 - total).max(0) / 2;
    for ((glyph, text), w) in entries.iter().zip(&widths) {
        let mid = x + glyph_w / 2;
        let line = |dy: i32, len: i32| vec![(mid, y + dy), (mid, y + dy + len)];
        match *glyph {
            Glyph::Swatch(color) => {
                let corners = [(x, y - 7), (x + glyph_w, y + 7)];
                root.draw(&Rectangle::new(corners, color.filled()))
            }
            Glyph::Tick => root.draw(&PathElement::new(line(-9, 18), INK.stroke_width(3))),
            Glyph::Dashed => [-9, -2, 5].into_iter().try_for_each(|dy| {
                root.draw(&PathElement::new(line(dy, 4), FAINT.stroke_width(2)))
            }),
        }
        .map_err(draw_err)?;
        let at = (x + glyph_w + 6, y);
        root.draw_text(text, &style, at).map_err(draw_err)?;
        x += glyph_w + 6 + w + gap;
    }
    Ok(())
}

/// A [`LinePanel`]'s line.
pub struct Line {
    pub points: Vec<(f64, f64)>,
    pub style: ShapeStyle,
    pub dashed: bool,
    /// The legend's label; no legend entry where none.
    pub label: Option<String>,
}

impl Line {
    /// A solid line through `points`, labelled `label` in the legend.
    pub fn solid(points: Vec<(f64, f64)>, style: ShapeStyle, label: &str) -> Self {
        Self {
            points,
            style,
            dashed: false,
            label: Some(label.to_owned()),
        }
    }

    /// A solid line through `points` without a legend entry.
    pub fn unlabelled(points: Vec<(f64, f64)>, style: ShapeStyle) -> Self {
        Self {
            label: None,
            ..Self::solid(points, style, "")
        }
    }

    /// A dashed line through `points`, labelled `label` in the legend.
    pub fn dashed(points: Vec<(f64, f64)>, style: ShapeStyle, label: &str) -> Self {
        Self {
            dashed: true,
            ..Self::solid(points, style, label)
        }
    }
}

/// A line chart's panel: caption, axes, lines, and their legend.
pub struct LinePanel {
    pub caption: String,
    pub x_desc: &'static str,
    pub y_desc: String,
    pub x: Range<f64>,
    pub y: Range<f64>,
    pub x_label: fn(f64) -> String,
    /// `Some(n)`: the finer grid (bold lines, `n` x and 8 y labels, at most 4 light lines
    /// between), and a dot at each point (filled on solid lines, open on dashed ones).
    pub grid: Option<usize>,
    pub lines: Vec<Line>,
    /// The legend's corner.
    pub legend: SeriesLabelPosition,
    /// The legend labels' limits, in characters and in pixels.
    pub label_chars: usize,
    pub label_pixels: u32,
}

/// A chart of [`LinePanel`]s: titles, then rows of `heights` pixels with `cols` panels each.
pub struct LineChart {
    pub title: String,
    pub subtitle: String,
    pub cols: usize,
    pub heights: Vec<u32>,
    pub panels: Vec<LinePanel>,
}

impl Chart for LineChart {
    fn height(&self) -> u32 {
        let panels: u32 = self.heights.iter().sum();
        SWEEP_HEADER.saturating_add(panels).min(20_000)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> crate::Result<()> {
        let mut rest = header(root, &self.title, &self.subtitle, SWEEP_HEADER)?;
        // Rows shrink in proportion where the chart's height is capped.
        let total = self.heights.iter().sum::<u32>().max(1);
        let space = rest.dim_in_pixel().1.min(total);
        for (row, height) in self.panels.chunks(self.cols).zip(&self.heights) {
            let height = u64::from(*height) * u64::from(space) / u64::from(total);
            let (top, below) = rest.split_vertically(height as u32);
            for (panel, area) in row.iter().zip(top.split_evenly((1, self.cols))) {
                draw_panel(&area, panel)?;
            }
            rest = below;
        }
        Ok(())
    }
}

/// Draws `p` on `area`: mesh, lines (dotted on the finer grid), legend, or "no data" if no lines.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &LinePanel,
) -> crate::Result<()> {
    let mut chart = ChartBuilder::on(area)
        .caption(&p.caption, (FONT, 18))
        .margin(14)
        .margin_right(28)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(p.x.clone(), p.y.clone())
        .map_err(draw_err)?;
    let span = p.y.end - p.y.start;
    let x_label = |v: &f64| (p.x_label)(*v);
    let y_label = |v: &f64| tick_label(*v, span);
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(p.x_desc)
        .y_desc(&p.y_desc)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .light_line_style(LIGHT_LINE)
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label);
    if let Some(n) = p.grid {
        mesh.bold_line_style(BOLD_LINE)
            .x_labels(n)
            .y_labels(8)
            .max_light_lines(4);
    }
    mesh.draw().map_err(draw_err)?;
    let label_style = TextStyle::from((FONT, 13).into_font());
    for line in &p.lines {
        let style = line.style;
        let xy = line.points.iter().copied();
        let series = if line.dashed {
            chart.draw_series(DashedLineSeries::new(xy, 7, 5, style))
        } else {
            chart.draw_series(LineSeries::new(xy, style))
        }
        .map_err(draw_err)?;
        if let Some(label) = &line.label {
            let fit = |t: &str| fits(area, t, &label_style, p.label_pixels);
            series.label(clip(label, p.label_chars, fit));
            let stroke = move |from, to| PathElement::new(vec![from, to], style);
            if line.dashed {
                series.legend(move |(x, y)| {
                    EmptyElement::at((x, y)) + stroke((0, 0), (7, 0)) + stroke((12, 0), (20, 0))
                });
            } else {
                series.legend(move |(x, y)| stroke((x, y), (x + 20, y)));
            }
        }
        if p.grid.is_some() {
            let dot = if line.dashed {
                style
            } else {
                style.color.filled()
            };
            let dots = line.points.iter().map(|&p| Circle::new(p, 4, dot));
            chart.draw_series(dots).map_err(draw_err)?;
        }
    }
    if p.lines.iter().any(|l| l.label.is_some()) {
        chart
            .configure_series_labels()
            .position(p.legend.clone())
            .label_font(label_style)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(draw_err)
    } else if p.lines.is_empty() {
        let (w, h) = area.dim_in_pixel();
        let style = text_style((FONT, 16), &FAINT, HPos::Center, VPos::Center);
        area.draw_text("no data", &style, (w as i32 / 2, h as i32 / 2))
            .map_err(draw_err)
    } else {
        Ok(())
    }
}

/// A value in about three significant digits.
pub fn short(v: f64) -> String {
    match v.abs() {
        m if m != 0.0 && !(1e-3..1e6).contains(&m) => format!("{v:.2e}"),
        m if m >= 100.0 => format!("{v:.0}"),
        m if m >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}
