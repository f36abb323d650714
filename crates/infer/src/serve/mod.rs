//! The HTTP inference server: `POST /v1/predict` (JSON or `.npy`), dynamic batching onto one
//! worker thread that owns the model, health/readiness probes, Prometheus metrics, graceful
//! shutdown, and a closed-loop load generator for benchmarks.
//!
//! Layout:
//! - [`Server`] starts everything and stops it gracefully;
//! - [`collect_batch`] is the batching policy the worker thread runs (tests drive it directly);
//! - [`loadgen`] measures a running server's throughput and latency.
//!
//! Connections (`conn`): at most `max_connections` open at once (one more gets 503 with
//! `Retry-After` and is closed); a request must arrive in full within `read_timeout` of its
//! first byte (else 408, and the connection closes), and an idle connection is closed after as
//! long. HTTP/1.1 only.
//!
//! Request flow: an HTTP handler validates the body and converts it to f32 samples, then
//! `try_send`s a job into a bounded queue (`queue_capacity`; full → 503). The worker thread
//! gathers queued jobs into batches of at most `max_batch` samples, waiting at most `max_wait`
//! after the first job arrived, runs each batch as one [`BatchRunner::run`] call and sends each
//! job its slice of the outputs.

mod batch;
mod codec;
mod conn;
mod error;
mod http;
pub mod loadgen;
mod metrics;
mod server;
mod worker;

pub use batch::{Batch, ClosedBy, Queued, collect_batch};
pub use codec::decode_request;
pub use error::ServeError;
pub use server::{ServeStats, Server, ShutdownHandle};

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// What the server runs batches on. Built and used on one dedicated worker thread (libtorch
/// models are not `Send`), so the runner itself need not be `Send`.
pub trait BatchRunner {
    /// Shape of one input sample, without the batch dimension (e.g. `[784]` or `[64, 469]`).
    fn sample_shape(&self) -> &[usize];

    /// Runs `n` samples stored contiguously in `inputs` (`n * product(sample_shape)` f32 values,
    /// C order). Returns the outputs: `n * product(out_shape)` f32 values and the per-sample
    /// output shape.
    ///
    /// An `Err` (or a panic) fails every request of the batch with a 500 carrying the message;
    /// the worker keeps serving.
    fn run(&mut self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, Vec<usize>), String>;
}

/// A factory that builds the runner on the worker thread (it may take seconds: loading a model,
/// warming up). `/ready` turns true only after it returned `Ok`.
pub type RunnerFactory = Box<dyn FnOnce() -> Result<Box<dyn BatchRunner>, String> + Send + 'static>;

/// How the server listens and batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// The address to listen on (default 127.0.0.1).
    pub host: IpAddr,
    /// The port to listen on; 0 picks any free port (tests; read it back with
    /// [`Server::local_addr`]).
    pub port: u16,
    /// The most samples one batch (and so one request) may hold: the profile's inference batch
    /// size.
    pub max_batch: usize,
    /// How long the first request of a batch may wait for more to join it.
    pub max_wait: Duration,
    /// The most requests that may wait in the queue; beyond this, requests get 503.
    pub queue_capacity: usize,
    /// The largest request body accepted, in bytes; larger bodies get 413.
    pub max_body_bytes: usize,
    /// How long a request may take to arrive, from its first byte to its body's last; past it,
    /// 408 and the connection closes. An idle connection is closed after as long.
    pub read_timeout: Duration,
    /// Connections open at once; one more gets 503 (with `Retry-After`) and is closed.
    pub max_connections: usize,
    /// Threads of the async runtime that parses and answers requests; 0 = one per CPU core.
    pub http_threads: usize,
    /// How long a graceful shutdown waits for open connections (requests in the queue or in a
    /// batch, but also stalled clients) before closing them regardless.
    pub shutdown_timeout: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8080,
            max_batch: 32,
            max_wait: Duration::from_millis(2),
            queue_capacity: 1024,
            max_body_bytes: 32 << 20,
            read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            http_threads: 0,
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

impl ServeConfig {
    /// The server settings of a run plan: `serve.*`, and `infer.batch_size` as the batch limit.
    pub fn from_plan(plan: &kiln_config::RunPlan) -> Self {
        let s = &plan.serve;
        Self {
            host: s.host,
            port: s.port,
            max_batch: usize::try_from(plan.infer.batch_size).unwrap_or(usize::MAX),
            max_wait: s.max_wait,
            queue_capacity: usize::try_from(s.queue_capacity).unwrap_or(usize::MAX),
            max_body_bytes: usize::try_from(s.max_body_bytes).unwrap_or(usize::MAX),
            read_timeout: s.read_timeout,
            max_connections: usize::try_from(s.max_connections).unwrap_or(usize::MAX),
            ..Self::default()
        }
    }

    /// Checks the settings that have a lower bound.
    pub fn validate(&self) -> Result<(), ServeError> {
        let positive = |key: &'static str, value: usize| {
            if value == 0 {
                Err(ServeError::InvalidConfig {
                    key,
                    value: value.to_string(),
                    expected: "at least 1".to_owned(),
                })
            } else {
                Ok(())
            }
        };
        positive("max_batch", self.max_batch)?;
        positive("queue_capacity", self.queue_capacity)?;
        positive("max_body_bytes", self.max_body_bytes)?;
        positive("max_connections", self.max_connections)?;
        if self.read_timeout.is_zero() {
            return Err(ServeError::InvalidConfig {
                key: "read_timeout",
                value: "0".to_owned(),
                expected: "a positive duration".to_owned(),
            });
        }
        Ok(())
    }
}
