//! `kiln infer --sliding-window`: a 2-D or 3-D input `[C, *spatial]` of any size (a `.npy` file,
//! or a TIFF stack: multi-page or OME-TIFF) through a model by sliding windows
//! ([`crate::sliding`]), written (`.npy` or TIFF) as the blended scores `[K, *spatial]` (f32), their
//! probabilities (softmax over the channels, f32), or a class map `[*spatial]` (the arg-max, in
//! the smallest type that holds the classes); a model
//! whose outputs are another size than the window scales `spatial` as it scales the window. The
//! settings are checked before the volume is read: the window against the input's shape, and
//! one trial window through the model.

use std::io::Read;
use std::path::Path;
use std::time::Instant;

use kiln_config::OutputDevice;
use kiln_data::DType;
use kiln_device::measured::MeasuredCache;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::onnx::OnnxEngine;
use crate::sliding::{Layout, SlidingWindow, WindowGrid, Zoom, run};
use crate::{InferError, LoadedModel};

/// A model the windows run through: a libtorch model (checkpoint, TorchScript, exported program)
/// or an ONNX Runtime session.
pub trait WindowModel {
    fn description(&self) -> &str;
    /// Where the windows go (the CPU for ONNX Runtime, which takes host arrays).
    fn device(&self) -> Device;
    /// The element type the windows reach the model in.
    fn kind(&self) -> Kind;
    /// The outputs `[n, K, *roi]` of a batch of windows `[n, C, *roi]` already on
    /// [`WindowModel::device`] in [`WindowModel::kind`].
    fn forward(&mut self, windows: &Tensor) -> Result<Tensor, InferError>;
    /// Re-lays the model's weights out channels-last (`on`) or contiguous; whether it can.
    fn set_channels_last(&mut self, _on: bool) -> Result<bool, InferError> {
        Ok(false)
    }
}

impl WindowModel for LoadedModel {
    fn description(&self) -> &str {
        LoadedModel::description(self)
    }

    fn device(&self) -> Device {
        LoadedModel::device(self)
    }

    fn kind(&self) -> Kind {
        LoadedModel::kind(self)
    }

    fn forward(&mut self, windows: &Tensor) -> Result<Tensor, InferError> {
        LoadedModel::forward(self, windows)
    }

    fn set_channels_last(&mut self, on: bool) -> Result<bool, InferError> {
        LoadedModel::set_channels_last(self, on)
    }
}

impl WindowModel for OnnxEngine {
    fn description(&self) -> &str {
        OnnxEngine::description(self)
    }

    fn device(&self) -> Device {
        Device::Cpu
    }

    fn kind(&self) -> Kind {
        Kind::Float
    }

    fn forward(&mut self, windows: &Tensor) -> Result<Tensor, InferError> {
        let n = windows.size().first().copied().unwrap_or(0);
        let windows = windows.f_contiguous()?;
        let numel = windows.numel();
        let mut values = vec![0f32; numel];
        windows.f_copy_data(&mut values, numel)?;
        let (out, per_sample) = self.run(&values, usize::try_from(n).unwrap_or(0))?;
        let mut shape = vec![n];
        shape.extend(per_sample.iter().map(|&d| d as i64));
        Ok(Tensor::f_from_slice(&out)?.f_view(shape.as_slice())?)
    }
}

/// What a sliding-window run did.
#[derive(Debug, Clone, Serialize)]
pub struct VolumeReport {
    pub model: String,
    pub input: String,
    /// `[C, *spatial]`.
    pub input_shape: Vec<usize>,
    pub roi: Vec<i64>,
    pub windows: usize,
    pub batch_size: usize,
    pub mode: String,
    pub output_device: String,
    /// The output written: `[K, *spatial]` scores or a `[*spatial]` class map.
    pub output_shape: Vec<usize>,
    pub output_dtype: String,
    /// The windows' run and their stitching (reading the input, loading the model and the
    /// trial window before them not counted).
    pub seconds: f64,
    /// Of which inside the model's forward (on CUDA, up to the device's finishing it).
    pub forward_seconds: f64,
    /// The layout the windows and the model's weights ran in: `channels-last` or `contiguous`.
    pub layout: String,
    /// Where kiln chose it (`performance.channels_last` not set): a batch of windows' forward
    /// in each layout, in ms, measured now or by an earlier run (cached).
    pub layout_measured: Option<LayoutTimes>,
    /// The trial window and any layout measurement (before `seconds`).
    pub trial_seconds: f64,
}

