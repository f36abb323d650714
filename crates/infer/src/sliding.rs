//! Sliding-window inference: a model run over windows of an input `[C, *spatial]` larger than
//! it takes (2-D or 3-D), in batches of windows, the outputs of overlapping windows blended with
//! a constant or Gaussian weight and normalised by the summed weights — as MONAI's
//! `sliding_window_inference` (1.6) places, pads, weighs and stitches them.
//!
//! Where an input is smaller than the window in a dimension it is padded (half before, the odd
//! voxel after) and the output cropped back. Windows step by `int(roi · (1 − overlap))` (at
//! least 1; the whole window where it equals the input), the last one moved back to end at the
//! edge; they are enumerated with the last dimension varying fastest.

use kiln_config::{BlendMode, PadMode, SlidingWindowPlan};
use kiln_torch_ext::blend::{Rows, blend_windows};
use tch::{Device, Kind, Tensor};

use crate::InferError;

/// The key named in errors about the window's size.
const ROI_KEY: &str = "infer.sliding_window.roi";

/// Where the windows lie over an input's spatial extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowGrid {
    /// The input's spatial size.
    pub image: Vec<i64>,
    /// The window's spatial size (the input's own where the setting is 0 or less).
    pub roi: Vec<i64>,
    /// Padding before and after, per dimension, where the window is larger than the input.
    pub pad: Vec<(i64, i64)>,
    /// Each dimension's window starts, in the padded input.
    pub starts: Vec<Vec<i64>>,
}

impl WindowGrid {
    /// The windows of size `roi` (one size for every dimension, or one per dimension) over an
    /// input of spatial size `image`, overlapping by `overlap`.
    pub fn new(image: &[i64], roi: &[i64], overlap: f64) -> Result<Self, InferError> {
        if !(0.0..1.0).contains(&overlap) {
            return Err(InferError::Input(format!(
                "infer.sliding_window.overlap = {overlap}: it must be in [0, 1)"
            )));
        }
        let roi: Vec<i64> = match roi {
            [one] => vec![*one; image.len()],
            many if many.len() == image.len() => many.to_vec(),
            many => {
                return Err(InferError::Input(format!(
                    "{ROI_KEY} = {many:?} has {} sizes; the input has {} spatial dimensions \
                     {image:?} (give one size per dimension, or one for all)",
                    many.len(),
                    image.len()
                )));
            }
        };
        let roi: Vec<i64> = roi
            .iter()
            .zip(image)
            .map(|(&r, &i)| if r > 0 { r } else { i })
            .collect();
        let pad: Vec<(i64, i64)> = roi
            .iter()
            .zip(image)
            .map(|(&r, &i)| {
                let diff = (r - i).max(0);
                (diff / 2, diff - diff / 2)
            })
            .collect();
        let starts = roi
            .iter()
            .zip(image)
            .map(|(&r, &i)| starts(i.max(r), r, overlap))
            .collect();
        Ok(Self {
            image: image.to_vec(),
            roi,
            pad,
            starts,
        })
    }

    /// The input's size once padded.
    pub fn padded(&self) -> Vec<i64> {
        self.image
            .iter()
            .zip(&self.pad)
            .map(|(&i, &(lo, hi))| i + lo + hi)
            .collect()
    }

    /// How many windows there are.
    pub fn len(&self) -> usize {
        self.starts.iter().map(Vec::len).product()
    }

    /// Whether there are none (never: every grid has at least one window).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Window `k`'s start in each dimension of the padded input (the last dimension varies
    /// fastest).
    pub fn window(&self, mut k: usize) -> Vec<i64> {
        let mut at = vec![0; self.starts.len()];
        for (d, starts) in self.starts.iter().enumerate().rev() {
            at[d] = starts[k % starts.len()];
            k /= starts.len();
        }
        at
    }
}

