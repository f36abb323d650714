//! Writes training curves (loss and accuracy against epoch) as a two-panel PNG chart.
//!
//! All text is drawn with DejaVu Sans embedded in the binary, so no system fonts are needed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, register_font};

/// Width of the written image, in pixels.
pub const PLOT_WIDTH: u32 = 1200;
/// Height of the written image, in pixels.
pub const PLOT_HEIGHT: u32 = 500;

/// The name the embedded DejaVu Sans is registered under with plotters by [`register_fonts`];
/// use it as the font family of every text style.
pub const FONT: &str = "kiln-dejavu-sans";

/// Values of larger magnitude are skipped like non-finite ones (plotters' tick search
/// never ends on ranges whose width overflows).
pub const MAX_MAGNITUDE: f64 = 1e100;

/// Titles and legend labels longer than this many characters or pixels are cut short (with an
/// ellipsis) so they stay in the image.
const MAX_TITLE_CHARS: usize = 120;
const MAX_TITLE_PIXELS: u32 = PLOT_WIDTH - 40;
const MAX_LABEL_CHARS: usize = 60;
const MAX_LABEL_PIXELS: u32 = 300;

/// Series with at most this many points are drawn with a marker on each point.
const MARKER_MAX_POINTS: usize = 60;

/// One named curve; `x` is the epoch (fractional for per-step values), `y` the value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// What to draw: a title, the loss curves (left panel) and the metric curves (right panel:
/// accuracy, an error such as MAE for regression, or any metric the run reports).
#[derive(Debug, Clone, Copy)]
pub struct PlotSpec<'a> {
    pub title: &'a str,
    pub loss: &'a [Series],
    pub accuracy: &'a [Series],
    /// The name of the right panel's metric (`accuracy`, a fraction in [0, 1]; any other is
    /// scaled to its values).
    pub metric: &'a str,
}

/// What can go wrong while writing a plot; every variant names the file at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// The embedded font could not be loaded.
    #[error("plot {}: the embedded font could not be loaded", path.display())]
    Font { path: PathBuf },
    /// Drawing the chart into memory failed.
    #[error("plot {}: drawing failed: {message}", path.display())]
    Draw { path: PathBuf, message: String },
    /// Encoding the image as PNG failed.
    #[error("plot {}: PNG encoding failed: {message}", path.display())]
    Encode { path: PathBuf, message: String },
    /// The file could not be written.
    #[error("plot {}: cannot write file: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Draws `spec` as a two-panel chart (loss left, accuracy right) and writes it to `path` as a PNG.
///
/// Non-finite points are skipped; empty series, single-point series and an entirely empty spec
/// are drawn as far as they go (an empty spec still yields a valid PNG with the title).
pub fn write_training_plot(path: &Path, spec: &PlotSpec<'_>) -> Result<(), PlotError> {
    if !register_fonts() {
        return Err(PlotError::Font {
            path: path.to_owned(),
        });
    }
    let mut rgb = vec![255u8; PLOT_WIDTH as usize * PLOT_HEIGHT as usize * 3];
    render(&mut rgb, spec).map_err(|message| PlotError::Draw {
        path: path.to_owned(),
        message,
    })?;
    let png = encode_png(&rgb, PLOT_WIDTH, PLOT_HEIGHT).map_err(|e| PlotError::Encode {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    std::fs::write(path, png).map_err(|source| PlotError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Registers the embedded DejaVu Sans (regular and bold) with plotters under [`FONT`], once per
/// process; false if it failed. Call it before drawing any text with [`FONT`].
pub fn register_fonts() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).is_ok()
    })
}

pub fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(out)
}

