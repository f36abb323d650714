//! What every chart shares: the canvas (size, colours, font), writing a chart as PNG and SVG,
//! the title band, the one-line legend, and the line charts' panels (axes, mesh, lines, legend).

use std::ops::Range;
use std::path::{Path, PathBuf};

use kiln_train::plot::{FONT, clip, encode_png, fits};
use plotters::chart::{MeshStyle, SeriesAnno};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
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

/// Draws `chart` into `<dir>/<stem>.png` and `<dir>/<stem>.svg` and appends both paths.
pub fn write_chart(
    dir: &Path,
    stem: &str,
    chart: &impl Chart,
    written: &mut Vec<PathBuf>,
) -> crate::Result<()> {
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
    let svg = svg.replace(
        &format!("font-family=\"{FONT}\""),
        &format!("font-family=\"{SVG_FONT_FAMILY}\""),
    );
    write_file(&svg_path, svg.as_bytes())?;
    written.extend([png_path, svg_path]);
    Ok(())
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
    TextStyle::from(font.into_font())
        .color(color)
        .pos(Pos::new(h, v))
}

/// The line charts' series labels: 13 px.
pub fn label_style() -> TextStyle<'static> {
    TextStyle::from((FONT, 13).into_font())
}

/// `text` cut to at most `chars` characters and `pixels` wide as a series label on `area`.
pub fn fit_label<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    chars: usize,
    pixels: u32,
) -> String {
    clip(text, chars, |t| fits(area, t, &label_style(), pixels))
}

/// Draws the white background, the title and the subtitle; returns the area below the top
/// `band` pixels.
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
    let total: i32 = widths.iter().map(|w| glyph_w + 6 + w).sum::<i32>()
        + gap * (entries.len() as i32 - 1).max(0);
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

/// A line chart's panel: x and y over `f64` ranges.
pub type Panel<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A [`Panel`] on `area`: `caption` above, room for the axes' labels, x over `x`, y over `y`.
pub fn panel<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    x: Range<f64>,
    y: Range<f64>,
) -> crate::Result<Panel<'a, DB>> {
    ChartBuilder::on(area)
        .caption(caption, (FONT, 18))
        .margin(14)
        .margin_right(28)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)
        .map_err(draw_err)
}

/// A panel's mesh with its axes' descriptions and the look all panels share (the caller adds
/// the rest and draws it).
pub fn mesh<'a, 'b, DB: DrawingBackend>(
    chart: &'b mut Panel<'a, DB>,
    x_desc: &str,
    y_desc: &str,
) -> MeshStyle<'a, 'b, RangedCoordf64, RangedCoordf64, DB> {
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc)
        .y_desc(y_desc)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .light_line_style(LIGHT_LINE);
    mesh
}

/// Draws `points` as a line of `style`, dashed (`on`, `off` pixels) if `dash` says so; returns
/// its series, to label.
pub fn line<'a, 'c, DB: DrawingBackend + 'a>(
    chart: &'c mut Panel<'a, DB>,
    points: &[(f64, f64)],
    style: ShapeStyle,
    dash: Option<(u32, u32)>,
) -> crate::Result<&'c mut SeriesAnno<'a, DB>> {
    let points = points.iter().copied();
    match dash {
        Some((on, off)) => chart.draw_series(DashedLineSeries::new(points, on, off, style)),
        None => chart.draw_series(LineSeries::new(points, style)),
    }
    .map_err(draw_err)
}

/// A series legend's glyph: a solid line in `color`, 20 pixels long.
pub fn solid_glyph(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
}

/// Draws the series' legend box of `chart` at `position`.
pub fn series_legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Panel<'a, DB>,
    position: SeriesLabelPosition,
) -> crate::Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(label_style())
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .draw()
        .map_err(draw_err)
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