/// One dimension's window starts: windows of `roi` over `size` (at least `roi`), stepping by
/// the scan interval, the last moved back to end at the edge.
fn starts(size: i64, roi: i64, overlap: f64) -> Vec<i64> {
    if size == roi {
        return vec![0];
    }
    // As Python computes `int(roi * (1 - overlap))`: in f64, truncated.
    let step = ((roi as f64 * (1.0 - overlap)) as i64).max(1);
    let count = (size - roi + step - 1) / step + 1;
    (0..count).map(|k| (k * step).min(size - roi)).collect()
}

/// The weight of each voxel of a window `[1, 1, *roi]` (f32): 1 everywhere (`constant`), or a
/// Gaussian of standard deviation `sigma_scale · roi` centred on the window (`gaussian`), not
/// renormalised, at least 10⁻³.
pub fn importance_map(
    roi: &[i64],
    mode: BlendMode,
    sigma_scale: f64,
    device: Device,
) -> Result<Tensor, InferError> {
    let mut shape = vec![1, 1];
    shape.extend_from_slice(roi);
    if mode == BlendMode::Constant {
        return Ok(Tensor::f_ones(shape.as_slice(), (Kind::Float, device))?);
    }
    let mut map = Tensor::f_ones([1i64; 2].as_slice(), (Kind::Float, device))?;
    for (d, &size) in roi.iter().enumerate() {
        let sigma = size as f64 * sigma_scale;
        let centre = (size as f64 - 1.0) / 2.0;
        let weights: Vec<f32> = (0..size)
            .map(|k| {
                let x = k as f64 - centre;
                (x * x / (-2.0 * sigma * sigma)).exp() as f32
            })
            .collect();
        let mut axis = vec![1i64; 2 + roi.len()];
        axis[2 + d] = size;
        let g = Tensor::f_from_slice(&weights)?
            .f_to_device(device)?
            .f_view(axis.as_slice())?;
        map = map.f_mul(&g)?;
    }
    Ok(map.f_clamp_min(1e-3)?)
}

/// What [`run`] needs besides the input and the model.
#[derive(Debug, Clone)]
pub struct SlidingWindow {
    pub roi: Vec<i64>,
    pub overlap: f64,
    pub mode: BlendMode,
    pub sigma_scale: f64,
    /// Windows per forward pass.
    pub batch_size: usize,
    pub padding_mode: PadMode,
    /// The fill of constant padding.
    pub cval: f64,
    /// Windows reach the model channels-last (`performance.channels_last`; 2-D and 3-D).
    pub channels_last: bool,
    /// How the layout is chosen: as `channels_last` says, or measured.
    pub layout: Layout,
}

/// How the windows' layout (and the model's weights') is chosen.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Layout {
    /// As `channels_last` says (the user set `performance.channels_last`).
    #[default]
    AsSet,
    /// Both layouts timed on a batch of the trial window's size, the faster kept
    /// ([`crate::volume::infer_volume`]); the answer cached in kiln's cache directory `dir`
    /// under the model's identity `model` (with the window, batch, hardware and versions),
    /// where given.
    Measured { cache: Option<LayoutCache> },
}

/// Where a measured layout is kept: kiln's cache directory, and what identifies the model (its
/// file's or weights' digest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutCache {
    pub dir: std::path::PathBuf,
    pub model: String,
}

impl SlidingWindow {
    /// The settings of `infer.sliding_window`, with windows channels-last where asked.
    pub fn from_plan(plan: &SlidingWindowPlan, channels_last: bool) -> Self {
        Self {
            roi: plan.roi.clone(),
            overlap: plan.overlap,
            mode: plan.mode,
            sigma_scale: plan.sigma_scale,
            batch_size: usize::try_from(plan.batch_size)
                .unwrap_or(usize::MAX)
                .max(1),
            padding_mode: plan.padding_mode,
            cval: plan.cval,
            channels_last,
            layout: Layout::AsSet,
        }
    }
}

