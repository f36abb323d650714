//! Starting and stopping the server: the listener, the async runtime's thread, the worker
//! thread, the shutdown handle and the final statistics.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Serialize;
use tokio::sync::watch;

use super::conn::{CappedListener, ConnPhase};
use super::error::panic_message;
use super::http::{self, AppState};
use super::metrics::{Metrics, Outcome};
use super::worker::{Readiness, WorkerContext, run_worker};
use super::{RunnerFactory, ServeConfig, ServeError};

/// A running inference server. Stop it with [`Server::shutdown`] (or a [`ShutdownHandle`] and
/// [`Server::wait`]); dropping it without either also starts a graceful shutdown, in the
/// background.
pub struct Server {
    addr: SocketAddr,
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
    shutdown: ShutdownHandle,
    runtime: tokio::runtime::Handle,
    http: JoinHandle<Result<(), ServeError>>,
    worker: JoinHandle<()>,
    started: Instant,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Triggers the server's graceful shutdown from anywhere (a signal handler, another thread).
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    stop: Arc<watch::Sender<bool>>,
    readiness: Arc<Readiness>,
}

impl ShutdownHandle {
    /// Starts the graceful shutdown: `/ready` turns 503, the listener stops accepting, and
    /// every request already accepted is answered (within `shutdown_timeout`). Returns at once;
    /// calling it again does nothing.
    ///
    /// It takes a lock, so it is not async-signal-safe: call it from a thread that watches for
    /// signals (signal-hook's iterator, tokio's `signal`), not from a raw signal handler.
    pub fn trigger(&self) {
        self.readiness.set_shutting_down();
        if !self.stop.send_replace(true) {
            tracing::info!("inference server shutting down: finishing accepted requests");
        }
    }

    /// Whether the shutdown was triggered.
    pub fn is_triggered(&self) -> bool {
        *self.stop.borrow()
    }
}

impl Server {
    /// Binds the listener (an error names the address if it is taken), spawns the worker thread
    /// (which calls `factory`) and the async runtime's thread, and returns at once. Use
    /// [`Server::wait_ready`] to wait for the runner.
    pub fn start(config: ServeConfig, factory: RunnerFactory) -> Result<Server, ServeError> {
        config.validate()?;
        let addr = SocketAddr::new(config.host, config.port);
        let bind_error = |e: std::io::Error| ServeError::Bind {
            addr,
            message: e.to_string(),
        };
        let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;

        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.enable_all().thread_name("kiln-serve-http");
        if config.http_threads > 0 {
            builder.worker_threads(config.http_threads);
        }
        let runtime = builder.build().map_err(|e| ServeError::Start {
            what: "async runtime",
            message: e.to_string(),
        })?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(bind_error)?
        };

        let metrics = Arc::new(Metrics::new(config.max_batch));
        let readiness = Arc::new(Readiness::new());
        let (jobs, queue) = crossbeam::channel::bounded(config.queue_capacity);
        let context = WorkerContext {
            jobs: queue,
            max_batch: config.max_batch,
            max_wait: config.max_wait,
            readiness: readiness.clone(),
            metrics: metrics.clone(),
        };
        let worker = std::thread::Builder::new()
            .name("kiln-serve-worker".to_owned())
            .spawn(move || run_worker(factory, context))
            .map_err(|e| ServeError::Start {
                what: "worker thread",
                message: e.to_string(),
            })?;

