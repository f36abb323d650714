//! Data-parallel training: the trainer's view of the ranks a launcher started (torchrun,
//! SLURM, `kiln train --nproc-per-node`) and the two collectives it needs from their process
//! group: rank 0's weights to every rank at the start, and the mean of the gradients (and of
//! the logged metrics) over the ranks at each step. On c10d the gradients go through
//! `c10d::Reducer`, PyTorch's DDP engine, bucket by bucket while backward runs.

use std::sync::{Arc, Mutex};

use tch::{Kind, Tensor};

pub use kiln_torch_ext::dist::Buckets;
use kiln_torch_ext::dist::Reducer;

use crate::TrainError;

/// A process group as the trainer uses it (torch-ext's c10d group implements it; tests use an
/// in-process one).
pub trait Group: std::fmt::Debug + Send {
    /// This process's rank, 0 to `world_size − 1`.
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Makes every rank's `tensors` equal to rank 0's, in place.
    fn broadcast_from_first(&mut self, tensors: &[Tensor]) -> Result<(), TrainError>;
    /// Replaces each of `tensors`, in place, by its mean over the ranks.
    fn all_reduce_mean(&mut self, tensors: &[Tensor]) -> Result<(), TrainError>;
    /// Replaces each of `tensors`, in place, by its sum over the ranks. By default the mean
    /// times the world size (exact for a world size that is a power of 2).
    fn all_reduce_sum(&mut self, tensors: &[Tensor]) -> Result<(), TrainError> {
        self.all_reduce_mean(tensors)?;
        let world = self.world_size() as f64;
        for t in tensors {
            let _ = t.shallow_clone().f_mul_scalar_(world)?;
        }
        Ok(())
    }

    /// At the start of training: checks that every rank holds the same `trainable`
    /// parameters, then makes every rank's `tensors` (parameters and buffers) rank 0's. By
    /// default only the broadcast.
    fn start(&mut self, trainable: &[Tensor], tensors: &[Tensor]) -> Result<(), TrainError> {
        let _ = trainable;
        self.broadcast_from_first(tensors)
    }

    /// Starts the ranks' vote on stopping (this rank votes `votes`); the answer, for each
    /// reason whether any rank voted it, comes from [`StopVote::wait`]. By default decided at
    /// once.
    fn start_stop_vote(&mut self, votes: StopVotes) -> Result<Box<dyn StopVote>, TrainError> {
        let flags = votes.tensor()?;
        self.all_reduce_mean(std::slice::from_ref(&flags))?;
        Ok(Box::new(Decided(StopVotes::counted(&flags)?)))
    }

    /// How this group averages the gradients of `params` during training. By default one
    /// flat all-reduce after the step's last backward ([`AfterBackward`]).
    fn gradient_sync(
        &mut self,
        params: &[Tensor],
        buckets: Buckets,
    ) -> Result<Box<dyn GradientSync>, TrainError> {
        let _ = (params, buckets);
        Ok(Box::new(AfterBackward))
    }
}

/// What a rank votes at a step: to stop because it was asked to (a signal), or because its
/// clock passed `train.max_time` (each rank's own clock: the vote makes them agree); and, from
/// the rank that writes checkpoints, that `checkpoint.every_seconds` passed on its clock (every
/// rank takes part in a checkpoint inside an epoch, so they must agree on its step too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopVotes {
    pub asked: bool,
    pub time_up: bool,
    pub checkpoint_due: bool,
}

impl StopVotes {
    fn tensor(self) -> Result<Tensor, TrainError> {
        let flag = |b: bool| f32::from(u8::from(b));
        Ok(Tensor::f_from_slice(&[
            flag(self.asked),
            flag(self.time_up),
            flag(self.checkpoint_due),
        ])?)
    }

    /// The reasons any rank voted, from the reduced flags (a sum or a mean).
    fn counted(flags: &Tensor) -> Result<Self, TrainError> {
        Ok(Self {
            asked: flags.f_double_value(&[0])? > 0.0,
            time_up: flags.f_double_value(&[1])? > 0.0,
            checkpoint_due: flags.f_double_value(&[2])? > 0.0,
        })
    }
}

/// A vote on stopping, under way ([`Group::start_stop_vote`]).
pub trait StopVote: std::fmt::Debug + Send {
    /// For each reason, whether any rank voted it.
    fn wait(self: Box<Self>) -> Result<StopVotes, TrainError>;
}

/// A vote already counted.
#[derive(Debug)]
struct Decided(StopVotes);