/// `input` `[C, *spatial]` through `predict` window by window (batches `[n, C, *roi]` on the
/// model's device, outputs `[n, K, *out]`), stitched on `output_device` into `[K, *spatial']`,
/// where `spatial'` is `spatial` scaled as the outputs are to the window ([`Zoom`]; the same
/// where the model keeps the window's size). On a GPU the next batch is gathered on a thread of
/// its own while the model runs the current one.
pub fn run(
    input: &Tensor,
    settings: &SlidingWindow,
    model_device: Device,
    output_device: Device,
    predict: &mut dyn FnMut(&Tensor) -> Result<Tensor, InferError>,
) -> Result<Tensor, InferError> {
    let _guard = tch::no_grad_guard();
    let size = input.size();
    let spatial = size.get(1..).unwrap_or(&[]).to_vec();
    if spatial.is_empty() {
        return Err(InferError::Input(format!(
            "a sliding window needs an input [channels, *spatial]; it is {size:?}"
        )));
    }
    let grid = WindowGrid::new(&spatial, &settings.roi, settings.overlap)?;
    check_padding(&grid, settings)?;
    let padded = pad(&input.f_unsqueeze(0)?, &grid, settings)?;
    let windows: Vec<Vec<i64>> = (0..grid.len()).map(|k| grid.window(k)).collect();
    let batches: Vec<&[Vec<i64>]> = windows.chunks(settings.batch_size).collect();
    let mut stitched: Option<Stitch> = None;
    // Ahead on a thread where the model runs on a GPU; on the CPU the thread would take cores
    // from the model's forward (measured: slower in all and outside the forward).
    let ahead = model_device.is_cuda();
    let source = Source {
        padded,
        roi: &grid.roi,
        channels_last: settings.channels_last,
        device: model_device,
    };
    gather_batches(&source, &batches, ahead, |k, windows_in| {
        let out = predict(&windows_in)?;
        // The first batch's outputs tell their channels and size: the buffers are made then.
        let mut stitch = match stitched.take() {
            Some(stitch) => stitch,
            None => Stitch::new(&grid, &out, settings, output_device)?,
        };
        stitch.add(&out, batches[k])?;
        stitched = Some(stitch);
        Ok(())
    })?;
    let stitch = stitched.ok_or_else(|| InferError::Input("no window".to_owned()))?;
    stitch.finish(&grid)
}

/// Where windows are cut from: the padded input `[1, C, *padded]` (a shallow copy, so that a
/// gathering thread can own one), the window's size, and how and where the model takes them.
struct Source<'a> {
    padded: Tensor,
    roi: &'a [i64],
    channels_last: bool,
    device: Device,
}

impl Source<'_> {
    /// The windows at `batch`'s starts, cut and stacked `[n, C, *roi]` on the model's device.
    fn gather(&self, batch: &[Vec<i64>]) -> Result<Tensor, InferError> {
        let parts: Vec<Tensor> = batch
            .iter()
            .map(|at| crop(&self.padded, at, self.roi))
            .collect::<Result<_, _>>()?;
        let windows = Tensor::f_cat(&parts, 0)?.f_to_device(self.device)?;
        Ok(match self.channels_last {
            true => kiln_torch_ext::layout::to_channels_last(&windows)?,
            false => windows,
        })
    }

    /// Another handle on the same input and settings.
    fn share(&self) -> Self {
        Source {
            padded: self.padded.shallow_clone(),
            ..*self
        }
    }
}