        let (stop, mut stopped) = watch::channel(false);
        let shutdown = ShutdownHandle {
            stop: Arc::new(stop),
            readiness: readiness.clone(),
        };
        let app = http::router(Arc::new(AppState {
            jobs,
            readiness: readiness.clone(),
            metrics: metrics.clone(),
            max_batch: config.max_batch,
            max_body_bytes: config.max_body_bytes,
            queue_capacity: config.queue_capacity,
            read_timeout: config.read_timeout,
        }));
        let listener = CappedListener::new(
            listener,
            config.max_connections,
            config.read_timeout,
            metrics.clone(),
        );
        let handle = runtime.handle().clone();
        let shutdown_timeout = config.shutdown_timeout;
        // If this spawn fails, `app` (and with it the jobs sender) is dropped, so the worker
        // exits on its own once its factory returns.
        let http = std::thread::Builder::new()
            .name("kiln-serve-main".to_owned())
            .spawn(move || {
                let mut overdue_stop = stopped.clone();
                // Every handle gone without a trigger also stops the server (a dropped Server).
                let signal = async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                let overdue = async move {
                    let _ = overdue_stop.wait_for(|stop| *stop).await;
                    tokio::time::sleep(shutdown_timeout).await;
                };
                let served = runtime.block_on(async move {
                    let app = app.into_make_service_with_connect_info::<ConnPhase>();
                    let serve = axum::serve(listener, app).with_graceful_shutdown(signal);
                    tokio::select! {
                        served = serve => served,
                        () = overdue => {
                            tracing::warn!(
                                "connections still open {:.1} s after the shutdown started; \
                                 closing them",
                                shutdown_timeout.as_secs_f64()
                            );
                            Ok(())
                        }
                    }
                });
                // Dropping the runtime here cancels whatever connections are left, and with
                // them the last jobs senders.
                drop(runtime);
                served.map_err(|e| ServeError::Http {
                    message: e.to_string(),
                })
            })
            .map_err(|e| ServeError::Start {
                what: "HTTP thread",
                message: e.to_string(),
            })?;

        tracing::info!(
            addr = %local_addr,
            max_batch = config.max_batch,
            max_wait_ms = config.max_wait.as_secs_f64() * 1e3,
            queue_capacity = config.queue_capacity,
            max_body_bytes = config.max_body_bytes,
            read_timeout_s = config.read_timeout.as_secs_f64(),
            max_connections = config.max_connections,
            "inference server listening on http://{local_addr}"
        );
        Ok(Server {
            addr: local_addr,
            readiness,
            metrics,
            shutdown,
            runtime: handle,
            http,
            worker,
            started: Instant::now(),
        })
    }

    /// The address the server listens on (with the actual port when `port` was 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the worker has built the runner; the factory's message if it failed.
    pub fn wait_ready(&self) -> Result<(), ServeError> {
        self.readiness
            .wait()
            .map_err(|message| ServeError::RunnerLoad { message })
    }

    /// A handle that triggers the same graceful shutdown as [`Server::shutdown`].
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Triggers the graceful shutdown on SIGINT (Ctrl-C) or, on Unix, SIGTERM. Once installed,
    /// these signals no longer end the process by themselves.
    pub fn shutdown_on_signals(&self) {
        let handle = self.shutdown.clone();
        let mut stopped = handle.stop.subscribe();
        self.runtime.spawn(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
                _ = terminate() => tracing::info!("SIGTERM received"),
                _ = stopped.wait_for(|stop| *stop) => return,
            }
            handle.trigger();
        });
    }

    /// Graceful shutdown: stops accepting, answers every request already accepted (queued or
    /// in a batch), then joins the threads. Returns the final statistics.
    pub fn shutdown(self) -> Result<ServeStats, ServeError> {
        self.shutdown.trigger();
        self.wait()
    }

    /// Blocks until a shutdown was triggered (through a [`ShutdownHandle`] or a signal, see
    /// [`Server::shutdown_on_signals`]) and has completed. Returns the final statistics.
    pub fn wait(self) -> Result<ServeStats, ServeError> {
        let Server {
            metrics,
            shutdown,
            http,
            worker,
            started,
            ..
        } = self;
        let served = join(http, "HTTP");
        // The HTTP side is gone, and with it every jobs sender: the worker drains the queue
        // and exits.
        let worked = join(worker, "worker");
        drop(shutdown);
        served??;
        worked?;
        let stats = ServeStats::from_metrics(&metrics, started.elapsed().as_secs_f64());
        tracing::info!("inference server stopped: {stats}");
        Ok(stats)
    }
}

fn join<T>(thread: JoinHandle<T>, name: &'static str) -> Result<T, ServeError> {
    thread.join().map_err(|payload| ServeError::Panicked {
        thread: name,
        message: panic_message(&*payload),
    })
}

#[cfg(unix)]
async fn terminate() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut sigterm) => {
            sigterm.recv().await;
        }
        Err(_) => std::future::pending::<()>().await,
    }
}

