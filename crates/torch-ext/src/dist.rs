//! Data-parallel collectives on PyTorch's own c10d: a Gloo process group found through a
//! TCPStore rendezvous (rank 0 hosts it, or torchrun's agent does), with broadcast, all-reduce
//! and barrier over CPU tensors. The launcher's variables (RANK, WORLD_SIZE, …) say where.

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

    /// [`Self::from_vars`] over this process's environment.
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }
}

/// A c10d process group on Gloo (CPU tensors). Dropping it leaves the group.
#[derive(Debug)]
pub struct ProcessGroup {
    ptr: *mut c_void,
    rank: usize,
    world_size: usize,
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

impl ProcessGroup {
    /// Meets the other ranks (waiting at most `timeout`) and forms the group. `gloo_host` is
    /// the address Gloo binds ("127.0.0.1" on one machine); `None` lets c10d choose
    /// (`GLOO_SOCKET_IFNAME`, else the hostname's address).
    pub fn connect(r: &Rendezvous, timeout: Duration, gloo_host: Option<&str>) -> Result<Self> {
        let addr = c_string("MASTER_ADDR", &r.master_addr)?;
        let restart = c_string("TORCHELASTIC_RESTART_COUNT", &r.restart_count)?;
        let host = c_string("the Gloo host", gloo_host.unwrap_or(""))?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid C strings and an out pointer; on success `ptr` is an owned handle.
        ffi::check("distributed connect", unsafe {
            ffi::kiln_dist_connect(
                c_int_of("RANK", r.rank)?,
                c_int_of("WORLD_SIZE", r.world_size)?,
                addr.as_ptr(),
                c_int::from(r.master_port),
                timeout.as_secs_f64(),
                r.agent_store,
                restart.as_ptr(),
                host.as_ptr(),
                &mut ptr,
            )
        })?;
        Ok(Self {
            ptr,
            rank: r.rank,
            world_size: r.world_size,
        })
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

    /// Waits until every rank gets here.
    pub fn barrier(&mut self) -> Result<()> {
        // SAFETY: a live group.
        ffi::check("barrier", unsafe { ffi::kiln_dist_barrier(self.ptr) })
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
