//! The multi-worker prefetching loader.
//!
//! Persistent worker threads take batch jobs (a list of sample indices) from a channel, read the
//! samples straight into one contiguous buffer per batch, and send the batch back. The workers
//! never run more than `num_workers × prefetch_factor` batches ahead of the consumer, which
//! gets them in sampler order, whatever order the workers finish in. A failing or panicking
//! sample ends the epoch with an error naming the sample, as soon as it happens. Dropping the loader stops and joins its
//! workers; with `num_workers = 0` batches are read inline on the consumer's thread.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, Sender};

use crate::{
    BatchBuffers, DType, DataError, Dataset, FeatureBuffer, HeapBuffers, Position, Sampler,
    SamplerConfig, TargetSlot, Targets,
};

/// How to batch and feed a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderConfig {
    pub batch_size: usize,
    /// Worker threads; 0 reads batches inline on the consumer's thread.
    pub num_workers: usize,
    /// Batches in flight per worker.
    pub prefetch_factor: usize,
    /// Drop the last, incomplete batch of an epoch.
    pub drop_last: bool,
    pub sampler: SamplerConfig,
    /// Threads that read a batch together when `num_workers = 0` (each a part of it), e.g. the
    /// trainer's compute threads, idle while it waits for the batch; 0 or 1: the consumer's
    /// thread alone.
    pub inline_threads: usize,
    /// Read each batch by name, one buffer per input array of [`Dataset::inputs`] in the type
    /// it reaches the model as ([`Batch::arrays`]), instead of as one `f32` features buffer.
    pub by_name: bool,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        Self {
            batch_size: 32,
            num_workers: 0,
            prefetch_factor: 2,
            drop_last: false,
            sampler: SamplerConfig::default(),
            inline_threads: 1,
            by_name: false,
        }
    }
}

/// One batch: features of every sample back to back, in one allocation; or, read by name, one
/// allocation per input array.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// `[batch, sample_shape…]`; `[batch]` when read by name.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, sample after sample, in the memory the loader's
    /// [`BatchBuffers`] gave; empty when read by name.
    pub features: FeatureBuffer,
    /// Read by name ([`LoaderConfig::by_name`]): every input array, in [`Dataset::inputs`]
    /// order; else empty.
    pub arrays: Vec<ArrayBatch>,
    /// The features are integer ids (exact in `f32`) that the model takes as `int64`.
    pub integer_features: bool,
    /// The samples' targets, sample after sample.
    pub targets: Targets,
    /// `[batch, target shape…]`.
    pub target_shape: Vec<usize>,
    /// The dataset indices of the samples, in batch order.
    pub indices: Vec<usize>,
    /// The batch's number within its epoch.
    pub number: usize,
}

/// One input array of a batch read by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayBatch {
    pub name: String,
    /// The type the model takes it as ([`DType::model`] of the stored type).
    pub dtype: DType,
    /// `[batch, sample shape…]`.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` elements of `dtype`, in the machine's byte order.
    pub data: Vec<u8>,
}

/// Throughput of the loader and how long its consumer waited for data.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoaderStats {
    pub batches: u64,
    pub samples: u64,
    /// Time the consumer spent blocked waiting for a batch (or reading it inline).
    pub wait: Duration,
    /// Time from the first request of a batch to now.
    pub elapsed: Duration,
}

impl LoaderStats {
    pub fn samples_per_second(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.samples as f64 / secs
        } else {
            0.0
        }
    }

    /// Share of the elapsed time the consumer spent waiting for data, in [0, 1].
    pub fn wait_share(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            (self.wait.as_secs_f64() / secs).min(1.0)
        } else {
            0.0
        }
    }
}

struct Job {
    generation: u64,
    number: usize,
    indices: Vec<usize>,
}

type Reply = (u64, usize, Result<Batch, DataError>);

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".to_owned())
}

