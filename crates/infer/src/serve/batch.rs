//! The batching policy: how the worker gathers queued requests into one runner call.
//!
//! [`collect_batch`] is a plain function over a channel so that tests can drive it with their
//! own job type; the worker thread calls it in a loop with the server's jobs.

use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, RecvTimeoutError, TryRecvError};

/// A queued unit of work as the batching policy sees it.
pub trait Queued {
    /// How many samples the job holds (its share of a batch).
    fn samples(&self) -> usize;
    /// When the job was queued; a batch waits at most `max_wait` past its first job's arrival.
    fn arrival(&self) -> Instant;
}

/// Why [`collect_batch`] stopped adding jobs to a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosedBy {
    /// The batch reached `max_batch` samples, or the next job would have overflowed it (that job
    /// is held over as the first of the next batch).
    Full,
    /// `max_wait` passed since the first job arrived, and no more jobs were queued.
    Deadline,
    /// Every sender is gone and the channel is empty (shutdown): the last, partial batch.
    Closed,
}

/// Jobs to run as one runner call.
#[derive(Debug)]
pub struct Batch<J> {
    /// The jobs, in arrival order; never empty.
    pub jobs: Vec<J>,
    /// The sum of the jobs' samples; at most `max_batch` (unless a single job is larger, which
    /// the HTTP layer never queues).
    pub samples: usize,
    /// Why the batch stopped growing.
    pub closed_by: ClosedBy,
}

/// Gathers the next batch from `rx`, starting with `held_over` (the job the previous batch had
/// no room for) if there is one.
///
/// - With nothing held over, blocks until a job arrives; returns `None` once the channel is
///   closed and empty (the worker's signal to exit).
/// - The batch's deadline is its first job's arrival plus `max_wait`. Until then it takes
///   queued jobs as they come; jobs already queued when the deadline passes still join (they
///   cost no waiting), so under load batches fill up.
/// - Jobs are never split or dropped: one that would push the batch past `max_batch` samples
///   is stored in `held_over` and the batch closes as [`ClosedBy::Full`]. A batch that reaches
///   exactly `max_batch` closes at once.
/// - A first job larger than `max_batch` on its own still forms a batch (by itself), so the
///   loop can never get stuck on it.
pub fn collect_batch<J: Queued>(
    rx: &Receiver<J>,
    held_over: &mut Option<J>,
    max_batch: usize,
    max_wait: Duration,
) -> Option<Batch<J>> {
    let first = match held_over.take() {
        Some(job) => job,
        None => rx.recv().ok()?,
    };
    // `None` only for a max_wait so long it overflows `Instant`: then wait without a deadline.
    let deadline = first.arrival().checked_add(max_wait);
    let mut samples = first.samples();
    let mut jobs = vec![first];
    let close = |jobs, samples, closed_by| {
        Some(Batch {
            jobs,
            samples,
            closed_by,
        })
    };
    loop {
        if samples >= max_batch {
            return close(jobs, samples, ClosedBy::Full);
        }
        let next = match rx.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Disconnected) => return close(jobs, samples, ClosedBy::Closed),
            Err(TryRecvError::Empty) => {
                let waited = match deadline {
                    Some(deadline) => rx.recv_deadline(deadline),
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                };
                match waited {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => {
                        return close(jobs, samples, ClosedBy::Deadline);
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        return close(jobs, samples, ClosedBy::Closed);
                    }
                }
            }
        };
        if samples.saturating_add(next.samples()) > max_batch {
            *held_over = Some(next);
            return close(jobs, samples, ClosedBy::Full);
        }
        samples += next.samples();
        jobs.push(next);
    }
}
