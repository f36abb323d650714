//! The server's Prometheus metrics (`GET /metrics`, OpenMetrics text) and the request outcome
//! classes they count.

use std::fmt::Write as _;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// How a prediction request ended; the `outcome` label of `kiln_serve_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Outcome {
    /// 200.
    Ok,
    /// 400: a body that is not JSON / not a `.npy` file.
    BadRequest,
    /// 415: a content type other than JSON or `.npy`.
    UnsupportedMediaType,
    /// 422: well-formed, but the wrong shape or element type.
    InvalidInput,
    /// 413: a body over the size limit, or more samples than `max_batch`.
    TooLarge,
    /// 408: the body did not arrive within the read timeout.
    TimedOut,
    /// 503: the queue was full.
    Overloaded,
    /// 503: the runner is not built (still loading, failed) or the worker is gone.
    NotReady,
    /// 500: the runner failed (or panicked) on the request's batch.
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 9] = [
        Outcome::Ok,
        Outcome::BadRequest,
        Outcome::UnsupportedMediaType,
        Outcome::InvalidInput,
        Outcome::TooLarge,
        Outcome::TimedOut,
        Outcome::Overloaded,
        Outcome::NotReady,
        Outcome::Error,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::BadRequest => "bad_request",
            Outcome::UnsupportedMediaType => "unsupported_media_type",
            Outcome::InvalidInput => "invalid_input",
            Outcome::TooLarge => "too_large",
            Outcome::TimedOut => "timed_out",
            Outcome::Overloaded => "overloaded",
            Outcome::NotReady => "not_ready",
            Outcome::Error => "error",
        }
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: Outcome,
}

/// Every metric the server exports, registered under the `kiln_serve` prefix.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<OutcomeLabels, Counter>,
    request_duration: Histogram,
    batch_size: Histogram,
    batches: Counter,
    batch_samples: Counter,
    batch_failures: Counter,
    inference_duration: Histogram,
    queue_depth: Gauge,
    open_connections: Gauge,
    refused_connections: Counter,
    read_timeouts: Counter,
}

impl Metrics {
    /// The metrics of a server whose batches hold at most `max_batch` samples.
    pub fn new(max_batch: usize) -> Self {
        let mut registry = Registry::with_prefix("kiln_serve");
        let requests = Family::<OutcomeLabels, Counter>::default();
        // Every outcome shows from the start (at 0), so dashboards need not wait for one.
        for outcome in Outcome::ALL {
            let _ = requests.get_or_create(&OutcomeLabels { outcome });
        }
        registry.register(
            "requests",
            "Prediction requests answered, by outcome",
            requests.clone(),
        );
        let request_duration = Histogram::new(exponential_buckets(0.000_25, 2.0, 17));
        registry.register_with_unit(
            "request_duration",
            "Time from a prediction request's arrival to its response",
            Unit::Seconds,
            request_duration.clone(),
        );
        let batch_size = Histogram::new(batch_buckets(max_batch));
        registry.register(
            "batch_size",
            "Samples per batch run on the model",
            batch_size.clone(),
        );
        let batches = Counter::default();
        registry.register("batches", "Batches run on the model", batches.clone());
        let batch_samples = Counter::default();
        registry.register(
            "batch_samples",
            "Samples run on the model",
            batch_samples.clone(),
        );
        let batch_failures = Counter::default();
        registry.register(
            "batch_failures",
            "Batches whose runner call failed or panicked",
            batch_failures.clone(),
        );
        let inference_duration = Histogram::new(exponential_buckets(0.000_125, 2.0, 17));
        registry.register_with_unit(
            "inference_duration",
            "Time of one runner call (one batch)",
            Unit::Seconds,
            inference_duration.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Requests accepted and waiting for their batch to run",
            queue_depth.clone(),
        );
        let (open_connections, refused_connections, read_timeouts) =
            register_connections(&mut registry);
        Self {
            registry,
            requests,
            request_duration,
            batch_size,
            batches,
            batch_samples,
            batch_failures,
            inference_duration,
            queue_depth,
            open_connections,
            refused_connections,
            read_timeouts,
        }
    }

    /// Adds `change` to the open connections: +1 accepted, -1 closed.
    pub fn connection_changed(&self, change: i64) {
        self.open_connections.inc_by(change);
    }

    /// Counts a connection refused over the cap.
    pub fn connection_refused(&self) {
        self.refused_connections.inc();
    }

    /// Counts a request cut off by the read timeout (answered 408).
    pub fn read_timed_out(&self) {
        self.read_timeouts.inc();
    }

    /// (connections refused, requests cut off by the read timeout) so far.
    pub fn connection_totals(&self) -> (u64, u64) {
        (self.refused_connections.get(), self.read_timeouts.get())
    }

    /// Counts one answered prediction request.
    pub fn observe_request(&self, outcome: Outcome, duration: Duration) {
        self.requests
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        self.request_duration.observe(duration.as_secs_f64());
    }

    /// Counts one runner call of `samples` samples.
    pub fn observe_batch(&self, samples: usize, duration: Duration) {
        self.batch_size.observe(samples as f64);
        self.batches.inc();
        self.batch_samples.inc_by(samples as u64);
        self.inference_duration.observe(duration.as_secs_f64());
    }

    pub fn batch_failed(&self) {
        self.batch_failures.inc();
    }

    /// Adds `change` to the queue depth: +1 as a request is queued, -1 if queueing failed, and
    /// minus a batch's jobs as the worker starts running them.
    pub fn queue_changed(&self, change: i64) {
        self.queue_depth.inc_by(change);
    }

    /// Requests answered with `outcome` so far.
    pub fn requests(&self, outcome: Outcome) -> u64 {
        self.requests
            .get_or_create(&OutcomeLabels { outcome })
            .get()
    }

    /// (batches run, samples run, batches failed) so far.
    pub fn batch_totals(&self) -> (u64, u64, u64) {
        (
            self.batches.get(),
            self.batch_samples.get(),
            self.batch_failures.get(),
        )
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// The connection metrics: open connections, those refused over the cap, and requests cut off
/// by the read timeout.
fn register_connections(registry: &mut Registry) -> (Gauge, Counter, Counter) {
    let open = Gauge::default();
    registry.register("open_connections", "Connections open", open.clone());
    let refused = Counter::default();
    registry.register(
        "refused_connections",
        "Connections refused (503, then closed) beyond serve.max_connections",
        refused.clone(),
    );
    let timeouts = Counter::default();
    registry.register(
        "read_timeouts",
        "Requests not received within serve.read_timeout_s (408, then closed)",
        timeouts.clone(),
    );
    (open, refused, timeouts)
}

/// Batch-size histogram bounds: powers of two below `max_batch`, then `max_batch` itself.
fn batch_buckets(max_batch: usize) -> Vec<f64> {
    let mut bounds: Vec<f64> = std::iter::successors(Some(1usize), |b| b.checked_mul(2))
        .take_while(|&b| b < max_batch)
        .map(|b| b as f64)
        .collect();
    bounds.push(max_batch as f64);
    bounds
}