#[cfg(not(unix))]
async fn terminate() {
    std::future::pending::<()>().await
}

/// What the server did over its life, for a final log line.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ServeStats {
    /// Prediction requests answered with 200.
    pub ok: u64,
    /// 400: malformed JSON or `.npy` bodies.
    pub bad_request: u64,
    /// 415: unsupported content types.
    pub unsupported_media_type: u64,
    /// 422: wrong shape or element type.
    pub invalid_input: u64,
    /// 413: bodies over the size limit, or more samples than `max_batch`.
    pub too_large: u64,
    /// 408: bodies not received within the read timeout.
    pub timed_out: u64,
    /// 503: the queue was full.
    pub overloaded: u64,
    /// 503: the runner was not built (loading or failed).
    pub not_ready: u64,
    /// 500: the runner failed or panicked.
    pub errors: u64,
    /// Requests of any route cut off by the read timeout (408, then closed): `timed_out`, and
    /// those whose head was too slow.
    pub read_timeouts: u64,
    /// Connections refused (503, then closed) beyond `max_connections`.
    pub refused_connections: u64,
    /// Runner calls.
    pub batches: u64,
    /// Samples run, over all batches.
    pub samples: u64,
    /// Runner calls that failed or panicked.
    pub failed_batches: u64,
    /// Seconds from start to the end of the shutdown.
    pub uptime_secs: f64,
}

impl ServeStats {
    fn from_metrics(metrics: &Metrics, uptime_secs: f64) -> Self {
        let (batches, samples, failed_batches) = metrics.batch_totals();
        let (refused_connections, read_timeouts) = metrics.connection_totals();
        Self {
            ok: metrics.requests(Outcome::Ok),
            bad_request: metrics.requests(Outcome::BadRequest),
            unsupported_media_type: metrics.requests(Outcome::UnsupportedMediaType),
            invalid_input: metrics.requests(Outcome::InvalidInput),
            too_large: metrics.requests(Outcome::TooLarge),
            timed_out: metrics.requests(Outcome::TimedOut),
            read_timeouts,
            refused_connections,
            overloaded: metrics.requests(Outcome::Overloaded),
            not_ready: metrics.requests(Outcome::NotReady),
            errors: metrics.requests(Outcome::Error),
            batches,
            samples,
            failed_batches,
            uptime_secs,
        }
    }

    /// Requests refused before reaching the model (4xx, and 503s).
    pub fn rejected(&self) -> u64 {
        self.bad_request
            + self.unsupported_media_type
            + self.invalid_input
            + self.too_large
            + self.timed_out
            + self.overloaded
            + self.not_ready
    }

    /// Every prediction request answered.
    pub fn requests(&self) -> u64 {
        self.ok + self.rejected() + self.errors
    }

    /// Mean samples per batch (0 before any batch).
    pub fn mean_batch_size(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.samples as f64 / self.batches as f64
        }
    }
}

impl fmt::Display for ServeStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requests in {:.1} s: {} ok, {} failed, {} rejected",
            self.requests(),
            self.uptime_secs,
            self.ok,
            self.errors,
            self.rejected()
        )?;
        if self.rejected() > 0 {
            let classes = [
                ("bad request", self.bad_request),
                ("unsupported type", self.unsupported_media_type),
                ("invalid input", self.invalid_input),
                ("too large", self.too_large),
                ("timed out", self.timed_out),
                ("overloaded", self.overloaded),
                ("not ready", self.not_ready),
            ];
            let parts: Vec<String> = classes
                .iter()
                .filter(|(_, count)| *count > 0)
                .map(|(name, count)| format!("{count} {name}"))
                .collect();
            write!(f, " ({})", parts.join(", "))?;
        }
        write!(
            f,
            "; {} batches, mean {:.2} samples per batch",
            self.batches,
            self.mean_batch_size()
        )?;
        if self.failed_batches > 0 {
            write!(f, ", {} failed", self.failed_batches)?;
        }
        if self.read_timeouts + self.refused_connections > 0 {
            write!(
                f,
                "; {} requests cut off by the read timeout, {} connections refused",
                self.read_timeouts, self.refused_connections
            )?;
        }
        Ok(())
    }
}
