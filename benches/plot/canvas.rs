//! What every chart shares: the canvas (size, colours, font), writing a chart as PNG and SVG,
//! the title band, the one-line legend, and the panels of the line charts (axes, mesh and
//! series legend).

use std::ops::Range;
use std::path::{Path, PathBuf};

use kiln_train::plot::{FONT, clip, encode_png, fits};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Width of every chart, in pixels.
pub const WIDTH: u32 = 1200;
/// Height of the title, subtitle and legend band of a ratio chart.
pub const HEADER: u32 = 96;
/// Height of the title and subtitle band of the sweep chart.
pub const SWEEP_HEADER: u32 = 70;
/// Height of one bar's row in a ratio chart.
pub const ROW_HEIGHT: u32 = 36;
/// Height of one row of panels in the sweep chart.
pub const PANEL_HEIGHT: u32 = 480;

/// Bar labels take at most this share of the chart's width; longer ones are cut short.
pub const MAX_LABEL_SHARE: f64 = 0.45;
pub const MAX_TITLE_PIXELS: u32 = WIDTH - 40;

/// The font family the SVGs ask for in place of the name the font is registered under.
pub const SVG_FONT_FAMILY: &str = "DejaVu Sans, sans-serif";

pub const MET: RGBColor = RGBColor(44, 160, 44);
pub const MISSED: RGBColor = RGBColor(214, 39, 40);
pub const NO_GOAL: RGBColor = RGBColor(140, 150, 165);
pub const INK: RGBColor = RGBColor(30, 30, 30);
pub const FAINT: RGBColor = RGBColor(110, 110, 110);

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
    let height = chart.height();
    let png_path = dir.join(format!("{stem}.png"));
    let mut rgb = vec![255u8; WIDTH as usize * height as usize * 3];
    render(
        chart,
        BitMapBackend::with_buffer(&mut rgb, (WIDTH, height)),
        &png_path,
    )?;
    let png = encode_png(&rgb, WIDTH, height)
        .map_err(|e| format!("plot {}: PNG encoding failed: {e}", png_path.display()))?;
    write_file(&png_path, &png)?;
    written.push(png_path);

    let svg_path = dir.join(format!("{stem}.svg"));
    let mut svg = String::new();
    render(
        chart,
        SVGBackend::with_string(&mut svg, (WIDTH, height)),
        &svg_path,
    )?;
    let svg = svg.replace(
        &format!("font-family=\"{FONT}\""),
        &format!("font-family=\"{SVG_FONT_FAMILY}\""),
    );
    write_file(&svg_path, svg.as_bytes())?;
    written.push(svg_path);
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

pub fn draw_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    e.to_string()
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
pub enum Glyph {
    Swatch(RGBColor),
    Tick,
    /// A vertical dashed line.
    Dashed,
}

/// Draws a one-line legend centred at height `y` of `root`.
pub fn legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    y: i32,
    entries: &[(Glyph, String)],
) -> crate::Result<()> {
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

/// A line chart's panel on `area`: `caption` above, room for the axes' labels, x over
/// `x` and y over `y`.
pub type Panel<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Builds a [`Panel`] (the layout every line chart uses).
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

/// Draws the series' legend box of `chart` at `position`.
pub fn series_legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Panel<'a, DB>,
    position: SeriesLabelPosition,
    label_style: TextStyle<'a>,
) -> crate::Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(label_style)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .draw()
        .map_err(draw_err)
}

/// A value in about three significant digits.
pub fn short(v: f64) -> String {
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
