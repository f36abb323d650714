//! `kiln-soak server`: `kiln serve` (the release CLI beside this binary, on 127.0.0.1 and
//! a port of its choosing) under mixed traffic for `--minutes` (10) at twice the capacity it
//! first measures (`--capacity-seconds` of valid requests only, from the same clients).
//!
//! The traffic ([`traffic`]): `--clients` paced clients, the bound on concurrent requests, each
//! taking the next request of an open-loop schedule at the target rate (valid JSON and `.npy`,
//! malformed JSON and `.npy`, a wrong content type, bodies over the limit, clients that leave
//! mid-request), plus `--slow-clients` slow clients, each trickling a head or a body a byte at a
//! time. The server runs with small limits so that every one of them is reached: a read timeout
//! of 2 s, 64 connections, a queue of 16, bodies of 64 KiB. Every few seconds the server's
//! resident memory (VmRSS) is read and whether it is still alive; at the end it gets SIGTERM and
//! must exit cleanly.
//!
//! Goals: no crash; every malformed request a 4xx (or the connection cap's 503, which comes
//! before the request is read); every slow client cut off with a 408 (or the cap's 503); valid
//! requests answered 200 or 503, and 503 seen once the queue is full; the schedule kept (at
//! least 90 % of the target rate offered); resident memory flat: after a minute's warm-up, a
//! least-squares slope under 1 MiB per minute. The p50/p95/p99 latency of accepted requests is
//! reported. The report is JSON (`--out`, default `<target>/kiln-bench/soak-server.json`); any
//! goal missed makes the command fail.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use kiln_benches::{Msg, Result, report_path};
use serde_json::{Value, json};

use super::traffic::{self, Bodies, Client, Ending, Kind};
use kiln_benches::run_cli::{kiln_exe, read_summary};

/// The server's limits during the soak: small, so that the traffic reaches each of them.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_CONNECTIONS: usize = 64;
const QUEUE_CAPACITY: usize = 16;
const MAX_BODY_BYTES: usize = 64 << 10;
/// Memory samples before this many minutes are the warm-up, left out of the slope.
const WARM_UP_MINUTES: f64 = 1.0;
const RSS_EVERY: Duration = Duration::from_secs(5);
const RSS_GOAL_MIB_PER_MIN: f64 = 1.0;
/// The share of the target rate the paced clients must offer for the run to count.
const PACE_GOAL: f64 = 0.9;
/// The served MLP's hidden layers: wide enough that the server's work is the model's, not
/// HTTP's, so that clients on the same CPU can offer it twice what it answers.
const HIDDEN: &str = "2048,2048";

/// `kiln-soak server`'s options.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Minutes of mixed traffic at twice the measured capacity.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Seconds of valid traffic, as fast as the clients go, that measure the capacity.
    #[arg(long, default_value_t = 20.0)]
    capacity_seconds: f64,
    /// Paced clients: the most requests in flight at once.
    #[arg(long, default_value_t = 56)]
    clients: usize,
    /// Slow clients, each trickling one request at a time.
    #[arg(long, default_value_t = 6)]
    slow_clients: usize,
    /// The JSON report (default: <target>/kiln-bench/soak-server.json).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Scratch directory for the model's run and the server's log (default: a temporary one,
    /// removed afterwards).
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
}

/// Runs the soak in its scratch directory.
pub fn run(a: &ServerArgs) -> Result<()> {
    let temporary = a.work_dir.is_none();
    let work = a.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("kiln-soak-server-{}", std::process::id()))
    });
    std::fs::create_dir_all(&work).at(&work)?;
    let result = soak(a, &work);
    if temporary {
        let _ = std::fs::remove_dir_all(&work);
    }
    result
}

