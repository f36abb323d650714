//! Data-parallel collectives on PyTorch's own c10d: a process group found through a TCPStore
//! rendezvous (rank 0 hosts it, or torchrun's agent does) — Gloo for CPU tensors, NCCL for CUDA
//! ones where the build has it — with broadcast, all-reduce, barrier, c10d's parameter check,
//! and c10d's DDP engine (`Reducer`) for gradients. The launcher's variables (RANK,
//! WORLD_SIZE, …) say where.

use std::ffi::{CString, c_int, c_void};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::ffi;

/// Where this rank meets the others: what torchrun, SLURM setups and Kubernetes PyTorchJobs
/// export, or `kiln train --nproc-per-node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// torchrun's agent already hosts the store (`TORCHELASTIC_USE_AGENT_STORE=True`): every
    /// rank connects as a client, under `/worker/attempt_<restart count>`.
    pub agent_store: bool,
    pub restart_count: String,
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument {
        op: "distributed rendezvous",
        message,
    }
}

impl Rendezvous {
    /// The rendezvous the launcher's variables describe, read through `var`; `None` without
    /// `RANK` and `WORLD_SIZE` (this process trains alone). A malformed or missing variable is
    /// an error naming it.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let (Some(rank), Some(world)) = (var("RANK"), var("WORLD_SIZE")) else {
            return Ok(None);
        };
        let number = |name: &str, text: &str| {
            text.trim()
                .parse::<usize>()
                .map_err(|_| invalid(format!("{name}={text:?} is not a whole number")))
        };
        let (rank, world_size) = (number("RANK", &rank)?, number("WORLD_SIZE", &world)?);
        if world_size == 0 || rank >= world_size {
            return Err(invalid(format!(
                "RANK={rank} must be below WORLD_SIZE={world_size} (and WORLD_SIZE at least 1)"
            )));
        }
        let local_rank = match var("LOCAL_RANK") {
            Some(t) => number("LOCAL_RANK", &t)?,
            None => rank,
        };
        let master_addr = var("MASTER_ADDR")
            .ok_or_else(|| invalid("MASTER_ADDR is not set (the address of rank 0)".into()))?;
        let port = var("MASTER_PORT")
            .ok_or_else(|| invalid("MASTER_PORT is not set (rank 0's store port)".into()))?;
        let master_port = port
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| invalid(format!("MASTER_PORT={port:?} is not a port (1 to 65535)")))?;
        Ok(Some(Self {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
            agent_store: var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v == "True"),
            restart_count: var("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".to_owned()),
        }))
    }

    /// Rank `rank` of `world_size` on this machine, rank 0's store at 127.0.0.1:`port` (what
    /// ranks started as threads, or a one-rank self-check, use).
    pub fn loopback(rank: usize, world_size: usize, port: u16) -> Self {
        Self {
            rank,
            world_size,
            local_rank: rank,
            master_addr: "127.0.0.1".to_owned(),
            master_port: port,
            agent_store: false,
            restart_count: "0".to_owned(),
        }
    }

    /// [`Self::from_vars`] over this process's environment.
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }
}

/// A c10d process group: Gloo for CPU tensors, and with [`ProcessGroup::connect_nccl`] NCCL
/// for CUDA ones. Dropping it leaves the group.
#[derive(Debug)]
pub struct ProcessGroup {
    ptr: *mut c_void,
    rank: usize,
    world_size: usize,
    nccl: bool,
}

/// Whether this build has c10d's NCCL process group (libtorch with CUDA, and NCCL's and CUDA's
/// headers found when kiln was built).
pub fn nccl_available() -> bool {
    cfg!(kiln_nccl)
}

// SAFETY: c10d process groups are used from any thread (their work runs on their own threads);
// kiln calls one group from one thread at a time (the trainer holds it behind a Mutex).
unsafe impl Send for ProcessGroup {}

fn c_string(what: &str, text: &str) -> Result<CString> {
    CString::new(text).map_err(|_| invalid(format!("{what} {text:?} holds a NUL byte")))
}

fn c_int_of(what: &str, n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| invalid(format!("{what} {n} is out of range")))
}

/// A rendezvous as the C ABI takes it.
struct CRendezvous {
    rank: c_int,
    world: c_int,
    addr: CString,
    port: c_int,
    restart: CString,
    host: CString,
}