/// Each batch of `batches` gathered from `source` and given to `each` with its index, in
/// order; with `ahead`, batch k + 1 is gathered by a thread of its own while `each` runs batch
/// k. The first error ends it.
fn gather_batches(
    source: &Source<'_>,
    batches: &[&[Vec<i64>]],
    ahead: bool,
    mut each: impl FnMut(usize, Tensor) -> Result<(), InferError>,
) -> Result<(), InferError> {
    if !ahead {
        return (0..batches.len()).try_for_each(|k| each(k, source.gather(batches[k])?));
    }
    let gatherer = source.share();
    let (send, receive) = crossbeam::channel::bounded::<Result<Tensor, InferError>>(1);
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let _guard = tch::no_grad_guard();
            for batch in batches {
                let gathered = gatherer.gather(batch);
                let failed = gathered.is_err();
                // The receiver is gone when the consumer stopped early: nothing more to do.
                if send.send(gathered).is_err() || failed {
                    return;
                }
            }
        });
        let result = (0..batches.len()).try_for_each(|k| {
            let windows_in = receive
                .recv()
                .map_err(|_| InferError::Input("the window gatherer stopped".to_owned()))??;
            each(k, windows_in)
        });
        // Dropping the receiver lets a gatherer still waiting to send finish.
        drop(receive);
        result
    })
}

/// How a model's outputs scale the window: `out[d] / roi[d]` per spatial dimension, a window
/// starting at `s` landing at `int(s · zoom)` in the output (as MONAI places outputs of
/// another size than the window).
#[derive(Debug, Clone, PartialEq)]
pub struct Zoom {
    /// The output's spatial size per window.
    pub out: Vec<i64>,
    /// `out[d] / roi[d]`.
    pub scale: Vec<f64>,
}

impl Zoom {
    /// The zoom of outputs `[n, K, *out]` over `grid`'s windows; an error unless the outputs
    /// have the window's spatial rank and every window lands on exactly `out` voxels.
    pub fn new(grid: &WindowGrid, output: &[i64]) -> Result<Self, InferError> {
        let out = output.get(2..).unwrap_or(&[]).to_vec();
        if out.len() != grid.roi.len() || out.contains(&0) {
            return Err(InferError::Input(format!(
                "the model gave {output:?} for windows of {:?}; a sliding window needs outputs                  [windows, channels, *spatial] with {} spatial dimensions",
                grid.roi,
                grid.roi.len()
            )));
        }
        let scale: Vec<f64> = out
            .iter()
            .zip(&grid.roi)
            .map(|(&o, &r)| o as f64 / r as f64)
            .collect();
        let zoom = Self { out, scale };
        for (d, starts) in grid.starts.iter().enumerate() {
            for &s in starts {
                let (a, b) = (zoom.at(d, s), zoom.at(d, s + grid.roi[d]));
                if b - a != zoom.out[d] {
                    return Err(zoom.uneven(grid, d, s, a, b));
                }
            }
        }
        Ok(zoom)
    }

    /// Position `p` of dimension `d` in the output: `int(p · scale)`, as Python truncates.
    pub fn at(&self, d: usize, p: i64) -> i64 {
        (p as f64 * self.scale[d]) as i64
    }

    /// A spatial extent (one size per dimension) in the output: each `int(size · scale)`.
    pub fn scaled(&self, sizes: &[i64]) -> Vec<i64> {
        sizes
            .iter()
            .enumerate()
            .map(|(d, &n)| self.at(d, n))
            .collect()
    }

    /// The error for a window that lands on `[a, b)`, not `out[d]` voxels.
    fn uneven(&self, grid: &WindowGrid, d: usize, s: i64, a: i64, b: i64) -> InferError {
        InferError::Input(format!(
            "the model's outputs ({:?} for windows of {:?}) scale dimension {d} by {}; the              window starting at {s} would land on [{a}, {b}), not on {} voxels: choose              {ROI_KEY} and infer.sliding_window.overlap so that every window start times the              scale is a whole number",
            self.out, grid.roi, self.scale[d], self.out[d]
        ))
    }
}

/// The running sums of a sliding-window run on the output's device.
struct Stitch {
    /// The weighted outputs `[1, K, *out_padded]`.
    sum: Tensor,
    /// The summed weights `[1, 1, *out_padded]`.
    count: Tensor,
    /// The importance map at the outputs' size `[1, 1, *zoom.out]`.
    weight: Tensor,
    zoom: Zoom,
    /// On the CPU, the windows yet to reach each row of `sum` and `count` (they start
    /// uninitialised, each row zeroed by its first window and divided after its last);
    /// elsewhere none (they start zeroed, and are divided at the end).
    rows: Option<Rows>,
}