fn soak(a: &ServerArgs, work: &Path) -> Result<()> {
    let kiln = kiln_exe("soak")?;
    let model = train_model(&kiln, work)?;
    let mut server = Served::start(&kiln, &model, work)?;
    let bodies = Bodies::new(&server.sample_shape, MAX_BODY_BYTES)?;
    eprintln!(
        "measuring capacity: {} clients, valid requests only, {} s",
        a.clients.min(QUEUE_CAPACITY),
        a.capacity_seconds
    );
    let schedule = Schedule::capacity(a.capacity_seconds, a.clients.min(QUEUE_CAPACITY));
    let measured = drive(&mut server, &bodies, a, &schedule);
    let capacity = measured.ok_per_second();
    let target = 2.0 * capacity;
    eprintln!(
        "capacity {capacity:.0} answers/s; soaking at {target:.0} requests/s for {} min",
        a.minutes
    );
    let driven = drive(
        &mut server,
        &bodies,
        a,
        &Schedule::soak(a.minutes, target, a.clients),
    );
    let metrics = traffic::get(server.addr, "/metrics").unwrap_or_default();
    let sample_shape = server.sample_shape.clone();
    let soaked = Soaked {
        capacity,
        target,
        driven,
        exit: server.stop(),
        metrics,
        sample_shape,
    };
    let report = Report::new(a, &soaked);
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| report_path("soak-server.json"));
    write_json(&out, &report.json)?;
    report.print();
    eprintln!("report: {}", out.display());
    report.verdict()
}

/// Writes `value` as pretty JSON to `path`, creating its directory.
pub fn write_json(path: &Path, value: &Value) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).at(dir)?;
    }
    let text = serde_json::to_string_pretty(value).msg()?;
    std::fs::write(path, text + "\n").at(path)
}

/// Trains the model the server serves: kiln's MLP (hidden layers [`HIDDEN`]) on its synthetic
/// data, one epoch on the CPU.
fn train_model(kiln: &Path, work: &Path) -> Result<PathBuf> {
    let runs = work.join("runs");
    let sets = [
        "data.synthetic_samples=1024".to_owned(),
        format!("model.hidden={HIDDEN}"),
        "run.tensorboard=false".to_owned(),
        format!("run.output_dir={}", runs.display()),
    ];
    let mut cmd = Command::new(kiln);
    cmd.args([
        "train", "--model", "mlp", "--epochs", "1", "--device", "cpu",
    ]);
    for set in &sets {
        cmd.args(["--set", set]);
    }
    let log = work.join("train.log");
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).at(&log)?)
        .status()
        .msg()?;
    if !status.success() {
        return Err(format!(
            "training the soak's model failed ({status}); see {}",
            log.display()
        ));
    }
    Ok(read_summary(&runs)?.0)
}

/// `kiln serve` running as a child process.
struct Served {
    child: Child,
    addr: SocketAddr,
    sample_shape: Vec<usize>,
    log: PathBuf,
}

impl Served {
    /// Starts `kiln serve --model MODEL` with the soak's limits on 127.0.0.1, a free port,
    /// and waits until it is ready.
    fn start(kiln: &Path, model: &Path, work: &Path) -> Result<Self> {
        let log = work.join("serve.log");
        let sets = [
            format!("serve.read_timeout_s={}", READ_TIMEOUT.as_secs_f64()),
            format!("serve.max_connections={MAX_CONNECTIONS}"),
            format!("serve.queue_capacity={QUEUE_CAPACITY}"),
            format!("serve.max_body_bytes={MAX_BODY_BYTES}"),
            "infer.engine=libtorch".to_owned(),
            "infer.precision=fp32".to_owned(),
        ];
        let mut cmd = Command::new(kiln);
        cmd.arg("serve").arg("--model").arg(model);
        cmd.args(["--host", "127.0.0.1", "--port", "0", "--device", "cpu"]);
        for set in &sets {
            cmd.args(["--set", set]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).at(&log)?)
            .spawn()
            .msg()?;
        let mut served = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            sample_shape: vec![],
            log,
        };
        served.wait_ready()?;
        Ok(served)
    }

    /// Reads the address from the log, then polls `GET /ready` for the sample shape (at most
    /// two minutes).
    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().msg()? {
                return Err(format!(
                    "kiln serve exited ({status}); see {}",
                    self.log.display()
                ));
            }
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(addr) = listening_addr(&text) {
                self.addr = addr;
                let ready = traffic::get(addr, "/ready");
                let shape = ready.and_then(|body| sample_shape(&body));
                if let Some(shape) = shape {
                    self.sample_shape = shape;
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "kiln serve was not ready within 2 minutes; see {}",
            self.log.display()
        ))
    }

    /// The server's resident memory in MiB (VmRSS).
    fn rss_mib(&self) -> Option<f64> {
        kiln_benches::proc_memory::vm_rss(self.child.id()).map(kiln_benches::proc_memory::mib)
    }

    /// SIGTERM, then at most a minute for a graceful exit (else SIGKILL).
    fn stop(mut self) -> Exit {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Exit::Died(status.to_string());
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return match status.code() {
                    Some(0) => Exit::Clean,
                    _ => Exit::Died(status.to_string()),
                };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Exit::Died("still running a minute after SIGTERM (killed)".to_owned())
    }
}