/// Reads the samples of one batch into a single buffer, in parts on `pool`'s threads where
/// there is one; a panic is caught and named.
fn build_batch<D: Dataset>(
    dataset: &D,
    (number, indices, by_name): (usize, Vec<usize>, bool),
    buffers: &dyn BatchBuffers,
    pool: Option<&rayon::ThreadPool>,
) -> Result<Batch, DataError> {
    if by_name {
        return build_named(dataset, number, indices, pool);
    }
    let spec = dataset.target();
    let len = dataset.sample_numel() * indices.len();
    let mut features = buffers.features(len);
    if features.len() != len {
        return Err(DataError::InvalidConfig {
            key: "buffers",
            value: format!("a buffer of {} values", features.len()),
            expected: format!("one of {len} values, as asked for"),
        });
    }
    let mut targets = spec.batch(indices.len());
    let read = catch_unwind(AssertUnwindSafe(|| {
        read_parts(dataset, &indices, &mut features, targets.all(), pool)
    }));
    match read {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(payload) => return Err(name_panic(dataset, &indices, false, payload.as_ref())),
    }
    let mut shape = vec![indices.len()];
    shape.extend_from_slice(dataset.sample_shape());
    let mut target_shape = vec![indices.len()];
    target_shape.extend_from_slice(spec.shape());
    Ok(Batch {
        shape,
        features,
        arrays: vec![],
        integer_features: dataset.integer_features(),
        targets,
        target_shape,
        indices,
        number,
    })
}

/// [`Dataset::read_batch`] of `indices`, split into one contiguous part per thread of `pool`
/// (the whole batch on this thread without one); the first failing part's error.
fn read_parts<D: Dataset>(
    dataset: &D,
    indices: &[usize],
    features: &mut [f32],
    targets: TargetSlot<'_>,
    pool: Option<&rayon::ThreadPool>,
) -> Result<(), DataError> {
    let Some(pool) = pool.filter(|p| indices.len() > 1 && p.current_num_threads() > 1) else {
        return dataset.read_batch(indices, features, targets);
    };
    let (numel, per) = (dataset.sample_numel(), dataset.target().numel());
    let size = indices.len().div_ceil(pool.current_num_threads());
    let mut results = vec![Ok(()); indices.len().div_ceil(size)];
    let (mut rest_f, mut rest_t) = (features, targets);
    pool.scope(|scope| {
        for (chunk, result) in indices.chunks(size).zip(&mut results) {
            let (f, next_f) = rest_f.split_at_mut(chunk.len() * numel);
            let (t, next_t) = rest_t.split_at(chunk.len() * per);
            (rest_f, rest_t) = (next_f, next_t);
            scope.spawn(move |_| *result = dataset.read_batch(chunk, f, t));
        }
    });
    results.into_iter().collect()
}

/// Reads the samples of one batch by name: one buffer per input array, in parts on `pool`'s
/// threads where there is one; a panic is caught and named.
fn build_named<D: Dataset>(
    dataset: &D,
    number: usize,
    indices: Vec<usize>,
    pool: Option<&rayon::ThreadPool>,
) -> Result<Batch, DataError> {
    let spec = dataset.target();
    let n = indices.len();
    let mut arrays: Vec<ArrayBatch> = dataset
        .inputs()
        .into_iter()
        .map(|a| {
            let dtype = a.dtype.model();
            let mut shape = vec![n];
            shape.extend_from_slice(&a.shape);
            let data = vec![0u8; n * a.numel() * dtype.size()];
            ArrayBatch {
                name: a.name,
                dtype,
                shape,
                data,
            }
        })
        .collect();
    let mut targets = spec.batch(n);
    let read = catch_unwind(AssertUnwindSafe(|| {
        let mut slots: Vec<&mut [u8]> = arrays.iter_mut().map(|a| &mut a.data[..]).collect();
        read_named_parts(dataset, &indices, &mut slots, targets.all(), pool)
    }));
    match read {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(payload) => return Err(name_panic(dataset, &indices, true, payload.as_ref())),
    }
    let mut target_shape = vec![n];
    target_shape.extend_from_slice(spec.shape());
    Ok(Batch {
        shape: vec![n],
        features: FeatureBuffer::from_vec(vec![]),
        arrays,
        integer_features: false,
        targets,
        target_shape,
        indices,
        number,
    })
}