impl Stitch {
    /// The buffers for outputs like `first` (the first batch's): zeroed, or on the CPU to be
    /// zeroed and divided row by row as `grid`'s windows reach them.
    fn new(
        grid: &WindowGrid,
        first: &Tensor,
        settings: &SlidingWindow,
        device: Device,
    ) -> Result<Self, InferError> {
        let size = first.size();
        let zoom = Zoom::new(grid, &size)?;
        let map = importance_map(&grid.roi, settings.mode, settings.sigma_scale, device)?;
        let weight = resample(&map, &zoom.out)?.f_contiguous()?;
        let spatial = zoom.scaled(&grid.padded());
        let rows = match device {
            Device::Cpu => {
                let starts: Vec<Vec<i64>> = (0..grid.len())
                    .map(|k| zoom.scaled(&grid.window(k)))
                    .collect();
                Some(Rows::new(&spatial, &zoom.out, &starts)?)
            }
            _ => None,
        };
        let buffer = |channels: i64| {
            let mut shape = vec![1, channels];
            shape.extend(&spatial);
            match rows {
                Some(_) => Tensor::f_empty(shape.as_slice(), (Kind::Float, device)),
                None => Tensor::f_zeros(shape.as_slice(), (Kind::Float, device)),
            }
        };
        Ok(Self {
            sum: buffer(size[1])?,
            count: buffer(1)?,
            weight,
            zoom,
            rows,
        })
    }

    /// The view of `buffer` where the window at `at` lands.
    fn target(&self, buffer: &Tensor, at: &[i64]) -> Result<Tensor, InferError> {
        crop(buffer, &self.zoom.scaled(at), &self.zoom.out)
    }

    /// A batch's outputs `[n, K, *out]`, weighted, added in place where their windows land,
    /// and their weights to the summed weights: on the CPU in one pass over the rows the batch
    /// covers ([`blend_windows`]), elsewhere window by window.
    fn add(&mut self, out: &Tensor, batch: &[Vec<i64>]) -> Result<(), InferError> {
        check_output(out, batch.len(), self.sum.size()[1], &self.zoom.out)?;
        let out = out.f_to_device(self.sum.device())?.f_to_kind(Kind::Float)?;
        match &mut self.rows {
            Some(rows) => {
                let starts: Vec<Vec<i64>> = batch.iter().map(|at| self.zoom.scaled(at)).collect();
                let (sum, count, weight) = (&self.sum, &self.count, &self.weight);
                Ok(blend_windows(sum, count, &out, weight, &starts, rows)?)
            }
            None => self.add_each(&out, batch),
        }
    }

    fn add_each(&self, out: &Tensor, batch: &[Vec<i64>]) -> Result<(), InferError> {
        for (i, at) in batch.iter().enumerate() {
            let window = out.f_narrow(0, i as i64, 1)?;
            let _ = self
                .target(&self.sum, at)?
                .f_addcmul_(&window, &self.weight)?;
            let _ = self.target(&self.count, at)?.f_add_(&self.weight)?;
        }
        Ok(())
    }

    /// The blend `sum / count` `[K, *spatial']`, cropped of any padding as MONAI crops it
    /// (`round(pad · scale)` to `round((pad + size) · scale)`, Python's rounding).
    fn finish(mut self, grid: &WindowGrid) -> Result<Tensor, InferError> {
        match &self.rows {
            Some(rows) => rows.finish_the_rest(&self.sum, &self.count)?,
            None => {
                let _ = self.sum.f_div_(&self.count)?;
            }
        }
        let mut out = self.sum.f_squeeze_dim(0)?;
        if grid.pad.iter().all(|&(lo, hi)| lo == 0 && hi == 0) {
            return Ok(out);
        }
        for (d, (&(lo, _), &n)) in grid.pad.iter().zip(&grid.image).enumerate() {
            let scale = self.zoom.scale[d];
            let len = out.size()[1 + d];
            let from = ((lo as f64 * scale).round_ties_even() as i64).min(len);
            let to = (((lo + n) as f64 * scale).round_ties_even() as i64).clamp(from, len);
            out = out.f_narrow(1 + d as i64, from, to - from)?;
        }
        Ok(out)
    }
}

