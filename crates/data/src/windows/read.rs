//! The windows of a split as a [`Dataset`]: each sample the named arrays a forecaster takes,
//! copied out of the stored series when read.

use std::sync::Arc;

use super::{Store, TargetNormalizer, WindowsManifest};
use crate::dataset::array_slots_error;
use crate::target::TargetSpec;
use crate::{ArraySpec, DType, DataError, Dataset, TargetSlot};

/// Added to a series' standard deviation, so a constant series scales by a finite amount:
/// float16's machine epsilon, 2⁻¹⁰, as pytorch-forecasting's `GroupNormalizer` adds.
const SCALE_EPS: f64 = 1.0 / 1024.0;

/// Windows of one series: `count` of them, from `first` on, of one [`Shape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub series: usize,
    pub first: usize,
    pub count: usize,
    pub shape: Shape,
}

/// How a run's windows lie: with a full history (`first` the first window's first row), or,
/// for windows of variable length, a shorter one ending at the end of the part of the series
/// they are cut from (the cutoff for training, the series' end for validation), or a shorter
/// one starting at the series' first row (`first` the first window's history length), as
/// pytorch-forecasting's `min_encoder_length` gives a window ending and one starting at every
/// step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Full,
    End { end: usize },
    Start,
}

/// One split's windows (training or validation) over the stored series, read by name:
/// `encoder_cont` `[encoder, reals]` (known then unknown reals; a target among them scaled
/// as `target_scale` says), `encoder_target` `[encoder]` (as stored), `decoder_cont`
/// `[horizon, known]`, `static_cat` `[statics]` (int64), `group`, `decoder_time` `[horizon]`,
/// `encoder_length`, `decoder_length` (int64) and `target_scale` `[2]` (center, scale); the
/// target is the horizon's values `[horizon]` as stored. With several targets, each
/// per-target array gains a last dimension of the targets. Arrays with no columns are left out.
#[derive(Debug, Clone)]
pub struct WindowedDataset {
    store: Arc<Store>,
    runs: Vec<Run>,
    /// Windows before each run and after the last.
    ends: Vec<usize>,
    /// `[center, scale]` of each series' targets, series after series.
    scales: Arc<Vec<[f32; 2]>>,
    parts: Vec<Part>,
    specs: Vec<ArraySpec>,
    target: TargetSpec,
    /// For each real column, the target it is (scaled as that target) where the dataset
    /// normalises.
    real_target: Vec<Option<usize>>,
}

impl WindowedDataset {
    pub(crate) fn new(store: Arc<Store>, runs: Vec<Run>, scales: Arc<Vec<[f32; 2]>>) -> Self {
        let ends = runs
            .iter()
            .scan(0, |n, r| {
                *n += r.count;
                Some(*n)
            })
            .collect();
        let (parts, specs) = array_specs(&store.manifest);
        let m = &store.manifest;
        let real_target = m
            .reals()
            .map(|name| {
                let t = m.columns.target.iter().position(|t| t == name)?;
                (m.normalize == TargetNormalizer::Group).then_some(t)
            })
            .collect();
        let target = TargetSpec::Values {
            shape: per_target(store.manifest.horizon, store.manifest.columns.target.len()),
        };
        Self {
            store,
            runs,
            ends,
            scales,
            parts,
            specs,
            target,
            real_target,
        }
    }

    /// The manifest of the stored series.
    pub fn manifest(&self) -> &WindowsManifest {
        &self.store.manifest
    }

    /// Window `index`: its series and the place of its first row in the series.
    pub fn window(&self, index: usize) -> Option<(usize, usize)> {
        self.window_at(index)
            .map(|(series, place, _)| (series, place))
    }

    /// The history window `index` gives: the encoder length, or less where the windows are
    /// of variable length and its series' end allows no full one.
    pub fn encoder_of(&self, index: usize) -> Option<usize> {
        self.window_at(index).map(|(_, _, encoder)| encoder)
    }

    /// Window `index`'s series, the place of its first row, and its encoder length.
    fn window_at(&self, index: usize) -> Option<(usize, usize, usize)> {
        let k = self.ends.partition_point(|&end| end <= index);
        let run = self.runs.get(k)?;
        let before = if k == 0 { 0 } else { self.ends[k - 1] };
        let m = &self.store.manifest;
        let at = run.first + index - before;
        let (place, encoder) = match run.shape {
            Shape::Full => (at, m.encoder_length),
            Shape::End { end } => (at, end - at - m.horizon),
            Shape::Start => (0, at),
        };
        Some((run.series, place, encoder))
    }