/// [`Dataset::read_arrays`] of `indices`, split into one contiguous part per thread of `pool`
/// (the whole batch on this thread without one); the first failing part's error.
fn read_named_parts<D: Dataset>(
    dataset: &D,
    indices: &[usize],
    slots: &mut [&mut [u8]],
    targets: TargetSlot<'_>,
    pool: Option<&rayon::ThreadPool>,
) -> Result<(), DataError> {
    let Some(pool) = pool.filter(|p| indices.len() > 1 && p.current_num_threads() > 1) else {
        return dataset.read_arrays(indices, slots, targets);
    };
    let n = indices.len();
    let size = n.div_ceil(pool.current_num_threads());
    let per = dataset.target().numel();
    // Each part's share of every array: its rows' bytes, cut from the front of the rest.
    let mut parts: Vec<Vec<&mut [u8]>> = indices.chunks(size).map(|_| vec![]).collect();
    for slot in slots.iter_mut() {
        let row = slot.len() / n;
        let mut rest: &mut [u8] = slot;
        for (chunk, part) in indices.chunks(size).zip(&mut parts) {
            let (mine, next) = rest.split_at_mut(chunk.len() * row);
            part.push(mine);
            rest = next;
        }
    }
    let mut results = vec![Ok(()); parts.len()];
    let mut rest_t = targets;
    pool.scope(|scope| {
        for ((chunk, mut part), result) in indices.chunks(size).zip(parts).zip(&mut results) {
            let (t, next_t) = rest_t.split_at(chunk.len() * per);
            rest_t = next_t;
            scope.spawn(move |_| *result = dataset.read_arrays(chunk, &mut part, t));
        }
    });
    results.into_iter().collect()
}

/// The error for a panic while reading `indices`: the batch is read again sample by sample
/// (by name where it was read by name) to find the sample at fault (the batch's first where none
/// panics again).
fn name_panic<D: Dataset>(
    dataset: &D,
    indices: &[usize],
    by_name: bool,
    payload: &(dyn std::any::Any + Send),
) -> DataError {
    let mut target = dataset.target().batch(1);
    let mut read_one: Box<dyn FnMut(usize) -> Result<(), DataError> + '_> = if by_name {
        let mut arrays: Vec<Vec<u8>> = dataset
            .inputs()
            .iter()
            .map(|a| vec![0u8; a.numel() * a.dtype.model().size()])
            .collect();
        Box::new(move |index| {
            let mut slots: Vec<&mut [u8]> = arrays.iter_mut().map(|a| &mut a[..]).collect();
            dataset.read_arrays(&[index], &mut slots, target.all())
        })
    } else {
        let mut features = vec![0f32; dataset.sample_numel()];
        Box::new(move |index| dataset.read_sample(index, &mut features, target.all()))
    };
    let culprit = indices
        .iter()
        .copied()
        .find(|&index| catch_unwind(AssertUnwindSafe(|| read_one(index))).is_err());
    DataError::WorkerPanic {
        index: culprit.or(indices.first().copied()).unwrap_or(0),
        message: panic_message(payload),
    }
}

/// Workers need at least one batch in flight each.
fn check_prefetch(workers: usize, prefetch_factor: usize) -> Result<(), DataError> {
    if workers > 0 && prefetch_factor == 0 {
        return Err(DataError::InvalidConfig {
            key: "prefetch_factor",
            value: "0".to_owned(),
            expected: "at least 1 when num_workers > 0".to_owned(),
        });
    }
    Ok(())
}

/// A multi-worker prefetching loader over one dataset; workers persist across epochs.
pub struct Loader<D: Dataset> {
    dataset: Arc<D>,
    config: LoaderConfig,
    sampler: Sampler,
    jobs: Option<Sender<Job>>,
    replies: Receiver<Reply>,
    workers: Vec<JoinHandle<()>>,
    /// The threads reading inline batches in parts (`inline_threads` > 1, no workers).
    inline_pool: Option<rayon::ThreadPool>,
    /// Where batches' features are written.
    buffers: Arc<dyn BatchBuffers>,
    /// The epoch being served; workers skip jobs of an abandoned one.
    generation: Arc<AtomicU64>,
    stats: LoaderStats,
    started: Option<Instant>,
}

