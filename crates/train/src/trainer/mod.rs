//! The trainer: one optimizer step (gather `grad_accum_steps` micro-batches — forward under
//! autocast, loss, scaled backward — then unscale/check, clip, step, update the loss scale,
//! clear gradients), out-of-memory retries, validation, and checkpoint save/restore. The loop
//! over epochs and steps that drives it is in [`fit`](self::fit).

mod fit;
mod graph;

use std::sync::Arc;
use std::time::Instant;

use kiln_config::keys;
use kiln_config::{
    CheckpointPlan, CudaGraphs, EarlyStoppingPlan, EmaPlan, LossKind, LossScalePlan, OptimizerKind,
    ProfilingPlan, ScheduleKind, TrainPlan,
};
use kiln_data::{Dataset, LoaderConfig, TargetSpec};
use kiln_device::settings::AmpDtype;
use kiln_torch_ext::autocast::{AutocastDtype, AutocastGuard, DeviceType};
use kiln_torch_ext::optim::{AdamWConfig, SgdConfig, clip_grad_norm};
use kiln_torch_ext::profiler::Range;
use tch::{Device, Kind, Tensor, nn};

use crate::TrainError;
use crate::checkpoint::{self, Checkpoint, RunningSums};
use crate::distributed::{self, SharedGroup};
use crate::feed::DeviceBatch;
use crate::inputs::Inputs;
use crate::loss::Loss;
use crate::metrics::{BatchSums, MetricKind, MetricSet, MetricValues, Tally};
use crate::model::{CompiledStep, Model};
use crate::optim::{Optimizer, Rule, param_groups};
use crate::scaler::LossScaler;

/// How to train, independent of where the values came from.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSettings {
    pub epochs: u64,
    pub precision: AmpDtype,
    pub optimizer: OptimizerKind,
    pub lr: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub grad_accum_steps: u64,
    /// 0 = no clipping.
    pub clip_grad_norm: f64,
    pub schedule: ScheduleKind,
    pub warmup_steps: u64,
    pub min_lr: f64,
    pub loss_scale: LossScalePlan,
    pub log_interval: u64,
    /// Return cached GPU memory every N steps; 0 = never.
    pub empty_cache_interval: u64,
    /// Stop after this many consecutive steps with non-finite gradients.
    pub max_bad_steps: u64,
    /// The loss (`Auto`: from the dataset's target).
    pub loss: LossKind,
    /// Replay a compiled step as one CUDA graph ([`Trainer::plan_cuda_graph`]).
    pub cuda_graphs: CudaGraphs,
    /// `train.max_steps` and `train.max_time`.
    pub limits: crate::stopping::Limits,
    pub early_stopping: EarlyStoppingPlan,
    /// `train.ema`: an average of the weights, evaluated and checkpointed beside them.
    pub ema: EmaPlan,
}

impl Default for TrainSettings {
    /// kiln's built-in defaults (what `kiln config` shows before a profile or the user changes
    /// them): 3 epochs of fused AdamW at lr 1e-3, weight decay 0.01, cosine decay after 50
    /// warm-up steps, clipping at 1.0, fp32, the loss from the dataset's target.
    fn default() -> Self {
        Self {
            epochs: 3,
            precision: AmpDtype::None,
            optimizer: OptimizerKind::AdamW,
            lr: 1e-3,
            weight_decay: 0.01,
            momentum: 0.9,
            grad_accum_steps: 1,
            clip_grad_norm: 1.0,
            schedule: ScheduleKind::Cosine,
            warmup_steps: 50,
            min_lr: 0.0,
            loss_scale: LossScalePlan {
                init: 65536.0,
                growth: 2.0,
                backoff: 0.5,
                growth_interval: 2000,
            },
            log_interval: 50,
            empty_cache_interval: 0,
            max_bad_steps: 10,
            loss: LossKind::Auto,
            cuda_graphs: CudaGraphs::Off,
            limits: crate::stopping::Limits::default(),
            early_stopping: EarlyStoppingPlan::default(),
            ema: EmaPlan::default(),
        }
    }
}

impl TrainSettings {
    pub fn from_plan(plan: &TrainPlan, empty_cache_interval: u64) -> Self {
        Self {
            epochs: plan.epochs,
            precision: plan.amp,
            optimizer: plan.optimizer,
            lr: plan.lr,
            weight_decay: plan.weight_decay,
            momentum: plan.momentum,
            grad_accum_steps: plan.grad_accum_steps.max(1),
            clip_grad_norm: plan.clip_grad_norm,
            schedule: plan.schedule,
            warmup_steps: plan.warmup_steps,
            min_lr: plan.min_lr,
            loss_scale: plan.loss_scale,
            log_interval: plan.log_interval.max(1),
            empty_cache_interval,
            max_bad_steps: plan.max_bad_steps.max(1),
            loss: plan.loss,
            cuda_graphs: plan.cuda_graphs,
            limits: crate::stopping::Limits {
                max_steps: plan.max_steps,
                max_time: plan.max_time,
            },
            early_stopping: plan.early_stopping,
            ema: plan.ema,
        }
    }
}

/// fp32, fp16 or bf16: the precision's one spelling, as configuration and reports print it.
pub fn precision_name(p: AmpDtype) -> &'static str {
    p.as_str()
}