/// The address in `kiln serve`'s "listening on http://ADDR …" line.
fn listening_addr(log: &str) -> Option<SocketAddr> {
    let rest = log.split("listening on http://").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// `sample_shape` of a `/ready` body.
fn sample_shape(body: &str) -> Option<Vec<usize>> {
    let v: Value = serde_json::from_str(body).ok()?;
    v["sample_shape"]
        .as_array()?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect()
}

/// How the server's process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Exit {
    /// Exit code 0 after SIGTERM.
    Clean,
    /// Anything else, said in words.
    Died(String),
}

/// When the paced clients send: every `interval` from `start` until `end` (no interval: as
/// fast as they go), and whether the mix is only valid requests.
#[derive(Debug)]
struct Schedule {
    seconds: f64,
    /// Paced clients.
    clients: usize,
    rate: Option<f64>,
    valid_only: bool,
    slow_clients: bool,
}

impl Schedule {
    /// Valid requests from `clients` clients as fast as they go (no more than the queue
    /// holds, so that the server's time goes to answers rather than to refusals).
    fn capacity(seconds: f64, clients: usize) -> Self {
        Self {
            seconds,
            clients,
            rate: None,
            valid_only: true,
            slow_clients: false,
        }
    }

    fn soak(minutes: f64, rate: f64, clients: usize) -> Self {
        Self {
            seconds: minutes * 60.0,
            clients,
            rate: Some(rate),
            valid_only: false,
            slow_clients: true,
        }
    }
}

/// The open-loop schedule's tickets, shared by the paced clients.
struct Pacer {
    start: Instant,
    end: Instant,
    interval: Option<Duration>,
    next: AtomicU64,
    stop: AtomicBool,
}

impl Pacer {
    fn new(schedule: &Schedule) -> Self {
        let start = Instant::now();
        Self {
            start,
            end: start + Duration::from_secs_f64(schedule.seconds),
            interval: schedule.rate.map(|r| Duration::from_secs_f64(1.0 / r)),
            next: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }

    /// The next ticket and when it is due; `None` once the schedule is over.
    fn take(&self) -> Option<(u64, Instant)> {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let due = match self.interval {
            Some(every) => self.start + every.mul_f64(ticket as f64),
            None => Instant::now(),
        };
        let over = due >= self.end || Instant::now() >= self.end;
        (!over && !self.stop.load(Ordering::Relaxed)).then_some((ticket, due))
    }

    fn running(&self) -> bool {
        Instant::now() < self.end && !self.stop.load(Ordering::Relaxed)
    }
}

/// What some clients saw: answers counted by kind and label, latencies of the 200s.
#[derive(Debug, Default)]
struct Tally {
    counts: BTreeMap<(Kind, String), u64>,
    ok_micros: Vec<u32>,
    /// Tickets taken more than 100 ms after they were due (the clients fell behind).
    late: u64,
}

impl Tally {
    fn add(&mut self, kind: Kind, ending: &Ending, took: Duration) {
        *self.counts.entry((kind, ending.label())).or_default() += 1;
        if ending.status() == Some(200) {
            let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
            self.ok_micros.push(micros);
        }
    }

    fn merge(&mut self, other: Tally) {
        for (key, n) in other.counts {
            *self.counts.entry(key).or_default() += n;
        }
        self.ok_micros.extend(other.ok_micros);
        self.late += other.late;
    }

