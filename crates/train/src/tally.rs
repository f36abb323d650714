//! Running sums of a run's loss and metrics over some steps (a log interval, an epoch): kept
//! on the device so that steps never wait for the host, read (one synchronisation) when
//! reported, and saved in checkpoints so that a resumed run reports what an uninterrupted one
//! would.

use tch::{Device, Kind, Tensor};

use crate::TrainError;
use crate::loss::{BatchSums, MetricKind, sums_len};

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

impl Metrics {
    /// The values by metric name (`val_loss`, `val_accuracy`, `val_mae`, `val_rmse`; those the
    /// task has), as checkpoints record them.
    pub fn named(&self) -> std::collections::BTreeMap<String, f64> {
        use kiln_config::MetricName as M;
        [
            (M::Loss, Some(self.loss)),
            (M::Accuracy, self.accuracy),
            (M::Mae, self.mae),
            (M::Rmse, self.rmse),
        ]
        .into_iter()
        .filter_map(|(name, v)| Some((name.as_str().to_owned(), v?)))
        .collect()
    }
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

/// Sums on the device (f64, laid out as [`crate::loss::BatchSums`] for the tally's metric)
/// and counts on the host.
#[derive(Debug)]
pub struct Tally {
    metric: MetricKind,
    sums: Tensor,
    samples: u64,
    judged: u64,
}

impl Tally {
    /// An empty tally of `metric`'s sums on `device`.
    pub fn new(metric: MetricKind, device: Device) -> Result<Self, TrainError> {
        Ok(Self {
            metric,
            sums: Tensor::f_zeros([sums_len(metric)], (Kind::Double, device))?,
            samples: 0,
            judged: 0,
        })
    }

    /// A tally continuing `saved`.
    pub fn restore(saved: Saved, metric: MetricKind, device: Device) -> Result<Self, TrainError> {
        let values: Vec<f64> = match metric {
            MetricKind::Accuracy => vec![saved.loss, saved.correct],
            MetricKind::Regression => vec![saved.loss, saved.abs_err, saved.sq_err],
            MetricKind::LossOnly => vec![saved.loss],
        };
        Ok(Self {
            metric,
            sums: Tensor::f_from_slice(&values)?.f_to_device(device)?,
            samples: saved.samples,
            judged: saved.judged as u64,
        })
    }

    /// Adds the sums of `samples` samples.
    pub fn add(&mut self, sums: &BatchSums, samples: u64) -> Result<(), TrainError> {
        self.sums = self.sums.f_add(&sums.values)?;
        self.samples += samples;
        self.judged += sums.judged;
        Ok(())
    }

    /// Adds another tally and empties it.
    pub fn absorb(&mut self, other: &mut Tally) -> Result<(), TrainError> {
        self.sums = self.sums.f_add(&other.sums)?;
        self.samples += other.samples;
        self.judged += other.judged;
        *other = Tally::new(other.metric, other.sums.device())?;
        Ok(())
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The sums as numbers (synchronises).
    pub fn saved(&self) -> Result<Saved, TrainError> {
        let v: Vec<f64> = Vec::<f64>::try_from(&self.sums)?;
        let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
        let (correct, abs_err, sq_err) = match self.metric {
            MetricKind::Accuracy => (at(1), 0.0, 0.0),
            MetricKind::Regression => (0.0, at(1), at(2)),
            MetricKind::LossOnly => (0.0, 0.0, 0.0),
        };
        Ok(Saved {
            loss: at(0),
            correct,
            judged: self.judged as f64,
            abs_err,
            sq_err,
            samples: self.samples,
        })
    }

    /// The metrics of the tally's kind (synchronises).
    pub fn read(&self) -> Result<Metrics, TrainError> {
        Ok(self.saved()?.metrics(self.metric))
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