/// What one optimizer step did.
#[derive(Debug)]
pub struct StepOutcome {
    /// The step's metric sums (see [`crate::metrics::BatchSums`]; the first value on the device
    /// is the loss × samples).
    pub sums: BatchSums,
    pub samples: u64,
    /// Global gradient norm before clipping, when clipping is on.
    pub grad_norm: Option<Tensor>,
}

/// Wall time spent in each phase of the train steps since timing was turned on
/// ([`Trainer::set_phase_timing`]), for benchmarks' step breakdowns. Each phase ends with a
/// device synchronisation while timing is on, so on a GPU the times are the work's, not its
/// launch's (and steps run a little slower than untimed).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    pub forward: std::time::Duration,
    pub backward: std::time::Duration,
    /// Unscale/check, clip, the optimizer step, the scale update and clearing gradients.
    pub optimizer: std::time::Duration,
    pub steps: u64,
}

/// A phase of a train step, for [`PhaseTimes`].
#[derive(Debug, Clone, Copy)]
enum Phase {
    Forward,
    Backward,
    Optimizer,
}

/// Validation results.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub metrics: MetricValues,
    pub samples: u64,
}

/// The data of a run.
#[derive(Debug)]
pub struct FitData<D: Dataset, V: Dataset> {
    pub train: Arc<D>,
    pub val: Option<Arc<V>>,
    /// With `workers_auto`, `loader.num_workers` is the most the measurement tries.
    pub loader: LoaderConfig,
    /// `data.num_workers = auto`: measure the worker count on the first steps.
    pub workers_auto: bool,
}

/// Where and how a run writes checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointOptions {
    /// `runs/<run>/checkpoints`.
    pub dir: std::path::PathBuf,
    pub plan: CheckpointPlan,
    /// The resolved configuration, stored in each checkpoint.
    pub config: serde_json::Value,
    /// The model's input, stored in each checkpoint for inference.
    pub input: Option<crate::model::InputSpec>,
}

/// Checkpointing, resuming and stopping for [`Trainer::fit`].
#[derive(Debug, Default)]
pub struct FitOptions {
    pub checkpoints: Option<CheckpointOptions>,
    /// On a rank other than 0 of a data-parallel run: the plan rank 0 checkpoints on. This
    /// rank writes nothing, but takes part in each checkpoint inside an epoch (rank 0 saves
    /// every rank's open metric sums, and each rank continues its own on resume).
    pub rank0_checkpoints: Option<kiln_config::CheckpointPlan>,
    /// Continue from this checkpoint (already verified).
    pub resume: Option<Checkpoint>,
    /// Set from a signal handler: finish the current step, checkpoint, stop.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Profile on this schedule, writing traces into `dir`.
    pub profiling: Option<ProfilingOptions>,
    /// How an automatic batch size was found, for the reports.
    pub batch_size_search: Option<String>,
    /// How `train.lr = "auto"` was resolved, for the reports.
    pub lr_search: Option<String>,
    /// The clock of the time limit and time-based checkpoints (`None`: wall time).
    pub clock: Option<crate::stopping::Clock>,
}

/// The profiler's schedule and where its traces go (`runs/<run>/profiler_traces`).
#[derive(Debug, Clone)]
pub struct ProfilingOptions {
    pub plan: ProfilingPlan,
    pub dir: std::path::PathBuf,
}

/// Drives a [`Model`] whose parameters live in a `VarStore`.
pub struct Trainer<'m> {
    model: &'m dyn Model,
    vs: &'m nn::VarStore,
    model_name: String,
    parameters: usize,
    /// The loss and the metrics that go with it (set from the dataset's target by `fit`, or
    /// by [`Trainer::set_target`]).
    loss: Loss,
    metrics: MetricSet,
    /// The classes of class targets, where known (checked against a cross-entropy output).
    classes: Option<usize>,
    device: Device,
    settings: TrainSettings,
    optimizer: Optimizer,
    scaler: Option<LossScaler>,
    autocast: Option<(DeviceType, AutocastDtype)>,
    steps_done: u64,
    health: StepHealth,
    oom: OomRetry,
    /// The loader's batch size in `fit` (recorded in checkpoints).
    batch_size: u64,
    timing: Timing,
    ranks: Ranks,
    /// The step as one CUDA graph, where it is used.
    graph: graph::GraphState,
    /// `train.ema`'s average of the weights, while `fit` runs with one.
    ema: Option<crate::ema::Ema>,
}

/// The steps' health, on the device: whether this step's gradients held an inf or NaN
/// (without a loss scaler), and the bad steps in a row and in all.
struct StepHealth {
    found_inf: Tensor,
    unit: Tensor,
    bad_run: Tensor,
    skipped_total: Tensor,
}

/// Out-of-memory retries: each batch of a step is split into `split` micro-batches (doubled
/// after an out-of-memory error), and how many times a step was retried that way.
struct OomRetry {
    split: u64,
    retries: u64,
    enabled: bool,
}

/// What the profiler and phase timing see: named ranges (only while the profiler records) and
/// per-phase wall times (while phase timing is on).
struct Timing {
    ranges: bool,
    phase_times: Option<std::cell::Cell<PhaseTimes>>,
}

