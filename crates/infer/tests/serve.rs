//! The inference server end to end, over real HTTP, with fake runners: request formats,
//! validation messages, dynamic batching, overload, shutdown, probes, metrics, the load
//! generator, the read timeout and the connection cap.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, Sender, bounded, unbounded};
use kiln_infer::serve::{
    Batch, BatchRunner, ClosedBy, Queued, RunnerFactory, ServeConfig, ServeError, Server,
    collect_batch, loadgen,
};
use reqwest::StatusCode;
use reqwest::blocking::{Client, Response};
use serde_json::{Value, json};

/// An input value that makes [`TestRunner`] panic.
const PANIC: f32 = 666.0;
/// An input value that makes [`TestRunner`] return an error.
const FAIL: f32 = 777.0;

/// A gate threads wait on until it is opened (once open, it stays open).
#[derive(Debug, Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn open(&self) {
        *self.0.0.lock().unwrap() = true;
        self.0.1.notify_all();
    }

    fn wait(&self) {
        let open = self.0.0.lock().unwrap();
        drop(self.0.1.wait_while(open, |open| !*open).unwrap());
    }
}

/// Output per sample: `[sum(x), 2*x...]` (shape `[len + 1]`). Records every batch size, can
/// report entering `run` and hold there until a gate opens.
struct TestRunner {
    shape: Vec<usize>,
    batches: Arc<Mutex<Vec<usize>>>,
    gate: Option<Gate>,
    entered: Option<mpsc::Sender<usize>>,
}

impl TestRunner {
    fn new(shape: &[usize]) -> Self {
        Self {
            shape: shape.to_vec(),
            batches: Arc::default(),
            gate: None,
            entered: None,
        }
    }

    fn gated(mut self, gate: &Gate) -> (Self, mpsc::Receiver<usize>) {
        let (tx, rx) = mpsc::channel();
        self.gate = Some(gate.clone());
        self.entered = Some(tx);
        (self, rx)
    }

    fn factory(self) -> RunnerFactory {
        Box::new(move || Ok(Box::new(self) as Box<dyn BatchRunner>))
    }
}

impl BatchRunner for TestRunner {
    fn sample_shape(&self) -> &[usize] {
        &self.shape
    }

    fn run(&mut self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, Vec<usize>), String> {
        if let Some(entered) = &self.entered {
            let _ = entered.send(n);
        }
        if let Some(gate) = &self.gate {
            gate.wait();
        }
        self.batches.lock().unwrap().push(n);
        if inputs.contains(&PANIC) {
            panic!("poisoned input");
        }
        if inputs.contains(&FAIL) {
            return Err("the model rejected the input".to_owned());
        }
        let len: usize = self.shape.iter().product();
        assert_eq!(inputs.len(), n * len);
        let outputs = inputs.chunks(len).flat_map(expected).collect();
        Ok((outputs, vec![len + 1]))
    }
}

/// What [`TestRunner`] returns for one sample.
fn expected(sample: &[f32]) -> Vec<f32> {
    let mut out = vec![sample.iter().sum()];
    out.extend(sample.iter().map(|x| 2.0 * x));
    out
}

fn config() -> ServeConfig {
    ServeConfig {
        port: 0,
        max_batch: 4,
        max_wait: Duration::from_millis(2),
        queue_capacity: 64,
        max_body_bytes: 64 << 10,
        http_threads: 2,
        ..ServeConfig::default()
    }
}

fn start(config: ServeConfig, runner: TestRunner) -> Server {
    let server = Server::start(config, runner.factory()).unwrap();
    server.wait_ready().unwrap();
    server
}

fn client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("http://{addr}{path}")
}

fn post(addr: SocketAddr, content_type: &str, body: impl Into<Vec<u8>>) -> Response {
    client()
        .post(url(addr, "/v1/predict"))
        .header("content-type", content_type)
        .body(body.into())
        .send()
        .unwrap()
}

fn post_json(addr: SocketAddr, body: &Value) -> Response {
    post(addr, "application/json", body.to_string())
}

fn get(addr: SocketAddr, path: &str) -> Response {
    client().get(url(addr, path)).send().unwrap()
}

