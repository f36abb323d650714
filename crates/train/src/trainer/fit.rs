//! The loop [`Trainer::fit`] runs, top to bottom: set up (loaders, schedule, resume point),
//! then for each epoch, for each optimizer step, take `grad_accum_steps` batches and step;
//! log every `log_interval` steps; checkpoint every `checkpoint.every_steps` or when asked to
//! stop; validate and checkpoint at the end of the epoch; summarise.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kiln_config::keys;
use kiln_config::{OptimizerKind, ProfileUnit};
use kiln_data::{Dataset, Loader, LoaderConfig, Position, SamplerConfig, TargetSpec};
use kiln_torch_ext::profiler::Range;
use tch::{Device, Tensor};

use super::{
    CheckpointOptions, Evaluation, FitData, FitOptions, StepOutcome, Trainer, precision_name,
    scalar,
};
use crate::TrainError;
use crate::checkpoint::{self, RankSums, Retention, RunningSums};
use crate::distributed::{self, StopVotes};
use crate::feed::{DeviceFeeder, PinnedBuffers};
use crate::metrics::{MetricKind, MetricValues, SavedTally, Tally};
use crate::monitor::{MemorySample, PerfMonitor, Throughput};
use crate::profiling::StepProfiler;
use crate::record::{EpochRecord, Observer, Progress, RunStart, StepRecord, Summary};
use crate::schedule::LrSchedule;
use crate::stopping::{Clock, EarlyStopping, Limits, StopReason};
use crate::workers::WorkerTuner;

/// A run's loaders.
struct Loaders<D: Dataset, V: Dataset> {
    train: Loader<D>,
    val: Option<Loader<V>>,
}

/// A run in progress: its schedule, where it started, and its running sums.
struct Run {
    target: TargetSpec,
    train_samples: usize,
    val_samples: usize,
    accum: usize,
    batches_per_epoch: usize,
    total_steps: u64,
    schedule: LrSchedule,
    start_epoch: u64,
    start_batch: usize,
    /// Best validation results and skipped steps (the tallies below hold the sums).
    sums: RunningSums,
    epoch: Tally,
    interval: Tally,
    profiler: Option<StepProfiler>,
    monitor: PerfMonitor,
    started: Instant,
    last_epoch: Option<EpochRecord>,
    /// `data.num_workers = auto`'s measurement, and once made its choice.
    workers: Option<WorkerTuner>,
    limits: Limits,
    early_stopping: Option<EarlyStopping>,
    /// Why the run ends before its epochs, once it must.
    stop: Option<StopReason>,
    /// Training time of the run's earlier segments (before the checkpoint it resumed from).
    trained_before: Duration,
    /// The clock the time limit and time-based checkpoints read, and its reading at the start.
    clock: Clock,
    clock_start: Duration,
    /// Which checkpoints are kept.
    retention: Option<Retention>,
    /// The clock's reading when the last checkpoint was written (or the run started), for
    /// `checkpoint.every_seconds`.
    last_saved: Duration,
    /// The step of the last checkpoint (every rank of a data-parallel run agrees on it).
    checkpointed_at: u64,
    /// The checkpoint being written in the background, if any.
    writing: Option<checkpoint::Writing>,
}

impl Run {
    /// Training time over every resume.
    fn trained(&self) -> Duration {
        self.trained_before + self.clock.now().saturating_sub(self.clock_start)
    }

    /// Time since the last checkpoint, on the run's clock.
    fn since_saved(&self) -> Duration {
        self.clock.now().saturating_sub(self.last_saved)
    }

    /// Waits for the checkpoint being written, if any; its error, if it failed.
    fn settle_checkpoint(&mut self) -> Result<(), TrainError> {
        match self.writing.take() {
            Some(writing) => writing.wait().map(|_| ()),
            None => Ok(()),
        }
    }

    /// [`Run::settle_checkpoint`] once the write has ended: a failed write stops the run at
    /// the step that sees it.
    fn poll_checkpoint(&mut self) -> Result<(), TrainError> {
        match self
            .writing
            .as_ref()
            .is_some_and(checkpoint::Writing::is_finished)
        {
            true => self.settle_checkpoint(),
            false => Ok(()),
        }
    }

