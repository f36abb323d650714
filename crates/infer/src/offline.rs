//! Offline inference (`kiln infer`): every input through the engine in batches of the
//! inference batch size, with per-batch latency percentiles and throughput, the task's metrics
//! where the inputs have targets (accuracy, per element for class maps; MAE and RMSE), and, at
//! reduced precision, the largest deviation from an fp32 run of the same model on the same
//! inputs.

use std::time::Instant;

use kiln_data::Targets;
use serde::Serialize;

use crate::InferError;
use crate::engine::Runner;
use crate::io::Inputs;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (any order); zeros when empty.
    pub fn of(samples: &[f64]) -> Self {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            let rank = (q * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1]
        };
        Self {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            max: sorted.last().copied().unwrap_or(0.0),
        }
    }
}

/// How far reduced-precision outputs are from fp32 ones.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Deviation {
    /// The largest absolute difference of any output value.
    pub max_abs: f64,
    /// The largest fp32 output magnitude, for scale.
    pub max_reference: f64,
    /// The share of samples whose arg-max output agrees (classifiers).
    pub argmax_agreement: f64,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub model: String,
    pub inputs: String,
    pub samples: usize,
    pub batches: usize,
    pub batch_size: usize,
    pub precision: String,
    /// Which engine ran ("libtorch", "onnxruntime 1.31.1 (CPU build), …", an automatic choice).
    pub engine: String,
    pub cuda_graphs: String,
    pub output_shape: Vec<usize>,
    /// Samples per second over the timed batches (the warm-up batch excluded).
    pub samples_per_second: f64,
    /// Per-batch latency (host to host, outputs on the host).
    pub batch_latency_ms: Percentiles,
    /// Arg-max accuracy where the inputs have class targets (per element for class maps).
    pub accuracy: Option<f64>,
    /// Mean absolute and root-mean-square error where the inputs have value targets and the
    /// outputs their shape.
    pub mae: Option<f64>,
    pub rmse: Option<f64>,
    /// Against fp32, when run at reduced precision.
    pub deviation_from_fp32: Option<Deviation>,
}

/// The outputs and the report of a run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// `samples × output numel` values.
    pub outputs: Vec<f32>,
    /// `[samples, …output]`.
    pub shape: Vec<usize>,
    pub report: Report,
}

/// Every sample of `inputs` through `engine` (one untimed warm-up batch first). With
/// `reference` (the same model in fp32), also measures the deviation from it.
pub fn run(
    engine: &mut dyn Runner,
    reference: Option<&mut dyn Runner>,
    inputs: &Inputs,
    precision: &str,
) -> Result<Outcome, InferError> {
    if inputs.sample_shape != engine.sample_shape() {
        return Err(InferError::Input(format!(
            "{} has samples of shape {:?}; {} takes {:?}",
            inputs.description,
            inputs.sample_shape,
            engine.description(),
            engine.sample_shape()
        )));
    }
    let batch = engine.max_batch();
    let first = batch.min(inputs.len);
    engine.run(inputs.slice(0, first), first)?;

    let mut outputs = Vec::new();
    let mut out_shape = Vec::new();
    let mut latencies = Vec::new();
    let started = Instant::now();
    let mut start = 0;
    while start < inputs.len {
        let n = batch.min(inputs.len - start);
        let t = Instant::now();
        let (values, shape) = engine.run(inputs.slice(start, n), n)?;
        latencies.push(t.elapsed().as_secs_f64() * 1e3);
        outputs.extend_from_slice(&values);
        out_shape = shape;
        start += n;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let per: usize = out_shape.iter().product();

    let (accuracy, mae, rmse) = match &inputs.targets {
        Some(t) => task_metrics(&outputs, per, t),
        None => (None, None, None),
    };

    let deviation = match reference {
        Some(reference) => {
            let mut max_abs = 0f64;
            let mut max_reference = 0f64;
            let mut agree = 0usize;
            let mut start = 0;
            while start < inputs.len {
                let n = batch.min(inputs.len - start).min(reference.max_batch());
                let (want, _) = reference.run(inputs.slice(start, n), n)?;
                let got = &outputs[start * per..(start + n) * per];
                for (a, b) in got.iter().zip(&want) {
                    max_abs = max_abs.max(f64::from((a - b).abs()));
                    max_reference = max_reference.max(f64::from(b.abs()));
                }
                if per > 0 {
                    agree += got
                        .chunks_exact(per)
                        .zip(want.chunks_exact(per))
                        .filter(|(g, w)| argmax(g) == argmax(w))
                        .count();
                }
                start += n;
            }
            Some(Deviation {
                max_abs,
                max_reference,
                argmax_agreement: agree as f64 / inputs.len as f64,
            })
        }
        None => None,
    };

    let mut shape = vec![inputs.len];
    shape.extend_from_slice(&out_shape);
    Ok(Outcome {
        outputs,
        shape,
        report: Report {
            model: engine.description(),
            inputs: inputs.description.clone(),
            samples: inputs.len,
            batches: latencies.len(),
            batch_size: batch,
            precision: precision.to_owned(),
            engine: engine.engine(),
            cuda_graphs: engine.cuda_graphs(),
            output_shape: out_shape,
            samples_per_second: inputs.len as f64 / elapsed.max(1e-9),
            batch_latency_ms: Percentiles::of(&latencies),
            accuracy,
            mae,
            rmse,
            deviation_from_fp32: deviation,
        },
    })
}

/// The metrics of `outputs` (`per` values per sample) against `targets`: accuracy for class
/// targets (the arg-max over the classes, which come first in each sample's output, as
/// `[classes, …target shape]`), MAE and RMSE for values when the outputs have their shape.
fn task_metrics(
    outputs: &[f32],
    per: usize,
    targets: &crate::io::InputTargets,
) -> (Option<f64>, Option<f64>, Option<f64>) {
    let e = targets.spec.numel().max(1);
    match &targets.values {
        Targets::Classes(classes) if per > e && per.is_multiple_of(e) => {
            let c = per / e;
            let right = outputs
                .chunks_exact(per)
                .zip(classes.chunks_exact(e))
                .flat_map(|(row, want)| {
                    (0..e).map(move |p| {
                        let scores = (0..c).map(|k| row[k * e + p]);
                        let best = scores
                            .enumerate()
                            .max_by(|a, b| a.1.total_cmp(&b.1))
                            .map_or(0, |(k, _)| k);
                        best as i64 == want[p]
                    })
                })
                .filter(|&ok| ok)
                .count();
            (Some(right as f64 / classes.len().max(1) as f64), None, None)
        }
        Targets::Values(values) if per == e => {
            let n = values.len().max(1) as f64;
            let (abs, sq) = outputs
                .iter()
                .zip(values)
                .fold((0.0, 0.0), |(a, s), (o, v)| {
                    let d = f64::from(o - v);
                    (a + d.abs(), s + d * d)
                });
            (None, Some(abs / n), Some((sq / n).sqrt()))
        }
        _ => (None, None, None),
    }
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = Percentiles::of(&samples);
        assert_eq!((p.p50, p.p95, p.p99, p.max), (50.0, 95.0, 99.0, 100.0));
        let one = Percentiles::of(&[7.0]);
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
        assert_eq!(Percentiles::of(&[]).max, 0.0);
    }
}