/// A batch of windows' forward in each layout, in ms (the faster was kept; a near tie stays
/// contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LayoutTimes {
    pub contiguous_ms: f64,
    pub channels_last_ms: f64,
    /// Unix seconds when they were measured.
    pub measured_at: u64,
    /// Whether they came from kiln's cache (measured by an earlier run) rather than this run.
    #[serde(default, skip_deserializing)]
    pub cached: bool,
}

impl LayoutTimes {
    /// Whether channels-last is the faster, by more than the engine choice's tie margin
    /// ([`crate::choose::TIE`]: a stable choice over timing noise).
    pub fn channels_last(&self) -> bool {
        self.channels_last_ms < self.contiguous_ms * (1.0 - crate::choose::TIE)
    }
}

/// Where the output goes and what it is.
#[derive(Debug, Clone, Copy)]
pub struct VolumeOutput<'a> {
    /// The `.npy` or TIFF file to write (never overwritten), if any.
    pub path: Option<&'a Path>,
    /// `infer.sliding_window.output_device`.
    pub device: OutputDevice,
    /// The model's GPU memory in bytes, for `auto` to judge whether the output fits there.
    pub device_memory: Option<u64>,
    /// What is written: the scores, their probabilities, or the class map.
    pub values: VolumeValues,
}

/// What a sliding-window run writes of the blended outputs `[K, *spatial]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeValues {
    /// The blended outputs as the model gives them (logits, or whatever it computes), f32.
    Scores,
    /// Softmax over the channels of the blended outputs (a sigmoid where there is one
    /// channel), f32: MONAI's `Activations` after the blend.
    Probabilities,
    /// The arg-max over the channels `[*spatial]`, in the smallest integer type that holds it.
    ClassMap,
}

/// `input` (a `.npy` or TIFF `[C, *spatial]`) through `model` by sliding windows, stitched and
/// written as `output` says.
pub fn infer_volume(
    model: &mut dyn WindowModel,
    input: &Path,
    settings: &SlidingWindow,
    output: VolumeOutput<'_>,
) -> Result<VolumeReport, InferError> {
    let (dtype, shape) = volume_header(input)?;
    let spatial: Vec<i64> = shape[1..].iter().map(|&d| d as i64).collect();
    let grid = WindowGrid::new(&spatial, &settings.roi, settings.overlap)?;
    crate::sliding::check_padding(&grid, settings)?;
    let trial_started = Instant::now();
    let trial = trial_window(&mut *model, shape[0] as i64, &grid)?;
    let mut settings = settings.clone();
    let layout_measured = settle_layout(&mut *model, &trial.window, grid.len(), &mut settings)?;
    let trial_seconds = trial_started.elapsed().as_secs_f64();
    let settings = &settings;
    let padded: i64 = trial.zoom.scaled(&grid.padded()).iter().product();
    // The running sum (K channels) and the summed weights, in f32.
    let needed = (padded as u64) * (trial.channels as u64 + 1) * 4;
    let model_device = model.device();
    let output_device = place_output(output.device, model_device, needed, output.device_memory);
    let volume = read_volume(input, dtype, &shape)?;
    let description = model.description().to_owned();
    let started = Instant::now();
    let mut forward_seconds = 0.0;
    let mut predict = |windows: &Tensor| -> Result<Tensor, InferError> {
        let windows = windows.f_to_kind(model.kind())?;
        let start = Instant::now();
        let out = model.forward(&windows)?;
        synchronize(model_device, &description)?;
        forward_seconds += start.elapsed().as_secs_f64();
        Ok(out)
    };
    let scores = run(&volume, settings, model_device, output_device, &mut predict)?;
    let class_map = output.values == VolumeValues::ClassMap;
    let (out, out_dtype) = match output.values {
        VolumeValues::ClassMap => class_map_of(&scores)?,
        VolumeValues::Probabilities => (probabilities_of(&scores)?, DType::F32),
        VolumeValues::Scores => (scores, DType::F32),
    };
    let seconds = started.elapsed().as_secs_f64();
    let out_shape: Vec<usize> = out.size().iter().map(|&d| d as usize).collect();
    if let Some(path) = output.path {
        write(path, &out, out_dtype, &out_shape, class_map)?;
    }
    Ok(VolumeReport {
        model: description,
        input: input.display().to_string(),
        input_shape: shape,
        roi: grid.roi.clone(),
        windows: grid.len(),
        batch_size: settings.batch_size,
        mode: settings.mode.to_string(),
        output_device: format!("{output_device:?}").to_lowercase(),
        output_shape: out_shape,
        output_dtype: out_dtype.to_string(),
        seconds,
        forward_seconds,
        layout: match settings.channels_last {
            true => "channels-last",
            false => "contiguous",
        }
        .to_owned(),
        layout_measured,
        trial_seconds,
    })
}

