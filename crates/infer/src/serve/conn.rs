//! The server's connections: a listener that caps how many are open (beyond
//! `max_connections`, a 503 with `Retry-After`, then close) and a connection that cuts off a
//! request not received within `read_timeout` of its first byte (408, then close).
//!
//! A connection's current request goes through phases, moved along by the connection's I/O and
//! by the routes' outermost layer ([`ConnPhase`]): idle (waiting for a request's first byte),
//! reading (its head), handling (a route has it, and reads the body against the same deadline),
//! answered (the route returned; the first byte of the answer written starts the next idle
//! phase). The timer runs while idle (then the connection closes without an answer: no request
//! was started) and while reading (a 408). A connection the server closes lingers for at most
//! [`LINGER`]: its last answer written, its write side shut, and whatever the client still sends
//! read and dropped, so that the client reads the answer instead of a reset.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use super::metrics::Metrics;

/// The longest a closing connection waits to write its last answer and read what the client
/// still sends.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// Where a connection's current request stands.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for a request's first byte, since then.
    Idle(Instant),
    /// A request's first byte arrived then; its head is being read.
    Reading(Instant),
    /// A route has the request.
    Handling,
    /// The route returned its response; hyper is about to write it.
    Answered,
}

/// A connection's phase, shared by its I/O and the requests it carries (a route finds it as
/// `ConnectInfo<ConnPhase>`).
#[derive(Debug, Clone)]
pub(crate) struct ConnPhase(Arc<Mutex<Phase>>);

impl ConnPhase {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(Phase::Idle(Instant::now()))))
    }

    fn get(&self) -> Phase {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, change: impl FnOnce(Phase) -> Phase) {
        let mut phase = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *phase = change(*phase);
    }

    /// A route took the request: the timer stops. Returns when the request's first byte came.
    pub fn start_handling(&self) -> Instant {
        let mut started = Instant::now();
        self.set(|phase| {
            if let Phase::Reading(first) = phase {
                started = first;
            }
            Phase::Handling
        });
        started
    }

    /// The route returned its response.
    pub fn answered(&self) {
        self.set(|_| Phase::Answered);
    }

    /// Bytes arrived: on an idle connection, a request started.
    fn bytes_read(&self) {
        self.set(|phase| match phase {
            Phase::Idle(_) => Phase::Reading(Instant::now()),
            other => other,
        });
    }

    /// Bytes of an answer went out: once the route answered, the connection is idle again.
    fn bytes_written(&self) {
        self.set(|phase| match phase {
            Phase::Answered | Phase::Idle(_) => Phase::Idle(Instant::now()),
            other => other,
        });
    }
}

impl Connected<IncomingStream<'_, CappedListener>> for ConnPhase {
    fn connect_info(stream: IncomingStream<'_, CappedListener>) -> Self {
        stream.io().phase.clone()
    }
}

/// What every connection of one server shares: its limits, metrics and canned answers.
#[derive(Debug)]
struct Shared {
    read_timeout: Duration,
    metrics: Arc<Metrics>,
    /// The 408 written to a connection whose request head did not arrive in time.
    timed_out: Bytes,
}

/// A listener that accepts at most `max_connections` open connections; one more is answered
/// 503 (with `Retry-After: 1`) and closed.
#[derive(Debug)]
pub(crate) struct CappedListener {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    shared: Arc<Shared>,
    /// The 503 written to a connection over the cap.
    refusal: Bytes,
}

impl CappedListener {
    pub fn new(
        inner: TcpListener,
        max_connections: usize,
        read_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let timed_out = canned(
            "408 Request Timeout",
            "",
            &format!(
                "the request did not arrive within {} s of its first byte (serve.read_timeout_s); \
                 the connection is closed",
                read_timeout.as_secs_f64()
            ),
        );
        let refusal = canned(
            "503 Service Unavailable",
            "retry-after: 1\r\n",
            &format!(
                "the server already has {max_connections} connections open \
                 (serve.max_connections); retry later"
            ),
        );
        Self {
            inner,
            slots: Arc::new(Semaphore::new(max_connections)),
            shared: Arc::new(Shared {
                read_timeout,
                metrics,
                timed_out,
            }),
            refusal,
        }
    }
}