impl StopVote for Decided {
    fn wait(self: Box<Self>) -> Result<StopVotes, TrainError> {
        Ok(self.0)
    }
}

/// A vote c10d is counting while training goes on.
#[derive(Debug)]
struct Counting {
    pending: kiln_torch_ext::dist::Pending,
    votes: Tensor,
}

impl StopVote for Counting {
    fn wait(self: Box<Self>) -> Result<StopVotes, TrainError> {
        self.pending.wait()?;
        StopVotes::counted(&self.votes)
    }
}

/// How the gradients of a step are averaged over the ranks. Each micro-batch of a step calls
/// [`GradientSync::before_forward`] and, when it is the step's last (the one whose backward
/// synchronises), [`GradientSync::before_backward`]; after the last backward,
/// [`GradientSync::after_backward`].
pub trait GradientSync: std::fmt::Debug + Send {
    fn before_forward(&mut self, last: bool) -> Result<(), TrainError>;
    /// `loss` is what backward starts from.
    fn before_backward(&mut self, loss: &Tensor) -> Result<(), TrainError>;
    fn after_backward(&mut self, group: &SharedGroup, grads: &[Tensor]) -> Result<(), TrainError>;
}

/// Gradients averaged in one flat all-reduce after the step's last backward (the fallback for
/// groups that are not c10d's).
#[derive(Debug)]
pub struct AfterBackward;

impl GradientSync for AfterBackward {
    fn before_forward(&mut self, _last: bool) -> Result<(), TrainError> {
        Ok(())
    }
    fn before_backward(&mut self, _loss: &Tensor) -> Result<(), TrainError> {
        Ok(())
    }
    fn after_backward(&mut self, group: &SharedGroup, grads: &[Tensor]) -> Result<(), TrainError> {
        average_gradients(group, grads)
    }
}

/// c10d's DDP engine: gradient buckets all-reduced from autograd hooks while backward runs;
/// micro-batches before a step's last skip it (PyTorch's `no_sync`) and accumulate locally.
#[derive(Debug)]
struct C10dReducer {
    reducer: Reducer,
    find_unused: bool,
}

impl GradientSync for C10dReducer {
    fn before_forward(&mut self, last: bool) -> Result<(), TrainError> {
        Ok(self.reducer.before_forward(last)?)
    }
    fn before_backward(&mut self, loss: &Tensor) -> Result<(), TrainError> {
        let outputs = if self.find_unused {
            vec![loss.shallow_clone()]
        } else {
            Vec::new()
        };
        Ok(self.reducer.before_backward(&outputs)?)
    }
    fn after_backward(&mut self, _: &SharedGroup, _: &[Tensor]) -> Result<(), TrainError> {
        Ok(())
    }
}

/// A group shared by the run and its trainer.
pub type SharedGroup = Arc<Mutex<dyn Group>>;