/// Lays the model and the windows out as `settings.layout` says: as set (the weights
/// re-laid too where channels-last is asked for: a window of one channel is only laid out by
/// them), or measured on a batch of `trial`-sized windows of zeros as many as a batch holds
/// (a layout's speed differs with the batch), or the answer cached for this model, window,
/// batch and hardware.
fn settle_layout(
    model: &mut dyn WindowModel,
    trial: &Tensor,
    windows: usize,
    settings: &mut SlidingWindow,
) -> Result<Option<LayoutTimes>, InferError> {
    let Layout::Measured { cache } = settings.layout.clone() else {
        if settings.channels_last {
            model.set_channels_last(true)?;
        }
        return Ok(None);
    };
    let mut shape = trial.size();
    shape[0] = settings.batch_size.min(windows).max(1) as i64;
    let key = match &cache {
        Some(c) => Some(layout_key(&c.model, &shape, model)?),
        None => None,
    };
    let mut store =
        cache.map(|c| MeasuredCache::<LayoutTimes>::open_file(&c.dir, LAYOUT_FILE, "layout cache"));
    if let Some(hit) = store
        .as_ref()
        .zip(key.as_deref())
        .and_then(|(s, k)| s.get(k).copied())
    {
        if model.set_channels_last(hit.channels_last())? {
            settings.channels_last = hit.channels_last();
            return Ok(Some(LayoutTimes {
                cached: true,
                ..hit
            }));
        }
        return Ok(None);
    }
    let zeros = Tensor::f_zeros(shape.as_slice(), (model.kind(), model.device()))?;
    let measured = choose_layout(model, &zeros, settings)?;
    if let (Some(store), Some(key), Some(times)) = (store.as_mut(), key, measured) {
        // A cache that cannot be written costs the next run a measurement, nothing more.
        if let Err(e) = store.store(&key, times) {
            tracing::warn!("{e}");
        }
    }
    Ok(measured)
}

/// The layout cache's file in kiln's cache directory.
const LAYOUT_FILE: &str = "layout-choice.json";

/// Everything a measured layout depends on: the model, the batch of windows, the element type,
/// the hardware and threads, libtorch's version and kiln's.
fn layout_key(
    model_id: &str,
    batch: &[i64],
    model: &dyn WindowModel,
) -> Result<String, InferError> {
    let hardware = kiln_device::measured::hardware_key(model.device())?;
    Ok(format!(
        "{model_id} | windows {batch:?} {:?} | {hardware} | libtorch 2.11.0 | kiln {}",
        model.kind(),
        env!("CARGO_PKG_VERSION")
    ))
}

/// Times one forward of `windows` (a batch of zeros) in each layout and keeps the faster: the
/// model's weights re-laid and `settings.channels_last` set to match. None where the model
/// cannot be re-laid (an ONNX session, an exported program's compiled forward). One forward
/// each, not warmed: setting up a convolution for a new shape or layout costs milliseconds,
/// the same on both sides, against a forward that takes tens of them.
fn choose_layout(
    model: &mut dyn WindowModel,
    windows: &Tensor,
    settings: &mut SlidingWindow,
) -> Result<Option<LayoutTimes>, InferError> {
    let _guard = tch::no_grad_guard();
    // From the standard layout, whatever the model was built in.
    if !model.set_channels_last(false)? {
        return Ok(None);
    }
    let contiguous_ms = timed_forward(model, windows)?;
    model.set_channels_last(true)?;
    let windows = kiln_torch_ext::layout::to_channels_last(windows)?;
    let channels_last_ms = timed_forward(model, &windows)?;
    let times = LayoutTimes {
        contiguous_ms,
        channels_last_ms,
        measured_at: crate::choose::now(),
        cached: false,
    };
    if !times.channels_last() {
        model.set_channels_last(false)?;
    }
    settings.channels_last = times.channels_last();
    Ok(Some(times))
}