/// An HTTP/1.1 answer with a JSON `{"error": message}` body that closes the connection.
fn canned(status: &str, headers: &str, message: &str) -> Bytes {
    let body = serde_json::json!({ "error": message }).to_string();
    Bytes::from(format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{headers}connection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    ))
}

impl Listener for CappedListener {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        loop {
            let (stream, addr) = Listener::accept(&mut self.inner).await;
            match self.slots.clone().try_acquire_owned() {
                Ok(permit) => return (Connection::new(stream, permit, &self.shared), addr),
                Err(_) => {
                    self.shared.metrics.connection_refused();
                    tokio::spawn(close_gently(stream, Some(self.refusal.clone()), None));
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection's place under the cap, given back (and counted as closed) when dropped.
#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.metrics.connection_changed(-1);
    }
}

/// One accepted connection: a TCP stream whose reads time out as the module doc says.
#[derive(Debug)]
pub(crate) struct Connection {
    /// `None` only once dropped.
    stream: Option<TcpStream>,
    phase: ConnPhase,
    timer: Pin<Box<Sleep>>,
    shared: Arc<Shared>,
    /// What to write before closing (the 408).
    farewell: Option<Bytes>,
    /// The client closed its side (a read returned end of file).
    peer_closed: bool,
    slot: Option<Slot>,
}

impl Connection {
    fn new(stream: TcpStream, permit: OwnedSemaphorePermit, shared: &Arc<Shared>) -> Self {
        shared.metrics.connection_changed(1);
        let _ = stream.set_nodelay(true);
        Self {
            stream: Some(stream),
            phase: ConnPhase::new(),
            timer: Box::pin(tokio::time::sleep(shared.read_timeout)),
            shared: shared.clone(),
            farewell: None,
            peer_closed: false,
            slot: Some(Slot {
                _permit: permit,
                metrics: shared.metrics.clone(),
            }),
        }
    }

    fn stream(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.stream
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }

    /// Polls the read timer of an idle or reading connection whose read is pending: at the
    /// deadline, end of file (idle) or a timeout error with the 408 to write (reading).
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (since, reading) = match self.phase.get() {
            Phase::Idle(since) => (since, false),
            Phase::Reading(since) => (since, true),
            Phase::Handling | Phase::Answered => return Poll::Pending,
        };
        let deadline = tokio::time::Instant::from_std(since + self.shared.read_timeout);
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        if self.timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if !reading {
            return Poll::Ready(Ok(()));
        }
        self.farewell = Some(self.shared.timed_out.clone());
        self.shared.metrics.read_timed_out();
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the request head did not arrive within serve.read_timeout_s",
        )))
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match this.stream()?.poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() == before {
                    this.peer_closed = true;
                } else {
                    this.phase.bytes_read();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_timer(cx),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = self.stream()?.poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.phase.bytes_written();
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = self.stream()?.poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.phase.bytes_written();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_shutdown(cx)
    }
}

impl Drop for Connection {
    /// Unless the client closed first, closes [gently](close_gently) in a task of its own,
    /// which keeps the connection's slot until it is done.
    fn drop(&mut self) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        if self.peer_closed {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(close_gently(stream, self.farewell.take(), self.slot.take()));
        }
    }
}

/// Writes `farewell`, shuts the write side and reads until the client closes, all within
/// [`LINGER`]; then drops the stream and `slot`.
async fn close_gently(mut stream: TcpStream, farewell: Option<Bytes>, slot: Option<Slot>) {
    let linger = async {
        if let Some(bytes) = farewell {
            write_all(&stream, &bytes).await?;
        }
        std::future::poll_fn(|cx| Pin::new(&mut stream).poll_shutdown(cx)).await?;
        drain(&stream).await
    };
    let _ = tokio::time::timeout(LINGER, linger).await;
    drop(slot);
}

/// Writes all of `bytes` to `stream`.
async fn write_all(stream: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads and drops what `stream` receives until the client closes it.
async fn drain(stream: &TcpStream) -> io::Result<()> {
    let mut sink = [0u8; 4096];
    loop {
        stream.readable().await?;
        match stream.try_read(&mut sink) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}