impl CRendezvous {
    fn new(r: &Rendezvous, gloo_host: Option<&str>) -> Result<Self> {
        Ok(Self {
            rank: c_int_of("RANK", r.rank)?,
            world: c_int_of("WORLD_SIZE", r.world_size)?,
            addr: c_string("MASTER_ADDR", &r.master_addr)?,
            port: c_int::from(r.master_port),
            restart: c_string("TORCHELASTIC_RESTART_COUNT", &r.restart_count)?,
            host: c_string("the Gloo host", gloo_host.unwrap_or(""))?,
        })
    }
}

impl ProcessGroup {
    fn joined(ptr: *mut c_void, r: &Rendezvous, nccl: bool) -> Self {
        Self {
            ptr,
            rank: r.rank,
            world_size: r.world_size,
            nccl,
        }
    }

    /// Meets the other ranks (waiting at most `timeout`) and forms the group. `gloo_host` is
    /// the address Gloo binds ("127.0.0.1" on one machine); `None` lets c10d choose
    /// (`GLOO_SOCKET_IFNAME`, else the hostname's address).
    pub fn connect(r: &Rendezvous, timeout: Duration, gloo_host: Option<&str>) -> Result<Self> {
        let c = CRendezvous::new(r, gloo_host)?;
        let (t, agent) = (timeout.as_secs_f64(), r.agent_store);
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid C strings and an out pointer; on success `ptr` is an owned handle.
        ffi::check("distributed connect", unsafe {
            ffi::kiln_dist_connect(
                c.rank,
                c.world,
                c.addr.as_ptr(),
                c.port,
                t,
                agent,
                c.restart.as_ptr(),
                c.host.as_ptr(),
                &mut ptr,
            )
        })?;
        Ok(Self::joined(ptr, r, false))
    }

    /// Like [`ProcessGroup::connect`], with NCCL for CUDA tensors on GPU `device_index` (this
    /// rank's `LOCAL_RANK`: NCCL takes one rank per GPU) beside Gloo for CPU tensors.
    #[cfg(kiln_nccl)]
    pub fn connect_nccl(
        r: &Rendezvous,
        timeout: Duration,
        gloo_host: Option<&str>,
        device_index: usize,
    ) -> Result<Self> {
        let c = CRendezvous::new(r, gloo_host)?;
        let (t, agent) = (timeout.as_secs_f64(), r.agent_store);
        let device = c_int_of("LOCAL_RANK", device_index)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid C strings and an out pointer; on success `ptr` is an owned handle.
        ffi::check("distributed connect (NCCL)", unsafe {
            ffi::kiln_dist_connect_nccl(
                c.rank,
                c.world,
                c.addr.as_ptr(),
                c.port,
                t,
                agent,
                c.restart.as_ptr(),
                c.host.as_ptr(),
                device,
                &mut ptr,
            )
        })?;
        Ok(Self::joined(ptr, r, true))
    }

    /// Without NCCL in this build: an error saying so.
    #[cfg(not(kiln_nccl))]
    pub fn connect_nccl(
        _r: &Rendezvous,
        _timeout: Duration,
        _gloo_host: Option<&str>,
        _device_index: usize,
    ) -> Result<Self> {
        Err(Error::Unavailable {
            op: "data-parallel training on CUDA (NCCL)",
            reason: "this kiln was built without NCCL (it needs a libtorch with CUDA and NCCL's \
                     and CUDA's headers, as the torch wheel's nvidia/nccl and nvidia/cu13 \
                     provide)"
                .to_owned(),
        })
    }

