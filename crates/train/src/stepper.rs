//! The train step alone, on batches the caller holds: kiln's step (forward, loss, backward,
//! fused AdamW at a constant learning rate, no clipping) without its loader, schedule, logging or
//! checkpoints. For measuring the step (benchmarks, `profile-model`-like tools) and for loops
//! that are not kiln's; a run of kiln's own is [`crate::learner::Learner`].

use kiln_config::{CudaGraphs, OptimizerKind, ScheduleKind};
use kiln_data::TargetSpec;
use kiln_device::settings::AmpDtype;
use tch::{Device, Tensor, nn};

use crate::error::TrainError;
use crate::feed::DeviceBatch;
use crate::metrics::MetricValues;
use crate::model::Model;
use crate::trainer::{TrainSettings, Trainer};

pub use crate::trainer::PhaseTimes;

/// What a [`Stepper`]'s step does: the precision, AdamW's learning rate and weight decay, and
/// whether the step is one CUDA graph (`train.cuda_graphs = on`: an exported program on CUDA).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOptions {
    pub precision: AmpDtype,
    pub lr: f64,
    pub weight_decay: f64,
    pub cuda_graphs: bool,
}

impl StepOptions {
    /// kiln's defaults at `precision`: lr 1e-3, weight decay 0.01, no CUDA graph.
    pub fn new(precision: AmpDtype) -> Self {
        Self {
            precision,
            lr: 1e-3,
            weight_decay: 0.01,
            cuda_graphs: false,
        }
    }

    fn settings(&self) -> TrainSettings {
        TrainSettings {
            epochs: 1,
            precision: self.precision,
            optimizer: OptimizerKind::AdamW,
            lr: self.lr,
            weight_decay: self.weight_decay,
            clip_grad_norm: 0.0,
            schedule: ScheduleKind::Constant,
            warmup_steps: 0,
            log_interval: 1,
            cuda_graphs: if self.cuda_graphs {
                CudaGraphs::On
            } else {
                CudaGraphs::Off
            },
            ..TrainSettings::default()
        }
    }
}

/// kiln's train step over `model`'s parameters in `vs`, one batch at a time.
pub struct Stepper<'m> {
    trainer: Trainer<'m>,
    lr: f64,
    steps: usize,
}

impl std::fmt::Debug for Stepper<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stepper")
            .field("lr", &self.lr)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl<'m> Stepper<'m> {
    /// A step for `model` (named `name` in errors) on `device`. The loss is cross-entropy
    /// until [`Stepper::set_target`] says otherwise. With `cuda_graphs`, what cannot be one
    /// graph is refused here, naming why.
    pub fn new(
        model: &'m dyn Model,
        name: &str,
        vs: &'m nn::VarStore,
        options: &StepOptions,
        device: Device,
    ) -> Result<Self, TrainError> {
        let mut trainer = Trainer::new(model, name, vs, options.settings(), device)?;
        trainer.plan_cuda_graph()?;
        Ok(Self {
            trainer,
            lr: options.lr,
            steps: 0,
        })
    }

    /// The targets the batches hold (the loss follows from them, as in a run).
    pub fn set_target(&mut self, target: &TargetSpec) -> Result<(), TrainError> {
        self.trainer.set_target(target)
    }

    /// One step on `features` and `targets` (on the step's device); returns the batch's mean
    /// loss, read back from the device as a logging loop reads it (one synchronisation).
    pub fn step(&mut self, features: &Tensor, targets: &Tensor) -> Result<f64, TrainError> {
        let batch = DeviceBatch {
            inputs: crate::inputs::Inputs::features(features.shallow_clone()),
            targets: targets.shallow_clone(),
            indices: vec![],
            number: self.steps,
        };
        self.steps += 1;
        let out = self.trainer.train_step(&[batch], self.lr)?;
        let samples = targets.size().first().copied().unwrap_or(1).max(1);
        Ok(out.sums.values.f_double_value(&[0])? / samples as f64)
    }

    /// Times the steps from now on phase by phase (each phase synchronises the device), or
    /// stops timing them.
    pub fn time_phases(&mut self, on: bool) {
        self.trainer.set_phase_timing(on);
    }

    /// The phases' summed times since [`Stepper::time_phases`] turned timing on.
    pub fn phase_times(&self) -> Option<PhaseTimes> {
        self.trainer.phase_times()
    }

    /// The model in eval mode over `batches` of (features, targets): the run's metrics.
    pub fn evaluate<I>(&self, batches: I) -> Result<MetricValues, TrainError>
    where
        I: IntoIterator<Item = (Tensor, Tensor)>,
    {
        let batches = batches.into_iter().enumerate().map(|(number, (f, t))| {
            Ok(DeviceBatch {
                inputs: crate::inputs::Inputs::features(f),
                targets: t,
                indices: vec![],
                number,
            })
        });
        Ok(self.trainer.evaluate(batches)?.metrics)
    }
}