    /// The `[center, scale]` of series `series`' targets (`series` one of the manifest's).
    pub(crate) fn scales(&self, series: usize) -> &[[f32; 2]] {
        let t = self.store.manifest.columns.target.len();
        &self.scales[series * t..(series + 1) * t]
    }

    /// Writes window `index`'s arrays (sample `k` of each slot) and horizon target.
    fn read_window(
        &self,
        index: usize,
        k: usize,
        inputs: &mut [&mut [u8]],
        target: &mut [f32],
    ) -> Result<(), DataError> {
        let (series, place, e) = self
            .window_at(index)
            .ok_or_else(|| crate::error::out_of_range(index, self.len()))?;
        let m = &self.store.manifest;
        let s = &m.series[series];
        let h = m.horizon;
        let first = s.start + place;
        let scales = self.scales(series);
        for ((part, spec), slot) in self.parts.iter().zip(&self.specs).zip(inputs.iter_mut()) {
            let size = spec.numel() * spec.dtype.model().size();
            let out = &mut slot[k * size..(k + 1) * size];
            // A shorter history fills the encoder's first rows; the rest are zeros.
            let (history, padding) = out.split_at_mut(size / m.encoder_length.max(1) * e);
            match part {
                Part::EncoderCont => {
                    self.reals(first..first + e, None, scales, history);
                    padding.fill(0);
                }
                Part::EncoderTarget => {
                    put_f32s(history, self.targets(first..first + e));
                    padding.fill(0);
                }
                Part::EncoderMask => {
                    history.fill(1);
                    padding.fill(0);
                }
                Part::DecoderCont => {
                    let known = m.columns.known.len();
                    self.reals(first + e..first + e + h, Some(known), scales, out)
                }
                Part::StaticCat => put_i64s(out, s.statics.iter().copied()),
                Part::Group => put_i64s(out, [series as i64]),
                Part::DecoderTime => {
                    let t0 = s.first_time + (place + e) as i64;
                    put_i64s(out, (0..h as i64).map(|j| t0 + j))
                }
                Part::EncoderLength => put_i64s(out, [e as i64]),
                Part::DecoderLength => put_i64s(out, [h as i64]),
                Part::TargetScale => put_f32s(out, scales.iter().flatten().copied()),
            }
        }
        for (o, v) in target
            .iter_mut()
            .zip(self.targets(first + e..first + e + h))
        {
            *o = v;
        }
        Ok(())
    }

    /// The stored targets of `rows`, row after row.
    fn targets(&self, rows: std::ops::Range<usize>) -> impl Iterator<Item = f32> + '_ {
        f32s(self.store.targets.rows(rows.start, rows.end))
    }

    /// The reals of `rows` (only the first `columns` of each row where given) into `out`; a
    /// target column among them scaled where the dataset normalises.
    fn reals(
        &self,
        rows: std::ops::Range<usize>,
        columns: Option<usize>,
        scales: &[[f32; 2]],
        out: &mut [u8],
    ) {
        let Some(reals) = &self.store.reals else {
            return;
        };
        let width = reals.shape[1];
        let keep = columns.unwrap_or(width);
        let scale_of = |j: usize| self.real_target[j].map(|t| scales[t]);
        let values = f32s(reals.rows(rows.start, rows.end))
            .enumerate()
            .filter(|(j, _)| j % width < keep)
            .map(|(j, v)| match scale_of(j % width) {
                Some([center, scale]) => (v - center) / scale,
                None => v,
            });
        put_f32s(out, values);
    }
}

/// `[n]` for one target, `[n, targets]` for several.
fn per_target(n: usize, targets: usize) -> Vec<usize> {
    if targets == 1 {
        vec![n]
    } else {
        vec![n, targets]
    }
}

/// What an array of a window holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    EncoderCont,
    EncoderTarget,
    /// `[encoder]` bool: which history rows hold data (windows of variable length only).
    EncoderMask,
    DecoderCont,
    StaticCat,
    Group,
    DecoderTime,
    EncoderLength,
    DecoderLength,
    TargetScale,
}