/// One forward of `window` through `model`, in ms (on CUDA, up to the device's finishing it).
fn timed_forward(model: &mut dyn WindowModel, window: &Tensor) -> Result<f64, InferError> {
    let start = Instant::now();
    let _out = model.forward(window)?;
    synchronize(model.device(), model.description())?;
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

/// Waits for `device` to finish (nothing on the CPU); a device error is an error naming the model.
fn synchronize(device: Device, description: &str) -> Result<(), InferError> {
    if let Device::Cuda(i) = device {
        // tch's synchronize panics on a device error (an assert in a kernel): an error here.
        std::panic::catch_unwind(|| tch::Cuda::synchronize(i as i64)).map_err(|_| {
            InferError::Input(format!(
                "{description}: the device failed while running a batch of windows"
            ))
        })?;
    }
    Ok(())
}

/// The shape `[C, *roi]` of one window over `input` (read from its header alone): what a model
/// with fixed input dimensions (an ONNX file) must take.
pub fn window_shape(input: &Path, settings: &SlidingWindow) -> Result<Vec<usize>, InferError> {
    let (_, shape) = volume_header(input)?;
    let spatial: Vec<i64> = shape[1..].iter().map(|&d| d as i64).collect();
    let grid = WindowGrid::new(&spatial, &settings.roi, settings.overlap)?;
    let mut window = vec![shape[0]];
    window.extend(grid.roi.iter().map(|&r| r as usize));
    Ok(window)
}

/// Where the stitched output lives: the model's device, or the CPU when asked, or (`auto`) when
/// the output's `needed` bytes would take more than a quarter of the GPU's memory.
fn place_output(
    choice: OutputDevice,
    model: Device,
    needed: u64,
    device_memory: Option<u64>,
) -> Device {
    match choice {
        OutputDevice::Cpu => Device::Cpu,
        OutputDevice::Device => model,
        OutputDevice::Auto => match device_memory {
            Some(total) if model != Device::Cpu && needed > total / 4 => Device::Cpu,
            _ => model,
        },
    }
}

/// Whether `path` names a TIFF (`.tif`, `.tiff`) rather than a `.npy` file.
fn is_tiff(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("tif") || e.eq_ignore_ascii_case("tiff"))
}

/// The element type and shape an input declares, read from its header(s) alone (a `.npy`
/// header, or a TIFF stack's pages: read as f32); an error unless it is `[C, *spatial]` with 2
/// or 3 spatial dimensions.
fn volume_header(path: &Path) -> Result<(DType, Vec<usize>), InferError> {
    let (dtype, shape) = match is_tiff(path) {
        true => (DType::F32, kiln_data::tiff_stack::stack_layout(path)?.shape),
        false => {
            let mut head = Vec::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(1 << 17).read_to_end(&mut head))
                .map_err(|e| InferError::file(path, format!("cannot read: {e}")))?;
            let h = kiln_data::npy_parse_header(&head).map_err(|e| InferError::file(path, e))?;
            (h.dtype, h.shape)
        }
    };
    if !(3..=4).contains(&shape.len()) || shape.contains(&0) {
        return Err(InferError::file(
            path,
            format!(
                "the array is {shape:?}; a sliding window takes one input laid out [channels, \
                 *spatial] with 2 or 3 spatial dimensions ([C, H, W] or [C, D, H, W])"
            ),
        ));
    }
    Ok((dtype, shape))
}

/// What the trial window found: the outputs' channels and how they scale the window.
struct Trial {
    channels: i64,
    zoom: Zoom,
    /// The window of zeros it ran.
    window: Tensor,
}

