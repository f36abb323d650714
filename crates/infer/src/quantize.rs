//! `kiln export --quantize int8`: an exported fp32 ONNX model with its Linear and MatMul weights
//! quantized to int8 (activations quantized on the fly) by ONNX Runtime's own tool, run beside
//! the fp32 model in ONNX Runtime on a dataset the user names, and published only where the
//! task's metric stays within its limit: accuracy within 1 point (classification), MAE within 2%
//! (regression), Dice within 0.01 (segmentation).

use std::path::Path;

use kiln_data::{Dataset, TargetSlot, TargetSpec};

use crate::InferError;
use crate::onnx::{OnnxEngine, OnnxOptions};

/// Samples per batch in the comparison.
const BATCH: usize = 64;
/// The most samples of the dataset the comparison reads (the first ones).
pub const MAX_SAMPLES: usize = 10_000;

/// The metric the two models are compared by, from the dataset's target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// One class per sample: the share right (arg-max of the scores).
    Accuracy,
    /// A class per element (a segmentation): the foreground Dice score.
    Dice,
    /// Values: the mean absolute error.
    Mae,
}

impl Judged {
    pub fn of(target: &TargetSpec) -> Self {
        match target {
            TargetSpec::Classes { shape, .. } if shape.is_empty() => Self::Accuracy,
            TargetSpec::Classes { .. } => Self::Dice,
            TargetSpec::Values { .. } => Self::Mae,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Accuracy => "accuracy",
            Self::Dice => "Dice score",
            Self::Mae => "mean absolute error",
        }
    }

    /// The limit an int8 model must keep to.
    pub fn limit(self) -> &'static str {
        match self {
            Self::Accuracy => "at most 1 point below fp32's accuracy",
            Self::Dice => "at most 0.01 below fp32's Dice",
            Self::Mae => "at most 2% above fp32's MAE",
        }
    }

    pub fn passes(self, fp32: f64, int8: f64) -> bool {
        match self {
            Self::Accuracy | Self::Dice => int8 >= fp32 - 0.01,
            Self::Mae => int8 <= fp32 * 1.02,
        }
    }

    /// A batch's sums: (right, judged) for accuracy, (|error|, elements) for MAE, (overlap,
    /// predicted, actual) foreground elements for Dice.
    fn sums(self, out: &[f32], shape: &[usize], targets: &[f64]) -> Result<[f64; 3], String> {
        let rows = shape.first().copied().unwrap_or(0);
        let classes = shape.get(1).copied().unwrap_or(1).max(1);
        let per = shape.get(2..).map_or(1, |s| s.iter().product::<usize>());
        let expected = match self {
            Self::Mae => out.len(),
            Self::Accuracy => rows,
            Self::Dice => rows * per,
        };
        if targets.len() != expected || out.len() != rows * classes * per {
            return Err(format!(
                "the model's output {shape:?} does not fit {} targets for its {}",
                targets.len(),
                self.name()
            ));
        }
        let class_of = |row: usize, at: usize| {
            (0..classes)
                .max_by(|&a, &b| {
                    out[(row * classes + a) * per + at]
                        .total_cmp(&out[(row * classes + b) * per + at])
                })
                .unwrap_or(0) as f64
        };
        let mut s = [0.0; 3];
        for (k, &t) in targets.iter().enumerate() {
            match self {
                Self::Mae => (s[0], s[1]) = (s[0] + (f64::from(out[k]) - t).abs(), s[1] + 1.0),
                Self::Accuracy => {
                    (s[0], s[1]) = (s[0] + f64::from(class_of(k, 0) == t), s[1] + 1.0)
                }
                Self::Dice => {
                    let p = class_of(k / per, k % per);
                    s[0] += f64::from(p == t && t != 0.0);
                    s[1] += f64::from(p != 0.0);
                    s[2] += f64::from(t != 0.0);
                }
            }
        }
        Ok(s)
    }

    fn value(self, s: [f64; 3]) -> f64 {
        match self {
            Self::Dice => 2.0 * s[0] / (s[1] + s[2]).max(1.0),
            _ => s[0] / s[1].max(1.0),
        }
    }
}

/// How the int8 model compared with the fp32 one.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub metric: Judged,
    pub fp32: f64,
    pub int8: f64,
    pub samples: usize,
    /// What the quantizer said (its JSON line).
    pub quantizer: String,
}