    /// The running sums carried from one epoch to the next: the skipped steps, the best
    /// values, early stopping's count and the time trained (the epoch's sums start anew).
    fn carried(&mut self, skipped_steps: u64) -> RunningSums {
        RunningSums {
            skipped_steps,
            best_val: std::mem::take(&mut self.sums.best_val),
            early_stopping: self.sums.early_stopping.take(),
            trained_seconds: Some(self.trained().as_secs_f64()),
            ..RunningSums::default()
        }
    }
}

/// Where an epoch is: its start, the batches consumed, the last gradient norm.
struct EpochPlace {
    epoch: u64,
    started: Instant,
    timing_before: Throughput,
    consumed: usize,
    last_norm: Option<Tensor>,
}

impl Trainer<'_> {
    /// Trains for `settings.epochs` epochs over `data`, validating after each, reporting to
    /// `observer`; checkpoints, resumes and stops as `options` say.
    pub fn fit<D: Dataset, V: Dataset>(
        &mut self,
        data: FitData<D, V>,
        observer: &mut dyn Observer,
        options: FitOptions,
    ) -> Result<Summary, TrainError> {
        let (mut loaders, mut run) = self.begin(data, &options)?;
        observer.on_start(&self.run_start(&run, &options))?;
        if let Device::Cuda(i) = self.device {
            kiln_torch_ext::memory::reset_peak(i)?;
        }
        for epoch in run.start_epoch..self.settings.epochs {
            // A run resumed at its limits ends before it steps.
            if run.stop.is_none() && run.limits.time_up(run.trained_before) {
                run.stop = Some(run.limits.time_reason(run.trained_before, self.steps_done));
            }
            run.stop = run
                .stop
                .take()
                .or(run.limits.steps_reached(self.steps_done));
            if let Some(es) = &run.early_stopping {
                let met = es.already_met(run.sums.early_stopping.as_ref());
                run.stop = run.stop.take().or(met);
            }
            if run.stop.is_some() {
                break;
            }
            self.run_epoch(&mut loaders, &mut run, epoch, observer, &options)?;
        }
        if let Some(reason) = &run.stop {
            tracing::info!("the run ends: {}", reason.message);
        }
        self.finish(run, observer)
    }

    /// Loaders, schedule, loss, and where to start (restoring the checkpoint to resume).
    fn begin<D: Dataset, V: Dataset>(
        &mut self,
        data: FitData<D, V>,
        options: &FitOptions,
    ) -> Result<(Loaders<D, V>, Run), TrainError> {
        let target = data.train.target();
        self.set_target(&target)?;
        self.model.check_inputs(&data.train.inputs())?;
        // A model that takes its inputs by name gets batches read by name.
        let loader = LoaderConfig {
            by_name: self.model.reads_by_name(),
            ..data.loader
        };
        if loader.by_name {
            warn_narrowed(&data.train.inputs());
        }
        self.plan_cuda_graph()?;
        let train_samples = data.train.len();
        let val_samples = data.val.as_ref().map_or(0, |v| v.len());
        let workers = data
            .workers_auto
            .then(|| WorkerTuner::new(loader.num_workers));
        let first = LoaderConfig {
            num_workers: workers
                .as_ref()
                .map_or(loader.num_workers, WorkerTuner::first),
            ..loader
        };
        // On CUDA the loader writes each batch into pinned memory the copy starts from.
        let train = match self.device {
            Device::Cuda(_) => {
                Loader::with_buffers(data.train, first, Arc::new(PinnedBuffers::default()))?
            }
            _ => Loader::new(data.train, first)?,
        };
        let val = match data.val.filter(|v| !v.is_empty()) {
            Some(v) => Some(Loader::new(v, validation_loader(loader))?),
            None => None,
        };
        let accum = self.settings.grad_accum_steps.max(1) as usize;
        self.batch_size = data.loader.batch_size as u64;
        let batches_per_epoch = train.batches_per_epoch();
        if batches_per_epoch == 0 {
            return Err(TrainError::InvalidPlan {
                key: keys::train::batch_size,
                value: data.loader.batch_size.to_string(),
                expected: format!(
                    "a batch size the {train_samples} training samples can fill (drop_last is on)"
                ),
            });
        }
        let limits = self.settings.limits;
        // The schedule follows the limit that ends the run, where it is known in advance.
        let total_steps = crate::schedule::total_steps(
            batches_per_epoch as u64,
            accum as u64,
            self.settings.epochs,
            limits.max_steps,
        );
        let names: Vec<&str> = self.metrics.names().collect();
        let early_stopping =
            EarlyStopping::resolve(&self.settings.early_stopping, &names, val_samples > 0)?;
        let (start_epoch, start_batch, sums) = match &options.resume {
            Some(ckpt) => {
                self.check_resume_world(ckpt)?;
                self.restore(ckpt)?;
                if let Some(c) = enabled(&options.checkpoints) {
                    checkpoint::prepare_to_continue(&c.dir, ckpt.meta.step)?;
                }
                (ckpt.meta.epoch, ckpt.meta.batch, ckpt.meta.sums.running())
            }
            None => (0, 0, RunningSums::default()),
        };
        self.ema = self.start_ema(options.resume.as_ref())?;
        let loaders = Loaders { train, val };
        let retention = enabled(&options.checkpoints).map(|c| {
            let policy = Retention::of(&c.plan);
            match early_stopping {
                Some(es) => policy.watching(es.metric, es.higher_is_better),
                None => policy,
            }
        });
        let trained_before = Duration::from_secs_f64(sums.trained_seconds.unwrap_or(0.0).max(0.0));
        let own = sums.of_rank(self.ranks.place.map_or(0, |(rank, _)| rank));
        let clock = options.clock.clone().unwrap_or_else(Clock::real);
        let clock_start = clock.now();
        let run = Run {
            target,
            train_samples,
            val_samples,
            accum,
            batches_per_epoch,
            total_steps,
            schedule: LrSchedule {
                kind: self.settings.schedule,
                base_lr: self.settings.lr,
                min_lr: self.settings.min_lr,
                warmup_steps: self.settings.warmup_steps,
                total_steps,
            },
            start_epoch,
            start_batch,
            epoch: Tally::restore(&self.metrics, &own.epoch, self.device)?,
            interval: Tally::restore(&self.metrics, &own.interval, self.device)?,
            sums,
            profiler: options
                .profiling
                .as_ref()
                .filter(|p| p.plan.enabled())
                .map(|p| StepProfiler::new(p.plan, p.dir.clone(), self.device.is_cuda())),
            monitor: PerfMonitor::new(),
            started: Instant::now(),
            last_epoch: None,
            workers,
            limits,
            early_stopping,
            stop: None,
            trained_before,
            clock,
            clock_start,
            retention,
            last_saved: clock_start,
            checkpointed_at: self.steps_done,
            writing: None,
        };
        Ok((loaders, run))
    }

    /// The facts reported when the run starts.
    fn run_start(&self, run: &Run, options: &FitOptions) -> RunStart {
        RunStart {
            model: self.model_name.clone(),
            task: self.loss.task(&run.target).to_owned(),
            loss: self.loss.name().to_owned(),
            metrics: self.metrics.names().map(str::to_owned).collect(),
            parameters: self.parameters,
            device: format!("{:?}", self.device).to_lowercase(),
            precision: precision_name(self.settings.precision).to_owned(),
            optimizer: match self.settings.optimizer {
                OptimizerKind::AdamW => "adamw (fused)".to_owned(),
                OptimizerKind::Sgd => "sgd (fused)".to_owned(),
            },
            batch_size: self.batch_size,
            grad_accum_steps: run.accum as u64,
            epochs: self.settings.epochs,
            steps_per_epoch: run.batches_per_epoch.div_ceil(run.accum) as u64,
            total_steps: run.total_steps,
            train_samples: run.train_samples,
            val_samples: run.val_samples,
            feed: match (self.device, self.model.reads_by_name()) {
                (Device::Cpu, false) => {
                    "cpu: batch buffers become tensors without a copy".to_owned()
                }
                (Device::Cpu, true) => {
                    "cpu: arrays read by name, each copied into a tensor of its type".to_owned()
                }
                (Device::Cuda(_), false) => {
                    "pinned host buffers, copied on a side stream one batch ahead".to_owned()
                }
                (Device::Cuda(_), true) => "arrays read by name, each copied into pinned memory \
                                            and on a side stream one batch ahead"
                    .to_owned(),
                (other, _) => format!("copies to {other:?}"),
            },
            resumed_from: options
                .resume
                .as_ref()
                .map(|c| (c.dir.clone(), c.meta.step)),
            batch_size_search: options.batch_size_search.clone(),
            lr: self.settings.lr,
            lr_search: options.lr_search.clone(),
        }
    }

    /// One epoch: its steps (logging and checkpointing as they come), then validation and the
    /// end-of-epoch checkpoint. A requested stop checkpoints and returns `Stopped`.
    fn run_epoch<D: Dataset, V: Dataset>(
        &mut self,
        loaders: &mut Loaders<D, V>,
        run: &mut Run,
        epoch: u64,
        observer: &mut dyn Observer,
        options: &FitOptions,
    ) -> Result<(), TrainError> {
        if let Some(p) = run.profiler.as_mut() {
            self.timing.ranges = p.begin(ProfileUnit::Epochs, epoch)?;
        }
        let first_batch = if epoch == run.start_epoch {
            run.start_batch
        } else {
            0
        };
        let mut place = EpochPlace {
            epoch,
            started: Instant::now(),
            timing_before: run.monitor.total(),
            consumed: first_batch,
            last_norm: None,
        };
        let mut feeder = DeviceFeeder::new(
            loaders.train.resume(Position {
                epoch,
                batch: first_batch,
            }),
            self.device,
        );
        while place.consumed < run.batches_per_epoch {
            let began = Instant::now();
            let Some((outcome, lr)) = self.next_step(run, &mut feeder, &mut place)? else {
                break;
            };
            if let Some(workers) = self.measure_workers(run, began)? {
                // The staged batch goes with the feeder; the resumed epoch reads it again.
                drop(feeder);
                loaders.train.set_workers(workers)?;
                let at = Position {
                    epoch,
                    batch: place.consumed,
                };
                feeder = DeviceFeeder::new(loaders.train.resume(at), self.device);
            }
            run.interval.add(&outcome.sums, outcome.samples)?;
            place.last_norm = outcome.grad_norm.or(place.last_norm.take());
            observer.on_step(&Progress {
                epoch,
                step: self.steps_done,
                total_steps: run.total_steps,
            })?;
            if self.after_step(run, &place, lr, observer, options)? {
                break;
            }
        }
        drop(feeder);
        let val = match &mut loaders.val {
            Some(loader) => {
                if let Some(kept) = run
                    .workers
                    .as_ref()
                    .and_then(|t| t.choice())
                    .map(|c| c.chosen)
                    && loader.config().num_workers != kept
                {
                    loader.set_workers(kept)?;
                }
                Some(self.validate(loader)?)
            }
            None => None,
        };
        self.end_epoch(run, &place, val, observer, options)
    }

    /// The validation of the weights, and of their EMA (`train.ema`) where there is one.
    fn validate<V: Dataset>(
        &mut self,
        loader: &mut Loader<V>,
    ) -> Result<(Evaluation, Option<Evaluation>), TrainError> {
        let _range = self.range("kiln/validation")?;
        let raw = self.evaluate(DeviceFeeder::new(loader.epoch(0), self.device))?;
        let Some(mut ema) = self.ema.take() else {
            return Ok((raw, None));
        };
        let averaged =
            ema.swapped(|| self.evaluate(DeviceFeeder::new(loader.epoch(0), self.device)));
        self.ema = Some(ema);
        Ok((raw, Some(averaged?)))
    }

    /// `train.ema`'s average starting from the weights now (restored, when resuming), and
    /// continuing the checkpoint's own where it carries one.
    fn start_ema(
        &self,
        resumed: Option<&checkpoint::Checkpoint>,
    ) -> Result<Option<crate::ema::Ema>, TrainError> {
        if !self.settings.ema.enabled() {
            return Ok(None);
        }
        let mut ema = crate::ema::Ema::new(&self.settings.ema, &self.model_tensors())?;
        if let Some(ckpt) = resumed
            && !ema.restore(&ckpt.state)?
        {
            tracing::info!(
                "{} holds no EMA weights: the average starts from its weights",
                ckpt.dir.display()
            );
        }
        Ok(Some(ema))
    }

    /// After a step: the ranks' stop vote and the limits, the log line, the checkpoint due.
    /// `true` when a limit ends the run after this step (the epoch is validated and
    /// checkpointed where it stands); `Stopped` when the run was asked to stop.
    fn after_step(
        &mut self,
        run: &mut Run,
        place: &EpochPlace,
        lr: f64,
        observer: &mut dyn Observer,
        options: &FitOptions,
    ) -> Result<bool, TrainError> {
        run.poll_checkpoint()?;
        let epoch_done = place.consumed >= run.batches_per_epoch;
        let asked = options
            .stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::SeqCst));
        let time_up = run.limits.time_up(run.trained());
        let checkpoint_due = enabled(&options.checkpoints)
            .is_some_and(|c| timed_out(c.plan.every_seconds, run.since_saved()));
        let votes = self.stop_together(StopVotes {
            asked,
            time_up,
            checkpoint_due,
        })?;
        if run.stop.is_none() {
            let steps = self.steps_done;
            run.stop = run.limits.steps_reached(steps).or_else(|| {
                votes
                    .time_up
                    .then(|| run.limits.time_reason(run.trained(), steps))
            });
        }
        let ending = run.stop.is_some();
        // (A stop does not log: the open interval goes into the checkpoint, so the resumed
        // run logs exactly what an uninterrupted one would.)
        if self.steps_done.is_multiple_of(self.settings.log_interval) || epoch_done || ending {
            self.log_interval(run, place, lr, observer)?;
        }
        let saved = self.checkpoint_in_epoch(run, place, votes, options)?;
        if votes.asked {
            run.settle_checkpoint()?;
            if let Some(p) = run.profiler.take() {
                p.finish()?;
            }
            return Err(TrainError::Stopped {
                step: self.steps_done,
                checkpoint: saved,
            });
        }
        Ok(ending)
    }

    /// Takes the next step's batches from `feeder` and steps; `None` when the epoch has none.
    fn next_step<I>(
        &mut self,
        run: &mut Run,
        feeder: &mut DeviceFeeder<I>,
        place: &mut EpochPlace,
    ) -> Result<Option<(StepOutcome, f64)>, TrainError>
    where
        I: Iterator<Item = Result<kiln_data::Batch, kiln_data::DataError>>,
    {
        if let Some(p) = run.profiler.as_mut() {
            self.timing.ranges = p.begin(ProfileUnit::Steps, self.steps_done)?;
        }
        let step_range = if self.timing.ranges {
            Some(Range::new(&format!("kiln/step#{}", self.steps_done + 1))?)
        } else {
            None
        };
        run.monitor.start_step();
        let group = run.accum.min(run.batches_per_epoch - place.consumed);
        let mut batches = Vec::with_capacity(group);
        for _ in 0..group {
            let wait = Instant::now();
            let next = {
                let _range = self.range("kiln/data_wait")?;
                feeder.next()
            };
            run.monitor.data_wait(wait.elapsed());
            match next {
                Some(batch) => batches.push(batch?),
                None => break,
            }
        }
        if batches.is_empty() {
            return Ok(None);
        }
        place.consumed += batches.len();
        let lr = run.schedule.lr_at(self.steps_done);
        let outcome = self.train_step(&batches, lr)?;
        drop(batches);
        run.monitor.end_step(outcome.samples);
        drop(step_range);
        if let Some(p) = run.profiler.as_mut() {
            p.end(ProfileUnit::Steps)?;
        }
        Ok(Some((outcome, lr)))
    }

    /// Times the step begun at `began` for `data.num_workers = auto` (waiting for the device
    /// first, while measuring); returns the worker count to switch to, if it changes.
    fn measure_workers(&self, run: &mut Run, began: Instant) -> Result<Option<usize>, TrainError> {
        let Some(tuner) = run.workers.as_mut().filter(|t| t.choice().is_none()) else {
            return Ok(None);
        };
        kiln_torch_ext::cuda::synchronize(self.device)?;
        let next = tuner.record(began.elapsed());
        if let Some(choice) = tuner.choice() {
            tracing::info!("data.num_workers = auto: {}", choice.describe());
        }
        Ok(next)
    }

    /// Reports the interval's metrics (one host synchronisation) and folds it into the epoch.
    fn log_interval(
        &mut self,
        run: &mut Run,
        place: &EpochPlace,
        lr: f64,
        observer: &mut dyn Observer,
    ) -> Result<(), TrainError> {
        self.check_bad_run()?;
        let timing = run.monitor.take_interval();
        let metrics = self.across_ranks(&run.interval)?;
        let record = StepRecord {
            kind: "step",
            epoch: place.epoch,
            step: self.steps_done,
            epoch_progress: place.epoch as f64
                + place.consumed as f64 / run.batches_per_epoch as f64,
            metrics,
            lr,
            loss_scale: match &self.scaler {
                Some(s) => Some(s.scale()?),
                None => None,
            },
            grad_norm: place.last_norm.as_ref().map(scalar).transpose()?,
            step_time_s: timing.step_seconds(),
            samples_per_s: timing.samples_per_second() * self.world() as f64,
            data_wait_share: timing.data_wait_share(),
            skipped_steps: self.skipped_steps()?,
            memory: MemorySample::read(self.device),
        };
        observer.on_log(&record)?;
        run.epoch.absorb(&mut run.interval)
    }

    /// The checkpoint every `checkpoint.every_steps`, or `checkpoint.every_seconds` after the
    /// last one (but for an epoch's last step, and a step a limit ends the run at: the epoch's
    /// end checkpoints then), or when stopping; returns its path. In a data-parallel run every
    /// rank takes part (the ranks agree on the step: `votes` carries rank 0's clock), and rank 0
    /// saves each rank's open metric sums.
    fn checkpoint_in_epoch(
        &mut self,
        run: &mut Run,
        place: &EpochPlace,
        votes: StopVotes,
        options: &FitOptions,
    ) -> Result<Option<std::path::PathBuf>, TrainError> {
        let Some(plan) = checkpoint_plan(options) else {
            return Ok(None);
        };
        // On an epoch's last step the end-of-epoch checkpoint (after validation) follows at
        // once; it is the one a run resumes from with any number of ranks.
        let epoch_ends = place.consumed >= run.batches_per_epoch || run.stop.is_some();
        // A vote counted while the next step ran was cast a step ago: one a checkpoint since
        // then answered is spent.
        let voted_at = self.steps_done - u64::from(self.ranks.stop_vote.is_some());
        let timed = votes.checkpoint_due && run.checkpointed_at < voted_at;
        let every = plan.every_steps;
        let periodic = every > 0 && self.steps_done.is_multiple_of(every);
        if !((periodic || timed) && !epoch_ends || votes.asked) {
            return Ok(None);
        }
        run.checkpointed_at = self.steps_done;
        let own = RankSums {
            epoch: run.epoch.saved()?,
            interval: run.interval.saved()?,
        };
        let other_ranks = self.gather_rank_sums(&own)?;
        let Some(ckpt) = enabled(&options.checkpoints) else {
            return Ok(None);
        };
        let sums = RunningSums {
            epoch: own.epoch,
            interval: own.interval,
            skipped_steps: self.skipped_steps()?,
            best_val: run.sums.best_val.clone(),
            early_stopping: run.sums.early_stopping.clone(),
            trained_seconds: Some(run.trained().as_secs_f64()),
            other_ranks,
        };
        let at = (place.epoch, place.consumed);
        self.write_checkpoint(run, ckpt, at, sums, None).map(Some)
    }

    /// The open epoch's and interval's sums of ranks 1, 2, …, this rank's being `own` (every
    /// rank calls it at the same step; empty with one rank).
    fn gather_rank_sums(&self, own: &RankSums) -> Result<Vec<RankSums>, TrainError> {
        let Some(group) = &self.ranks.group else {
            return Ok(Vec::new());
        };
        let names: Vec<String> = own.epoch.sums.keys().cloned().collect();
        let mut row = Vec::with_capacity(2 * names.len() + 2);
        for t in [&own.epoch, &own.interval] {
            row.extend(t.sums.values().copied());
            row.push(t.samples as f64);
        }
        let rows = distributed::gather_rows(group, &row)
            .map_err(|e| self.in_ranks("gathering the ranks' metric sums", false, e))?;
        let tally = |values: &[f64]| {
            let (samples, sums) = values.split_last().unwrap_or((&0.0, &[]));
            SavedTally {
                samples: *samples as u64,
                sums: names.iter().cloned().zip(sums.iter().copied()).collect(),
            }
        };
        let half = names.len() + 1;
        Ok(rows
            .iter()
            .skip(1)
            .map(|r| RankSums {
                epoch: tally(&r[..half]),
                interval: tally(&r[half..]),
            })
            .collect())
    }

    /// Begins writing a checkpoint at `at` (epoch, batch) once the previous one is written; the
    /// run's retention policy prunes older ones after it is complete. Restarts the clock of
    /// `checkpoint.every_seconds`. Returns where it will be.
    fn write_checkpoint(
        &self,
        run: &mut Run,
        ckpt: &CheckpointOptions,
        at: (u64, usize),
        sums: RunningSums,
        val: Option<MetricValues>,
    ) -> Result<std::path::PathBuf, TrainError> {
        run.settle_checkpoint()?;
        let (dir, retention) = (ckpt.dir.clone(), run.retention);
        let prune = move |_: &std::path::Path| match retention {
            Some(policy) => checkpoint::prune(&dir, &policy).map(|_| ()),
            None => Ok(()),
        };
        let writing = self.save_checkpoint(ckpt, at, sums, val, prune)?;
        run.last_saved = run.clock.now();
        let path = writing.dir().to_owned();
        run.writing = Some(writing);
        Ok(path)
    }

    /// Reports the epoch with its validation, counts it for early stopping, starts the next
    /// epoch's sums, and checkpoints: where the next epoch starts, or where this one stands
    /// when a limit ended it early.
    fn end_epoch(
        &mut self,
        run: &mut Run,
        place: &EpochPlace,
        val: Option<(Evaluation, Option<Evaluation>)>,
        observer: &mut dyn Observer,
        options: &FitOptions,
    ) -> Result<(), TrainError> {
        let (val, val_ema) = val.map_or((None, None), |(v, e)| (Some(v), e));
        if let Some(v) = &val {
            for (name, value) in v.metrics.iter() {
                let best = run.sums.best_val.entry(name.to_owned()).or_insert(value);
                *best = match self.metrics.higher_is_better(name) {
                    true => best.max(value),
                    false => best.min(value),
                };
            }
        }
        if let (Some(es), Some(v)) = (run.early_stopping, &val) {
            let state = run.sums.early_stopping.get_or_insert_with(Default::default);
            let reason = es.observe(state, place.epoch, &v.metrics);
            run.stop = run.stop.take().or(reason);
        }
        let mut record = self.epoch_record(run, place, val.as_ref())?;
        record.val_ema = val_ema.map(|e| e.metrics).unwrap_or_default();
        observer.on_epoch(&record)?;
        run.last_epoch = Some(record);
        if let Some(p) = run.profiler.as_mut() {
            p.end(ProfileUnit::Epochs)?;
        }
        run.sums = run.carried(self.skipped_steps()?);
        run.epoch = Tally::new(&self.metrics, self.device)?;
        run.interval = Tally::new(&self.metrics, self.device)?;
        let next = match place.consumed >= run.batches_per_epoch {
            true => (place.epoch + 1, 0),
            false => (place.epoch, place.consumed),
        };
        if checkpoint_plan(options).is_some() {
            run.checkpointed_at = self.steps_done;
        }
        if let Some(ckpt) = enabled(&options.checkpoints) {
            run.settle_checkpoint()?;
            let at_this_step = ckpt.dir.join(checkpoint::dir_name(self.steps_done));
            if !at_this_step.exists() {
                let sums = run.sums.clone();
                self.write_checkpoint(run, ckpt, next, sums, val.map(|v| v.metrics))?;
            }
        }
        Ok(())
    }

    /// The finished epoch's report.
    fn epoch_record(
        &self,
        run: &Run,
        place: &EpochPlace,
        val: Option<&Evaluation>,
    ) -> Result<EpochRecord, TrainError> {
        let train = self.across_ranks(&run.epoch)?;
        let t = run.monitor.total();
        let seconds = t.seconds - place.timing_before.seconds;
        let per_second = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
        Ok(EpochRecord {
            kind: "epoch",
            epoch: place.epoch,
            step: self.steps_done,
            train,
            val: val.map(|v| v.metrics.clone()).unwrap_or_default(),
            val_ema: MetricValues::default(),
            seconds: place.started.elapsed().as_secs_f64(),
            samples_per_s: per_second((t.samples - place.timing_before.samples) as f64)
                * self.world() as f64,
            data_wait_share: per_second(
                t.data_wait_seconds - place.timing_before.data_wait_seconds,
            )
            .clamp(0.0, 1.0),
            memory: MemorySample::read(self.device),
        })
    }

    /// The best validation values so far, in the metric set's order.
    fn best_values(&self, sums: &RunningSums) -> MetricValues {
        let mut best = MetricValues::default();
        for name in self.metrics.names() {
            if let Some(&v) = sums.best_val.get(name) {
                best.push(name, v);
            }
        }
        best
    }

    /// Closes the profiler and reports the summary.
    fn finish(&mut self, mut run: Run, observer: &mut dyn Observer) -> Result<Summary, TrainError> {
        run.settle_checkpoint()?;
        // The last step's stop vote: every rank counts it before leaving.
        if let Some(vote) = self.ranks.stop_vote.take() {
            vote.wait()?;
        }
        let profiler_traces = match run.profiler {
            Some(p) => p.finish()?,
            None => vec![],
        };
        self.timing.ranges = false;
        // A run shorter than the measurement keeps the choice from what it measured.
        let workers = run.workers.and_then(|mut t| t.finish().cloned());
        let total = run.monitor.total();
        let last = run.last_epoch.as_ref();
        let summary = Summary {
            model: self.model_name.clone(),
            task: self.loss.task(&run.target).to_owned(),
            loss: self.loss.name().to_owned(),
            parameters: self.parameters,
            device: format!("{:?}", self.device).to_lowercase(),
            precision: precision_name(self.settings.precision).to_owned(),
            epochs: self.settings.epochs,
            steps: self.steps_done,
            samples: total.samples * self.world() as u64,
            seconds: run.started.elapsed().as_secs_f64(),
            mean_step_time_s: total.step_seconds(),
            samples_per_s: total.samples_per_second() * self.world() as f64,
            data_wait_share: total.data_wait_share(),
            skipped_steps: self.skipped_steps()?,
            final_train: last.map(|e| e.train.clone()).unwrap_or_default(),
            final_val: last.map(|e| e.val.clone()).unwrap_or_default(),
            final_val_ema: last.map(|e| e.val_ema.clone()).unwrap_or_default(),
            best_val: self.best_values(&run.sums),
            chance_accuracy: run
                .target
                .classes()
                .filter(|_| {
                    matches!(
                        self.metrics.kind(),
                        MetricKind::Accuracy | MetricKind::Segmentation
                    )
                })
                .map(|c| 1.0 / c.max(1) as f64),
            memory: MemorySample::read(self.device),
            oom_retries: self.oom.retries,
            profiler_traces,
            num_workers_auto: workers,
            stopped_by: run.stop.clone(),
        };
        observer.on_finish(&summary)?;
        Ok(summary)
    }
}