/// The other ranks of a data-parallel run, if any: the group, how gradients are averaged over
/// it, this rank and the world size, and the ranks' vote on stopping started after the
/// previous step (all none with one rank).
#[derive(Default)]
struct Ranks {
    group: Option<SharedGroup>,
    gradient_sync: Option<Box<dyn distributed::GradientSync>>,
    place: Option<(usize, usize)>,
    stop_vote: Option<Box<dyn distributed::StopVote>>,
}

impl std::fmt::Debug for Trainer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("model", &self.model_name)
            .field("device", &self.device)
            .field("settings", &self.settings)
            .field("steps_done", &self.steps_done)
            .finish()
    }
}

fn autocast_for(
    device: Device,
    precision: AmpDtype,
) -> Result<Option<(DeviceType, AutocastDtype)>, TrainError> {
    let dtype = match precision {
        AmpDtype::None => return Ok(None),
        AmpDtype::Fp16 => AutocastDtype::Float16,
        AmpDtype::Bf16 => AutocastDtype::BFloat16,
    };
    let device_type = match device {
        Device::Cpu => DeviceType::Cpu,
        Device::Cuda(_) => DeviceType::Cuda,
        other => {
            return Err(TrainError::InvalidPlan {
                key: keys::train::amp,
                value: precision_name(precision).to_owned(),
                expected: format!(
                    "mixed precision is supported on cpu and cuda, not {other:?}; use none"
                ),
            });
        }
    };
    Ok(Some((device_type, dtype)))
}

fn scalar(t: &Tensor) -> Result<f64, TrainError> {
    Ok(t.f_double_value(&[])?)
}

impl<'m> Trainer<'m> {
    /// A trainer for `model`, whose parameters are `vs`'s trainable variables, on `device`.
    pub fn new(
        model: &'m dyn Model,
        model_name: &str,
        vs: &'m nn::VarStore,
        settings: TrainSettings,
        device: Device,
    ) -> Result<Self, TrainError> {
        let rule = match settings.optimizer {
            OptimizerKind::AdamW => Rule::AdamW(AdamWConfig {
                lr: settings.lr,
                weight_decay: settings.weight_decay,
                ..AdamWConfig::default()
            }),
            OptimizerKind::Sgd => Rule::Sgd(SgdConfig {
                lr: settings.lr,
                momentum: settings.momentum,
                weight_decay: settings.weight_decay,
                ..SgdConfig::default()
            }),
        };
        let groups = param_groups(vs, settings.weight_decay);
        if groups.is_empty() {
            return Err(TrainError::InvalidPlan {
                key: keys::model::name,
                value: model_name.to_owned(),
                expected: "a model with trainable parameters".to_owned(),
            });
        }
        let scaler = match settings.precision {
            AmpDtype::Fp16 => Some(LossScaler::new(settings.loss_scale, device)?),
            _ => None,
        };
        let zero = || Tensor::f_zeros([1], (Kind::Float, device));
        Ok(Self {
            model,
            vs,
            health: StepHealth {
                found_inf: zero()?,
                unit: Tensor::f_ones([1], (Kind::Float, device))?,
                bad_run: zero()?,
                skipped_total: zero()?,
            },
            model_name: model_name.to_owned(),
            parameters: crate::model::parameter_count(vs),
            loss: Loss::before_target(settings.loss),
            metrics: MetricSet::for_task(
                Loss::before_target(settings.loss).metric(&TargetSpec::label(2)),
            ),
            classes: None,
            device,
            autocast: autocast_for(device, settings.precision)?,
            optimizer: Optimizer::new(rule, groups)?,
            scaler,
            settings,
            steps_done: 0,
            oom: OomRetry {
                split: 1,
                retries: 0,
                enabled: true,
            },
            ranks: Ranks::default(),
            batch_size: 0,
            timing: Timing {
                ranges: false,
                phase_times: None,
            },
            graph: graph::GraphState::Unplanned,
            ema: None,
        })
    }

    /// Chooses the loss (`settings.loss`, `auto` by the target's kind) and its metrics for a
    /// dataset whose targets are `target`. `fit` calls it; a program that drives
    /// [`Trainer::train_step`] itself on targets other than class labels calls it first (until
    /// then the trainer assumes class labels: `auto` is cross-entropy).
    pub fn set_target(&mut self, target: &TargetSpec) -> Result<(), TrainError> {
        let loss = Loss::resolve(self.settings.loss, target)?;
        if loss == Loss::Module && !self.model.has_own_loss() {
            return Err(TrainError::InvalidPlan {
                key: keys::train::loss,
                value: "module".to_owned(),
                expected: format!(
                    "a model with a loss of its own, and {} has none (a TorchScript module \
                     needs a `loss(output, target)` method); or use cross_entropy, mse, l1, \
                     huber or bce_with_logits",
                    self.model_name
                ),
            });
        }
        self.loss = loss;
        self.metrics = self.metrics.for_other_task(match self.model.predicts() {
            true => loss.metric(target),
            false => MetricKind::LossOnly,
        })?;
        self.classes = target.classes();
        Ok(())
    }

    /// The loss in use.
    pub fn loss(&self) -> Loss {
        self.loss
    }

    /// The metrics the run reports.
    pub fn metrics(&self) -> &MetricSet {
        &self.metrics
    }