    fn count(&self, keep: impl Fn(Kind, &str) -> bool) -> u64 {
        let kept = self.counts.iter().filter(|((k, l), _)| keep(*k, l));
        kept.map(|(_, n)| n).sum()
    }
}

/// One phase's traffic: the tally, its length, the memory samples (minutes, MiB) and whether
/// the server died.
struct Driven {
    tally: Tally,
    seconds: f64,
    rss: Vec<(f64, f64)>,
    crashed: Option<String>,
}

impl Driven {
    fn ok_per_second(&self) -> f64 {
        self.tally.ok_micros.len() as f64 / self.seconds
    }

    /// Paced requests sent per second (slow clients apart).
    fn offered_per_second(&self) -> f64 {
        self.tally.count(|k, _| !k.slow()) as f64 / self.seconds
    }
}

/// Runs `schedule` against the server: the paced and slow clients on threads of their own, the
/// memory and liveness watch on this one.
fn drive(server: &mut Served, bodies: &Bodies, a: &ServerArgs, schedule: &Schedule) -> Driven {
    let pacer = &Pacer::new(schedule);
    let addr = server.addr;
    let started = Instant::now();
    let (tally, (rss, crashed)) = std::thread::scope(|scope| {
        let paced: Vec<_> = (0..schedule.clients)
            .map(|_| scope.spawn(move || paced_client(addr, bodies, pacer, schedule.valid_only)))
            .collect();
        let slow_count = if schedule.slow_clients {
            a.slow_clients
        } else {
            0
        };
        let slow: Vec<_> = (0..slow_count)
            .map(|i| scope.spawn(move || slow_client(addr, bodies, pacer, i)))
            .collect();
        let watched = watch(server, pacer, started);
        let mut tally = Tally::default();
        for handle in paced.into_iter().chain(slow) {
            tally.merge(handle.join().unwrap_or_default());
        }
        (tally, watched)
    });
    Driven {
        tally,
        seconds: started.elapsed().as_secs_f64(),
        rss,
        crashed,
    }
}

/// Samples the server's memory every [`RSS_EVERY`] until the schedule ends or the server dies
/// (which stops the clients).
fn watch(
    server: &mut Served,
    pacer: &Pacer,
    started: Instant,
) -> (Vec<(f64, f64)>, Option<String>) {
    let mut rss = Vec::new();
    let mut next = started;
    while pacer.running() {
        if let Ok(Some(status)) = server.child.try_wait() {
            pacer.stop.store(true, Ordering::Relaxed);
            return (
                rss,
                Some(format!("kiln serve exited during the soak ({status})")),
            );
        }
        if Instant::now() >= next {
            if let Some(mib) = server.rss_mib() {
                rss.push((started.elapsed().as_secs_f64() / 60.0, mib));
            }
            next += RSS_EVERY;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (rss, None)
}

/// A paced client: takes tickets, waits for each to be due, sends the ticket's kind of request.
fn paced_client(addr: SocketAddr, bodies: &Bodies, pacer: &Pacer, valid_only: bool) -> Tally {
    let mut client = Client::new(addr, READ_TIMEOUT);
    let mut tally = Tally::default();
    while let Some((ticket, due)) = pacer.take() {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else if now - due > Duration::from_millis(100) {
            tally.late += 1;
        }
        let kind = match valid_only {
            true if ticket % 2 == 0 => Kind::Json,
            true => Kind::Npy,
            false => Kind::of_ticket(ticket),
        };
        let sent = Instant::now();
        let ending = client.send(kind, bodies);
        tally.add(kind, &ending, sent.elapsed());
    }
    tally
}

/// A slow client: one slow request after another (head and body in turn) until the end.
fn slow_client(addr: SocketAddr, bodies: &Bodies, pacer: &Pacer, index: usize) -> Tally {
    let mut client = Client::new(addr, READ_TIMEOUT);
    let mut tally = Tally::default();
    let mut turn = index;
    while pacer.running() {
        let kind = [Kind::SlowHead, Kind::SlowBody][turn % 2];
        turn += 1;
        let sent = Instant::now();
        let ending = client.send(kind, bodies);
        tally.add(kind, &ending, sent.elapsed());
    }
    tally
}

/// The upper `q` quantile of `values` (sorted in place), in milliseconds.
fn quantile_ms(values: &mut [u32], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_unstable();
    let at = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1;
    f64::from(values[at]) / 1e3
}

/// The least-squares slope of `points` (x, y); NaN for fewer than two distinct x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points
        .iter()
        .map(|(x, y)| (x - mean_x) * (y - mean_y))
        .sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mean_x).powi(2)).sum();
    if sxx > 0.0 { sxy / sxx } else { f64::NAN }
}