/// The importance map `[1, 1, *roi]` at the outputs' size `out`, as `F.interpolate` with
/// `nearest-exact` gives it (the map itself where the sizes agree).
fn resample(map: &Tensor, out: &[i64]) -> Result<Tensor, InferError> {
    let roi = &map.size()[2..];
    if roi == out {
        return Ok(map.shallow_clone());
    }
    Ok(match out.len() {
        2 => map.f_internal_upsample_nearest_exact2d(out, None, None)?,
        3 => map.f_internal_upsample_nearest_exact3d(out, None, None, None)?,
        n => {
            return Err(InferError::Input(format!(
                "a sliding window takes 2 or 3 spatial dimensions, not {n}"
            )));
        }
    })
}

/// The view of `t` `[n, c, *spatial]` of the window at `at` of size `roi`.
fn crop(t: &Tensor, at: &[i64], roi: &[i64]) -> Result<Tensor, InferError> {
    let mut view = t.shallow_clone();
    for (d, (&start, &len)) in at.iter().zip(roi).enumerate() {
        view = view.f_narrow(2 + d as i64, start, len)?;
    }
    Ok(view)
}

/// An error, named, where the padding mode cannot pad the input to the window: reflection
/// pads each side by less than the input's size in that dimension, circular by at most it.
pub fn check_padding(grid: &WindowGrid, settings: &SlidingWindow) -> Result<(), InferError> {
    let widest = |(&(lo, hi), &n): (&(i64, i64), &i64)| (lo.max(hi), n);
    let mut sides = grid.pad.iter().zip(&grid.image).map(widest);
    let (mode, limit) = match settings.padding_mode {
        PadMode::Reflect => ("reflect", "less than"),
        PadMode::Circular => ("circular", "at most"),
        _ => return Ok(()),
    };
    let too_far = match settings.padding_mode {
        PadMode::Reflect => sides.any(|(p, n)| p >= n),
        _ => sides.any(|(p, n)| p > n),
    };
    if too_far {
        return Err(InferError::Input(format!(
            "infer.sliding_window.padding_mode = {mode} cannot pad the input {:?} to the window \
             {:?} (each side must be padded by {limit} the input's size); use constant or \
             replicate, or a smaller infer.sliding_window.roi",
            grid.image, grid.roi
        )));
    }
    Ok(())
}

/// `input` `[1, C, *spatial]` padded where the window is larger, as the settings say.
fn pad(input: &Tensor, grid: &WindowGrid, settings: &SlidingWindow) -> Result<Tensor, InferError> {
    if grid.pad.iter().all(|&(lo, hi)| lo == 0 && hi == 0) {
        return Ok(input.shallow_clone());
    }
    // torch's pad takes the last dimension first.
    let amounts: Vec<i64> = grid
        .pad
        .iter()
        .rev()
        .flat_map(|&(lo, hi)| [lo, hi])
        .collect();
    let (mode, value) = match settings.padding_mode {
        PadMode::Constant => ("constant", Some(settings.cval)),
        PadMode::Reflect => ("reflect", None),
        PadMode::Replicate => ("replicate", None),
        PadMode::Circular => ("circular", None),
    };
    input.f_pad(amounts.as_slice(), mode, value).map_err(|e| {
        InferError::Input(format!(
            "cannot pad the input {:?} to the window {:?} with infer.sliding_window.padding_mode \
             = {}: {e}",
            grid.image, grid.roi, settings.padding_mode
        ))
    })
}