/// The arrays of a window of `m`, in order; those with no columns left out.
fn array_specs(m: &WindowsManifest) -> (Vec<Part>, Vec<ArraySpec>) {
    let c = &m.columns;
    let (e, h, t) = (m.encoder_length, m.horizon, c.target.len());
    let reals = c.known.len() + c.unknown.len();
    let spec = |name: &str, dtype: DType, shape: Vec<usize>| ArraySpec {
        name: name.to_owned(),
        dtype,
        shape,
        ids: false,
    };
    let scale = if t == 1 { vec![2] } else { vec![t, 2] };
    let statics = c.static_categoricals.len();
    // Only windows of variable length need a mask (an array with no columns is left out).
    let mask = if m.min_encoder_length.is_some() { e } else { 0 };
    let all = [
        (
            Part::EncoderCont,
            spec("encoder_cont", DType::F32, vec![e, reals]),
        ),
        (
            Part::EncoderTarget,
            spec("encoder_target", DType::F32, per_target(e, t)),
        ),
        (
            Part::EncoderMask,
            spec("encoder_mask", DType::Bool, vec![mask]),
        ),
        (
            Part::DecoderCont,
            spec("decoder_cont", DType::F32, vec![h, c.known.len()]),
        ),
        (
            Part::StaticCat,
            spec("static_cat", DType::I64, vec![statics]),
        ),
        (Part::Group, spec("group", DType::I64, vec![])),
        (Part::DecoderTime, spec("decoder_time", DType::I64, vec![h])),
        (
            Part::EncoderLength,
            spec("encoder_length", DType::I64, vec![]),
        ),
        (
            Part::DecoderLength,
            spec("decoder_length", DType::I64, vec![]),
        ),
        (Part::TargetScale, spec("target_scale", DType::F32, scale)),
    ];
    all.into_iter()
        .filter(|(_, a)| a.shape.iter().all(|&n| n > 0))
        .unzip()
}

/// Little-endian `f32`s.
fn f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Writes `values` into `out` in the machine's byte order.
fn put_f32s(out: &mut [u8], values: impl IntoIterator<Item = f32>) {
    for (o, v) in out.chunks_exact_mut(4).zip(values) {
        o.copy_from_slice(&v.to_ne_bytes());
    }
}

fn put_i64s(out: &mut [u8], values: impl IntoIterator<Item = i64>) {
    for (o, v) in out.chunks_exact_mut(8).zip(values) {
        o.copy_from_slice(&v.to_ne_bytes());
    }
}

impl Dataset for WindowedDataset {
    fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    fn sample_shape(&self) -> &[usize] {
        &self.specs[0].shape
    }

    fn target(&self) -> TargetSpec {
        self.target.clone()
    }

    /// A window is several named arrays: read it with [`Dataset::read_arrays`].
    fn read_sample(
        &self,
        index: usize,
        _features: &mut [f32],
        _target: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        let names: Vec<&str> = self.specs.iter().map(|a| a.name.as_str()).collect();
        Err(DataError::Sample {
            index,
            message: format!(
                "a window is {} named arrays ({}), not one features array: read it by name \
                 (`read_arrays`), as a model taking its inputs by name does",
                names.len(),
                names.join(", ")
            ),
        })
    }

    fn inputs(&self) -> Vec<ArraySpec> {
        self.specs.clone()
    }

    fn read_arrays(
        &self,
        indices: &[usize],
        inputs: &mut [&mut [u8]],
        targets: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        let n = indices.len();
        let fits = |(spec, slot): (&ArraySpec, &&mut [u8])| {
            slot.len() == n * spec.numel() * spec.dtype.model().size()
        };
        if inputs.len() != self.specs.len() || !self.specs.iter().zip(&*inputs).all(fits) {
            return Err(array_slots_error(&self.specs, n, inputs));
        }
        let per = self.target.numel();
        let TargetSlot::Values(targets) = targets else {
            return Err(DataError::Shape {
                what: "the target slot".to_owned(),
                expected: format!("{} f32 values per window", per),
                got: "class labels".to_owned(),
            });
        };
        if targets.len() != n * per {
            return Err(DataError::Shape {
                what: "the target slot".to_owned(),
                expected: format!("{} f32 values for {n} windows", n * per),
                got: targets.len().to_string(),
            });
        }
        for (k, &index) in indices.iter().enumerate() {
            self.read_window(index, k, inputs, &mut targets[k * per..(k + 1) * per])?;
        }
        Ok(())
    }
}

/// Each split's runs of windows: a training window's horizon ends at or before its series'
/// cutoff (`val_steps` before the end), a validation window's starts after it.
pub(crate) fn split_ranges(m: &WindowsManifest, val_steps: usize) -> (Vec<Run>, Vec<Run>) {
    let (mut train, mut val) = (vec![], vec![]);
    for (series, s) in m.series.iter().enumerate() {
        let cutoff = s.len.saturating_sub(val_steps);
        train.extend(runs_in(m, series, cutoff, 0));
        if val_steps > 0 {
            // A validation window's history ends at the cutoff or later.
            val.extend(runs_in(m, series, s.len, cutoff));
        }
    }
    (train, val)
}