/// What the soak found, for its report.
struct Soaked {
    /// Answers (200) per second under valid traffic as fast as the clients go.
    capacity: f64,
    /// The soak's rate: twice the capacity.
    target: f64,
    driven: Driven,
    exit: Exit,
    /// The server's `/metrics` text at the end.
    metrics: String,
    sample_shape: Vec<usize>,
}

/// One goal, met or not, with the figures that decide it.
#[derive(Debug)]
struct Goal {
    name: &'static str,
    met: bool,
    detail: String,
}

/// The soak's report: its JSON and its goals.
struct Report {
    json: Value,
    goals: Vec<Goal>,
}

impl Report {
    fn new(a: &ServerArgs, soaked: &Soaked) -> Self {
        let driven = &soaked.driven;
        let mut ok = driven.tally.ok_micros.clone();
        let latency = json!({
            "count": ok.len(),
            "p50_ms": quantile_ms(&mut ok, 0.50),
            "p95_ms": quantile_ms(&mut ok, 0.95),
            "p99_ms": quantile_ms(&mut ok, 0.99),
            "max_ms": quantile_ms(&mut ok, 1.0),
        });
        let after: Vec<(f64, f64)> = driven
            .rss
            .iter()
            .copied()
            .filter(|(t, _)| *t >= WARM_UP_MINUTES)
            .collect();
        let rss_slope = slope(&after);
        let goals = goals(soaked, rss_slope, after.len());
        let json = json!({
            "machine": machine(),
            "minutes": a.minutes,
            "server": {
                "read_timeout_s": READ_TIMEOUT.as_secs_f64(),
                "max_connections": MAX_CONNECTIONS,
                "queue_capacity": QUEUE_CAPACITY,
                "max_body_bytes": MAX_BODY_BYTES,
                "model": format!("kiln's MLP (hidden {HIDDEN}), one epoch on its synthetic data"),
                "sample_shape": soaked.sample_shape,
            },
            "clients": a.clients,
            "slow_clients": a.slow_clients,
            "capacity_per_s": soaked.capacity,
            "target_per_s": soaked.target,
            "offered_per_s": driven.offered_per_second(),
            "late_tickets": driven.tally.late,
            "requests": requests_json(&driven.tally),
            "accepted_latency": latency,
            "rss": {
                "samples_min_mib": driven.rss,
                "warm_up_min": WARM_UP_MINUTES,
                "slope_mib_per_min": rss_slope,
                "goal_mib_per_min": RSS_GOAL_MIB_PER_MIN,
            },
            "crash": driven.crashed,
            "exit": match &soaked.exit { Exit::Clean => "clean".to_owned(), Exit::Died(why) => why.clone() },
            "server_metrics": server_metrics(&soaked.metrics),
            "goals": goals.iter().map(|g| json!({"goal": g.name, "met": g.met, "detail": g.detail})).collect::<Vec<_>>(),
        });
        Self { json, goals }
    }

    fn print(&self) {
        eprintln!(
            "{}",
            serde_json::to_string_pretty(&self.json["requests"]).unwrap_or_default()
        );
        eprintln!("accepted latency: {}", self.json["accepted_latency"]);
        for goal in &self.goals {
            let mark = if goal.met { "met" } else { "MISSED" };
            eprintln!("{mark:>6}  {}: {}", goal.name, goal.detail);
        }
    }

    fn verdict(&self) -> Result<()> {
        let missed: Vec<&str> = self
            .goals
            .iter()
            .filter(|g| !g.met)
            .map(|g| g.name)
            .collect();
        if missed.is_empty() {
            Ok(())
        } else {
            Err(format!("the server soak missed: {}", missed.join("; ")))
        }
    }
}

/// Requests by kind, then by how they ended.
fn requests_json(tally: &Tally) -> Value {
    let mut by_kind: BTreeMap<&str, BTreeMap<String, u64>> = BTreeMap::new();
    for ((kind, label), n) in &tally.counts {
        by_kind
            .entry(kind.name())
            .or_default()
            .insert(label.clone(), *n);
    }
    json!(by_kind)
}