/// Warns of each array stored as `f64`: the model gets it as `f32`.
fn warn_narrowed(arrays: &[kiln_data::ArraySpec]) {
    for a in arrays.iter().filter(|a| a.dtype == kiln_data::DType::F64) {
        tracing::warn!(
            "array `{}` is stored as f64; the model gets it as f32 (store it as f32 to say so)",
            a.name
        );
    }
}

/// The validation loader: the training loader's settings, in order, keeping the last batch.
/// Every rank of a data-parallel run validates on all of the validation set (the weights are
/// the same on every rank, so are the results, with no collective).
fn validation_loader(train: LoaderConfig) -> LoaderConfig {
    LoaderConfig {
        drop_last: false,
        sampler: SamplerConfig {
            shuffle: false,
            rank: 0,
            world_size: 1,
            ..train.sampler
        },
        ..train
    }
}

/// The checkpoint options, when checkpoints are on.
fn enabled(options: &Option<CheckpointOptions>) -> Option<&CheckpointOptions> {
    options.as_ref().filter(|c| c.plan.enabled)
}

/// The checkpoint schedule this rank follows: its own, or (another rank of a data-parallel
/// run) rank 0's.
fn checkpoint_plan(options: &FitOptions) -> Option<&kiln_config::CheckpointPlan> {
    let own = enabled(&options.checkpoints).map(|c| &c.plan);
    own.or(options.rank0_checkpoints.as_ref().filter(|p| p.enabled))
}

/// Whether `checkpoint.every_seconds = seconds` (0: off) makes a checkpoint due `since` the
/// last one.
fn timed_out(seconds: u64, since: Duration) -> bool {
    seconds > 0 && since >= Duration::from_secs(seconds)
}