/// The windows to forecast: for each horizon that starts at a series' cutoff (`val_steps`
/// before its end) or later, one window with the longest history the series has (up to the
/// encoder length, at least the minimum): full histories, and shorter ones from a series'
/// start; never the deliberately shortened histories of [`split_ranges`]'s windows at an end.
pub(crate) fn forecast_ranges(m: &WindowsManifest, val_steps: usize) -> Vec<Run> {
    let (e, min, h) = (m.encoder_length, m.min_encoder(), m.horizon);
    let mut out = vec![];
    for (series, s) in m.series.iter().enumerate() {
        let cutoff = s.len.saturating_sub(val_steps);
        // Full histories: first rows p with p + e >= cutoff and p + e + h <= len.
        let first = cutoff.saturating_sub(e);
        if let Some(last) = s.len.checked_sub(e + h).filter(|&last| last >= first) {
            out.push(Run {
                series,
                first,
                count: last - first + 1,
                shape: Shape::Full,
            });
        }
        // From the series' start: histories of max(min, cutoff) to e - 1 steps, the horizon
        // inside the series.
        let shortest = min.max(cutoff);
        let longest = (e - 1).min(s.len.saturating_sub(h));
        if min < e && longest >= shortest {
            out.push(Run {
                series,
                first: shortest,
                count: longest - shortest + 1,
                shape: Shape::Start,
            });
        }
    }
    out
}

/// The runs of windows of series `series` within its first `end` steps whose history ends at
/// step `after` or later: full histories, then (variable lengths) shorter ones ending at `end`
/// and shorter ones starting at the series' start (each window once).
fn runs_in(m: &WindowsManifest, series: usize, end: usize, after: usize) -> Vec<Run> {
    let (e, min, h) = (m.encoder_length, m.min_encoder(), m.horizon);
    let run = |first: usize, last: Option<usize>, shape| {
        let count = last.map_or(0, |last| (last + 1).saturating_sub(first));
        (count > 0).then_some(Run {
            series,
            first,
            count,
            shape,
        })
    };
    // Full: first rows p with p + e >= after and p + e + h <= end.
    let full = run(after.saturating_sub(e), end.checked_sub(e + h), Shape::Full);
    // Ending at `end`: p + len + h = end with min <= len < e, so p from end - h - e + 1; their
    // histories end at end - h.
    let ends = run(
        (end + 1).saturating_sub(h + e),
        end.checked_sub(h + min),
        Shape::End { end },
    )
    .filter(|_| min < e && end >= after + h);
    // Starting at the series' start: history lengths from max(min, after) to e - 1, short of
    // reaching `end` (that window is the last run's).
    let starts = run(
        min.max(after),
        end.min(e + h).checked_sub(h + 1),
        Shape::Start,
    )
    .filter(|_| min < e);
    [full, ends, starts].into_iter().flatten().collect()
}

/// Each series' target scales from its rows before the cutoff: `[0, 1]` without
/// normalisation; with it, the mean and the standard deviation (`n - 1` in the denominator,
/// as pandas computes it) plus [`SCALE_EPS`]. A series with fewer than 2 rows before its cutoff
/// has no spread to measure: scale 1.
pub(crate) fn scales(store: &Store, val_steps: usize) -> Result<Arc<Vec<[f32; 2]>>, DataError> {
    let m = &store.manifest;
    let t = m.columns.target.len();
    let mut out = Vec::with_capacity(m.series.len() * t);
    for s in &m.series {
        let rows = s.len.saturating_sub(val_steps);
        for column in 0..t {
            if m.normalize == TargetNormalizer::None {
                out.push([0.0, 1.0]);
                continue;
            }
            let values: Vec<f64> = f32s(store.targets.rows(s.start, s.start + rows))
                .skip(column)
                .step_by(t)
                .map(f64::from)
                .collect();
            out.push(mean_std(&values));
        }
    }
    Ok(Arc::new(out))
}

/// `[mean, std + eps]` of `values` (`[mean or 0, 1]` for fewer than 2).
fn mean_std(values: &[f64]) -> [f32; 2] {
    let n = values.len() as f64;
    let mean = if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / n
    };
    if values.len() < 2 {
        return [mean as f32, 1.0];
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    [mean as f32, (var.sqrt() + SCALE_EPS) as f32]
}
