//! The server soak's traffic: each kind of request a client sends (valid JSON and `.npy`,
//! malformed ones, bodies over the limit, clients that leave mid-request, slow clients), written
//! as raw HTTP/1.1 so that the soak controls every byte, and what each answer counts as.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// What a request of the soak is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// One valid sample as JSON.
    Json,
    /// Two valid samples as `.npy`.
    Npy,
    /// JSON cut off in the middle.
    BadJson,
    /// A body that is not a `.npy` file.
    BadNpy,
    /// Valid JSON sent as `text/plain`.
    WrongType,
    /// A body just over the server's limit.
    Oversize,
    /// Half a body, then the client closes the connection.
    Leaves,
    /// A head sent one byte at a time, never finished.
    SlowHead,
    /// A whole head, then a body sent one byte at a time.
    SlowBody,
}

impl Kind {
    /// The paced traffic's mix, by weight (slow clients run apart, a fixed number at a time).
    pub const MIX: [(Kind, u64); 7] = [
        (Kind::Json, 40),
        (Kind::Npy, 35),
        (Kind::BadJson, 6),
        (Kind::BadNpy, 6),
        (Kind::WrongType, 3),
        (Kind::Oversize, 4),
        (Kind::Leaves, 6),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Json => "valid json",
            Kind::Npy => "valid npy",
            Kind::BadJson => "malformed json",
            Kind::BadNpy => "malformed npy",
            Kind::WrongType => "wrong content type",
            Kind::Oversize => "oversize body",
            Kind::Leaves => "client leaves mid-request",
            Kind::SlowHead => "slow client (head)",
            Kind::SlowBody => "slow client (body)",
        }
    }

    /// Whether the server must refuse it with a 4xx once it reads it.
    pub fn malformed(self) -> bool {
        matches!(
            self,
            Kind::BadJson | Kind::BadNpy | Kind::WrongType | Kind::Oversize
        )
    }

    pub fn valid(self) -> bool {
        matches!(self, Kind::Json | Kind::Npy)
    }

    pub fn slow(self) -> bool {
        matches!(self, Kind::SlowHead | Kind::SlowBody)
    }

    /// The kind of the paced traffic's `ticket`th request: [`Kind::MIX`] by a hash of it.
    pub fn of_ticket(ticket: u64) -> Kind {
        let total: u64 = Kind::MIX.iter().map(|(_, w)| w).sum();
        let mut pick = splitmix64(ticket) % total;
        for (kind, weight) in Kind::MIX {
            if pick < weight {
                return kind;
            }
            pick -= weight;
        }
        Kind::Json
    }
}

/// A well-mixed 64-bit hash (SplitMix64's finalizer).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How a request ended, as the soak counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// An answer with this status; `refused` when it was the connection cap's 503.
    Answered { status: u16, refused: bool },
    /// The server closed the connection without answering.
    Closed,
    /// The client left on purpose ([`Kind::Leaves`]).
    Left,
    /// The client's own I/O failed (reset, timed out, …).
    Failed(io::ErrorKind),
}