/// Locks `group` (a panic elsewhere while holding it leaves nothing half-done).
pub fn lock(group: &SharedGroup) -> std::sync::MutexGuard<'_, dyn Group + 'static> {
    group
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Averages `grads` over the ranks as one flat buffer (one collective per step), so that every
/// rank steps with the gradient of the global batch.
pub fn average_gradients(group: &SharedGroup, grads: &[Tensor]) -> Result<(), TrainError> {
    let mut g = lock(group);
    if g.world_size() == 1 || grads.is_empty() {
        return Ok(());
    }
    let flat: Vec<Tensor> = grads
        .iter()
        .map(|t| t.f_reshape([-1]))
        .collect::<Result<_, _>>()?;
    let flat = Tensor::f_cat(&flat, 0)?;
    g.all_reduce_mean(std::slice::from_ref(&flat))?;
    let mut offset = 0;
    for t in grads {
        let n = t.numel() as i64;
        let part = flat.f_narrow(0, offset, n)?.f_view_as(t)?;
        t.shallow_clone().f_copy_(&part)?;
        offset += n;
    }
    Ok(())
}

/// `e`, the error of `what` on `rank` of `world_size`, as a [`TrainError::Distributed`] when
/// it is a collective's failure (a native error of that kind, or any libtorch error of a
/// backward whose hooks all-reduce); other errors are returned as they are.
pub fn collective_error(
    rank: usize,
    world_size: usize,
    what: &str,
    e: TrainError,
    backward: bool,
) -> TrainError {
    let message = match &e {
        TrainError::Torch(t) if t.is_distributed() => t.to_string(),
        TrainError::Tch(t) if backward => t.to_string(),
        _ => return e,
    };
    TrainError::Distributed {
        rank,
        world_size,
        what: what.to_owned(),
        message: message.lines().next().unwrap_or_default().to_owned(),
    }
}

/// `sums` and `samples` added up over the ranks (every rank holds the same metrics, so the
/// sums line up); their own with one rank.
pub fn sum_over_ranks(
    group: &SharedGroup,
    sums: Vec<f64>,
    samples: u64,
) -> Result<(Vec<f64>, u64), TrainError> {
    let mut g = lock(group);
    let world = g.world_size();
    if world == 1 {
        return Ok((sums, samples));
    }
    let mut values = sums;
    values.push(samples as f64);
    let t = Tensor::f_from_slice(&values)?.f_to_kind(Kind::Double)?;
    g.all_reduce_mean(std::slice::from_ref(&t))?;
    let mut total: Vec<f64> = Vec::<f64>::try_from(&t.f_mul_scalar(world as f64)?)?;
    let samples = total.pop().unwrap_or_default().round() as u64;
    Ok((total, samples))
}

/// The smallest of every rank's `value` (each rank posts its value in its own slot; the
/// all-reduce's mean times the world size gives every slot).
pub fn min_over_ranks(group: &SharedGroup, value: u64) -> Result<u64, TrainError> {
    let mut g = lock(group);
    let world = g.world_size();
    if world == 1 {
        return Ok(value);
    }
    let mut slots = vec![0.0_f64; world];
    slots[g.rank()] = value as f64;
    let t = Tensor::f_from_slice(&slots)?.f_to_kind(Kind::Double)?;
    g.all_reduce_mean(std::slice::from_ref(&t))?;
    let all: Vec<f64> = Vec::<f64>::try_from(&t)?;
    Ok(all
        .iter()
        .map(|v| (v * world as f64).round() as u64)
        .min()
        .unwrap_or(value))
}

/// Every rank's `row` (all of the same length), in rank order, on every rank: each rank
/// posts its row in its own slot of one sum over the ranks (the others' slots zero, so each
/// value arrives exactly).
pub fn gather_rows(group: &SharedGroup, row: &[f64]) -> Result<Vec<Vec<f64>>, TrainError> {
    let mut g = lock(group);
    let (world, rank) = (g.world_size(), g.rank());
    if world == 1 {
        return Ok(vec![row.to_vec()]);
    }
    let mut slots = vec![0.0_f64; world * row.len()];
    slots[rank * row.len()..(rank + 1) * row.len()].copy_from_slice(row);
    let t = Tensor::f_from_slice(&slots)?;
    g.all_reduce_sum(std::slice::from_ref(&t))?;
    let all = Vec::<f64>::try_from(&t)?;
    Ok(all.chunks(row.len().max(1)).map(<[f64]>::to_vec).collect())
}

/// Checks that every rank runs the same job: each `(what, value)` of this rank against rank
/// 0's. All ranks learn the verdict together (no rank is left waiting in a collective), and
/// the error names what differs.
pub fn check_same_setup(group: &SharedGroup, setup: &[(&str, f64)]) -> Result<(), TrainError> {
    let mut g = lock(group);
    if g.world_size() == 1 || setup.is_empty() {
        return Ok(());
    }
    let mine: Vec<f64> = setup.iter().map(|(_, v)| *v).collect();
    let first = Tensor::f_from_slice(&mine)?.f_to_kind(Kind::Double)?;
    g.broadcast_from_first(std::slice::from_ref(&first))?;
    let first: Vec<f64> = Vec::<f64>::try_from(&first)?;
    let differs = setup
        .iter()
        .zip(&first)
        .find(|((_, v), f)| (*v - **f).abs() > 0.0)
        .map(|((what, v), f)| format!("{what} is {v} here and {f} on rank 0"));
    let flag = Tensor::f_from_slice(&[f64::from(u8::from(differs.is_some()))])?;
    g.all_reduce_mean(std::slice::from_ref(&flag))?;
    let any = flag.f_double_value(&[0])? > 0.0;
    match (any, differs) {
        (false, _) => Ok(()),
        (true, Some(what)) => Err(TrainError::InvalidPlan {
            key: "distributed",
            value: format!("rank {}", g.rank()),
            expected: format!("the same job on every rank: {what}"),
        }),
        (true, None) => Err(TrainError::InvalidPlan {
            key: "distributed",
            value: format!("rank {}", g.rank()),
            expected: "the same job on every rank: another rank's differs from rank 0's".to_owned(),
        }),
    }
}

impl Group for kiln_torch_ext::dist::ProcessGroup {
    fn rank(&self) -> usize {
        kiln_torch_ext::dist::ProcessGroup::rank(self)
    }
    fn world_size(&self) -> usize {
        kiln_torch_ext::dist::ProcessGroup::world_size(self)
    }
    fn broadcast_from_first(&mut self, tensors: &[Tensor]) -> Result<(), TrainError> {
        let nccl = self.has_nccl();
        reachable(nccl, tensors, |t| Ok(self.broadcast(t, 0)?))
    }
    fn all_reduce_mean(&mut self, tensors: &[Tensor]) -> Result<(), TrainError> {
        let nccl = self.has_nccl();
        reachable(nccl, tensors, |t| Ok(self.all_reduce(t, true)?))
    }
    fn all_reduce_sum(&mut self, tensors: &[Tensor]) -> Result<(), TrainError> {
        let nccl = self.has_nccl();
        reachable(nccl, tensors, |t| Ok(self.all_reduce(t, false)?))
    }
    fn start(&mut self, trainable: &[Tensor], tensors: &[Tensor]) -> Result<(), TrainError> {
        let nccl = self.has_nccl();
        reachable(nccl, trainable, |t| Ok(self.verify_params(t)?))?;
        // DistributedDataParallel's broadcast buffer: 250 MiB.
        reachable(nccl, tensors, |t| {
            Ok(self.broadcast_coalesced(t, 250 << 20, 0)?)
        })
    }
    fn start_stop_vote(&mut self, votes: StopVotes) -> Result<Box<dyn StopVote>, TrainError> {
        let votes = votes.tensor()?;
        let pending = self.all_reduce_sum_start(&votes)?;
        Ok(Box::new(Counting { pending, votes }))
    }
    fn gradient_sync(
        &mut self,
        params: &[Tensor],
        buckets: Buckets,
    ) -> Result<Box<dyn GradientSync>, TrainError> {
        if !self.has_nccl() && params.iter().any(|p| p.device() != tch::Device::Cpu) {
            // Gloo alone reaches host memory: CUDA gradients through host copies, after
            // backward (what a group without NCCL can do).
            return Ok(Box::new(AfterBackward));
        }
        Ok(Box::new(C10dReducer {
            reducer: self.reducer(params, buckets)?,
            find_unused: buckets.find_unused_parameters,
        }))
    }
}

/// Runs `f` on `tensors` where the group reaches them (CPU tensors, and CUDA ones with NCCL),
/// else on host copies.
fn reachable(
    nccl: bool,
    tensors: &[Tensor],
    f: impl FnOnce(&[Tensor]) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    if nccl {
        f(tensors)
    } else {
        on_host(tensors, f)
    }
}

/// Runs `f` on CPU copies of `tensors` (Gloo works on host memory) and copies the results
/// back; CPU tensors are used as they are.
fn on_host(
    tensors: &[Tensor],
    f: impl FnOnce(&[Tensor]) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    if tensors.iter().all(|t| t.device() == tch::Device::Cpu) {
        return f(tensors);
    }
    let host: Vec<Tensor> = tensors
        .iter()
        .map(|t| t.f_to_device(tch::Device::Cpu))
        .collect::<Result<_, _>>()?;
    f(&host)?;
    let _guard = tch::no_grad_guard();
    for (t, h) in tensors.iter().zip(&host) {
        t.shallow_clone().f_copy_(h)?;
    }
    Ok(())
}

/// This process's place among the ranks a launcher started, connected (waiting at most
/// `timeout`): Gloo, and with `cuda` NCCL too on GPU `LOCAL_RANK`; `None` when no launcher
/// variables are set. On one machine (MASTER_ADDR a loopback address) Gloo binds 127.0.0.1;
/// otherwise c10d picks the interface (`GLOO_SOCKET_IFNAME`).
pub fn connect_from_env(
    timeout: std::time::Duration,
    cuda: bool,
) -> Result<Option<(SharedGroup, kiln_torch_ext::dist::Rendezvous)>, TrainError> {
    use kiln_torch_ext::dist::ProcessGroup;
    let Some(r) = kiln_torch_ext::dist::Rendezvous::from_env()? else {
        return Ok(None);
    };
    let local = r.master_addr == "127.0.0.1" || r.master_addr == "localhost";
    let host = local.then_some("127.0.0.1");
    let group = if cuda {
        ProcessGroup::connect_nccl(&r, timeout, host, r.local_rank)?
    } else {
        ProcessGroup::connect(&r, timeout, host)?
    };
    let shared: SharedGroup = Arc::new(Mutex::new(group));
    Ok(Some((shared, r)))
}
