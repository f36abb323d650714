//! What a run reports as it goes (start, per-step progress, logged steps, epochs, the summary),
//! and the [`Observer`] trait through which progress bars and run directories receive it.

use serde::Serialize;

use crate::TrainError;
use crate::metrics::MetricValues;
use crate::monitor::MemorySample;

/// Facts fixed at the start of a run.
#[derive(Debug, Clone, Serialize)]
pub struct RunStart {
    pub model: String,
    /// classification, dense classification or regression (the dataset's target).
    pub task: String,
    /// The loss minimised (cross_entropy, mse, …, or module).
    pub loss: String,
    /// The metrics reported, by name (`loss` first; see [`crate::metrics`]).
    pub metrics: Vec<String>,
    pub parameters: usize,
    pub device: String,
    /// fp32, fp16 or bf16.
    pub precision: String,
    pub optimizer: String,
    pub batch_size: u64,
    pub grad_accum_steps: u64,
    pub epochs: u64,
    pub steps_per_epoch: u64,
    pub total_steps: u64,
    pub train_samples: usize,
    pub val_samples: usize,
    /// Where batches come from (CPU zero-copy, pinned side-stream copies, …).
    pub feed: String,
    /// The checkpoint this run continues, and its step.
    pub resumed_from: Option<(std::path::PathBuf, u64)>,
    /// How `train.batch_size = "auto"` arrived at `batch_size` (trials, or the cache).
    pub batch_size_search: Option<String>,
    /// The base learning rate (before warm-up and schedule).
    pub lr: f64,
    /// How `train.lr = "auto"` arrived at `lr` (a range test, the cache, the resumed run).
    pub lr_search: Option<String>,
}

/// A run about to train: its directory (rank 0's; empty on other ranks, which write none) and
/// where its data comes from. Told before the trainer's own start.
#[derive(Debug, Clone, Serialize)]
pub struct RunReady {
    pub run_dir: std::path::PathBuf,
    /// The data, in words ("12,000 samples in data/", "synthetic …").
    pub data: String,
}

/// Cheap per-step progress (no host synchronisation).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Progress {
    pub epoch: u64,
    /// Optimizer steps done in the whole run.
    pub step: u64,
    pub total_steps: u64,
}

/// One logged interval of steps.
#[derive(Debug, Clone, Serialize)]
pub struct StepRecord {
    pub kind: &'static str,
    pub epoch: u64,
    pub step: u64,
    /// Fractional epoch at the end of the interval (for plots).
    pub epoch_progress: f64,
    /// The training metrics over the interval by name (`loss`, and `accuracy` or `mae` and
    /// `rmse`, as the task has them; see [`crate::metrics`]).
    #[serde(flatten)]
    pub metrics: MetricValues,
    pub lr: f64,
    /// The loss scale (fp16 only).
    pub loss_scale: Option<f64>,
    /// Global gradient norm of the last step, before clipping (when clipping is on).
    pub grad_norm: Option<f64>,
    pub step_time_s: f64,
    pub samples_per_s: f64,
    pub data_wait_share: f64,
    /// Steps skipped so far because fp16 gradients overflowed.
    pub skipped_steps: u64,
    pub memory: MemorySample,
}

