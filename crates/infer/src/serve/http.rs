//! The HTTP routes: `POST /v1/predict`, `GET /health`, `GET /ready`, `GET /metrics`, and JSON
//! errors for everything else.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use crossbeam::channel::{Sender, TrySendError};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Serialize;
use tokio::sync::oneshot;

use super::codec::{self, Format, Tensor};
use super::conn::ConnPhase;
use super::metrics::{Metrics, Outcome};
use super::worker::{Job, LoadState, Readiness};

/// Bodies larger than this are decoded on tokio's blocking pool, off the request threads.
const INLINE_DECODE_BYTES: usize = 256 << 10;

const ROUTES: &str = "POST /v1/predict, GET /health, GET /ready, GET /metrics";

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    pub jobs: Sender<Job>,
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<Metrics>,
    pub max_batch: usize,
    pub max_body_bytes: usize,
    pub queue_capacity: usize,
    pub read_timeout: Duration,
}

/// When the request being handled must have arrived in full (its first byte's time plus the
/// read timeout); a request extension.
#[derive(Debug, Clone, Copy)]
struct ReadDeadline(Instant);

/// An error response: JSON `{"error": message}` with `status`; 503s carry `Retry-After`, 408s
/// close the connection.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub outcome: Outcome,
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, outcome: Outcome, message: impl Into<String>) -> Self {
        Self {
            status,
            outcome,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Outcome::BadRequest, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            Outcome::InvalidInput,
            message,
        )
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, Outcome::TooLarge, message)
    }

    /// 413 for a body over `max_body_bytes`.
    fn body_too_large(max_body_bytes: usize) -> Self {
        Self::too_large(format!(
            "the request body is larger than the limit of {max_body_bytes} bytes; send fewer \
             samples per request (or raise the server's body limit)"
        ))
    }

    /// 408 for a body not received within `read_timeout` of the request's first byte.
    fn timed_out(read_timeout: Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            Outcome::TimedOut,
            format!(
                "the request did not arrive within {} s of its first byte \
                 (serve.read_timeout_s); the connection is closed",
                read_timeout.as_secs_f64()
            ),
        )
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Outcome::UnsupportedMediaType,
            message,
        )
    }

    pub fn not_ready(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, Outcome::NotReady, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, Outcome::Error, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json_error(self.status, &self.message);
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::REQUEST_TIMEOUT {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response.extensions_mut().insert(self.outcome);
        response
    }
}

/// `{"error": message}` with `status`.
fn json_error(status: StatusCode, message: &str) -> Response {
    #[derive(Serialize)]
    struct Body<'a> {
        error: &'a str,
    }
    (status, axum::Json(Body { error: message })).into_response()
}

/// The server's routes over `state`.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let predict_route = post(predict)
        .layer(middleware::from_fn_with_state(state.clone(), read_body))
        .layer(middleware::from_fn_with_state(state.clone(), track_request));
    Router::new()
        .route("/v1/predict", predict_route)
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), handling))
        .with_state(state)
}

/// Every request, while a route has it: its connection's read timer stops (see
/// [`super::conn`]), and the route learns the request's [`ReadDeadline`].
async fn handling(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let phase = request
        .extensions()
        .get::<ConnectInfo<ConnPhase>>()
        .map(|info| info.0.clone());
    let first_byte = phase
        .as_ref()
        .map_or_else(Instant::now, ConnPhase::start_handling);
    request
        .extensions_mut()
        .insert(ReadDeadline(first_byte + state.read_timeout));
    let response = next.run(request).await;
    if let Some(phase) = phase {
        phase.answered();
    }
    response
}

/// Reads a prediction's whole body, at most `max_body_bytes` (else 413) and by the request's
/// [`ReadDeadline`] (else 408, and the connection closes).
async fn read_body(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let deadline = request
        .extensions()
        .get::<ReadDeadline>()
        .map_or_else(|| Instant::now() + state.read_timeout, |d| d.0);
    let (parts, body) = request.into_parts();
    let collect = Limited::new(body, state.max_body_bytes).collect();
    let read = tokio::time::timeout_at(deadline.into(), collect).await;
    let error = match read {
        Ok(Ok(collected)) => {
            let body = Body::from(collected.to_bytes());
            return next.run(Request::from_parts(parts, body)).await;
        }
        Err(_elapsed) => {
            state.metrics.read_timed_out();
            ApiError::timed_out(state.read_timeout)
        }
        Ok(Err(e)) if e.is::<LengthLimitError>() => ApiError::body_too_large(state.max_body_bytes),
        Ok(Err(e)) => ApiError::bad_request(format!("cannot read the request body: {e}")),
    };
    error.into_response()
}