    /// Reports `metric` too, after the task's (see [`crate::metrics::Metric`]); a name taken
    /// already is an error.
    pub fn add_metric(
        &mut self,
        metric: std::sync::Arc<dyn crate::metrics::Metric>,
    ) -> Result<(), TrainError> {
        self.metrics = self.metrics.clone().with(metric)?;
        Ok(())
    }

    /// Judges the model's output as a forecast of `spec`'s horizon: MAE, RMSE and the quantile
    /// loss over the horizon and per step replace the task's metrics (see
    /// [`MetricSet::forecasting`]).
    pub fn set_forecast(
        &mut self,
        spec: std::sync::Arc<crate::metrics::ForecastSpec>,
    ) -> Result<(), TrainError> {
        self.metrics = self.metrics.forecasting(spec)?;
        Ok(())
    }

    /// Turns per-phase timing on (from zero) or off; see [`PhaseTimes`].
    pub fn set_phase_timing(&mut self, on: bool) {
        self.timing.phase_times = on.then(|| std::cell::Cell::new(PhaseTimes::default()));
    }

    /// The phase times so far, while timing is on.
    pub fn phase_times(&self) -> Option<PhaseTimes> {
        self.timing.phase_times.as_ref().map(std::cell::Cell::get)
    }

    /// The start of a timed phase (after the device finished earlier work); `None` when
    /// timing is off.
    fn phase_start(&self) -> Result<Option<Instant>, TrainError> {
        if self.timing.phase_times.is_none() {
            return Ok(None);
        }
        kiln_torch_ext::cuda::synchronize(self.device)?;
        Ok(Some(Instant::now()))
    }

    /// Ends a phase begun by [`Self::phase_start`], adding its time.
    fn phase_end(&self, phase: Phase, start: Option<Instant>) -> Result<(), TrainError> {
        let (Some(cell), Some(start)) = (&self.timing.phase_times, start) else {
            return Ok(());
        };
        kiln_torch_ext::cuda::synchronize(self.device)?;
        let mut t = cell.get();
        let spent = start.elapsed();
        match phase {
            Phase::Forward => t.forward += spent,
            Phase::Backward => t.backward += spent,
            Phase::Optimizer => {
                t.optimizer += spent;
                t.steps += 1;
            }
        }
        cell.set(t);
        Ok(())
    }

    /// A named range for the profiler's trace, when it is recording.
    fn range(&self, name: &str) -> Result<Option<Range>, TrainError> {
        Ok(if self.timing.ranges {
            Some(Range::new(name)?)
        } else {
            None
        })
    }

    /// Trains data-parallel with the ranks of `group`: the ranks check they hold the same
    /// parameters, every rank's weights and buffers become rank 0's now, and each step
    /// averages the gradients over the ranks (on c10d bucket by bucket during the backward of
    /// the step's last micro-batch, as `buckets` says) before the optimizer steps; every rank
    /// then holds the same weights. Out-of-memory retries are off (the ranks would split
    /// their steps differently).
    pub fn set_group(
        &mut self,
        group: SharedGroup,
        buckets: distributed::Buckets,
    ) -> Result<(), TrainError> {
        let tensors: Vec<Tensor> = self.model_tensors().into_iter().map(|(_, t)| t).collect();
        let trainable = self.vs.trainable_variables();
        let mut g = distributed::lock(&group);
        {
            let _guard = tch::no_grad_guard();
            g.start(&trainable, &tensors)?;
        }
        if g.world_size() > 1 {
            // A compiled step returns its gradients as outputs, so autograd hooks (c10d's
            // Reducer) never fire: its gradients are averaged after the step instead.
            self.ranks.gradient_sync = Some(if self.model.compiled_step().is_some() {
                Box::new(distributed::AfterBackward)
            } else {
                g.gradient_sync(&trainable, buckets)?
            });
            self.oom.enabled = false;
        }
        self.ranks.place = Some((g.rank(), g.world_size()));
        drop(g);
        self.ranks.group = Some(group);
        Ok(())
    }

    /// The number of ranks training together (1 outside data-parallel training).
    pub fn world(&self) -> usize {
        self.ranks.place.map_or(1, |(_, world)| world)
    }

    /// This process's rank (0 outside data-parallel training).
    pub fn rank(&self) -> usize {
        self.ranks.place.map_or(0, |(rank, _)| rank)
    }

    /// The metrics of `tally`'s sums over every rank (its own outside data-parallel training;
    /// one host synchronisation).
    pub(crate) fn across_ranks(&self, tally: &Tally) -> Result<MetricValues, TrainError> {
        let (sums, samples) = match &self.ranks.group {
            Some(g) => distributed::sum_over_ranks(g, tally.sums()?, tally.samples())
                .map_err(|e| self.in_ranks("summing the logged metrics", false, e))?,
            None => (tally.sums()?, tally.samples()),
        };
        Ok(self.metrics.values(&sums, samples))
    }