/// The server's own counters from its `/metrics` text: every `kiln_serve_*_total` sample.
fn server_metrics(text: &str) -> Value {
    let samples: BTreeMap<&str, f64> = text
        .lines()
        .filter(|l| l.starts_with("kiln_serve_") && !l.contains("_bucket"))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name, value.parse().ok()?))
        })
        .filter(|(name, _)| name.contains("_total"))
        .collect();
    json!(samples)
}

/// The CPU this ran on and its cores.
fn machine() -> Value {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1))
        .map_or("unknown", str::trim);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    json!({"cpu": model, "cores": cores})
}

/// The soak's goals over what the clients saw.
fn goals(soaked: &Soaked, rss_slope: f64, samples: usize) -> Vec<Goal> {
    let (driven, exit, target) = (&soaked.driven, &soaked.exit, soaked.target);
    let t = &driven.tally;
    let code = |l: &str| l.split(' ').next().and_then(|c| c.parse::<u16>().ok());
    let capped = |l: &str| l == "503 (connection cap)";
    let client_error = |c: u16| (400..500).contains(&c) && c != 408;
    let malformed_bad =
        t.count(|k, l| k.malformed() && !(capped(l) || code(l).is_some_and(client_error)));
    let slow_bad = t.count(|k, l| k.slow() && !(capped(l) || l == "408"));
    let timeouts = t.count(|k, l| k.slow() && l == "408");
    let valid_bad = t.count(|k, l| k.valid() && !(l == "200" || l.starts_with("503")));
    let queue_full = t.count(|k, l| k.valid() && l == "503 (queue full)");
    let offered = driven.offered_per_second();
    vec![
        Goal {
            name: "no crash",
            met: driven.crashed.is_none() && *exit == Exit::Clean,
            detail: format!("{:?}; after SIGTERM: {exit:?}", driven.crashed),
        },
        Goal {
            name: "every malformed request a 4xx",
            met: malformed_bad == 0,
            detail: format!("{malformed_bad} malformed requests got something else"),
        },
        Goal {
            name: "slow clients cut off with 408",
            met: slow_bad == 0 && timeouts > 0,
            detail: format!("{timeouts} got 408, {slow_bad} something else"),
        },
        Goal {
            name: "valid requests get 200, or 503 once the queue is full",
            met: valid_bad == 0 && queue_full > 0,
            detail: format!("{queue_full} got 503 (queue full), {valid_bad} something else"),
        },
        Goal {
            name: "twice the capacity offered",
            met: offered >= PACE_GOAL * target,
            detail: format!(
                "{offered:.0} requests/s offered of {target:.0} (goal ≥ {:.0} %)",
                PACE_GOAL * 100.0
            ),
        },
        Goal {
            name: "resident memory flat",
            met: samples >= 3 && rss_slope < RSS_GOAL_MIB_PER_MIN,
            detail: format!(
                "{rss_slope:.3} MiB/min after {WARM_UP_MINUTES} min ({samples} samples; goal < {RSS_GOAL_MIB_PER_MIN})"
            ),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_and_quantiles() {
        let line: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), 3.0 + 0.5 * f64::from(i)))
            .collect();
        assert!((slope(&line) - 0.5).abs() < 1e-12);
        assert!(slope(&[(1.0, 2.0)]).is_nan());
        let mut v: Vec<u32> = (1..=100).map(|ms| ms * 1000).collect();
        assert_eq!(quantile_ms(&mut v, 0.99), 99.0);
        assert_eq!(quantile_ms(&mut v, 1.0), 100.0);
    }

    #[test]
    fn the_servers_address_and_shape_are_read_from_what_it_says() {
        let log = "serving x\nlistening on http://127.0.0.1:4321 (POST /v1/predict …)\nready\n";
        assert_eq!(
            listening_addr(log),
            Some(SocketAddr::from(([127, 0, 0, 1], 4321)))
        );
        let ready = r#"{"status":"ready","sample_shape":[64]}"#;
        assert_eq!(sample_shape(ready), Some(vec![64]));
    }
}
