//! The worker thread: builds the runner, then runs batches gathered by [`collect_batch`] and
//! answers each job with its slice of the outputs. Also the readiness state it publishes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crossbeam::channel::Receiver;
use tokio::sync::oneshot;

use super::batch::{Batch, Queued, collect_batch};
use super::error::panic_message;
use super::metrics::Metrics;
use super::{BatchRunner, RunnerFactory};

/// One request's samples, queued for the worker.
#[derive(Debug)]
pub(crate) struct Job {
    /// `n * product(sample_shape)` values.
    pub inputs: Vec<f32>,
    /// Samples in `inputs` (1..=max_batch).
    pub n: usize,
    /// When the job was queued.
    pub arrival: Instant,
    /// Where the worker sends the outputs (or the runner's error).
    pub reply: oneshot::Sender<Result<Prediction, String>>,
}

impl Queued for Job {
    fn samples(&self) -> usize {
        self.n
    }
    fn arrival(&self) -> Instant {
        self.arrival
    }
}

/// One job's outputs: `n * product(out_shape)` values.
#[derive(Debug)]
pub(crate) struct Prediction {
    pub values: Vec<f32>,
    /// The shape of one sample's output.
    pub out_shape: Vec<usize>,
}

/// Where the runner is in its life, as `/ready` and the handlers see it.
#[derive(Debug, Clone)]
pub(crate) enum LoadState {
    Loading,
    /// Built; holds the runner's input sample shape.
    Ready(Arc<[usize]>),
    /// The factory failed; holds its message.
    Failed(Arc<str>),
}

/// The runner's load state, waited on by [`super::Server::wait_ready`], plus the shutdown flag
/// `/ready` reports.
#[derive(Debug)]
pub(crate) struct Readiness {
    state: Mutex<LoadState>,
    changed: Condvar,
    shutting_down: AtomicBool,
}

impl Readiness {
    pub fn new() -> Self {
        Self {
            state: Mutex::new(LoadState::Loading),
            changed: Condvar::new(),
            shutting_down: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LoadState> {
        // The state is a plain value, valid even if a holder panicked.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn state(&self) -> LoadState {
        self.lock().clone()
    }

    fn set(&self, state: LoadState) {
        *self.lock() = state;
        self.changed.notify_all();
    }

    /// Blocks while the runner is loading; the factory's message if it failed.
    pub fn wait(&self) -> Result<(), String> {
        let guard = self
            .changed
            .wait_while(self.lock(), |s| matches!(s, LoadState::Loading))
            .unwrap_or_else(PoisonError::into_inner);
        match &*guard {
            LoadState::Failed(message) => Err(message.to_string()),
            _ => Ok(()),
        }
    }

    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

/// Marks the load as failed if the worker thread ends (by a panic outside the guarded calls)
/// before the runner was built, so that `wait_ready` cannot block forever.
struct LoadGuard<'a>(&'a Readiness);

impl Drop for LoadGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        if matches!(*state, LoadState::Loading) {
            *state = LoadState::Failed("the worker thread stopped while loading".into());
            self.0.changed.notify_all();
        }
    }
}

/// What the worker needs besides the factory.
#[derive(Debug)]
pub(crate) struct WorkerContext {
    pub jobs: Receiver<Job>,
    pub max_batch: usize,
    pub max_wait: Duration,
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<Metrics>,
}

/// The worker thread's body: builds the runner, then batches and runs jobs until the channel is
/// closed and drained.
pub(crate) fn run_worker(factory: RunnerFactory, ctx: WorkerContext) {
    let guard = LoadGuard(&ctx.readiness);
    let loaded = Instant::now();
    let mut runner = match catch_unwind(AssertUnwindSafe(factory)) {
        Ok(Ok(runner)) => runner,
        Ok(Err(message)) => {
            tracing::error!("the model runner failed to load: {message}");
            ctx.readiness.set(LoadState::Failed(message.into()));
            return;
        }
        Err(payload) => {
            let message = format!("the runner factory panicked: {}", panic_message(&*payload));
            tracing::error!("{message}");
            ctx.readiness.set(LoadState::Failed(message.into()));
            return;
        }
    };
    let sample_shape: Arc<[usize]> = runner.sample_shape().into();
    tracing::info!(
        sample_shape = ?&*sample_shape,
        load_secs = loaded.elapsed().as_secs_f64(),
        "model runner ready"
    );
    ctx.readiness.set(LoadState::Ready(sample_shape.clone()));
    drop(guard);

    let sample_len = sample_shape.iter().product::<usize>();
    let mut held_over = None;
    while let Some(batch) = collect_batch(&ctx.jobs, &mut held_over, ctx.max_batch, ctx.max_wait) {
        // The held-over job (if any) still counts as waiting.
        let started = i64::try_from(batch.jobs.len()).unwrap_or(i64::MAX);
        ctx.metrics.queue_changed(-started);
        run_batch(&mut *runner, batch, sample_len, &ctx.metrics);
    }
    tracing::debug!("inference worker drained its queue and stopped");
}

/// Runs `batch` as one runner call (a panic is caught and becomes the batch's error) and sends
/// every job its outputs, or the error.
fn run_batch(runner: &mut dyn BatchRunner, batch: Batch<Job>, sample_len: usize, m: &Metrics) {
    let n = batch.samples;
    let mut inputs = Vec::with_capacity(n.saturating_mul(sample_len));
    for job in &batch.jobs {
        inputs.extend_from_slice(&job.inputs);
    }
    let started = Instant::now();
    let result = if inputs.len() != n.saturating_mul(sample_len) {
        Err(format!(
            "internal error: the batch holds {} values for {n} samples of {sample_len} values",
            inputs.len()
        ))
    } else {
        match catch_unwind(AssertUnwindSafe(|| runner.run(&inputs, n))) {
            Ok(result) => result,
            Err(payload) => Err(format!("the model panicked: {}", panic_message(&*payload))),
        }
    };
    m.observe_batch(n, started.elapsed());
    let result = result.and_then(|(values, out_shape)| {
        let out_len = element_count(&out_shape);
        match out_len.zip(out_len.and_then(|l| l.checked_mul(n))) {
            Some((out_len, want)) if want == values.len() => Ok((values, out_shape, out_len)),
            _ => Err(format!(
                "the model returned {} values for {n} samples of output shape {out_shape:?}",
                values.len()
            )),
        }
    });
    match result {
        Ok((values, out_shape, out_len)) => {
            let mut rest = values.as_slice();
            for job in batch.jobs {
                let len = job.n.saturating_mul(out_len);
                let reply = match rest.split_at_checked(len) {
                    Some((mine, tail)) => {
                        rest = tail;
                        Ok(Prediction {
                            values: mine.to_vec(),
                            out_shape: out_shape.clone(),
                        })
                    }
                    None => Err("internal error: the outputs ran short".to_owned()),
                };
                // The client may have gone away; nothing to do then.
                let _ = job.reply.send(reply);
            }
        }
        Err(message) => {
            m.batch_failed();
            tracing::warn!(
                samples = n,
                requests = batch.jobs.len(),
                "model runner failed: {message}"
            );
            for job in batch.jobs {
                let _ = job.reply.send(Err(message.clone()));
            }
        }
    }
}

/// The number of elements of `shape`; `None` on overflow.
pub(crate) fn element_count(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}
