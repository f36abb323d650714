//! A closed-loop load generator for benchmarking a running server: `concurrency` clients, each
//! on its own keep-alive connection, send `POST /v1/predict` back to back until `requests` are
//! done, and the latencies are summarized.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper_util::rt::TokioIo;
use serde::Serialize;

use super::ServeError;

/// What a load run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct LoadReport {
    /// Requests sent.
    pub requests: usize,
    /// Requests that did not get a 200 (status or transport errors).
    pub errors: usize,
    /// Concurrent clients.
    pub concurrency: usize,
    /// Wall time of the whole run, in seconds.
    pub elapsed_secs: f64,
    /// Requests per second over the run.
    pub throughput_rps: f64,
    /// Latency percentiles over every request (errors included), in milliseconds.
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The first error seen, if any (status and body, or the transport error).
    pub first_error: Option<String>,
}

/// Sends `requests` copies of `body` (with `content_type`) to `POST /v1/predict` on `addr` from
/// `concurrency` closed-loop clients. Errs on invalid arguments, or when every request failed
/// (the message carries the first failure).
pub fn run(
    addr: SocketAddr,
    body: Vec<u8>,
    content_type: &str,
    concurrency: usize,
    requests: usize,
) -> Result<LoadReport, ServeError> {
    for (key, value) in [("concurrency", concurrency), ("requests", requests)] {
        if value == 0 {
            return Err(ServeError::InvalidConfig {
                key,
                value: "0".to_owned(),
                expected: "at least 1".to_owned(),
            });
        }
    }
    let content_type =
        HeaderValue::from_str(content_type).map_err(|_| ServeError::InvalidConfig {
            key: "content_type",
            value: content_type.to_owned(),
            expected: "a valid header value".to_owned(),
        })?;
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(concurrency);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .thread_name("kiln-loadgen")
        .build()
        .map_err(|e| ServeError::Start {
            what: "load generator runtime",
            message: e.to_string(),
        })?;
    let request = Arc::new(Template {
        addr,
        host: HeaderValue::from_str(&addr.to_string()).map_err(|_| ServeError::LoadGen {
            message: format!("{addr} is not a valid Host header"),
        })?,
        content_type,
        body: Bytes::from(body),
    });
    runtime.block_on(drive(request, concurrency, requests))
}

/// The request every client sends.
#[derive(Debug)]
struct Template {
    addr: SocketAddr,
    host: HeaderValue,
    content_type: HeaderValue,
    body: Bytes,
}

/// One client's results.
#[derive(Debug, Default)]
struct ClientLog {
    latencies_ms: Vec<f64>,
    errors: usize,
    first_error: Option<String>,
}

async fn drive(
    request: Arc<Template>,
    concurrency: usize,
    requests: usize,
) -> Result<LoadReport, ServeError> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        clients.spawn(client(request.clone(), next.clone(), requests));
    }
    let mut all = ClientLog::default();
    while let Some(joined) = clients.join_next().await {
        let log = joined.map_err(|e| ServeError::LoadGen {
            message: format!("a client task failed: {e}"),
        })?;
        all.latencies_ms.extend(log.latencies_ms);
        all.errors += log.errors;
        if all.first_error.is_none() {
            all.first_error = log.first_error;
        }
    }
    let elapsed_secs = started.elapsed().as_secs_f64();
    if all.errors == requests {
        return Err(ServeError::LoadGen {
            message: format!(
                "all {requests} requests to {} failed; the first: {}",
                request.addr,
                all.first_error.as_deref().unwrap_or("(no message)")
            ),
        });
    }
    let mut lat = all.latencies_ms;
    lat.sort_by(f64::total_cmp);
    let mean_ms = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    Ok(LoadReport {
        requests: lat.len(),
        errors: all.errors,
        concurrency,
        elapsed_secs,
        throughput_rps: lat.len() as f64 / elapsed_secs.max(f64::MIN_POSITIVE),
        mean_ms,
        p50_ms: percentile(&lat, 50.0),
        p95_ms: percentile(&lat, 95.0),
        p99_ms: percentile(&lat, 99.0),
        max_ms: lat.last().copied().unwrap_or(0.0),
        first_error: all.first_error,
    })
}

/// Nearest-rank percentile of sorted values (0 for none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A closed-loop client: one request at a time on one keep-alive connection (reopened after a
/// transport error), until `total` requests were claimed across all clients.
async fn client(request: Arc<Template>, next: Arc<AtomicUsize>, total: usize) -> ClientLog {
    let mut log = ClientLog::default();
    let mut connection: Option<SendRequest<Full<Bytes>>> = None;
    while next.fetch_add(1, Ordering::Relaxed) < total {
        let sent = Instant::now();
        let result = send(&mut connection, &request).await;
        log.latencies_ms.push(sent.elapsed().as_secs_f64() * 1e3);
        if let Err(message) = result {
            log.errors += 1;
            log.first_error.get_or_insert(message);
        }
    }
    log
}

/// Sends one request; `Err` with the status and body for a non-200, or the transport error
/// (after which the connection is dropped).
async fn send(
    connection: &mut Option<SendRequest<Full<Bytes>>>,
    request: &Template,
) -> Result<(), String> {
    if connection.as_ref().is_none_or(SendRequest::is_closed) {
        *connection = Some(connect(request.addr).await?);
    }
    let Some(sender) = connection.as_mut() else {
        return Err("no connection".to_owned());
    };
    let outcome = async {
        sender.ready().await.map_err(|e| e.to_string())?;
        let http_request = hyper::Request::post("/v1/predict")
            .header(HOST, request.host.clone())
            .header(CONTENT_TYPE, request.content_type.clone())
            .body(Full::new(request.body.clone()))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(http_request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    }
    .await;
    match outcome {
        Ok((status, _)) if status.is_success() => Ok(()),
        Ok((status, body)) => {
            let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
            Err(format!("{status}: {text}"))
        }
        Err(message) => {
            *connection = None;
            Err(message)
        }
    }
}

/// Opens a keep-alive HTTP/1.1 connection to `addr`.
async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    // Small request/response exchanges: do not wait to coalesce packets.
    let _ = stream.set_nodelay(true);
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake with {addr} failed: {e}"))?;
    tokio::spawn(async move {
        // Ends when the sender is dropped or the server closes the connection.
        let _ = connection.await;
    });
    Ok(sender)
}
