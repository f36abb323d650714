//! The training loop. It reads top to bottom: for each epoch, for each optimizer step, gather
//! `grad_accum_steps` micro-batches (forward under autocast, scaled loss, backward), then
//! unscale/check, clip, step, update the loss scale, clear gradients; log every
//! `log_interval` steps; validate at the end of the epoch.

use std::sync::Arc;
use std::time::Instant;

use kiln_config::{LossScalePlan, OptimizerKind, ScheduleKind, TrainPlan};
use kiln_data::{Dataset, Loader, LoaderConfig, SamplerConfig};
use kiln_device::settings::AmpDtype;
use kiln_torch_ext::autocast::{AutocastDtype, AutocastGuard, DeviceType};
use kiln_torch_ext::optim::{AdamWConfig, SgdConfig, clip_grad_norm};
use tch::{Device, Kind, Tensor, nn};

use crate::TrainError;
use crate::feed::{DeviceBatch, DeviceFeeder};
use crate::model::Model;
use crate::monitor::{MemorySample, PerfMonitor};
use crate::optim::{Optimizer, Rule, param_groups};
use crate::record::{EpochRecord, Observer, Progress, RunStart, StepRecord, Summary};
use crate::scaler::LossScaler;
use crate::schedule::LrSchedule;

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
        }
    }
}

/// fp32, fp16 or bf16, as the reports spell it.
pub fn precision_name(p: AmpDtype) -> &'static str {
    match p {
        AmpDtype::None => "fp32",
        AmpDtype::Fp16 => "fp16",
        AmpDtype::Bf16 => "bf16",
    }
}

/// What one optimizer step did.
#[derive(Debug)]
pub struct StepOutcome {
    /// Sum over the step's samples of the (unscaled) loss, and of correct predictions, as
    /// scalar tensors on the device.
    pub loss_sum: Tensor,
    pub correct: Tensor,
    pub samples: u64,
    /// Global gradient norm before clipping, when clipping is on.
    pub grad_norm: Option<Tensor>,
}

/// Validation results.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    pub loss: f64,
    pub accuracy: f64,
    pub samples: u64,
}

/// The data of a run.
#[derive(Debug)]
pub struct FitData<D: Dataset, V: Dataset> {
    pub train: Arc<D>,
    pub val: Option<Arc<V>>,
    pub loader: LoaderConfig,
}