    /// Whether CUDA tensors go through NCCL in this group.
    pub fn has_nccl(&self) -> bool {
        self.nccl
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Every rank's `tensors` become rank `root`'s, in place.
    pub fn broadcast(&mut self, tensors: &[tch::Tensor], root: usize) -> Result<()> {
        let p: Vec<*const c_void> = tensors.iter().map(ffi::tensor_ptr).collect();
        let root = c_int_of("the root rank", root)?;
        // SAFETY: a live group and live tensor handles for the call.
        ffi::check("broadcast", unsafe {
            ffi::kiln_dist_broadcast(self.ptr, p.as_ptr(), p.len(), root)
        })
    }

    /// Each of `tensors` becomes, in place, its sum over the ranks (its mean with `mean`).
    pub fn all_reduce(&mut self, tensors: &[tch::Tensor], mean: bool) -> Result<()> {
        let p: Vec<*const c_void> = tensors.iter().map(ffi::tensor_ptr).collect();
        // SAFETY: a live group and live tensor handles for the call.
        ffi::check("all-reduce", unsafe {
            ffi::kiln_dist_all_reduce(self.ptr, p.as_ptr(), p.len(), mean)
        })
    }

    /// Starts summing `t` over the ranks, in place, while this thread goes on; the result is
    /// there once [`Pending::wait`] returns. Every rank starts the same collectives in the
    /// same order.
    pub fn all_reduce_sum_start(&mut self, t: &tch::Tensor) -> Result<Pending> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live group, a live tensor handle, and an out pointer that on success holds
        // an owned work handle (which keeps the tensor alive until the work is done).
        ffi::check("all-reduce", unsafe {
            ffi::kiln_dist_all_reduce_start(self.ptr, ffi::tensor_ptr(t), &mut ptr)
        })?;
        Ok(Pending { ptr })
    }

    /// Waits until every rank gets here.
    pub fn barrier(&mut self) -> Result<()> {
        // SAFETY: a live group.
        ffi::check("barrier", unsafe { ffi::kiln_dist_barrier(self.ptr) })
    }

    /// c10d's check that every rank holds `params` of the same number, shapes and kinds
    /// (what DistributedDataParallel runs at start): every rank fails alike, naming the
    /// first difference.
    pub fn verify_params(&mut self, params: &[tch::Tensor]) -> Result<()> {
        let p: Vec<*const c_void> = params.iter().map(ffi::tensor_ptr).collect();
        // SAFETY: a live group and live tensor handles for the call.
        ffi::check("verify parameters across ranks", unsafe {
            ffi::kiln_dist_verify_params(self.ptr, p.as_ptr(), p.len())
        })
    }

    /// Every rank's `tensors` become rank `root`'s, sent in flat buffers of at most
    /// `buffer_bytes` (DistributedDataParallel's sync of parameters and buffers at start).
    pub fn broadcast_coalesced(
        &mut self,
        tensors: &[tch::Tensor],
        buffer_bytes: usize,
        root: usize,
    ) -> Result<()> {
        let p: Vec<*const c_void> = tensors.iter().map(ffi::tensor_ptr).collect();
        let root = c_int_of("the root rank", root)?;
        let bytes = i64::try_from(buffer_bytes)
            .map_err(|_| invalid(format!("broadcast buffer {buffer_bytes} is out of range")))?;
        // SAFETY: a live group and live tensor handles for the call.
        ffi::check("broadcast", unsafe {
            ffi::kiln_dist_broadcast_coalesced(self.ptr, p.as_ptr(), p.len(), bytes, root)
        })
    }

    /// c10d's DDP engine (`c10d::Reducer`) over `params`: see [`Reducer`].
    pub fn reducer(&mut self, params: &[tch::Tensor], buckets: Buckets) -> Result<Reducer> {
        let p: Vec<*const c_void> = params.iter().map(ffi::tensor_ptr).collect();
        let bytes = |what: &str, mb: f64| -> Result<i64> {
            let b = mb * 1024.0 * 1024.0;
            if (1.0..9.0e18).contains(&b) {
                Ok(b as i64)
            } else {
                Err(invalid(format!("{what} {mb} MiB is not a positive size")))
            }
        };
        let cap = bytes("the gradient bucket", buckets.cap_mb)?;
        let first = bytes("the first gradient bucket", buckets.first_mb)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live group, live tensor handles, and an out pointer that on success holds
        // an owned reducer (which keeps its own references to the group and the parameters).
        ffi::check("gradient reducer", unsafe {
            ffi::kiln_dist_reducer_new(
                self.ptr,
                p.as_ptr(),
                p.len(),
                cap,
                first,
                buckets.find_unused_parameters,
                &mut ptr,
            )
        })?;
        Ok(Reducer { ptr })
    }
}

/// A collective under way ([`ProcessGroup::all_reduce_sum_start`]). Dropping it without
/// waiting lets it finish on its own.
#[derive(Debug)]
pub struct Pending {
    ptr: *mut c_void,
}

// SAFETY: a c10d work handle may be waited on from any thread.
unsafe impl Send for Pending {}