/// Quantizes the fp32 ONNX file `fp32` (a model taking samples of `sample_shape`) to int8,
/// compares both on the first [`MAX_SAMPLES`] samples of `data` (named `data_name` in errors)
/// and publishes the int8 file as `out` if it passes; an existing `out` is never touched.
pub fn to_int8(
    fp32: &Path,
    out: &Path,
    sample_shape: &[usize],
    data: &dyn Dataset,
    data_name: &str,
) -> Result<Comparison, InferError> {
    crate::export::check_target(out)?;
    if data.sample_shape() != sample_shape {
        return Err(InferError::Input(format!(
            "{data_name} holds samples of shape {:?}; the model takes {sample_shape:?}",
            data.sample_shape()
        )));
    }
    let staging = crate::export::staging_path(out);
    let result = (|| {
        let quantizer = crate::onnx::python::quantize(fp32, &staging)?;
        let (metric, [a, b], samples) = compare([fp32, &staging], sample_shape, data)?;
        if !metric.passes(a, b) {
            return Err(InferError::Quantization {
                data: data_name.to_owned(),
                samples,
                metric: metric.name(),
                fp32: a,
                int8: b,
                limit: metric.limit(),
            });
        }
        crate::export::publish(&staging, out)?;
        Ok(Comparison {
            metric,
            fp32: a,
            int8: b,
            samples,
            quantizer,
        })
    })();
    let _ = std::fs::remove_file(&staging);
    result
}

/// Runs both ONNX files on `data`'s first samples; returns the metric, its value for each and
/// the samples read.
fn compare(
    files: [&Path; 2],
    sample_shape: &[usize],
    data: &dyn Dataset,
) -> Result<(Judged, [f64; 2], usize), InferError> {
    let options = OnnxOptions {
        max_batch: BATCH,
        threads: usize::try_from(tch::get_num_threads()).unwrap_or(1),
        device: tch::Device::Cpu,
        input_shape: Some(sample_shape.to_vec()),
    };
    let mut engines = [
        OnnxEngine::open(files[0], &options)?,
        OnnxEngine::open(files[1], &options)?,
    ];
    let target = data.target();
    let metric = Judged::of(&target);
    let n = data.len().min(MAX_SAMPLES);
    let (numel, per) = (data.sample_numel(), target.numel());
    let mut sums = [[0.0; 3]; 2];
    for start in (0..n).step_by(BATCH) {
        let indices: Vec<usize> = (start..(start + BATCH).min(n)).collect();
        let mut x = vec![0.0f32; indices.len() * numel];
        let targets = read_targets(data, &target, &indices, &mut x, per)?;
        for (engine, s) in engines.iter_mut().zip(&mut sums) {
            let (out, per_sample) = engine.run(&x, indices.len())?;
            let shape: Vec<usize> = std::iter::once(indices.len()).chain(per_sample).collect();
            let batch = metric
                .sums(&out, &shape, &targets)
                .map_err(InferError::Input)?;
            s.iter_mut().zip(batch).for_each(|(a, b)| *a += b);
        }
    }
    Ok((metric, sums.map(|s| metric.value(s)), n))
}

/// Reads the samples at `indices` into `x` and returns their targets as numbers.
fn read_targets(
    data: &dyn Dataset,
    target: &TargetSpec,
    indices: &[usize],
    x: &mut [f32],
    per: usize,
) -> Result<Vec<f64>, InferError> {
    Ok(match target {
        TargetSpec::Classes { .. } => {
            let mut t = vec![0i64; indices.len() * per];
            data.read_batch(indices, x, TargetSlot::Classes(&mut t))?;
            t.into_iter().map(|v| v as f64).collect()
        }
        TargetSpec::Values { .. } => {
            let mut t = vec![0.0f32; indices.len() * per];
            data.read_batch(indices, x, TargetSlot::Values(&mut t))?;
            t.into_iter().map(f64::from).collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_task_is_judged_by_its_metric_and_limit() {
        // Two samples of three classes: the first right, the second wrong.
        let acc = Judged::Accuracy;
        let s = acc
            .sums(&[0.1, 0.9, 0.0, 1.0, 0.0, 0.5], &[2, 3], &[1.0, 2.0])
            .unwrap();
        assert_eq!(acc.value(s), 0.5);
        assert!(acc.passes(0.5, 0.491) && !acc.passes(0.5, 0.489));
        // A class map of 2 classes over 3 voxels: predicted [1, 0, 1], actual [1, 1, 0].
        let dice = Judged::Dice;
        let scores = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0];
        let s = dice.sums(&scores, &[1, 2, 3], &[1.0, 1.0, 0.0]).unwrap();
        assert_eq!(s, [1.0, 2.0, 2.0]);
        assert_eq!(dice.value(s), 0.5);
        let mae = Judged::Mae;
        let s = mae.sums(&[1.0, 3.0], &[2, 1], &[2.0, 2.0]).unwrap();
        assert_eq!(mae.value(s), 1.0);
        assert!(mae.passes(1.0, 1.019) && !mae.passes(1.0, 1.021));
        assert!(acc.sums(&[0.0; 6], &[2, 3], &[1.0]).is_err());
        assert_eq!(Judged::of(&TargetSpec::label(3)), Judged::Accuracy);
    }
}