/// Drives a [`Model`] whose parameters live in a `VarStore`.
pub struct Trainer<'m> {
    model: &'m dyn Model,
    model_name: String,
    parameters: usize,
    device: Device,
    settings: TrainSettings,
    optimizer: Optimizer,
    scaler: Option<LossScaler>,
    autocast: Option<(DeviceType, AutocastDtype)>,
    steps_done: u64,
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
                key: "train.amp",
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
        vs: &nn::VarStore,
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
                key: "model.name",
                value: model_name.to_owned(),
                expected: "a model with trainable parameters".to_owned(),
            });
        }
        let scaler = match settings.precision {
            AmpDtype::Fp16 => Some(LossScaler::new(settings.loss_scale, device)?),
            _ => None,
        };
        Ok(Self {
            model,
            model_name: model_name.to_owned(),
            parameters: crate::models::parameter_count(vs),
            device,
            autocast: autocast_for(device, settings.precision)?,
            optimizer: Optimizer::new(rule, groups)?,
            scaler,
            settings,
            steps_done: 0,
        })
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

    /// Forward and loss under autocast (when on) on the calling thread.
    fn forward_loss(
        &self,
        features: &Tensor,
        labels: &Tensor,
        train: bool,
    ) -> Result<(Tensor, Tensor), TrainError> {
        let _autocast = match self.autocast {
            Some((device, dtype)) => Some(AutocastGuard::new(device, dtype)?),
            None => None,
        };
        let output = self.model.forward(features, train)?;
        let loss = self.model.loss(&output, labels)?;
        let correct = self.model.correct(&output, labels)?;
        Ok((loss, correct))
    }

    /// One optimizer step over `batches` (micro-batches whose gradients accumulate) at
    /// learning rate `lr`. Each micro-batch's mean loss is weighted by its share of the
    /// step's samples, so k micro-batches of b samples give the gradient of one batch of k·b.
    pub fn train_step(
        &mut self,
        batches: &[DeviceBatch],
        lr: f64,
    ) -> Result<StepOutcome, TrainError> {
        let total: i64 = batches.iter().map(|b| b.labels.size()[0]).sum();
        if total == 0 {
            return Err(TrainError::InvalidPlan {
                key: "train.batch_size",
                value: "0".to_owned(),
                expected: "a step needs at least one sample".to_owned(),
            });
        }
        let mut loss_sum = Tensor::f_zeros([], (Kind::Float, self.device))?;
        let mut correct = Tensor::f_zeros([], (Kind::Float, self.device))?;
        for batch in batches {
            let n = batch.labels.size()[0];
            let (loss, right) = self.forward_loss(&batch.features, &batch.labels, true)?;
            let weighted = loss.f_mul_scalar(n as f64 / total as f64)?;
            let to_backward = match &self.scaler {
                Some(s) => s.scale_loss(&weighted)?,
                None => weighted,
            };
            to_backward.f_backward()?;
            loss_sum = loss_sum.f_add(
                &loss
                    .f_detach()?
                    .f_to_kind(Kind::Float)?
                    .f_mul_scalar(n as f64)?,
            )?;
            correct = correct.f_add(&right)?;
        }
        let grad_norm = self.apply_step(lr)?;
        Ok(StepOutcome {
            loss_sum,
            correct,
            samples: total as u64,
            grad_norm,
        })
    }

    /// Unscale/check, clip, step, update the scale, clear gradients.
    fn apply_step(&mut self, lr: f64) -> Result<Option<Tensor>, TrainError> {
        self.optimizer.set_lr(lr);
        let clip = self.settings.clip_grad_norm > 0.0;
        let grads = self.optimizer.grads();
        let mut grad_norm = None;
        match &mut self.scaler {
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
            }
            None => {
                if clip && !grads.is_empty() {
                    grad_norm = Some(clip_grad_norm(&grads, self.settings.clip_grad_norm)?);
                }
                self.optimizer.step(None, None)?;
            }
        }
        self.optimizer.zero_grad()?;
        self.steps_done += 1;
        if self.settings.empty_cache_interval > 0
            && self
                .steps_done
                .is_multiple_of(self.settings.empty_cache_interval)
            && self.device.is_cuda()
        {
            kiln_torch_ext::memory::empty_cache()?;
        }
        Ok(grad_norm)
    }

    /// Loss and accuracy over `batches`, without gradients.
    pub fn evaluate<I>(&self, batches: I) -> Result<Evaluation, TrainError>
    where
        I: Iterator<Item = Result<DeviceBatch, TrainError>>,
    {
        let _no_grad = tch::no_grad_guard();
        let mut loss_sum = Tensor::f_zeros([], (Kind::Float, self.device))?;
        let mut correct = Tensor::f_zeros([], (Kind::Float, self.device))?;
        let mut samples = 0u64;
        for batch in batches {
            let batch = batch?;
            let n = batch.labels.size()[0];
            let (loss, right) = self.forward_loss(&batch.features, &batch.labels, false)?;
            loss_sum = loss_sum.f_add(&loss.f_to_kind(Kind::Float)?.f_mul_scalar(n as f64)?)?;
            correct = correct.f_add(&right)?;
            samples += n as u64;
        }
        let denominator = samples.max(1) as f64;
        Ok(Evaluation {
            loss: scalar(&loss_sum)? / denominator,
            accuracy: scalar(&correct)? / denominator,
            samples,
        })
    }

    /// Trains for `settings.epochs` epochs over `data`, validating after each, reporting to
    /// `observer`.
    pub fn fit<D: Dataset, V: Dataset>(
        &mut self,
        data: FitData<D, V>,
        observer: &mut dyn Observer,
    ) -> Result<Summary, TrainError> {
        let classes = data.train.classes();
        let train_samples = data.train.len();
        let val_samples = data.val.as_ref().map_or(0, |v| v.len());
        let mut train_loader = Loader::new(data.train, data.loader)?;
        let mut val_loader = match data.val.filter(|v| !v.is_empty()) {
            Some(v) => Some(Loader::new(
                v,
                LoaderConfig {
                    drop_last: false,
                    sampler: SamplerConfig {
                        shuffle: false,
                        ..data.loader.sampler
                    },
                    ..data.loader
                },
            )?),
            None => None,
        };
        let accum = self.settings.grad_accum_steps.max(1) as usize;
        let batches_per_epoch = train_loader.batches_per_epoch();
        if batches_per_epoch == 0 {
            return Err(TrainError::InvalidPlan {
                key: "train.batch_size",
                value: data.loader.batch_size.to_string(),
                expected: format!(
                    "a batch size the {train_samples} training samples can fill (drop_last is on)"
                ),
            });
        }
        let steps_per_epoch = batches_per_epoch.div_ceil(accum) as u64;
        let total_steps = steps_per_epoch * self.settings.epochs;
        let schedule = LrSchedule {
            kind: self.settings.schedule,
            base_lr: self.settings.lr,
            min_lr: self.settings.min_lr,
            warmup_steps: self.settings.warmup_steps,
            total_steps,
        };
        let precision = precision_name(self.settings.precision);
        let feed_probe = DeviceFeeder::new(std::iter::empty(), self.device);
        let feed = match self.device {
            Device::Cpu => "cpu: batch buffers become tensors without a copy".to_owned(),
            _ if feed_probe.pinned() => {
                "pinned host buffers, copied on a side stream one batch ahead".to_owned()
            }
            _ => format!(
                "pageable copies ({})",
                feed_probe.unpinned_because().unwrap_or("no pinned memory")
            ),
        };
        observer.on_start(&RunStart {
            model: self.model_name.clone(),
            parameters: self.parameters,
            device: format!("{:?}", self.device).to_lowercase(),
            precision: precision.to_owned(),
            optimizer: match self.settings.optimizer {
                OptimizerKind::AdamW => "adamw (fused)".to_owned(),
                OptimizerKind::Sgd => "sgd (fused)".to_owned(),
            },
            batch_size: data.loader.batch_size as u64,
            grad_accum_steps: accum as u64,
            epochs: self.settings.epochs,
            steps_per_epoch,
            total_steps,
            train_samples,
            val_samples,
            feed,
        })?;
        if self.device.is_cuda()
            && let Device::Cuda(i) = self.device
        {
            kiln_torch_ext::memory::reset_peak(i)?;
        }

        let run_start = Instant::now();
        let mut monitor = PerfMonitor::new();
        let mut skipped_steps = 0u64;
        let mut last_epoch: Option<EpochRecord> = None;
        let mut best_val: Option<f64> = None;
        let mut final_train_loss = f64::NAN;
        for epoch in 0..self.settings.epochs {
            let epoch_start = Instant::now();
            let epoch_total_before = monitor.total();
            let mut feeder = DeviceFeeder::new(train_loader.epoch(epoch), self.device);
            let device = self.device;
            let zero = || Tensor::f_zeros([], (Kind::Float, device));
            let (mut epoch_loss, mut epoch_correct, mut epoch_samples) = (zero()?, zero()?, 0u64);
            let (mut interval_loss, mut interval_correct, mut interval_samples) =
                (zero()?, zero()?, 0u64);
            let mut consumed = 0usize;
            let mut last_norm = None;
            while consumed < batches_per_epoch {
                monitor.start_step();
                let group = accum.min(batches_per_epoch - consumed);
                let mut batches = Vec::with_capacity(group);
                for _ in 0..group {
                    let wait = Instant::now();
                    let next = feeder.next();
                    monitor.data_wait(wait.elapsed());
                    match next {
                        Some(batch) => batches.push(batch?),
                        None => break,
                    }
                }
                if batches.is_empty() {
                    break;
                }
                consumed += batches.len();
                let lr = schedule.lr_at(self.steps_done);
                let outcome = self.train_step(&batches, lr)?;
                drop(batches);
                monitor.end_step(outcome.samples);
                interval_loss = interval_loss.f_add(&outcome.loss_sum)?;
                interval_correct = interval_correct.f_add(&outcome.correct)?;
                interval_samples += outcome.samples;
                last_norm = outcome.grad_norm.or(last_norm);
                observer.on_step(&Progress {
                    epoch,
                    step: self.steps_done,
                    total_steps,
                })?;
                let epoch_done = consumed >= batches_per_epoch;
                if self.steps_done.is_multiple_of(self.settings.log_interval) || epoch_done {
                    let timing = monitor.take_interval();
                    let (loss_scale, skipped) = match &self.scaler {
                        Some(s) => (Some(s.scale()?), s.skipped()?),
                        None => (None, false),
                    };
                    skipped_steps += u64::from(skipped);
                    let n = interval_samples.max(1) as f64;
                    let record = StepRecord {
                        kind: "step",
                        epoch,
                        step: self.steps_done,
                        epoch_progress: epoch as f64 + consumed as f64 / batches_per_epoch as f64,
                        loss: scalar(&interval_loss)? / n,
                        accuracy: scalar(&interval_correct)? / n,
                        lr,
                        loss_scale,
                        grad_norm: last_norm.as_ref().map(scalar).transpose()?,
                        step_time_s: timing.step_seconds(),
                        samples_per_s: timing.samples_per_second(),
                        data_wait_share: timing.data_wait_share(),
                        skipped_steps,
                        memory: MemorySample::read(self.device),
                    };
                    observer.on_log(&record)?;
                    epoch_loss = epoch_loss.f_add(&interval_loss)?;
                    epoch_correct = epoch_correct.f_add(&interval_correct)?;
                    epoch_samples += interval_samples;
                    interval_loss = zero()?;
                    interval_correct = zero()?;
                    interval_samples = 0;
                }
            }
            drop(feeder);
            let n = epoch_samples.max(1) as f64;
            final_train_loss = scalar(&epoch_loss)? / n;
            let val = match &mut val_loader {
                Some(loader) => {
                    Some(self.evaluate(DeviceFeeder::new(loader.epoch(0), self.device))?)
                }
                None => None,
            };
            if let Some(v) = &val {
                best_val = Some(best_val.map_or(v.accuracy, |b: f64| b.max(v.accuracy)));
            }
            let epoch_timing = {
                let t = monitor.total();
                (
                    t.seconds - epoch_total_before.seconds,
                    t.samples - epoch_total_before.samples,
                    t.data_wait_seconds - epoch_total_before.data_wait_seconds,
                )
            };
            let record = EpochRecord {
                kind: "epoch",
                epoch,
                train_loss: final_train_loss,
                train_accuracy: scalar(&epoch_correct)? / n,
                val_loss: val.map(|v| v.loss),
                val_accuracy: val.map(|v| v.accuracy),
                seconds: epoch_start.elapsed().as_secs_f64(),
                samples_per_s: if epoch_timing.0 > 0.0 {
                    epoch_timing.1 as f64 / epoch_timing.0
                } else {
                    0.0
                },
                data_wait_share: if epoch_timing.0 > 0.0 {
                    (epoch_timing.2 / epoch_timing.0).clamp(0.0, 1.0)
                } else {
                    0.0
                },
                memory: MemorySample::read(self.device),
            };
            observer.on_epoch(&record)?;
            last_epoch = Some(record);
        }
        let total = monitor.total();
        let summary = Summary {
            model: self.model_name.clone(),
            parameters: self.parameters,
            device: format!("{:?}", self.device).to_lowercase(),
            precision: precision.to_owned(),
            epochs: self.settings.epochs,
            steps: total.steps,
            samples: total.samples,
            seconds: run_start.elapsed().as_secs_f64(),
            mean_step_time_s: total.step_seconds(),
            samples_per_s: total.samples_per_second(),
            data_wait_share: total.data_wait_share(),
            skipped_steps,
            final_train_loss,
            final_val_loss: last_epoch.as_ref().and_then(|e| e.val_loss),
            final_val_accuracy: last_epoch.as_ref().and_then(|e| e.val_accuracy),
            best_val_accuracy: best_val,
            chance_accuracy: classes.map_or(0.0, |c| 1.0 / c.max(1) as f64),
            memory: MemorySample::read(self.device),
        };
        observer.on_finish(&summary)?;
        Ok(summary)
    }
}