/// One window of zeros through the model: its output's channels and zoom, or an error naming
/// the window size unless the model takes it and every window's output lands evenly.
fn trial_window(
    model: &mut dyn WindowModel,
    channels: i64,
    grid: &WindowGrid,
) -> Result<Trial, InferError> {
    let _guard = tch::no_grad_guard();
    let roi = &grid.roi;
    let mut shape = vec![1, channels];
    shape.extend_from_slice(roi);
    let zeros = Tensor::f_zeros(shape.as_slice(), (model.kind(), model.device()))?;
    let description = model.description().to_owned();
    let refused = |why: String| {
        InferError::Input(format!(
            "infer.sliding_window.roi = {roi:?}: {description} cannot take a window [1, \
             {channels}, {}]: {why}",
            roi.iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    // libtorch's message without its C++ stack.
    let first_line = |e: InferError| e.to_string().lines().next().unwrap_or_default().to_owned();
    let out = model.forward(&zeros).map_err(|e| refused(first_line(e)))?;
    let size = out.size();
    let zoom = Zoom::new(grid, &size).map_err(|e| refused(e.to_string()))?;
    Ok(Trial {
        channels: size[1],
        zoom,
        window: zeros,
    })
}

/// The whole input as an f32 tensor `[C, *spatial]` on the CPU.
fn read_volume(path: &Path, dtype: DType, shape: &[usize]) -> Result<Tensor, InferError> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    if is_tiff(path) {
        let (_, values) = kiln_data::tiff_stack::read_stack(path)?;
        return Ok(Tensor::f_from_slice(&values)?.f_view(dims.as_slice())?);
    }
    let bytes =
        std::fs::read(path).map_err(|e| InferError::file(path, format!("cannot read: {e}")))?;
    let array = kiln_data::NpyArray::parse(&bytes).map_err(|e| InferError::file(path, e))?;
    if (array.dtype, array.shape.as_slice()) != (dtype, shape) {
        return Err(InferError::file(path, "changed while it was read"));
    }
    Ok(Tensor::f_from_slice(&array.to_f32())?.f_view(dims.as_slice())?)
}

/// The softmax over the channels of `scores` `[K, *spatial]`, or the sigmoid of a single one.
fn probabilities_of(scores: &Tensor) -> Result<Tensor, InferError> {
    Ok(match scores.size()[0] {
        1 => scores.f_sigmoid()?,
        _ => scores.f_softmax(0, Kind::Float)?,
    })
}

/// The arg-max over the channels `[K, *spatial]` → `[*spatial]`, in u8 for up to 256 classes,
/// else i16 or i32.
fn class_map_of(scores: &Tensor) -> Result<(Tensor, DType), InferError> {
    let classes = scores.size()[0];
    if classes < 2 {
        return Err(InferError::Input(
            "--class-map takes the arg-max over the output's channels, and this model gives one \
             channel (a single logit or probability): write its scores instead and threshold \
             them"
                .to_owned(),
        ));
    }
    let argmax = scores.f_argmax(0, false)?;
    let (kind, dtype) = match classes {
        0..=256 => (Kind::Uint8, DType::U8),
        257..=32_768 => (Kind::Int16, DType::I16),
        _ => (Kind::Int, DType::I32),
    };
    Ok((argmax.f_to_kind(kind)?, dtype))
}

/// Writes `t` (on any device) at `path`, which must not exist: `.npy`, or a TIFF stack (scores
/// `[K, *spatial]` a page per channel and plane; a class map's planes).
fn write(
    path: &Path,
    t: &Tensor,
    dtype: DType,
    shape: &[usize],
    class_map: bool,
) -> Result<(), InferError> {
    let t = t.f_to_device(Device::Cpu)?.f_contiguous()?;
    let mut bytes = vec![0u8; t.numel() * dtype.size()];
    t.f_copy_data_u8(&mut bytes, t.numel())?;
    if is_tiff(path) {
        let (channels, spatial) = match class_map {
            true => (1, shape),
            false => (shape[0], &shape[1..]),
        };
        return Ok(kiln_data::tiff_stack::write_stack(
            path, dtype, channels, spatial, &bytes,
        )?);
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| {
            InferError::file(path, format!("cannot create (kiln never overwrites): {e}"))
        })?;
    let header = kiln_data::npy_header(dtype, shape).map_err(|e| InferError::file(path, e))?;
    use std::io::Write;
    file.write_all(&header)
        .and_then(|_| file.write_all(&bytes))
        .map_err(|e| InferError::file(path, format!("cannot write: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_are_a_softmax_over_channels_or_a_single_channels_sigmoid() {
        let scores = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 3.0]).view([2, 2]);
        let p = Vec::<f32>::try_from(probabilities_of(&scores).unwrap().view([-1])).unwrap();
        let softmax = |a: f32, b: f32| a.exp() / (a.exp() + b.exp());
        let want = [
            softmax(1.0, 0.5),
            softmax(-2.0, 3.0),
            softmax(0.5, 1.0),
            softmax(3.0, -2.0),
        ];
        for (got, want) in p.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        let one = Tensor::from_slice(&[0.0f32, 2.0]).view([1, 2]);
        let p = Vec::<f32>::try_from(probabilities_of(&one).unwrap().view([-1])).unwrap();
        assert!((p[0] - 0.5).abs() < 1e-6 && (p[1] - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
    }
}