impl<D: Dataset> std::fmt::Debug for Loader<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("config", &self.config)
            .field("samples", &self.dataset.len())
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl<D: Dataset> Loader<D> {
    /// Starts the workers. Errors name the setting at fault.
    pub fn new(dataset: Arc<D>, config: LoaderConfig) -> Result<Self, DataError> {
        Self::with_buffers(dataset, config, Arc::new(HeapBuffers))
    }

    /// Like [`Loader::new`], each batch's features written into memory from `buffers`.
    pub fn with_buffers(
        dataset: Arc<D>,
        config: LoaderConfig,
        buffers: Arc<dyn BatchBuffers>,
    ) -> Result<Self, DataError> {
        if config.batch_size == 0 {
            return Err(DataError::InvalidConfig {
                key: "batch_size",
                value: "0".to_owned(),
                expected: "at least 1".to_owned(),
            });
        }
        check_prefetch(config.num_workers, config.prefetch_factor)?;
        let sampler = Sampler::new(dataset.len(), config.sampler)?;
        let mut loader = Self {
            dataset,
            config,
            sampler,
            jobs: None,
            replies: channel::never(),
            workers: vec![],
            inline_pool: None,
            buffers,
            generation: Arc::new(AtomicU64::new(0)),
            stats: LoaderStats::default(),
            started: None,
        };
        loader.start_workers()?;
        Ok(loader)
    }

    /// Starts `config.num_workers` threads on a fresh job queue and reply channel, or without
    /// workers the inline readers' pool (once).
    fn start_workers(&mut self) -> Result<(), DataError> {
        let inline = self.config.inline_threads;
        if self.config.num_workers == 0 && inline > 1 && self.inline_pool.is_none() {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(inline)
                .thread_name(|i| format!("kiln-read-{i}"))
                .build()
                .map_err(|e| DataError::InvalidConfig {
                    key: "inline_threads",
                    value: inline.to_string(),
                    expected: format!("a number of threads this system can start ({e})"),
                })?;
            self.inline_pool = Some(pool);
        }
        let (job_tx, job_rx) = channel::unbounded::<Job>();
        let (reply_tx, reply_rx) = channel::unbounded::<Reply>();
        self.jobs = Some(job_tx);
        self.replies = reply_rx;
        let by_name = self.config.by_name;
        for id in 0..self.config.num_workers {
            let (dataset, jobs, replies, generation, buffers) = (
                Arc::clone(&self.dataset),
                job_rx.clone(),
                reply_tx.clone(),
                Arc::clone(&self.generation),
                Arc::clone(&self.buffers),
            );
            let handle = std::thread::Builder::new()
                .name(format!("kiln-data-{id}"))
                .spawn(move || {
                    for job in jobs.iter() {
                        if job.generation != generation.load(Ordering::Acquire) {
                            continue; // an abandoned epoch's job
                        }
                        let job_of = (job.number, job.indices, by_name);
                        let batch = build_batch(&*dataset, job_of, &*buffers, None);
                        if replies.send((job.generation, job.number, batch)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| DataError::InvalidConfig {
                    key: "num_workers",
                    value: self.config.num_workers.to_string(),
                    expected: format!("a number of threads this system can start ({e})"),
                })?;
            self.workers.push(handle);
        }
        Ok(())
    }

    /// Abandons queued jobs, closes the queue and joins the workers (each finishes its batch).
    fn stop_workers(&mut self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.jobs.take();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }

    /// Serves the next epochs (or the next [`Loader::resume`]) with `workers` threads instead:
    /// the current ones finish their batch and stop, and an epoch in progress must be resumed.
    /// The batches are the same whatever the count; only who reads them changes.
    pub fn set_workers(&mut self, workers: usize) -> Result<(), DataError> {
        check_prefetch(workers, self.config.prefetch_factor)?;
        self.stop_workers();
        self.config.num_workers = workers;
        if workers > 0 {
            // The threads that read batches in parts without workers are not needed now.
            self.inline_pool = None;
        }
        self.start_workers()
    }

    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    /// Batches in one epoch on this rank.
    pub fn batches_per_epoch(&self) -> usize {
        let n = self.sampler.epoch_len();
        if self.config.drop_last {
            n / self.config.batch_size
        } else {
            n.div_ceil(self.config.batch_size)
        }
    }

    /// The batches of `epoch`, from the start.
    pub fn epoch(&mut self, epoch: u64) -> EpochIter<'_, D> {
        self.resume(Position { epoch, batch: 0 })
    }

    /// The batches of `position.epoch` from batch `position.batch` on: exactly the batches an
    /// uninterrupted epoch would have produced after the first `position.batch`.
    pub fn resume(&mut self, position: Position) -> EpochIter<'_, D> {
        let indices = self.sampler.epoch_indices(position.epoch);
        let bs = self.config.batch_size;
        let mut batches: Vec<Vec<usize>> = indices.chunks(bs).map(<[usize]>::to_vec).collect();
        if self.config.drop_last && batches.last().is_some_and(|b| b.len() < bs) {
            batches.pop();
        }
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.started.get_or_insert_with(Instant::now);
        EpochIter {
            next_submit: position.batch.min(batches.len()),
            next_yield: position.batch.min(batches.len()),
            batches,
            pending: BTreeMap::new(),
            generation,
            done: false,
            loader: self,
        }
    }

    /// Throughput and consumer wait time so far.
    pub fn stats(&self) -> LoaderStats {
        LoaderStats {
            elapsed: self.started.map_or(Duration::ZERO, |s| s.elapsed()),
            ..self.stats
        }
    }
}

impl<D: Dataset> Drop for Loader<D> {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

/// The batches of one epoch, in sampler order.
pub struct EpochIter<'a, D: Dataset> {
    loader: &'a mut Loader<D>,
    batches: Vec<Vec<usize>>,
    next_submit: usize,
    next_yield: usize,
    pending: BTreeMap<usize, Batch>,
    generation: u64,
    done: bool,
}

impl<D: Dataset> std::fmt::Debug for EpochIter<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochIter")
            .field("next", &self.next_yield)
            .field("batches", &self.batches.len())
            .finish()
    }
}