/// Counts every prediction response by outcome and times it from arrival (before the body is
/// read) to response.
async fn track_request(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let arrival = Instant::now();
    let response = next.run(request).await;
    let outcome = response
        .extensions()
        .get::<Outcome>()
        .copied()
        .unwrap_or_else(|| outcome_of(response.status()));
    state.metrics.observe_request(outcome, arrival.elapsed());
    response
}

/// The outcome class of a response that did not say (a rejection from axum itself).
fn outcome_of(status: StatusCode) -> Outcome {
    match status {
        StatusCode::OK => Outcome::Ok,
        StatusCode::PAYLOAD_TOO_LARGE => Outcome::TooLarge,
        StatusCode::REQUEST_TIMEOUT => Outcome::TimedOut,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => Outcome::UnsupportedMediaType,
        StatusCode::UNPROCESSABLE_ENTITY => Outcome::InvalidInput,
        StatusCode::SERVICE_UNAVAILABLE => Outcome::NotReady,
        s if s.is_client_error() => Outcome::BadRequest,
        _ => Outcome::Error,
    }
}

async fn predict(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match predict_inner(&state, &headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn predict_inner(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("(not text)"));
    let format = Format::from_content_type(content_type)?;
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::body_too_large(state.max_body_bytes)
        } else {
            ApiError::bad_request(format!(
                "cannot read the request body: {}",
                rejection.body_text()
            ))
        }
    })?;
    let sample_shape = match state.readiness.state() {
        LoadState::Ready(shape) => shape,
        LoadState::Loading => {
            return Err(ApiError::not_ready(
                "the model is still loading; retry when GET /ready answers 200",
            ));
        }
        LoadState::Failed(message) => {
            return Err(ApiError::not_ready(format!(
                "the model failed to load: {message}"
            )));
        }
    };

    let tensor = decode(format, body, sample_shape.clone(), state.max_batch).await?;
    let samples = codec::fit_samples(tensor, &sample_shape, state.max_batch)?;

    let (reply, answer) = oneshot::channel();
    let job = Job {
        inputs: samples.values,
        n: samples.n,
        arrival: Instant::now(),
        reply,
    };
    // Counted before sending so that the worker's decrement can never come first.
    state.metrics.queue_changed(1);
    if let Err(error) = state.jobs.try_send(job) {
        state.metrics.queue_changed(-1);
        return Err(match error {
            TrySendError::Full(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                Outcome::Overloaded,
                format!(
                    "the server is overloaded: {} requests are already queued; retry later",
                    state.queue_capacity
                ),
            ),
            TrySendError::Disconnected(_) => ApiError::not_ready("the server is shutting down"),
        });
    }
    let prediction = answer
        .await
        .map_err(|_| ApiError::internal("the inference worker stopped before answering"))?
        .map_err(|message| ApiError::internal(format!("inference failed: {message}")))?;

    let mut shape = prediction.out_shape;
    if samples.list {
        shape.insert(0, samples.n);
    }
    let (body, content_type) = match format {
        Format::Json => (
            codec::encode_json(&shape, &prediction.values)?,
            Format::JSON,
        ),
        Format::Npy => (codec::encode_npy(&shape, &prediction.values)?, Format::NPY),
    };
    let mut response = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    response.extensions_mut().insert(Outcome::Ok);
    Ok(response)
}

/// Decodes a body, on the blocking pool if it is large.
async fn decode(
    format: Format,
    body: Bytes,
    sample_shape: Arc<[usize]>,
    max_batch: usize,
) -> Result<Tensor, ApiError> {
    let inline = body.len() <= INLINE_DECODE_BYTES;
    let run = move || match format {
        Format::Json => codec::decode_json(&body, &sample_shape, max_batch),
        Format::Npy => codec::decode_npy(&body),
    };
    if inline {
        return run();
    }
    tokio::task::spawn_blocking(run)
        .await
        .map_err(|e| ApiError::internal(format!("decoding the request failed: {e}")))?
}

async fn health() -> Response {
    (
        StatusCode::OK,
        axum::Json(serde_json::json!({"status": "ok"})),
    )
        .into_response()
}

async fn ready(State(state): State<Arc<AppState>>) -> Response {
    if state.readiness.shutting_down() {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        );
    }
    match state.readiness.state() {
        LoadState::Ready(shape) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({"status": "ready", "sample_shape": &*shape})),
        )
            .into_response(),
        LoadState::Loading => json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is still loading",
        ),
        LoadState::Failed(message) => json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the model failed to load: {message}"),
        ),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    match state.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode the metrics",
        ),
    }
}

async fn not_found(method: Method, uri: Uri) -> Response {
    json_error(
        StatusCode::NOT_FOUND,
        &format!(
            "no route for {method} {}; the routes are {ROUTES}",
            uri.path()
        ),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    json_error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!(
            "{method} is not allowed on {}; the routes are {ROUTES}",
            uri.path()
        ),
    )
}