    /// Refuses to continue `ckpt` in the middle of an epoch with another number of ranks than
    /// wrote it (each rank's share of the epoch, and so the place reached, depends on it); from
    /// an epoch's end any number of ranks may continue.
    pub(crate) fn check_resume_world(
        &self,
        ckpt: &crate::checkpoint::Checkpoint,
    ) -> Result<(), TrainError> {
        let saved = ckpt.meta.world_size.unwrap_or(1);
        let world = self.ranks.place.map_or(1, |(_, world)| world as u64);
        if saved == world || ckpt.meta.batch == 0 {
            return Ok(());
        }
        Err(TrainError::InvalidPlan {
            key: "distributed",
            value: format!("{world} rank(s)"),
            expected: format!(
                "{saved} rank(s) to continue {}: it was written in the middle of epoch {} \
                 (after batch {}) by a run of {saved} rank(s), and the ranks' shares of an epoch \
                 depend on their number. Resume with {saved} rank(s), or from an end-of-epoch \
                 checkpoint (any number of ranks)",
                ckpt.dir.display(),
                ckpt.meta.epoch + 1,
                ckpt.meta.batch
            ),
        })
    }

    /// Whether to stop after this step: in a data-parallel run every rank stops at the same
    /// step once any of them was asked to (a signal reaches the ranks at different moments),
    /// so no rank is left waiting in the next step's all-reduce. The ranks vote after each
    /// step and count the votes while the next one runs: a stop asked during step k ends the
    /// run after step k + 1 on every rank. The time limit is voted the same way, since each
    /// rank reads its own clock.
    pub(crate) fn stop_together(
        &mut self,
        votes: distributed::StopVotes,
    ) -> Result<distributed::StopVotes, TrainError> {
        let Some(group) = &self.ranks.group else {
            return Ok(votes);
        };
        if self.ranks.gradient_sync.is_none() {
            return Ok(votes);
        }
        let started = distributed::lock(group).start_stop_vote(votes);
        let vote = started.map_err(|e| self.in_ranks("agreeing on a stop", false, e))?;
        let Some(previous) = self.ranks.stop_vote.replace(vote) else {
            return Ok(distributed::StopVotes::default());
        };
        previous
            .wait()
            .map_err(|e| self.in_ranks("agreeing on a stop", false, e))
    }

    /// `e` named as a failed collective of this rank (see [`distributed::collective_error`]);
    /// outside data-parallel training, `e` itself.
    fn in_ranks(&self, what: &str, backward: bool, e: TrainError) -> TrainError {
        match self.ranks.place {
            Some((rank, world)) => distributed::collective_error(rank, world, what, e, backward),
            None => e,
        }
    }

    /// Averages this step's gradients over the ranks, where that was not done during backward.
    fn sync_gradients(&mut self) -> Result<(), TrainError> {
        let (Some(group), Some(sync)) = (&self.ranks.group, self.ranks.gradient_sync.as_mut())
        else {
            return Ok(());
        };
        let grads: Vec<Tensor> = self
            .vs
            .trainable_variables()
            .iter()
            .map(Tensor::grad)
            .filter(Tensor::defined)
            .collect();
        sync.after_backward(group, &grads)
    }

    /// Whether a step that runs out of memory is retried in micro-batches (on by default;
    /// the batch-size search turns it off to see the failure).
    pub fn set_retry_out_of_memory(&mut self, retry: bool) {
        self.oom.enabled = retry;
    }

    /// Steps retried in smaller micro-batches after running out of memory.
    pub fn oom_retries(&self) -> u64 {
        self.oom.retries
    }

    /// How many micro-batches each batch is split into (1 until memory ran out).
    pub fn micro_batch_split(&self) -> u64 {
        self.oom.split
    }

    pub fn settings(&self) -> &TrainSettings {
        &self.settings
    }

    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    pub fn scaler(&self) -> Option<&LossScaler> {
        self.scaler.as_ref()
    }

    /// Optimizer steps taken so far.
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// Forward and loss under autocast (when on) on the calling thread; returns the loss and
    /// the batch's metric sums.
    fn forward_loss(
        &self,
        inputs: &Inputs,
        targets: &Tensor,
        train: bool,
    ) -> Result<(Tensor, BatchSums), TrainError> {
        // A compiled model has its precision inside its compiled code.
        let _autocast = match self
            .autocast
            .filter(|_| self.model.compiled_step().is_none())
        {
            Some((device, dtype)) => Some(AutocastGuard::new(device, dtype)?),
            None => None,
        };
        let own = match self.model.compiled_step().filter(|_| !train) {
            Some(step) => step.evaluate(inputs, targets)?,
            None => None,
        };
        let (loss, output) = match own {
            Some(pair) => pair,
            None => {
                let output = self.model.forward_inputs(inputs, train)?;
                let loss = self
                    .loss
                    .compute(self.model, &output, targets, self.classes)?;
                (loss, output)
            }
        };
        if loss.numel() != 1 {
            return Err(TrainError::ShapeMismatch {
                what: format!("train.loss = {}", self.loss.name()),
                expected: "a scalar loss".to_owned(),
                got: format!("the loss has shape {:?}", loss.size()),
            });
        }
        let sums = self.metrics.batch_sums(&loss, &output, targets)?;
        Ok((loss.f_view([])?, sums))
    }