impl<D: Dataset> EpochIter<'_, D> {
    fn submit(&mut self) -> Result<(), DataError> {
        // The bound counts every batch requested but not yet handed out, finished or not, so the
        // workers never run more than `limit` batches ahead of the consumer.
        let limit = self.loader.config.num_workers * self.loader.config.prefetch_factor;
        let jobs = self.loader.jobs.as_ref().ok_or(DataError::Disconnected)?;
        while self.next_submit - self.next_yield < limit && self.next_submit < self.batches.len() {
            let number = self.next_submit;
            let indices = std::mem::take(&mut self.batches[number]);
            jobs.send(Job {
                generation: self.generation,
                number,
                indices,
            })
            .map_err(|_| DataError::Disconnected)?;
            self.next_submit += 1;
        }
        Ok(())
    }

    fn next_batch(&mut self) -> Result<Batch, DataError> {
        if self.loader.config.num_workers == 0 {
            let number = self.next_yield;
            let indices = std::mem::take(&mut self.batches[number]);
            let (pool, buffers) = (self.loader.inline_pool.as_ref(), &*self.loader.buffers);
            let job = (number, indices, self.loader.config.by_name);
            return build_batch(&*self.loader.dataset, job, buffers, pool);
        }
        self.submit()?;
        loop {
            if let Some(batch) = self.pending.remove(&self.next_yield) {
                return Ok(batch);
            }
            let (generation, number, reply) = self
                .loader
                .replies
                .recv()
                .map_err(|_| DataError::Disconnected)?;
            if generation != self.generation {
                continue; // a reply from an abandoned epoch
            }
            self.pending.insert(number, reply?);
            self.submit()?;
        }
    }
}

impl<D: Dataset> Iterator for EpochIter<'_, D> {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.next_yield >= self.batches.len() {
            return None;
        }
        let waited = Instant::now();
        let result = self.next_batch();
        let stats = &mut self.loader.stats;
        stats.wait += waited.elapsed();
        match &result {
            Ok(batch) => {
                stats.batches += 1;
                stats.samples += batch.indices.len() as u64;
                self.next_yield += 1;
            }
            Err(_) => self.done = true,
        }
        Some(result)
    }
}