/// One finished epoch.
#[derive(Debug, Clone, Serialize)]
pub struct EpochRecord {
    pub kind: &'static str,
    pub epoch: u64,
    /// Optimizer steps done when the epoch ended: the step axis its values are plotted on.
    pub step: u64,
    /// The epoch's training metrics by name, written `train_loss`, `train_accuracy`, ….
    #[serde(flatten, serialize_with = "train_")]
    pub train: MetricValues,
    /// The validation metrics by name, written `val_loss`, … (none without validation data).
    #[serde(flatten, serialize_with = "val_")]
    pub val: MetricValues,
    /// The validation metrics of the EMA weights (`train.ema`), written `val_ema_loss`, ….
    #[serde(flatten, serialize_with = "val_ema_")]
    pub val_ema: MetricValues,
    pub seconds: f64,
    pub samples_per_s: f64,
    pub data_wait_share: f64,
    pub memory: MemorySample,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub model: String,
    /// classification, dense classification or regression.
    pub task: String,
    pub loss: String,
    pub parameters: usize,
    pub device: String,
    pub precision: String,
    pub epochs: u64,
    pub steps: u64,
    /// Samples trained, over every rank of a data-parallel run (as `samples_per_s`).
    pub samples: u64,
    pub seconds: f64,
    pub mean_step_time_s: f64,
    pub samples_per_s: f64,
    pub data_wait_share: f64,
    pub skipped_steps: u64,
    /// The last epoch's training metrics, written `final_train_loss`, ….
    #[serde(flatten, serialize_with = "final_train_")]
    pub final_train: MetricValues,
    /// The last validation, written `final_val_loss`, `final_val_accuracy`, ….
    #[serde(flatten, serialize_with = "final_val_")]
    pub final_val: MetricValues,
    /// The last validation of the EMA weights, written `final_val_ema_loss`, ….
    #[serde(flatten, serialize_with = "final_val_ema_")]
    pub final_val_ema: MetricValues,
    /// The best validation value of each metric over the run (the highest accuracy, the lowest
    /// loss, …), written `best_val_accuracy`, ….
    #[serde(flatten, serialize_with = "best_val_")]
    pub best_val: MetricValues,
    /// Accuracy a model guessing uniformly would get (classification).
    pub chance_accuracy: Option<f64>,
    pub memory: MemorySample,
    /// Steps retried in smaller micro-batches after running out of memory.
    pub oom_retries: u64,
    /// The profiler traces written (`runs/<run>/profiler_traces/…`).
    pub profiler_traces: Vec<std::path::PathBuf>,
    /// `data.num_workers = auto`: the mean whole step per worker count tried, and the count
    /// kept (absent for a fixed count).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_workers_auto: Option<crate::workers::WorkerChoice>,
    /// Why the run ended before its epochs (`train.max_steps`, `train.max_time`, early
    /// stopping), if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<crate::stopping::StopReason>,
}

/// Metric values written behind their prefix in records (`train_loss`, `val_accuracy`, …).
macro_rules! under {
    ($($f:ident => $prefix:literal),+) => {$(
        fn $f<S: serde::Serializer>(v: &MetricValues, s: S) -> Result<S::Ok, S::Error> {
            v.serialize_under($prefix, s)
        }
    )+};
}

under!(train_ => "train_", val_ => "val_", val_ema_ => "val_ema_",
    final_train_ => "final_train_", final_val_ => "final_val_",
    final_val_ema_ => "final_val_ema_", best_val_ => "best_val_");

/// Receives a run's reports. Every method has a do-nothing default; an error stops the run.
pub trait Observer {
    fn on_ready(&mut self, _ready: &RunReady) -> Result<(), TrainError> {
        Ok(())
    }
    fn on_start(&mut self, _start: &RunStart) -> Result<(), TrainError> {
        Ok(())
    }
    fn on_step(&mut self, _progress: &Progress) -> Result<(), TrainError> {
        Ok(())
    }
    fn on_log(&mut self, _record: &StepRecord) -> Result<(), TrainError> {
        Ok(())
    }
    fn on_epoch(&mut self, _record: &EpochRecord) -> Result<(), TrainError> {
        Ok(())
    }
    fn on_finish(&mut self, _summary: &Summary) -> Result<(), TrainError> {
        Ok(())
    }
}

/// An observer that ignores everything.
#[derive(Debug, Default)]
pub struct Silent;

impl Observer for Silent {}

/// Several observers, called in order.
#[derive(Default)]
pub struct Observers<'a>(pub Vec<&'a mut dyn Observer>);

impl std::fmt::Debug for Observers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Observers({})", self.0.len())
    }
}

impl Observer for Observers<'_> {
    fn on_ready(&mut self, ready: &RunReady) -> Result<(), TrainError> {
        self.0.iter_mut().try_for_each(|o| o.on_ready(ready))
    }
    fn on_start(&mut self, start: &RunStart) -> Result<(), TrainError> {
        self.0.iter_mut().try_for_each(|o| o.on_start(start))
    }
    fn on_step(&mut self, progress: &Progress) -> Result<(), TrainError> {
        self.0.iter_mut().try_for_each(|o| o.on_step(progress))
    }
    fn on_log(&mut self, record: &StepRecord) -> Result<(), TrainError> {
        self.0.iter_mut().try_for_each(|o| o.on_log(record))
    }
    fn on_epoch(&mut self, record: &EpochRecord) -> Result<(), TrainError> {
        self.0.iter_mut().try_for_each(|o| o.on_epoch(record))
    }
    fn on_finish(&mut self, summary: &Summary) -> Result<(), TrainError> {
        self.0.iter_mut().try_for_each(|o| o.on_finish(summary))
    }
}