/// An error unless `out` is `[n, K, *out_roi]`, as the first batch's outputs were.
fn check_output(out: &Tensor, n: usize, channels: i64, out_roi: &[i64]) -> Result<(), InferError> {
    let size = out.size();
    let mut want = vec![n as i64, channels];
    want.extend(out_roi);
    if size == want {
        return Ok(());
    }
    Err(InferError::Input(format!(
        "the model gave {size:?} for {n} windows, where the first windows' outputs make \
         {want:?} expected: a sliding window needs outputs of one size per window"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_gathered_ahead_on_a_thread_are_those_gathered_in_place_in_order() {
        let padded = Tensor::arange(2 * 9 * 7, (Kind::Float, Device::Cpu)).view([1, 2, 9, 7]);
        let grid = WindowGrid::new(&[9, 7], &[4, 3], 0.5).unwrap();
        let windows: Vec<Vec<i64>> = (0..grid.len()).map(|k| grid.window(k)).collect();
        let batches: Vec<&[Vec<i64>]> = windows.chunks(3).collect();
        let source = Source {
            padded,
            roi: &grid.roi,
            channels_last: false,
            device: Device::Cpu,
        };
        let mut seen = [vec![], vec![]];
        for (ahead, seen) in [false, true].into_iter().zip(&mut seen) {
            gather_batches(&source, &batches, ahead, |k, w| {
                seen.push((k, w));
                Ok(())
            })
            .unwrap();
        }
        assert_eq!(seen[0].len(), batches.len());
        for ((k0, w0), (k1, w1)) in seen[0].iter().zip(&seen[1]) {
            assert_eq!(k0, k1);
            assert!(w0.equal(w1));
        }
        // An error from the consumer ends the run, with the gatherer still sending.
        let mut calls = 0;
        let e = gather_batches(&source, &batches, true, |_, _| {
            calls += 1;
            Err(InferError::Input("stop".to_owned()))
        });
        assert!(e.is_err() && calls == 1);
    }

    /// The CPU's one-pass blend and the window-by-window one (other devices') sum and blend
    /// the same, for 2-D and 3-D windows, outputs contiguous and channels-last, and zoomed
    /// outputs.
    #[test]
    fn the_one_pass_blend_sums_as_window_by_window_does() {
        tch::manual_seed(4);
        let cases: [(&[i64], &[i64], f64, i64); 3] = [
            (&[9, 7], &[4, 3], 0.5, 1),
            (&[11, 9, 10], &[5, 4, 6], 0.25, 1),
            (&[12, 8, 8], &[4, 4, 4], 0.5, 2),
        ];
        for (image, roi, overlap, zoom) in cases {
            let grid = WindowGrid::new(image, roi, overlap).unwrap();
            let windows: Vec<Vec<i64>> = (0..grid.len()).map(|k| grid.window(k)).collect();
            let settings = SlidingWindow {
                roi: roi.to_vec(),
                overlap,
                mode: BlendMode::Gaussian,
                sigma_scale: 0.125,
                batch_size: 3,
                padding_mode: PadMode::Constant,
                cval: 0.0,
                channels_last: false,
                layout: Layout::AsSet,
            };
            let mut shape = vec![3i64, 3];
            shape.extend(roi.iter().map(|r| r * zoom));
            let outs = Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu));
            let laid_out = kiln_torch_ext::layout::to_channels_last(&outs).unwrap();
            let mut sums = vec![];
            for (one_pass, out) in [(false, &outs), (true, &outs), (true, &laid_out)] {
                let mut stitch = Stitch::new(&grid, out, &settings, Device::Cpu).unwrap();
                if !one_pass {
                    stitch.rows = None;
                    let _ = (stitch.sum.zero_(), stitch.count.zero_());
                }
                for batch in windows.chunks(3) {
                    let out = out.narrow(0, 0, batch.len() as i64);
                    match one_pass {
                        true => stitch.add(&out, batch).unwrap(),
                        false => stitch.add_each(&out, batch).unwrap(),
                    }
                }
                let count = stitch.count.copy();
                sums.push((stitch.finish(&grid).unwrap(), count));
            }
            for (blend, count) in &sums[1..] {
                let diff = f64::try_from((blend - &sums[0].0).abs().max()).unwrap();
                assert!(diff < 1e-5, "{image:?} {roi:?}: {diff}");
                assert!(count.allclose(&sums[0].1, 1e-6, 1e-6, false), "{image:?}");
            }
            assert!(f64::try_from(sums[0].1.min()).unwrap() > 0.0, "{image:?}");
        }
    }

    #[test]
    fn windows_step_by_the_scan_interval_and_end_at_the_edge() {
        assert_eq!(starts(10, 4, 0.25), [0, 3, 6]);
        assert_eq!(starts(10, 4, 0.5), [0, 2, 4, 6]);
        assert_eq!(starts(9, 3, 0.9), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(starts(8, 8, 0.5), [0]);
        // Python's int(20 * (1 - 0.9)) is 1 (1.9999999999999996), not 2.
        assert_eq!(starts(21, 20, 0.9), [0, 1]);
        assert_eq!(starts(30, 20, 0.9).len(), 11);
        let grid = WindowGrid::new(&[5, 6], &[3, 3], 1.0 / 3.0).unwrap();
        let order: Vec<Vec<i64>> = (0..grid.len()).map(|k| grid.window(k)).collect();
        assert_eq!(
            order,
            [[0, 0], [0, 2], [0, 3], [2, 0], [2, 2], [2, 3]].map(|w| w.to_vec())
        );
    }

    #[test]
    fn small_inputs_are_padded_half_before_and_sizes_fall_back_to_the_input() {
        let grid = WindowGrid::new(&[5, 7, 9], &[8, 0, 4], 0.25).unwrap();
        assert_eq!(grid.roi, [8, 7, 4]);
        assert_eq!(grid.pad, [(1, 2), (0, 0), (0, 0)]);
        assert_eq!(grid.padded(), [8, 7, 9]);
        assert_eq!(grid.starts[2], [0, 3, 5]);
        let e = WindowGrid::new(&[5, 7], &[4, 4, 4], 0.25).unwrap_err();
        assert!(e.to_string().contains(ROI_KEY), "{e}");
        let e = WindowGrid::new(&[5, 7], &[4], 1.0).unwrap_err();
        assert!(e.to_string().contains("[0, 1)"), "{e}");
    }

    #[test]
    fn the_gaussian_is_centred_unnormalised_and_clamped() {
        let map = importance_map(&[7, 8], BlendMode::Gaussian, 0.125, Device::Cpu).unwrap();
        let v = Vec::<f32>::try_from(map.view([-1])).unwrap();
        let g = |k: i64, n: i64| {
            let (s, x) = (n as f64 * 0.125, k as f64 - (n as f64 - 1.0) / 2.0);
            (-x * x / (2.0 * s * s)).exp()
        };
        for (i, w) in v.iter().enumerate() {
            let (a, b) = (i as i64 / 8, i as i64 % 8);
            let want = (g(a, 7) * g(b, 8)).max(1e-3);
            assert!(
                (f64::from(*w) - want).abs() < 1e-6,
                "{a},{b}: {w} vs {want}"
            );
        }
        // An even size has no voxel at the centre: the peak stays below 1.
        assert!(v.iter().cloned().fold(0.0, f32::max) < 0.9);
        let flat = importance_map(&[3, 3], BlendMode::Constant, 0.125, Device::Cpu).unwrap();
        assert_eq!(flat.size(), [1, 1, 3, 3]);
        assert_eq!(f64::try_from(flat.sum(Kind::Float)).unwrap(), 9.0);
    }
}