    /// One optimizer step over `batches` (micro-batches whose gradients accumulate) at
    /// learning rate `lr`. Each micro-batch's mean loss is weighted by its share of the
    /// step's samples, so k micro-batches of b samples give the gradient of one batch of k·b.
    ///
    /// When memory runs out in forward or backward, the partial gradients are dropped, cached
    /// memory is returned, and the step is retried with every batch split in two (the same
    /// effective batch through accumulation), down to single samples; the split stays for
    /// the rest of the run.
    pub fn train_step(
        &mut self,
        batches: &[DeviceBatch],
        lr: f64,
    ) -> Result<StepOutcome, TrainError> {
        let total: i64 = batches.iter().map(|b| b.targets.size()[0]).sum();
        if total == 0 {
            return Err(TrainError::InvalidPlan {
                key: keys::train::batch_size,
                value: "0".to_owned(),
                expected: "a step needs at least one sample".to_owned(),
            });
        }
        if let Some(outcome) = self.graphed_step(batches, lr)? {
            return Ok(outcome);
        }
        let largest = batches
            .iter()
            .map(|b| b.targets.size()[0])
            .max()
            .unwrap_or(1) as u64;
        loop {
            match self.accumulate(batches, total) {
                Ok(sums) => {
                    self.sync_gradients()
                        .map_err(|e| self.in_ranks("the gradient all-reduce", false, e))?;
                    crate::fault::reached(crate::fault::Point::Step);
                    let grad_norm = {
                        let _range = self.range("kiln/optimizer")?;
                        let start = self.phase_start()?;
                        let norm = self.apply_step(lr)?;
                        self.phase_end(Phase::Optimizer, start)?;
                        norm
                    };
                    return Ok(StepOutcome {
                        sums,
                        samples: total as u64,
                        grad_norm,
                    });
                }
                Err(e) if self.oom.enabled && e.is_out_of_memory() => {
                    self.optimizer.zero_grad()?;
                    if self.device.is_cuda() {
                        kiln_torch_ext::memory::empty_cache()?;
                    }
                    let micro = largest.div_ceil(self.oom.split);
                    if micro <= 1 {
                        return Err(TrainError::OutOfMemory {
                            step: self.steps_done + 1,
                            batch_size: largest,
                            micro_batch: micro,
                            message: crate::error::first_line(&e.to_string()),
                        });
                    }
                    self.oom.split *= 2;
                    self.oom.retries += 1;
                    tracing::warn!(
                        "out of memory at step {} in micro-batches of {micro}; freed cached memory, \
                         retrying in micro-batches of {} (same effective batch)",
                        self.steps_done + 1,
                        largest.div_ceil(self.oom.split)
                    );
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Forward and backward over every batch (each split into `self.oom.split` micro-batches),
    /// accumulating gradients; returns the step's metric sums.
    fn accumulate(&mut self, batches: &[DeviceBatch], total: i64) -> Result<BatchSums, TrainError> {
        let mut sums: Option<BatchSums> = None;
        for (b, batch) in batches.iter().enumerate() {
            let rows = batch.targets.size()[0];
            let chunk = (rows as u64).div_ceil(self.oom.split).max(1) as i64;
            let pieces: Vec<(Inputs, Tensor)> = if chunk >= rows {
                vec![(batch.inputs.shallow_clone(), batch.targets.shallow_clone())]
            } else {
                batch
                    .inputs
                    .split(chunk)?
                    .into_iter()
                    .zip(batch.targets.f_split(chunk, 0)?)
                    .collect()
            };
            let count = pieces.len();
            for (i, (features, targets)) in pieces.into_iter().enumerate() {
                let n = targets.size()[0];
                // Only the step's last micro-batch all-reduces (PyTorch's `no_sync` before it).
                let last = b + 1 == batches.len() && i + 1 == count;
                if let Some(sync) = self.ranks.gradient_sync.as_mut() {
                    let r = sync.before_forward(last);
                    r.map_err(|e| self.in_ranks("the gradient reducer", false, e))?;
                }
                let model = self.model;
                let piece_sums = match model.compiled_step() {
                    Some(step) => self.compiled_piece(step, (&features, &targets), n, total)?,
                    None => self.autograd_piece((&features, &targets), n, total, last)?,
                };
                match sums.as_mut() {
                    Some(s) => s.add(&piece_sums)?,
                    None => sums = Some(piece_sums),
                }
            }
        }
        sums.ok_or_else(|| TrainError::InvalidPlan {
            key: keys::train::batch_size,
            value: "0".to_owned(),
            expected: "a step needs at least one sample".to_owned(),
        })
    }

    /// One micro-batch through forward (under autocast), the loss and autograd's backward: its
    /// gradients, weighted by the micro-batch's share of the step's `total` samples (and scaled
    /// by the loss scaler), add to the parameters'; the step's `last` micro-batch arms the
    /// gradient sync.
    fn autograd_piece(
        &mut self,
        (inputs, targets): (&Inputs, &Tensor),
        n: i64,
        total: i64,
        last: bool,
    ) -> Result<BatchSums, TrainError> {
        let (loss, piece_sums) = {
            let _range = self.range("kiln/forward")?;
            let start = self.phase_start()?;
            let out = self.forward_loss(inputs, targets, true)?;
            self.phase_end(Phase::Forward, start)?;
            out
        };
        let weighted = loss.f_mul_scalar(n as f64 / total as f64)?;
        let to_backward = match &self.scaler {
            Some(s) => s.scale_loss(&weighted)?,
            None => weighted,
        };
        if let (true, Some(sync)) = (last, self.ranks.gradient_sync.as_mut()) {
            let r = sync.before_backward(&to_backward);
            r.map_err(|e| self.in_ranks("the gradient reducer", false, e))?;
        }
        let _range = self.range("kiln/backward")?;
        let start = self.phase_start()?;
        let synced = last && self.ranks.gradient_sync.is_some();
        to_backward.f_backward().map_err(|e| {
            let what = "backward (its gradients are all-reduced as it runs)";
            self.in_ranks(what, synced, e.into())
        })?;
        self.phase_end(Phase::Backward, start)?;
        Ok(piece_sums)
    }

    /// One micro-batch through a compiled step (forward, loss and backward in one call; its
    /// time counts as backward): its gradients, weighted by the micro-batch's share of the
    /// step's `total` samples and scaled by the loss scaler's scale, add to the parameters'.
    fn compiled_piece(
        &self,
        step: &dyn CompiledStep,
        (inputs, targets): (&Inputs, &Tensor),
        n: i64,
        total: i64,
    ) -> Result<BatchSums, TrainError> {
        let _range = self.range("kiln/compiled_step")?;
        let start = self.phase_start()?;
        let scale = self.scaler.as_ref().map(LossScaler::scale_tensor);
        let (loss, output) = step.step(inputs, targets, n as f64 / total as f64, scale)?;
        self.phase_end(Phase::Backward, start)?;
        self.metrics.batch_sums(&loss, &output, targets)
    }

    /// Unscale/check, clip, step, update the scale, clear gradients. A step whose gradients
    /// hold an inf or NaN changes nothing (with fp16 the scale also backs off); such steps are
    /// counted on the device, without a host synchronisation.
    fn apply_step(&mut self, lr: f64) -> Result<Option<Tensor>, TrainError> {
        self.optimizer.set_lr(lr)?;
        let grad_norm = self.update_on_device()?;
        self.count_step()?;
        Ok(grad_norm)
    }

    /// The device side of [`Trainer::apply_step`], at the learning rate already set: every
    /// tensor it keeps is updated in place and nothing waits for the host, so a CUDA graph can
    /// capture it. Returns the gradient norm where clipping computed one.
    fn update_on_device(&mut self) -> Result<Option<Tensor>, TrainError> {
        let clip = self.settings.clip_grad_norm > 0.0;
        let grads = self.optimizer.grads();
        let mut grad_norm = None;
        let found_inf = match &mut self.scaler {
            Some(scaler) => {
                // With clipping the gradients must be unscaled first; without, the fused
                // kernel divides them by the scale itself.
                scaler.check_and_unscale(&grads, clip)?;
                if clip {
                    grad_norm = Some(clip_grad_norm(&grads, self.settings.clip_grad_norm)?);
                }
                let grad_scale = (!clip).then(|| scaler.scale_tensor().shallow_clone());
                let found_inf = scaler.found_inf().shallow_clone();
                self.optimizer.step(grad_scale.as_ref(), Some(&found_inf))?;
                scaler.update()?;
                found_inf
            }
            None => {
                let _ = self.health.found_inf.f_zero_()?;
                kiln_torch_ext::optim::amp_unscale(
                    &grads,
                    &self.health.found_inf,
                    &self.health.unit,
                )?;
                if clip && !grads.is_empty() {
                    grad_norm = Some(clip_grad_norm(&grads, self.settings.clip_grad_norm)?);
                }
                self.optimizer.step(None, Some(&self.health.found_inf))?;
                self.health.found_inf.shallow_clone()
            }
        };
        let bad = found_inf.f_ne(0.0)?.f_to_kind(Kind::Float)?;
        // With fp16 the scaler's back-off is the remedy (a run often skips a few steps while
        // the scale settles); only without one do bad steps in a row stop the run.
        if self.scaler.is_none() {
            let _ = self.health.bad_run.f_add_(&bad)?.f_mul_(&bad)?;
        }
        let _ = self.health.skipped_total.f_add_(&bad)?;
        self.optimizer.zero_grad()?;
        Ok(grad_norm)
    }

    /// The host side of a finished step: its count, and the cache emptied on schedule.
    fn count_step(&mut self) -> Result<(), TrainError> {
        self.steps_done += 1;
        if let Some(ema) = &mut self.ema {
            ema.update()?;
        }
        if self.settings.empty_cache_interval > 0
            && self
                .steps_done
                .is_multiple_of(self.settings.empty_cache_interval)
            && self.device.is_cuda()
        {
            kiln_torch_ext::memory::empty_cache()?;
        }
        Ok(())
    }

    /// Steps skipped so far for non-finite gradients (synchronises).
    pub fn skipped_steps(&self) -> Result<u64, TrainError> {
        Ok(scalar(&self.health.skipped_total)? as u64)
    }

    /// Fails once `max_bad_steps` consecutive steps were bad (synchronises).
    fn check_bad_run(&self) -> Result<(), TrainError> {
        let run = scalar(&self.health.bad_run)? as u64;
        if run >= self.settings.max_bad_steps {
            return Err(TrainError::NonFinite {
                steps: run,
                limit: self.settings.max_bad_steps,
                step: self.steps_done,
            });
        }
        Ok(())
    }

    /// The model's weights and buffers by name, sorted.
    pub fn model_tensors(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Begins writing a checkpoint of the current state, in the background once it is in
    /// memory ([`checkpoint::save_in_background`], which runs `then` after it); refuses if any
    /// weight is not finite.
    fn save_checkpoint(
        &self,
        options: &CheckpointOptions,
        (epoch, batch): (u64, usize),
        sums: RunningSums,
        val: Option<MetricValues>,
        then: impl FnOnce(&std::path::Path) -> Result<(), TrainError> + Send + 'static,
    ) -> Result<checkpoint::Writing, TrainError> {
        let model = self.model_tensors();
        for (name, t) in &model {
            if t.is_floating_point() && t.f_isfinite()?.f_all()?.f_int64_value(&[])? == 0 {
                return Err(TrainError::InvalidPlan {
                    key: "checkpoint",
                    value: name.clone(),
                    expected: "finite weights: kiln never checkpoints non-finite weights"
                        .to_owned(),
                });
            }
        }
        let mut state = self.optimizer.state_tensors();
        if let Some(ema) = &self.ema {
            state.extend(ema.state_tensors()?);
        }
        state.push(("rng.cpu".to_owned(), kiln_torch_ext::rng::cpu_rng_state()?));
        if let Device::Cuda(i) = self.device {
            // Dropout on CUDA (libtorch's, and a TorchScript module's) draws from it.
            state.push((
                "rng.cuda".to_owned(),
                kiln_torch_ext::rng::cuda_rng_state(i)?,
            ));
        }
        let (loss_scale, tracker) = match &self.scaler {
            Some(s) => {
                let (scale, tracker) = s.state()?;
                (Some(scale), Some(tracker))
            }
            None => (None, None),
        };
        checkpoint::save_in_background(
            &options.dir,
            checkpoint::Contents {
                model: &model,
                state: &state,
                meta: checkpoint::Meta {
                    format: checkpoint::FORMAT.to_owned(),
                    version: checkpoint::VERSION,
                    kiln_version: env!("CARGO_PKG_VERSION").to_owned(),
                    libtorch_version: kiln_torch_ext::runtime::torch_version().to_owned(),
                    step: self.steps_done,
                    epoch,
                    batch,
                    batch_size: Some(self.batch_size),
                    lr: Some(self.settings.lr),
                    world_size: Some(self.ranks.place.map_or(1, |(_, world)| world as u64)),
                    loss_scale,
                    loss_scale_growth_tracker: tracker,
                    model_rng: self.model.rng_state(),
                    val_accuracy: val.as_ref().and_then(|v| v.get("accuracy")),
                    val_loss: val.as_ref().and_then(|v| v.get("loss")),
                    val_metrics: val.map(|v| v.named("val_")).unwrap_or_default(),
                    sums: sums.into(),
                    config: options.config.clone(),
                    input: options.input.clone(),
                    files: Default::default(),
                    file_bytes: Default::default(),
                    meta_sha256: String::new(),
                },
                script: Some(&|path: &std::path::Path| self.model.save_torchscript(path)),
                program: Some(&|path: &std::path::Path| self.model.save_program(path)),
            },
            then,
        )
    }

    /// Puts the trainer back in the state `ckpt` was taken in: weights, optimizer state, loss
    /// scale, step count, generators.
    pub fn restore(&mut self, ckpt: &Checkpoint) -> Result<(), TrainError> {
        ckpt.copy_weights_into(&self.model_tensors())?;
        self.optimizer.load_state(&ckpt.state, ckpt.meta.step)?;
        if let Some((_, rng)) = ckpt.state.iter().find(|(n, _)| n == "rng.cpu") {
            let _generator = kiln_torch_ext::rng::cpu_generator_lock();
            kiln_torch_ext::rng::set_cpu_rng_state(rng)?;
        }
        // A checkpoint taken on a GPU continues its CUDA draws; one taken on the CPU has none,
        // and the generator keeps the run's seed.
        if let (Device::Cuda(i), Some((_, rng))) = (
            self.device,
            ckpt.state.iter().find(|(n, _)| n == "rng.cuda"),
        ) {
            kiln_torch_ext::rng::set_cuda_rng_state(i, rng)?;
        }
        if let (Some(scaler), Some(scale), Some(tracker)) = (
            &mut self.scaler,
            ckpt.meta.loss_scale,
            ckpt.meta.loss_scale_growth_tracker,
        ) {
            scaler.set_state(scale, tracker)?;
        }
        self.model.set_rng_state(&ckpt.meta.model_rng)?;
        self.steps_done = ckpt.meta.step;
        let _ = self
            .health
            .skipped_total
            .f_fill_(ckpt.meta.sums.running().skipped_steps as f64)?;
        Ok(())
    }

    /// Loss and metrics over `batches`, without gradients, the model in eval mode.
    pub fn evaluate<I>(&self, batches: I) -> Result<Evaluation, TrainError>
    where
        I: Iterator<Item = Result<DeviceBatch, TrainError>>,
    {
        let _no_grad = tch::no_grad_guard();
        let mut tally = Tally::new(&self.metrics, self.device)?;
        for batch in batches {
            let batch = batch?;
            let (_, sums) = self.forward_loss(&batch.inputs, &batch.targets, false)?;
            tally.add(&sums, batch.targets.size()[0] as u64)?;
            crate::fault::reached(crate::fault::Point::Validation);
        }
        Ok(Evaluation {
            metrics: tally.read()?,
            samples: tally.samples(),
        })
    }
}
