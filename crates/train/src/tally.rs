//! Running sums of a run's loss and metrics over some steps (a log interval, an epoch): kept
//! on the device so that steps never wait for the host, read (one synchronisation) when
//! reported, and saved in checkpoints so that a resumed run reports what an uninterrupted one
//! would.

use tch::{Device, Kind, Tensor};

use crate::TrainError;
use crate::loss::MetricKind;

/// Loss and metrics over some samples.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Metrics {
    /// Mean loss per sample.
    pub loss: f64,
    /// Share of target elements right (classification, dense or multi-label).
    pub accuracy: Option<f64>,
    /// Mean absolute error per target element (regression).
    pub mae: Option<f64>,
    /// Root-mean-square error per target element (regression).
    pub rmse: Option<f64>,
}

/// The sums behind [`Metrics`], as plain numbers (for checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Saved {
    pub loss: f64,
    pub correct: f64,
    /// Target elements an accuracy or error was measured on.
    pub judged: f64,
    pub abs_err: f64,
    pub sq_err: f64,
    pub samples: u64,
}

/// Sums on the device (f64 `[loss × samples, right, judged, |error|, error²]`, see
/// [`crate::loss::batch_sums`]) and the sample count on the host.
#[derive(Debug)]
pub struct Tally {
    sums: Tensor,
    samples: u64,
}

impl Tally {
    /// An empty tally on `device`.
    pub fn new(device: Device) -> Result<Self, TrainError> {
        Ok(Self {
            sums: Tensor::f_zeros([5], (Kind::Double, device))?,
            samples: 0,
        })
    }

    /// A tally continuing `saved`.
    pub fn restore(saved: Saved, device: Device) -> Result<Self, TrainError> {
        let values = [
            saved.loss,
            saved.correct,
            saved.judged,
            saved.abs_err,
            saved.sq_err,
        ];
        Ok(Self {
            sums: Tensor::f_from_slice(&values)?.f_to_device(device)?,
            samples: saved.samples,
        })
    }

    /// Adds the sums of `samples` samples (from [`crate::loss::batch_sums`]).
    pub fn add(&mut self, sums: &Tensor, samples: u64) -> Result<(), TrainError> {
        self.sums = self.sums.f_add(sums)?;
        self.samples += samples;
        Ok(())
    }

    /// Adds another tally and empties it.
    pub fn absorb(&mut self, other: &mut Tally) -> Result<(), TrainError> {
        self.add(&other.sums, other.samples)?;
        let _ = other.sums.f_zero_()?;
        other.samples = 0;
        Ok(())
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The sums as numbers (synchronises).
    pub fn saved(&self) -> Result<Saved, TrainError> {
        let v: Vec<f64> = Vec::<f64>::try_from(&self.sums)?;
        let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
        Ok(Saved {
            loss: at(0),
            correct: at(1),
            judged: at(2),
            abs_err: at(3),
            sq_err: at(4),
            samples: self.samples,
        })
    }

    /// The metrics `metric` reports (synchronises).
    pub fn read(&self, metric: MetricKind) -> Result<Metrics, TrainError> {
        Ok(self.saved()?.metrics(metric))
    }
}

impl Saved {
    /// Mean loss and the metrics of kind `metric` (none where no element could be judged).
    pub fn metrics(&self, metric: MetricKind) -> Metrics {
        let n = self.samples.max(1) as f64;
        let e = self.judged;
        let (accuracy, mae, rmse) = match metric {
            _ if e <= 0.0 => (None, None, None),
            MetricKind::Accuracy => (Some(self.correct / e), None, None),
            MetricKind::Regression => {
                (None, Some(self.abs_err / e), Some((self.sq_err / e).sqrt()))
            }
            MetricKind::LossOnly => (None, None, None),
        };
        Metrics {
            loss: self.loss / n,
            accuracy,
            mae,
            rmse,
        }
    }
}