/// The status and the `error` message of a JSON error response.
fn error_of(response: Response) -> (StatusCode, String) {
    let status = response.status();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(content_type, "application/json", "status {status}");
    let body: Value = response.json().unwrap();
    let message = body["error"]
        .as_str()
        .expect("an `error` string")
        .to_owned();
    (status, message)
}

/// A `.npy` file with a raw header `descr`.
fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}\n");
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// Polls until `condition` holds (a bounded wait for the server to reach a state, not a
/// timing assertion).
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(2));
    }
}

/// The value of an unlabelled sample (or one written out in full with its labels).
fn metric(addr: SocketAddr, name: &str) -> f64 {
    let text = get(addr, "/metrics").text().unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Waits until `depth` requests are accepted and waiting (not yet in a running batch).
fn wait_for_queue(addr: SocketAddr, depth: usize) {
    wait_until(&format!("{depth} requests are queued"), || {
        metric(addr, "kiln_serve_queue_depth") == depth as f64
    });
}

/// Sends `sample` as one JSON request on its own thread; the thread returns the outputs.
fn spawn_request(addr: SocketAddr, sample: Vec<f32>) -> thread::JoinHandle<(StatusCode, Value)> {
    thread::spawn(move || {
        let response = post_json(addr, &json!({ "inputs": sample }));
        (response.status(), response.json().unwrap())
    })
}

fn assert_answered(request: thread::JoinHandle<(StatusCode, Value)>, sample: &[f32]) {
    let (status, body) = request.join().unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outputs"], json!(expected(sample)));
}

// ---------------------------------------------------------------------------------------------
// Formats

#[test]
fn json_round_trip_single_and_list() {
    let server = start(config(), TestRunner::new(&[2, 3]));
    let addr = server.local_addr();

    let response = post_json(addr, &json!({"inputs": [[1, 2, 3], [4, 5, 6.5]]}));
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().unwrap();
    assert_eq!(body["shape"], json!([7]));
    assert_eq!(
        body["outputs"],
        json!([21.5, 2.0, 4.0, 6.0, 8.0, 10.0, 13.0])
    );

    let list = json!({"inputs": [[[1, 1, 1], [1, 1, 1]], [[0, 0, 0], [0, 0, -1]]]});
    let body: Value = post_json(addr, &list).json().unwrap();
    assert_eq!(body["shape"], json!([2, 7]));
    assert_eq!(
        body["outputs"],
        json!([
            [6.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0],
            [-1.0, 0.0, 0.0, 0.0, 0.0, 0.0, -2.0]
        ])
    );
    let stats = server.shutdown().unwrap();
    assert_eq!((stats.ok, stats.samples, stats.rejected()), (2, 3, 0));
}

#[test]
fn npy_round_trip_single_and_list() {
    let server = start(config(), TestRunner::new(&[3]));
    let addr = server.local_addr();

    let single = kiln_data::npy_f32_bytes(&[3], &[0.5, 1.5, -2.0]).unwrap();
    let response = post(addr, "application/x-npy", single);
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/x-npy");
    let bytes = response.bytes().unwrap();
    let out = kiln_data::NpyArray::parse(&bytes).unwrap();
    assert_eq!(out.dtype, kiln_data::DType::F32);
    assert_eq!(out.shape, [4]);
    assert_eq!(out.to_f32(), expected(&[0.5, 1.5, -2.0]));

    // f64 lists are converted to f32; the answer keeps the list form.
    let values = [1.0f64, 2.0, 3.0, -4.0, 0.25, 8.0];
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let response = post(addr, "application/x-npy", npy("<f8", &[2, 3], &data));
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.bytes().unwrap();
    let out = kiln_data::NpyArray::parse(&bytes).unwrap();
    assert_eq!(out.shape, [2, 4]);
    let want: Vec<f32> = [[1.0, 2.0, 3.0], [-4.0, 0.25, 8.0]]
        .iter()
        .flat_map(|s| expected(s))
        .collect();
    assert_eq!(out.to_f32(), want);

    // f16 too: 1.0, 2.0, -0.5.
    let data: Vec<u8> = [0x3c00u16, 0x4000, 0xb800]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let response = post(addr, "application/x-npy", npy("<f2", &[3], &data));
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.bytes().unwrap();
    let out = kiln_data::NpyArray::parse(&bytes).unwrap();
    assert_eq!(out.to_f32(), expected(&[1.0, 2.0, -0.5]));
    server.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// The batching policy, driven directly

#[derive(Debug)]
struct TestJob {
    id: usize,
    samples: usize,
    arrival: Instant,
}

impl Queued for TestJob {
    fn samples(&self) -> usize {
        self.samples
    }
    fn arrival(&self) -> Instant {
        self.arrival
    }
}

/// Queues jobs of `sizes` samples that arrived `age` ago.
fn queue_jobs(tx: &Sender<TestJob>, sizes: &[usize], age: Duration) {
    let arrival = Instant::now() - age;
    for (id, &samples) in sizes.iter().enumerate() {
        tx.send(TestJob {
            id,
            samples,
            arrival,
        })
        .unwrap();
    }
}

/// Every batch until `collect_batch` reports the channel closed and drained.
fn drain(rx: &Receiver<TestJob>, max_batch: usize, max_wait: Duration) -> Vec<Batch<TestJob>> {
    let mut held = None;
    std::iter::from_fn(|| collect_batch(rx, &mut held, max_batch, max_wait)).collect()
}

fn summary(batches: &[Batch<TestJob>]) -> Vec<(Vec<usize>, usize, ClosedBy)> {
    batches
        .iter()
        .map(|b| {
            (
                b.jobs.iter().map(|j| j.id).collect(),
                b.samples,
                b.closed_by,
            )
        })
        .collect()
}

#[test]
fn a_lone_job_closes_by_deadline() {
    let (tx, rx) = unbounded();
    queue_jobs(&tx, &[1], Duration::ZERO);
    let mut held = None;
    let batch = collect_batch(&rx, &mut held, 8, Duration::from_millis(3)).unwrap();
    assert_eq!(summary(&[batch]), [(vec![0], 1, ClosedBy::Deadline)]);
    assert!(held.is_none());
    drop(tx);
    assert!(collect_batch(&rx, &mut held, 8, Duration::from_millis(3)).is_none());
}

#[test]
fn queued_jobs_fill_batches_to_max_and_overflow_is_held_over() {
    // Ones: batches of exactly max_batch, then the rest when the channel closes.
    let (tx, rx) = unbounded();
    queue_jobs(&tx, &[1; 10], Duration::ZERO);
    drop(tx);
    let sizes: Vec<_> = drain(&rx, 4, Duration::from_secs(3600))
        .iter()
        .map(|b| (b.samples, b.closed_by))
        .collect();
    assert_eq!(
        sizes,
        [
            (4, ClosedBy::Full),
            (4, ClosedBy::Full),
            (2, ClosedBy::Closed)
        ]
    );

    // Mixed sizes: a job that does not fit opens the next batch; none is split or lost. Jobs
    // arrived an hour ago, so deadlines have passed: already-queued jobs still join, and the
    // last batch closes by its deadline without waiting.
    let (tx, rx) = unbounded();
    queue_jobs(&tx, &[1, 2, 1, 3, 2, 2, 4, 1, 1], Duration::from_secs(3600));
    let mut held = None;
    let batches: Vec<_> = (0..5)
        .map(|_| collect_batch(&rx, &mut held, 4, Duration::from_millis(1)).unwrap())
        .collect();
    assert_eq!(
        summary(&batches),
        [
            (vec![0, 1, 2], 4, ClosedBy::Full),
            (vec![3], 3, ClosedBy::Full),
            (vec![4, 5], 4, ClosedBy::Full),
            (vec![6], 4, ClosedBy::Full),
            (vec![7, 8], 2, ClosedBy::Deadline),
        ]
    );
    assert!(held.is_none());
    assert!(batches.iter().all(|b| b.samples <= 4));
    drop(tx);
}

#[test]
fn an_oversized_job_forms_its_own_batch() {
    let (tx, rx) = unbounded();
    queue_jobs(&tx, &[6, 1], Duration::ZERO);
    drop(tx);
    assert_eq!(
        summary(&drain(&rx, 4, Duration::from_secs(3600))),
        [(vec![0], 6, ClosedBy::Full), (vec![1], 1, ClosedBy::Closed)]
    );
}

#[test]
fn a_batch_waits_for_jobs_sent_before_its_deadline() {
    let (tx, rx) = bounded(4);
    queue_jobs(&tx, &[1], Duration::ZERO);
    let sender = thread::spawn(move || {
        tx.send(TestJob {
            id: 1,
            samples: 2,
            arrival: Instant::now(),
        })
        .unwrap();
        tx
    });
    let mut held = None;
    // The deadline is far away; the batch closes once the second job fills it.
    let batch = collect_batch(&rx, &mut held, 3, Duration::from_secs(3600)).unwrap();
    assert_eq!(summary(&[batch]), [(vec![0, 1], 3, ClosedBy::Full)]);
    drop(sender.join().unwrap());
}

// ---------------------------------------------------------------------------------------------
// Batching over HTTP

#[test]
fn concurrent_requests_are_batched() {
    let gate = Gate::default();
    let (runner, entered) = TestRunner::new(&[2]).gated(&gate);
    let batches = runner.batches.clone();
    let server = start(config(), runner);
    let addr = server.local_addr();

    // The first request occupies the runner; seven more queue up behind it.
    let first = spawn_request(addr, vec![0.0, 1.0]);
    assert_eq!(entered.recv().unwrap(), 1);
    let samples: Vec<Vec<f32>> = (1..8).map(|i| vec![i as f32, -(i as f32)]).collect();
    let requests: Vec<_> = samples
        .iter()
        .map(|s| spawn_request(addr, s.clone()))
        .collect();
    wait_for_queue(addr, 7);
    gate.open();

    assert_answered(first, &[0.0, 1.0]);
    for (request, sample) in requests.into_iter().zip(&samples) {
        assert_answered(request, sample);
    }
    // Queued requests were run together, in batches of at most max_batch = 4.
    assert_eq!(*batches.lock().unwrap(), [1, 4, 3]);
    let stats = server.shutdown().unwrap();
    assert_eq!((stats.ok, stats.batches, stats.samples), (8, 3, 8));
    assert!((stats.mean_batch_size() - 8.0 / 3.0).abs() < 1e-9);
}

#[test]
fn overload_gets_503_and_the_server_recovers() {
    let gate = Gate::default();
    let (runner, entered) = TestRunner::new(&[1]).gated(&gate);
    let config = ServeConfig {
        max_batch: 1,
        queue_capacity: 2,
        ..config()
    };
    let server = start(config, runner);
    let addr = server.local_addr();

    let running = spawn_request(addr, vec![1.0]);
    assert_eq!(entered.recv().unwrap(), 1);
    let queued = [
        spawn_request(addr, vec![2.0]),
        spawn_request(addr, vec![3.0]),
    ];
    wait_for_queue(addr, 2);

    let response = post_json(addr, &json!({"inputs": [4.0]}));
    assert_eq!(response.headers()["retry-after"], "1");
    let (status, message) = error_of(response);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(message.contains("overloaded"), "{message}");

    gate.open();
    assert_answered(running, &[1.0]);
    for (request, x) in queued.into_iter().zip([2.0, 3.0]) {
        assert_answered(request, &[x]);
    }
    assert_answered(spawn_request(addr, vec![5.0]), &[5.0]);
    let stats = server.shutdown().unwrap();
    assert_eq!((stats.ok, stats.overloaded), (4, 1));
}

// ---------------------------------------------------------------------------------------------
// Validation

#[test]
fn bad_requests_get_the_right_status_and_say_what_was_expected() {
    let server = start(config(), TestRunner::new(&[2, 3]));
    let addr = server.local_addr();
    let json_case = |body: &str| error_of(post(addr, "application/json", body.to_owned()));

    let (status, message) = json_case(r#"{"inputs": [[1, 2, 3], [4, 5"#);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.contains("malformed JSON"), "{message}");
    assert!(message.contains(r#"{"inputs": [...]}"#), "{message}");
    assert!(message.contains("EOF"), "serde's message: {message}");

    let (status, message) = json_case(r#"{"inputs": [[1, 2], [3, 4]]}"#);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(message.contains("received shape [2, 2]"), "{message}");
    assert!(message.contains("[2, 3]"), "{message}");
    assert!(message.contains("[n, 2, 3]"), "{message}");

    for body in [
        r#"{"inputs": [["a", 2, 3], [4, 5, 6]]}"#,
        r#"{"inputs": [[true, 2, 3], [4, 5, 6]]}"#,
        r#"{"inputs": [[null, 2, 3], [4, 5, 6]]}"#,
    ] {
        let (status, message) = json_case(body);
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(message.contains("expected a number"), "{message}");
    }

    let (status, message) = json_case(r#"{"inputs": [[1, 2, 3], [4, 5]]}"#);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(message.contains("ragged"), "{message}");

    let (status, message) = json_case(r#"{"input": [[1, 2, 3], [4, 5, 6]]}"#);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(message.contains("missing field `inputs`"), "{message}");

    let (status, message) = json_case(r#"{"inputs": []}"#);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(message.contains("received shape [0]"), "{message}");

    let five = json!({"inputs": vec![[[0; 3]; 2]; 5]}).to_string();
    let (status, message) = json_case(&five);
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        message.contains("at most 4 samples per request (infer.batch_size)"),
        "{message}"
    );

    let ints: Vec<u8> = (0..6i64).flat_map(|v| v.to_le_bytes()).collect();
    let (status, message) = error_of(post(addr, "application/x-npy", npy("<i8", &[2, 3], &ints)));
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(message.contains("i64"), "{message}");
    assert!(
        message.contains("expected a little-endian, C-order float array"),
        "{message}"
    );

    let (status, message) = error_of(post(addr, "application/x-npy", npy(">f4", &[6], &[0; 24])));
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        message.contains("`>f4`") && message.contains("float array"),
        "{message}"
    );

    let (status, message) = error_of(post(addr, "application/x-npy", b"not a npy".to_vec()));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.contains("malformed .npy body"), "{message}");

    let wrong = kiln_data::npy_f32_bytes(&[3, 2], &[0.0; 6]).unwrap();
    let (status, message) = error_of(post(addr, "application/x-npy", wrong));
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(message.contains("received shape [3, 2]"), "{message}");

    let (status, message) = error_of(post(addr, "text/plain", "1 2 3"));
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(message.contains("`text/plain`"), "{message}");
    assert!(
        message.contains("application/json") && message.contains("application/x-npy"),
        "{message}"
    );
    let response = client()
        .post(url(addr, "/v1/predict"))
        .body("{}")
        .send()
        .unwrap();
    let (status, message) = error_of(response);
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(message.contains("(none given)"), "{message}");

    let big = vec![b' '; (64 << 10) + 1];
    let (status, message) = error_of(post(addr, "application/json", big));
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(message.contains(&(64usize << 10).to_string()), "{message}");

    let (status, message) = error_of(get(addr, "/v2/predict"));
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(message.contains("POST /v1/predict"), "{message}");
    let (status, message) = error_of(get(addr, "/v1/predict"));
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(message.contains("POST /v1/predict"), "{message}");

    // Still serving after all of that.
    let ok = post_json(addr, &json!({"inputs": [[1, 2, 3], [4, 5, 6]]}));
    assert_eq!(ok.status(), StatusCode::OK);
    let stats = server.shutdown().unwrap();
    assert_eq!(stats.ok, 1);
    assert_eq!(stats.bad_request, 2);
    assert_eq!(stats.unsupported_media_type, 2);
    assert_eq!(stats.too_large, 2);
    assert_eq!(stats.invalid_input, 10);
    assert_eq!(stats.batches, 1);
}

// ---------------------------------------------------------------------------------------------
// Failures, shutdown, probes

#[test]
fn runner_errors_and_panics_give_500_and_the_server_keeps_serving() {
    let server = start(config(), TestRunner::new(&[1]));
    let addr = server.local_addr();

    let (status, message) = error_of(post_json(addr, &json!({"inputs": [PANIC]})));
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        message.contains("panicked") && message.contains("poisoned input"),
        "{message}"
    );

    let (status, message) = error_of(post_json(addr, &json!({"inputs": [FAIL]})));
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        message.contains("the model rejected the input"),
        "{message}"
    );

    assert_answered(spawn_request(addr, vec![3.0]), &[3.0]);
    let stats = server.shutdown().unwrap();
    assert_eq!((stats.ok, stats.errors, stats.failed_batches), (1, 2, 2));
}

#[test]
fn shutdown_answers_every_request_in_flight() {
    let gate = Gate::default();
    let (runner, entered) = TestRunner::new(&[1]).gated(&gate);
    let batches = runner.batches.clone();
    let server = start(
        ServeConfig {
            max_batch: 2,
            ..config()
        },
        runner,
    );
    let addr = server.local_addr();
    let running = spawn_request(addr, vec![0.0]);
    assert_eq!(entered.recv().unwrap(), 1);
    let queued: Vec<_> = (1..6)
        .map(|i| spawn_request(addr, vec![i as f32]))
        .collect();
    wait_for_queue(addr, 5);

    let handle = server.shutdown_handle();
    handle.trigger();
    assert!(handle.is_triggered());
    let stopping = thread::spawn(move || server.wait());
    gate.open();

    assert_answered(running, &[0.0]);
    for (i, request) in queued.into_iter().enumerate() {
        assert_answered(request, &[(i + 1) as f32]);
    }
    let stats = stopping.join().unwrap().unwrap();
    assert_eq!((stats.ok, stats.samples), (6, 6));
    assert_eq!(*batches.lock().unwrap(), [1, 2, 2, 1]);
}

#[test]
fn ready_turns_200_only_once_the_factory_returns() {
    let gate = Gate::default();
    let factory_gate = gate.clone();
    let factory: RunnerFactory = Box::new(move || {
        factory_gate.wait();
        Ok(Box::new(TestRunner::new(&[1])) as Box<dyn BatchRunner>)
    });
    let server = Server::start(config(), factory).unwrap();
    let addr = server.local_addr();

    assert_eq!(get(addr, "/health").status(), StatusCode::OK);
    let (status, message) = error_of(get(addr, "/ready"));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(message.contains("loading"), "{message}");
    let response = post_json(addr, &json!({"inputs": [1.0]}));
    assert_eq!(response.headers()["retry-after"], "1");
    let (status, message) = error_of(response);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(message.contains("still loading"), "{message}");

    gate.open();
    server.wait_ready().unwrap();
    let ready = get(addr, "/ready");
    assert_eq!(ready.status(), StatusCode::OK);
    assert_eq!(ready.json::<Value>().unwrap()["sample_shape"], json!([1]));
    assert_answered(spawn_request(addr, vec![2.0]), &[2.0]);
    let stats = server.shutdown().unwrap();
    assert_eq!((stats.ok, stats.not_ready), (1, 1));
}

#[test]
fn a_failing_factory_is_reported() {
    let factory: RunnerFactory = Box::new(|| Err("no checkpoint at runs/x".to_owned()));
    let server = Server::start(config(), factory).unwrap();
    let addr = server.local_addr();
    let error = server.wait_ready().unwrap_err();
    assert!(matches!(error, ServeError::RunnerLoad { .. }));
    assert!(
        error.to_string().contains("no checkpoint at runs/x"),
        "{error}"
    );
    let (status, message) = error_of(get(addr, "/ready"));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(message.contains("no checkpoint at runs/x"), "{message}");
    assert_eq!(get(addr, "/health").status(), StatusCode::OK);
    server.shutdown().unwrap();

    let panicking: RunnerFactory = Box::new(|| panic!("cuda exploded"));
    let server = Server::start(config(), panicking).unwrap();
    let error = server.wait_ready().unwrap_err();
    assert!(error.to_string().contains("cuda exploded"), "{error}");
    server.shutdown().unwrap();
}

#[test]
fn metrics_count_the_traffic() {
    let server = start(config(), TestRunner::new(&[2]));
    let addr = server.local_addr();
    for _ in 0..3 {
        assert_answered(spawn_request(addr, vec![1.0, 2.0]), &[1.0, 2.0]);
    }
    let (status, _) = error_of(post(addr, "application/json", "{"));
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let response = get(addr, "/metrics");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = response.text().unwrap();
    for name in [
        "# TYPE kiln_serve_requests counter",
        "# TYPE kiln_serve_request_duration_seconds histogram",
        "# TYPE kiln_serve_batch_size histogram",
        "# TYPE kiln_serve_inference_duration_seconds histogram",
        "# TYPE kiln_serve_queue_depth gauge",
        "# TYPE kiln_serve_open_connections gauge",
        "# TYPE kiln_serve_refused_connections counter",
        "# TYPE kiln_serve_read_timeouts counter",
        "# EOF",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    assert_eq!(
        metric(addr, r#"kiln_serve_requests_total{outcome="ok"}"#),
        3.0
    );
    assert_eq!(
        metric(addr, r#"kiln_serve_requests_total{outcome="bad_request"}"#),
        1.0
    );
    assert_eq!(
        metric(addr, "kiln_serve_request_duration_seconds_count"),
        4.0
    );
    assert!(metric(addr, "kiln_serve_request_duration_seconds_sum") > 0.0);
    assert_eq!(metric(addr, "kiln_serve_batch_size_count"), 3.0);
    assert_eq!(metric(addr, "kiln_serve_batch_size_sum"), 3.0);
    assert_eq!(metric(addr, "kiln_serve_batches_total"), 3.0);
    assert_eq!(
        metric(addr, "kiln_serve_inference_duration_seconds_count"),
        3.0
    );
    assert_eq!(metric(addr, "kiln_serve_queue_depth"), 0.0);
    server.shutdown().unwrap();
}

#[test]
fn a_taken_port_is_a_clear_error() {
    let first = start(config(), TestRunner::new(&[1]));
    let taken = first.local_addr();
    let error = Server::start(
        ServeConfig {
            port: taken.port(),
            ..config()
        },
        TestRunner::new(&[1]).factory(),
    )
    .unwrap_err();
    assert!(matches!(error, ServeError::Bind { addr, .. } if addr == taken));
    let message = error.to_string();
    assert!(message.contains(&taken.to_string()), "{message}");
    assert!(message.to_lowercase().contains("in use"), "{message}");
    first.shutdown().unwrap();
}

#[test]
fn invalid_settings_are_refused() {
    let error = Server::start(
        ServeConfig {
            max_batch: 0,
            ..config()
        },
        TestRunner::new(&[1]).factory(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("max_batch"), "{error}");
    for (config, key) in [
        (
            ServeConfig {
                max_connections: 0,
                ..config()
            },
            "max_connections",
        ),
        (
            ServeConfig {
                read_timeout: Duration::ZERO,
                ..config()
            },
            "read_timeout",
        ),
    ] {
        let error = Server::start(config, TestRunner::new(&[1]).factory()).unwrap_err();
        assert!(error.to_string().contains(key), "{error}");
    }
}

// ---------------------------------------------------------------------------------------------
// Load generator

#[test]
fn loadgen_measures_a_running_server() {
    let server = start(config(), TestRunner::new(&[4]));
    let addr = server.local_addr();
    let body = kiln_data::npy_f32_bytes(&[4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let report = loadgen::run(addr, body, "application/x-npy", 8, 200).unwrap();
    assert_eq!((report.requests, report.errors), (200, 0));
    assert!(report.throughput_rps > 0.0);
    assert!(report.p50_ms <= report.p95_ms && report.p95_ms <= report.p99_ms);
    assert!(report.p99_ms <= report.max_ms);
    assert!(report.first_error.is_none());
    let stats = server.shutdown().unwrap();
    assert_eq!(stats.ok, 200);
    assert!(stats.batches <= 200);

    // Errors are counted, with the first one kept.
    let server = start(config(), TestRunner::new(&[4]));
    let addr = server.local_addr();
    let report = loadgen::run(addr, b"{}".to_vec(), "text/plain", 2, 10);
    let error = report.unwrap_err().to_string();
    assert!(
        error.contains("all 10 requests") && error.contains("415"),
        "{error}"
    );
    server.shutdown().unwrap();
    assert!(loadgen::run(addr, vec![], "application/json", 1, 1).is_err());
}

#[test]
fn shutdown_completes_despite_a_stalled_client() {
    let server = start(
        ServeConfig {
            shutdown_timeout: Duration::from_millis(100),
            ..config()
        },
        TestRunner::new(&[1]),
    );
    let addr = server.local_addr();
    // A client that starts a request and never finishes its headers.
    let mut stalled = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut stalled, b"POST /v1/predict HTTP/1.1\r\nHost: x\r\n").unwrap();
    assert_eq!(get(addr, "/health").status(), StatusCode::OK);
    server.shutdown().unwrap();
    drop(stalled);
}

// ---------------------------------------------------------------------------------------------
// Slow clients and the connection cap

/// A server whose requests must arrive within `read_timeout` and which holds at most
/// `max_connections` connections.
fn start_limited(read_timeout: Duration, max_connections: usize) -> Server {
    let config = ServeConfig {
        read_timeout,
        max_connections,
        ..config()
    };
    start(config, TestRunner::new(&[2]))
}

/// A raw connection to `addr` whose reads give up after a generous 30 s.
fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
}

/// Everything the server sends until it closes the connection.
fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .expect("the server closes the connection");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Sends `GET path` on `stream` (keep-alive) and reads one response: its head and body.
fn exchange(stream: &mut TcpStream, path: &str) -> String {
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")?
                        .parse()
                        .ok()
                })
                .unwrap_or(0usize);
            if body.len() >= length {
                return text;
            }
        }
        let n = stream.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "the server closed the connection mid-response: {text}"
        );
        bytes.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn a_request_head_not_received_in_time_gets_408_and_a_close() {
    let server = start_limited(Duration::from_millis(300), 64);
    let addr = server.local_addr();
    // A slow client: one byte of a head that never ends, every 20 ms, until the server closes.
    let mut stream = connect(addr);
    let mut writer = stream.try_clone().unwrap();
    let trickle = thread::spawn(move || {
        for byte in b"POST /v1/predict HTTP/1.1\r\nHost: x\r\n".iter().cycle() {
            if writer.write_all(&[*byte]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
    });
    let answer = read_until_closed(&mut stream);
    assert!(
        answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{answer}"
    );
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(answer.contains("serve.read_timeout_s"), "{answer}");
    drop(stream);
    trickle.join().unwrap();

    // A connection that never sends a byte is closed without an answer.
    let mut idle = connect(addr);
    assert_eq!(read_until_closed(&mut idle), "");

    assert_eq!(get(addr, "/health").status(), StatusCode::OK);
    let stats = server.shutdown().unwrap();
    assert_eq!((stats.read_timeouts, stats.timed_out), (1, 0));
}

#[test]
fn a_request_body_not_received_in_time_gets_408_and_a_close() {
    let server = start_limited(Duration::from_millis(300), 64);
    let addr = server.local_addr();
    let mut stream = connect(addr);
    let head = "POST /v1/predict HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
                content-length: 100\r\n\r\n";
    write!(stream, "{head}{{\"inputs\": [").unwrap();
    let answer = read_until_closed(&mut stream);
    assert!(
        answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{answer}"
    );
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(answer.contains("serve.read_timeout_s"), "{answer}");

    let ok = post_json(addr, &json!({"inputs": [1, 2]}));
    assert_eq!(ok.status(), StatusCode::OK);
    let stats = server.shutdown().unwrap();
    assert_eq!((stats.read_timeouts, stats.timed_out, stats.ok), (1, 1, 1));
}

#[test]
fn connections_over_the_cap_get_503_and_a_close() {
    let server = start_limited(Duration::from_secs(60), 2);
    let addr = server.local_addr();
    // Two keep-alive connections, each answered once, hold both places.
    let mut first = connect(addr);
    let mut second = connect(addr);
    for held in [&mut first, &mut second] {
        let answer = exchange(held, "/health");
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    }
    let mut third = connect(addr);
    write!(third, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let answer = read_until_closed(&mut third);
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{answer}"
    );
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("serve.max_connections"), "{answer}");
    // The held connections still work; closing one frees its place.
    assert!(exchange(&mut second, "/ready").starts_with("HTTP/1.1 200 OK\r\n"));
    drop(first);
    wait_until("a place is free again", || {
        exchange(&mut connect(addr), "/health").starts_with("HTTP/1.1 200 OK\r\n")
    });
    drop(second);
    let stats = server.shutdown().unwrap();
    assert!(stats.refused_connections >= 1, "{stats:?}");
}