impl Ending {
    /// The label the report counts it under.
    pub fn label(&self) -> String {
        match self {
            Ending::Answered {
                status: 503,
                refused: true,
            } => "503 (connection cap)".to_owned(),
            Ending::Answered { status: 503, .. } => "503 (queue full)".to_owned(),
            Ending::Answered { status, .. } => status.to_string(),
            Ending::Closed => "closed without an answer".to_owned(),
            Ending::Left => "left".to_owned(),
            Ending::Failed(kind) => format!("client error: {kind:?}"),
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Ending::Answered { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The bodies the soak sends, built once for the served model's sample shape.
#[derive(Debug, Clone)]
pub struct Bodies {
    json: Vec<u8>,
    npy: Vec<u8>,
    oversize: Vec<u8>,
}

impl Bodies {
    pub fn new(sample_shape: &[usize], max_body_bytes: usize) -> Result<Self, String> {
        let numel: usize = sample_shape.iter().product();
        let sample: Vec<f32> = (0..numel).map(|i| (i % 7) as f32 * 0.1).collect();
        let json = serde_json::json!({ "inputs": sample })
            .to_string()
            .into_bytes();
        let mut shape = vec![2];
        shape.extend_from_slice(sample_shape);
        let pair: Vec<f32> = sample.iter().chain(&sample).copied().collect();
        let npy = kiln_data::npy_f32_bytes(&shape, &pair)?;
        let mut oversize = json.clone();
        oversize.resize(max_body_bytes + 1024, b' ');
        Ok(Self {
            json,
            npy,
            oversize,
        })
    }

    /// `kind`'s content type and body.
    fn of(&self, kind: Kind) -> (&'static str, &[u8]) {
        const JSON: &str = "application/json";
        match kind {
            Kind::Json | Kind::SlowBody | Kind::Leaves => (JSON, &self.json),
            Kind::Npy => ("application/x-npy", &self.npy),
            Kind::BadJson => (JSON, &self.json[..self.json.len() / 2]),
            Kind::BadNpy => ("application/x-npy", b"\x93NUMPY this is not a header"),
            Kind::WrongType => ("text/plain", &self.json),
            Kind::Oversize => (JSON, &self.oversize),
            Kind::SlowHead => (JSON, b""),
        }
    }
}

/// `POST /v1/predict`'s head for a body of `len` bytes.
fn head(content_type: &str, len: usize) -> String {
    format!(
        "POST /v1/predict HTTP/1.1\r\nhost: soak\r\ncontent-type: {content_type}\r\n\
         content-length: {len}\r\n\r\n"
    )
}

/// One client: sends requests of any kind, keeping one connection alive between the requests
/// that allow it.
#[derive(Debug)]
pub struct Client {
    addr: SocketAddr,
    /// The server's read timeout: a connection idle for half of it is not reused (the server
    /// may be closing it), and a slow client waits a few of it for its 408.
    read_timeout: Duration,
    kept: Option<(TcpStream, Instant)>,
}

impl Client {
    pub fn new(addr: SocketAddr, read_timeout: Duration) -> Self {
        Self {
            addr,
            read_timeout,
            kept: None,
        }
    }

    fn connect(&self) -> io::Result<TcpStream> {
        let stream = TcpStream::connect(self.addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(self.read_timeout * 5 + Duration::from_secs(10)))?;
        Ok(stream)
    }

    /// Sends one request of `kind`: how it ended.
    pub fn send(&mut self, kind: Kind, bodies: &Bodies) -> Ending {
        let result = match kind {
            Kind::Leaves => self.leave(bodies),
            Kind::SlowHead | Kind::SlowBody => self.slow(kind, bodies),
            _ => self.exchange(kind, bodies),
        };
        result.unwrap_or_else(|e| Ending::Failed(e.kind()))
    }

    /// A request on the kept connection (a fresh one where there is none, or it sat idle).
    fn exchange(&mut self, kind: Kind, bodies: &Bodies) -> io::Result<Ending> {
        let fresh = |(_, used): &(TcpStream, Instant)| used.elapsed() < self.read_timeout / 2;
        let mut stream = match self.kept.take().filter(fresh) {
            Some((stream, _)) => stream,
            None => self.connect()?,
        };
        let (content_type, body) = bodies.of(kind);
        let mut bytes = head(content_type, body.len()).into_bytes();
        bytes.extend_from_slice(body);
        let written = stream.write_all(&bytes);
        // A server that answers early (413, the cap's 503) may close before all is written:
        // its answer is still there to read.
        let answer = read_answer(&mut stream);
        let answer = match (answer, written) {
            (Ok(answer), _) => answer,
            (Err(_), Err(e)) | (Err(e), Ok(())) => return Err(e),
        };
        let Some((ending, close)) = answer else {
            return Ok(Ending::Closed);
        };
        // Kept only after a 200: after a refusal the server may close without saying so.
        if !close && ending.status() == Some(200) {
            self.kept = Some((stream, Instant::now()));
        }
        Ok(ending)
    }

    /// Half of a valid request on a fresh connection, then the connection closed.
    fn leave(&mut self, bodies: &Bodies) -> io::Result<Ending> {
        self.kept = None;
        let mut stream = self.connect()?;
        let (content_type, body) = bodies.of(Kind::Leaves);
        stream.write_all(head(content_type, body.len()).as_bytes())?;
        stream.write_all(&body[..body.len() / 2])?;
        Ok(Ending::Left)
    }

    /// A slow client on a fresh connection: the head (and for [`Kind::SlowBody`], the body)
    /// written a byte at a time until the server answers, which it must within its read
    /// timeout.
    fn slow(&mut self, kind: Kind, bodies: &Bodies) -> io::Result<Ending> {
        self.kept = None;
        let mut stream = self.connect()?;
        let (content_type, body) = bodies.of(kind);
        let (whole, trickled) = match kind {
            Kind::SlowBody => (head(content_type, body.len()).into_bytes(), body.to_vec()),
            _ => (Vec::new(), head(content_type, 1 << 20).into_bytes()),
        };
        stream.write_all(&whole)?;
        let patience = Instant::now() + self.read_timeout * 4;
        let tick = Duration::from_millis(250);
        for byte in trickled.iter().cycle() {
            if Instant::now() > patience {
                return Err(io::Error::from(io::ErrorKind::TimedOut));
            }
            if stream.write_all(&[*byte]).is_err() || answer_waiting(&stream, tick)? {
                break;
            }
        }
        let ending = read_answer(&mut stream)?.map_or(Ending::Closed, |(ending, _)| ending);
        Ok(ending)
    }
}

/// Whether bytes (or the end of the stream) arrived within `wait`.
fn answer_waiting(stream: &TcpStream, wait: Duration) -> io::Result<bool> {
    stream.set_read_timeout(Some(wait))?;
    let mut probe = [0u8; 1];
    let waiting = match stream.peek(&mut probe) {
        Ok(_) => true,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            false
        }
        Err(_) => true,
    };
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(waiting)
}

/// Reads one HTTP/1.1 answer: how it ended and whether the server closes the connection after
/// it; `None` when the server closed without a byte.
pub fn read_answer(stream: &mut TcpStream) -> io::Result<Option<(Ending, bool)>> {
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = find(&bytes, b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            if bytes.is_empty() {
                return Ok(None);
            }
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        bytes.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_ascii_lowercase();
    let length = header(&head, "content-length").map_or(Ok(0), str::parse);
    let length: usize = length.map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    while bytes.len() < head_end + length {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidData))?;
    let body = String::from_utf8_lossy(&bytes[head_end..head_end + length]);
    let refused = status == 503 && body.contains("serve.max_connections");
    let close = header(&head, "connection") == Some("close");
    Ok(Some((Ending::Answered { status, refused }, close)))
}

/// A header's value in a lower-cased head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `GET path` on a fresh connection: the answer's body, if it answered 200.
pub fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: soak\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_follows_its_weights() {
        let mut counts = std::collections::BTreeMap::new();
        for ticket in 0..100_000 {
            *counts.entry(Kind::of_ticket(ticket)).or_insert(0u64) += 1;
        }
        for (kind, weight) in Kind::MIX {
            let share = counts[&kind] as f64 / 100_000.0;
            assert!(
                (share - weight as f64 / 100.0).abs() < 0.01,
                "{kind:?} {share}"
            );
        }
    }

    #[test]
    fn endings_are_labelled_by_status_and_cause() {
        let refused = Ending::Answered {
            status: 503,
            refused: true,
        };
        assert_eq!(refused.label(), "503 (connection cap)");
        let full = Ending::Answered {
            status: 503,
            refused: false,
        };
        assert_eq!(full.label(), "503 (queue full)");
        assert_eq!(
            Ending::Failed(io::ErrorKind::ConnectionReset).label(),
            "client error: ConnectionReset"
        );
        assert_eq!(
            header("http/1.1 200 ok\r\nconnection: close\r\n", "connection"),
            Some("close")
        );
    }
}