/// Draws the whole chart into an RGB buffer of `PLOT_WIDTH` x `PLOT_HEIGHT`.
fn render(rgb: &mut [u8], spec: &PlotSpec<'_>) -> Result<(), String> {
    let root = BitMapBackend::with_buffer(rgb, (PLOT_WIDTH, PLOT_HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let title_style = TextStyle::from((FONT, 24, FontStyle::Bold).into_font())
        .pos(Pos::new(HPos::Center, VPos::Top));
    root.draw_text(
        &clip(spec.title, MAX_TITLE_CHARS, |t| {
            fits(&root, t, &title_style, MAX_TITLE_PIXELS)
        }),
        &title_style,
        (PLOT_WIDTH as i32 / 2, 10),
    )
    .map_err(|e| e.to_string())?;
    let body = root.margin(44, 0, 0, 0);
    let (left, right) = body.split_horizontally(PLOT_WIDTH / 2);
    draw_panel(&left, "loss", spec.loss, Panel::Loss)?;
    match spec.metric {
        "accuracy" => draw_panel(&right, "accuracy", spec.accuracy, Panel::Accuracy)?,
        other => draw_panel(&right, &label(other), spec.accuracy, Panel::Loss)?,
    }
    root.present().map_err(|e| e.to_string())
}

/// A metric's name as a panel shows it (`mae` as MAE).
pub fn label(metric: &str) -> String {
    match metric {
        "mae" | "rmse" => metric.to_uppercase(),
        other => other.to_owned(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Panel {
    Loss,
    Accuracy,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    name: &str,
    series: &[Series],
    panel: Panel,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("{name} panel: {e}");
    // Only usable (finite, not absurdly large) points are ever drawn.
    let curves: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .copied()
                .filter(|&(x, y)| usable(x) && usable(y))
                .collect();
            (s.label.as_str(), pts)
        })
        .collect();
    let all = || curves.iter().flat_map(|(_, p)| p.iter().copied());
    let (x_lo, x_hi) = span(all().map(|p| p.0), Some(0.0), 1.0);
    let (y_lo, y_hi) = match panel {
        Panel::Loss => {
            let (lo, hi) = span(all().map(|p| p.1), None, 1.0);
            let pad = (hi - lo) * 0.05;
            (lo - pad, hi + pad)
        }
        // Accuracy is a fraction; widen only if values stray outside [0, 1].
        Panel::Accuracy => {
            let (lo, hi) = span(all().map(|p| p.1), Some(0.0), 1.0);
            (lo.min(0.0), hi.max(1.0))
        }
    };

    let label_style = TextStyle::from((FONT, 14).into_font());
    let mut chart = ChartBuilder::on(area)
        .caption(name, (FONT, 18))
        .margin(12)
        .margin_right(28)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc(name)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .x_labels(10)
        .y_labels(8)
        .x_label_formatter(&|v| tick_label(*v, x_hi - x_lo))
        .y_label_formatter(&|v| tick_label(*v, y_hi - y_lo))
        .draw()
        .map_err(err)?;

    let mut any_label = false;
    let mut any_points = false;
    for (i, (label, pts)) in curves.iter().enumerate() {
        if pts.is_empty() {
            continue;
        }
        any_points = true;
        let color = COLORS[i % COLORS.len()];
        let markers = pts.len() <= MARKER_MAX_POINTS;
        let line = chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?;
        if !label.is_empty() {
            any_label = true;
            let fitted = clip(label, MAX_LABEL_CHARS, |t| {
                fits(area, t, &label_style, MAX_LABEL_PIXELS)
            });
            line.label(fitted).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        if markers {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(err)?;
        }
    }
    if any_label {
        chart
            .configure_series_labels()
            .position(match panel {
                Panel::Loss => SeriesLabelPosition::UpperRight,
                Panel::Accuracy => SeriesLabelPosition::LowerRight,
            })
            .label_font(label_style.clone())
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(err)?;
    }
    if !any_points {
        let (w, h) = area.dim_in_pixel();
        let style = TextStyle::from((FONT, 16).into_font())
            .color(&RGBColor(120, 120, 120))
            .pos(Pos::new(HPos::Center, VPos::Center));
        area.draw_text("no data", &style, (w as i32 / 2, h as i32 / 2))
            .map_err(err)?;
    }
    Ok(())
}

/// `text`, cut short (ending in an ellipsis) to at most `max_chars` characters and until
/// `fits` accepts it.
pub fn clip(text: &str, max_chars: usize, fits: impl Fn(&str) -> bool) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max_chars && fits(text) {
        return text.to_owned();
    }
    let mut keep = max_chars.min(chars.len()).saturating_sub(1);
    loop {
        let mut out: String = chars[..keep].iter().collect();
        out.push('…');
        if keep == 0 || fits(&out) {
            return out;
        }
        keep -= 1;
    }
}

/// Whether `text` drawn in `style` is at most `max_px` wide (true if it cannot be measured).
pub fn fits<DB: DrawingBackend, CT: CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    text: &str,
    style: &TextStyle<'_>,
    max_px: u32,
) -> bool {
    area.estimate_text_size(text, style)
        .map_or(true, |(w, _)| w <= max_px)
}

/// Whether a coordinate can be drawn: finite and at most `MAX_MAGNITUDE`.
pub fn usable(v: f64) -> bool {
    v.is_finite() && v.abs() <= MAX_MAGNITUDE
}

/// The range covered by `values` (all `usable`), widened to include `anchor` if given, and
/// never narrower than plotters can put ticks on: no values give
/// `anchor..anchor + default_width` (anchor 0 if none); a too narrow range is widened upward
/// from the anchor if there is one, else symmetrically about its middle.
fn span(values: impl Iterator<Item = f64>, anchor: Option<f64>, default_width: f64) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let base = anchor.unwrap_or(0.0);
    if !lo.is_finite() || !hi.is_finite() {
        return (base, base + default_width);
    }
    let (lo, hi) = match anchor {
        Some(a) => (lo.min(a), hi.max(a)),
        None => (lo, hi),
    };
    let min_width = (lo.abs().max(hi.abs()) * 1e-9).max(1e-100);
    if hi - lo >= min_width {
        return (lo, hi);
    }
    if anchor.is_some() {
        return (lo, lo + default_width.max(min_width));
    }
    let mid = lo / 2.0 + hi / 2.0;
    let half = if mid.abs() * 0.1 >= 1e-100 {
        mid.abs() * 0.1
    } else {
        default_width / 2.0
    };
    (mid - half, mid + half)
}

/// Formats a tick value of an axis spanning `range`: enough decimals for the tick spacing,
/// trailing zeros trimmed, no `-0`, scientific notation for very large or small magnitudes.
pub fn tick_label(v: f64, range: f64) -> String {
    let mag = v.abs();
    if mag != 0.0 && !(1e-4..1e6).contains(&mag) && mag > range * 1e-9 {
        return format!("{v:.2e}");
    }
    let decimals = if range > 0.0 && range.is_finite() {
        (2.0 - range.log10().floor()).clamp(0.0, 9.0) as usize
    } else {
        2
    };
    let text = format!("{v:.decimals$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        text.as_str()
    };
    if text.trim_start_matches('-').chars().all(|c| c == '0') {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(label: &str, points: Vec<(f64, f64)>) -> Series {
        Series {
            label: label.to_owned(),
            points,
        }
    }

    /// A typical run: dense per-step train loss, per-epoch val loss and accuracies.
    fn typical() -> (Vec<Series>, Vec<Series>) {
        let steps = 400;
        let train_loss = (0..steps)
            .map(|i| {
                let x = f64::from(i) / 40.0;
                let noise = (f64::from(i) * 12.9898).sin() * 0.08;
                (x, 2.3 * (-x / 3.0).exp() + 0.2 + noise)
            })
            .collect();
        let val_loss = (1..=10)
            .map(|e| (f64::from(e), 2.3 * (-f64::from(e) / 3.0).exp() + 0.3))
            .collect();
        let train_acc = (1..=10)
            .map(|e| (f64::from(e), 1.0 - 0.9 * (-f64::from(e) / 2.5).exp()))
            .collect();
        let val_acc = (1..=10)
            .map(|e| (f64::from(e), 0.95 - 0.85 * (-f64::from(e) / 2.5).exp()))
            .collect();
        (
            vec![
                series("train loss", train_loss),
                series("val loss", val_loss),
            ],
            vec![series("train acc", train_acc), series("val acc", val_acc)],
        )
    }

    /// Writes the plot into a fresh temp dir and returns (dir guard, file bytes).
    fn write(spec: &PlotSpec<'_>) -> (tempfile::TempDir, Vec<u8>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plot.png");
        write_training_plot(&path, spec).expect("plot written");
        let bytes = std::fs::read(&path).expect("read back");
        (dir, bytes)
    }

    /// Also writes `spec` to `$PLOT_SAMPLE_DIR/<name>.png` when that variable is set, for eyeballing.
    fn sample(name: &str, spec: &PlotSpec<'_>) {
        if let Ok(dir) = std::env::var("PLOT_SAMPLE_DIR") {
            let path = Path::new(&dir).join(format!("{name}.png"));
            write_training_plot(&path, spec).expect("sample written");
        }
    }

    /// Decodes a PNG, returning (width, height, pixel bytes).
    fn decode(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "PNG signature");
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .expect("PNG header");
        let mut buf = vec![0; reader.output_buffer_size().expect("buffer size")];
        let info = reader.next_frame(&mut buf).expect("PNG frame");
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    #[test]
    fn writes_png_of_expected_size() {
        let (loss, accuracy) = typical();
        let spec = PlotSpec {
            title: "run 42: resnet18 on cifar10",
            loss: &loss,
            accuracy: &accuracy,
            metric: "accuracy",
        };
        let (_dir, bytes) = write(&spec);
        let (w, h, pixels) = decode(&bytes);
        assert_eq!((w, h), (PLOT_WIDTH, PLOT_HEIGHT));
        // Something besides the white background was drawn.
        assert!(pixels.iter().any(|&b| b < 128));
        sample("typical", &spec);
    }

    #[test]
    fn title_text_really_renders() {
        let (loss, accuracy) = typical();
        let a = PlotSpec {
            title: "first title",
            loss: &loss,
            accuracy: &accuracy,
            metric: "accuracy",
        };
        let b = PlotSpec {
            title: "a rather different title",
            ..a
        };
        let (_da, bytes_a) = write(&a);
        let (_db, bytes_b) = write(&b);
        let (_, _, pa) = decode(&bytes_a);
        let (_, _, pb) = decode(&bytes_b);
        let row = PLOT_WIDTH as usize * 3;
        // The title band (top 44 rows) differs, and it is not blank.
        assert_ne!(pa[..44 * row], pb[..44 * row]);
        assert!(pa[..44 * row].iter().any(|&v| v < 100));
        // Below the title band the two charts are identical.
        assert_eq!(pa[44 * row..], pb[44 * row..]);
        // Without a title the band is blank.
        let c = PlotSpec { title: "", ..a };
        let (_dc, bytes_c) = write(&c);
        let (_, _, pc) = decode(&bytes_c);
        assert!(pc[..44 * row].iter().all(|&v| v == 255));
    }

    #[test]
    fn empty_input_still_writes_a_valid_png() {
        let spec = PlotSpec {
            title: "nothing yet",
            loss: &[],
            accuracy: &[],
            metric: "accuracy",
        };
        let (_dir, bytes) = write(&spec);
        assert_eq!(decode(&bytes).0, PLOT_WIDTH);
        sample("empty", &spec);

        let empty = [series("train loss", vec![]), series("", vec![])];
        let spec = PlotSpec {
            title: "empty series",
            loss: &empty,
            accuracy: &empty,
            metric: "accuracy",
        };
        let (_dir, bytes) = write(&spec);
        assert_eq!(decode(&bytes).1, PLOT_HEIGHT);
    }

    #[test]
    fn single_point_series_is_drawn() {
        let loss = [series("val loss", vec![(1.0, 0.7)])];
        let accuracy = [series("val acc", vec![(0.0, 0.5)])];
        let spec = PlotSpec {
            title: "one epoch",
            loss: &loss,
            accuracy: &accuracy,
            metric: "accuracy",
        };
        sample("single", &spec);
        let (_dir, bytes) = write(&spec);
        assert_eq!(decode(&bytes).0, PLOT_WIDTH);
    }

    #[test]
    fn non_finite_values_are_skipped() {
        let loss = [
            series(
                "train loss",
                vec![
                    (0.0, f64::NAN),
                    (0.5, 2.0),
                    (1.0, f64::INFINITY),
                    (1.5, 1.0),
                    (f64::NAN, 0.5),
                    (2.0, f64::NEG_INFINITY),
                ],
            ),
            series("all nan", vec![(1.0, f64::NAN), (2.0, f64::NAN)]),
        ];
        let accuracy = [series("acc", vec![(1.0, f64::NAN)])];
        let spec = PlotSpec {
            title: "diverged",
            loss: &loss,
            accuracy: &accuracy,
            metric: "accuracy",
        };
        sample("nonfinite", &spec);
        let (_dir, bytes) = write(&spec);
        assert_eq!(decode(&bytes).1, PLOT_HEIGHT);
    }

    #[test]
    fn constant_and_out_of_range_values_are_drawn() {
        let loss = [series("flat", vec![(0.0, 0.0), (1.0, 0.0), (2.0, 0.0)])];
        let accuracy = [series("odd", vec![(3.0, 3.0), (3.0, -1.0)])];
        let spec = PlotSpec {
            title: "edge cases",
            loss: &loss,
            accuracy: &accuracy,
            metric: "accuracy",
        };
        sample("edge", &spec);
        let (_dir, bytes) = write(&spec);
        assert_eq!(decode(&bytes).0, PLOT_WIDTH);
    }

    #[test]
    fn extreme_values_do_not_panic() {
        let loss = [
            series("huge", vec![(0.0, f64::MAX), (1.0, -f64::MAX), (2.0, 1.0)]),
            series("tiny", vec![(1e300, 1e-300), (-1e300, 2e-300)]),
        ];
        let accuracy = [series(
            "acc",
            vec![(0.0, f64::MIN_POSITIVE), (f64::MAX, 1.0)],
        )];
        let spec = PlotSpec {
            title: "extreme",
            loss: &loss,
            accuracy: &accuracy,
            metric: "accuracy",
        };
        sample("extreme", &spec);
        let (_dir, bytes) = write(&spec);
        assert_eq!(decode(&bytes).0, PLOT_WIDTH);
    }

    #[test]
    fn awkward_ranges_terminate() {
        let pairs = [
            (1e100, -1e100),
            (1e10, 1e10 + 1e-5),
            (5e-324, 1e-320),
            (-1e-300, 1e-300),
            (123_456_789.0, 123_456_789.000_000_1),
            (-3.0, -3.0),
            (0.1, 0.1 + f64::EPSILON),
        ];
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plot.png");
        for (a, b) in pairs {
            let loss = [series("l", vec![(a, a), (b, b)])];
            let accuracy = [series("a", vec![(a, b), (b, a)])];
            let spec = PlotSpec {
                title: "awkward",
                loss: &loss,
                accuracy: &accuracy,
                metric: "accuracy",
            };
            write_training_plot(&path, &spec).expect("plot written");
        }
    }

    #[test]
    fn long_and_unusual_text_is_fine() {
        let long = "xW".repeat(250);
        let loss = [series(&long, vec![(0.0, 1.0), (1.0, 0.5)])];
        let accuracy = [series("accuracy ✓ ü 日本 🚀", vec![(0.0, 0.1), (1.0, 0.9)])];
        let spec = PlotSpec {
            title: &format!("ünïcödé ✓ 日本語 🚀 {long}"),
            loss: &loss,
            accuracy: &accuracy,
            metric: "accuracy",
        };
        sample("text", &spec);
        let (_dir, bytes) = write(&spec);
        assert_eq!(decode(&bytes).0, PLOT_WIDTH);
    }

    #[test]
    fn unwritable_path_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("no-such-dir").join("plot.png");
        let spec = PlotSpec {
            title: "t",
            loss: &[],
            accuracy: &[],
            metric: "accuracy",
        };
        let err = write_training_plot(&path, &spec).expect_err("must fail");
        assert!(matches!(err, PlotError::Write { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }

    #[test]
    fn long_text_is_clipped() {
        let any = |_: &str| true;
        assert_eq!(clip("short", 10, any), "short");
        assert_eq!(clip("abcdefghij", 10, any), "abcdefghij");
        assert_eq!(clip("abcdefghijk", 10, any), "abcdefghi…");
        assert_eq!(clip("日本語日本語", 3, any), "日本…");
        assert_eq!(clip("abcdefghij", 10, |t| t.len() <= 7), "abcd…");
        assert_eq!(clip("abc", 10, |_| false), "…");
    }

    #[test]
    fn tick_labels_are_tidy() {
        assert_eq!(tick_label(2.0, 10.0), "2");
        assert_eq!(tick_label(0.25, 1.0), "0.25");
        assert_eq!(tick_label(0.5, 2.0), "0.5");
        assert_eq!(tick_label(-1e-17, 1.0), "0");
        assert_eq!(tick_label(0.64, 0.14), "0.64");
        assert_eq!(tick_label(2.5e7, 1e8), "2.50e7");
        assert_eq!(tick_label(0.0, 0.0), "0");
    }

    #[test]
    fn span_is_never_empty() {
        assert_eq!(span(std::iter::empty(), None, 1.0), (0.0, 1.0));
        assert_eq!(span([2.0].into_iter(), Some(0.0), 1.0), (0.0, 2.0));
        let (lo, hi) = span([5.0, 5.0].into_iter(), None, 1.0);
        assert!(lo < 5.0 && hi > 5.0);
        assert_eq!(span(std::iter::empty(), Some(0.0), 1.0), (0.0, 1.0));
        assert_eq!(span([0.0].into_iter(), Some(0.0), 1.0), (0.0, 1.0));
        assert_eq!(span([1e-200, 2e-200].into_iter(), None, 1.0), (-0.5, 0.5));
        let (lo, hi) = span([1e50, 1e50 + 1e35].into_iter(), None, 1.0);
        assert!(lo < 1e50 && hi > 1e50 && (hi - lo) >= 1e40);
        let (lo, hi) = span([0.0].into_iter(), None, 1.0);
        assert!(lo < 0.0 && hi > 0.0);
    }
}