impl Pending {
    /// Waits for the collective (at most the group's timeout).
    pub fn wait(self) -> Result<()> {
        // SAFETY: a live work handle; `self` frees it when dropped.
        ffi::check("all-reduce", unsafe { ffi::kiln_dist_work_wait(self.ptr) })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // SAFETY: the handle came from kiln_dist_all_reduce_start and is freed exactly once.
        unsafe { ffi::kiln_dist_work_free(self.ptr) }
    }
}

/// How a [`Reducer`] groups gradients: PyTorch's `DistributedDataParallel` arguments of the
/// same names and defaults (`bucket_cap_mb` 25, the first bucket 1 MiB,
/// `find_unused_parameters` off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Buckets {
    pub cap_mb: f64,
    pub first_mb: f64,
    /// Search each step's graph for parameters that got no gradient (a model whose forward
    /// skips some), so their buckets still complete.
    pub find_unused_parameters: bool,
}

impl Default for Buckets {
    fn default() -> Self {
        Self {
            cap_mb: 25.0,
            first_mb: 1.0,
            find_unused_parameters: false,
        }
    }
}

/// c10d's DDP engine (`c10d::Reducer`, the engine under PyTorch's `DistributedDataParallel`):
/// autograd hooks on the parameters all-reduce their gradients in buckets while backward is
/// still running, and leave each gradient averaged over the ranks. Each micro-batch calls
/// [`Reducer::before_forward`]; one whose gradients are synchronised then calls
/// [`Reducer::before_backward`] before its backward. Micro-batches that skip it accumulate
/// locally (PyTorch's `no_sync`); the next synchronised backward all-reduces the sum.
#[derive(Debug)]
pub struct Reducer {
    ptr: *mut c_void,
}

// SAFETY: the reducer is driven from one thread at a time (the trainer owns it); its hooks
// run on autograd's threads, which c10d synchronises itself.
unsafe impl Send for Reducer {}

impl Reducer {
    /// Before a forward pass: buckets are rebuilt once (after the first synchronised step,
    /// in the order gradients arrived), and a synchronised micro-batch is announced.
    pub fn before_forward(&mut self, sync: bool) -> Result<()> {
        // SAFETY: a live reducer.
        ffi::check("gradient reducer (before forward)", unsafe {
            ffi::kiln_dist_reducer_before_forward(self.ptr, sync)
        })
    }

    /// Arms the hooks for the backward that follows; `outputs` (needed only with
    /// `find_unused_parameters`) are where the search for unused parameters starts.
    pub fn before_backward(&mut self, outputs: &[tch::Tensor]) -> Result<()> {
        let p: Vec<*const c_void> = outputs.iter().map(ffi::tensor_ptr).collect();
        // SAFETY: a live reducer and live tensor handles for the call.
        ffi::check("gradient reducer (before backward)", unsafe {
            ffi::kiln_dist_reducer_before_backward(self.ptr, p.as_ptr(), p.len())
        })
    }
}

impl Drop for Reducer {
    fn drop(&mut self) {
        // SAFETY: the handle came from kiln_dist_reducer_new and is freed exactly once.
        unsafe { ffi::kiln_dist_reducer_free(self.ptr) }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: the handle came from kiln_dist_connect and is freed exactly once.
        unsafe { ffi::kiln_dist_free(self.ptr) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn launcher_variables_make_a_rendezvous_or_none() {
        assert_eq!(Rendezvous::from_vars(vars(&[])).unwrap(), None);
        let r = Rendezvous::from_vars(vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((r.rank, r.world_size, r.local_rank), (1, 2, 1));
        assert_eq!((r.master_addr.as_str(), r.master_port), ("10.0.0.1", 29500));
        assert!(r.agent_store);
        assert_eq!(r.restart_count, "0");
    }

    #[test]
    fn bad_launcher_variables_are_named() {
        let base = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")];
        let err = |extra: &[(&str, &str)]| {
            let all: Vec<(&str, &str)> = base.iter().chain(extra).copied().collect();
            Rendezvous::from_vars(vars(&all)).unwrap_err().to_string()
        };
        assert!(err(&[("RANK", "x"), ("WORLD_SIZE", "2")]).contains("RANK=\"x\""));
        assert!(err(&[("RANK", "2"), ("WORLD_SIZE", "2")]).contains("must be below WORLD_SIZE"));
        let no_port = Rendezvous::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "1")]));
        assert!(
            no_port
                .unwrap_err()
                .to_string()
                .contains("MASTER_ADDR is not set")
        );
    }
}
