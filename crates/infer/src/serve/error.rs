//! The error type of the inference server and its load generator.

use std::net::SocketAddr;

/// What can go wrong while starting, running or stopping the server; each variant names the
/// setting, address or thread at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A server (or load generator) setting outside what is valid.
    #[error("`{key}` = {value} is invalid: {expected}")]
    InvalidConfig {
        key: &'static str,
        value: String,
        expected: String,
    },
    /// The listening socket could not be bound (the address is taken, or not local).
    #[error("cannot listen on {addr}: {message}")]
    Bind { addr: SocketAddr, message: String },
    /// A thread or the async runtime could not be started.
    #[error("cannot start the server's {what}: {message}")]
    Start { what: &'static str, message: String },
    /// The runner factory failed (or panicked) on the worker thread.
    #[error("the model runner failed to load: {message}")]
    RunnerLoad { message: String },
    /// The HTTP server stopped with an I/O error.
    #[error("the HTTP server failed: {message}")]
    Http { message: String },
    /// A server thread panicked outside the guarded runner calls.
    #[error("the server's {thread} thread panicked: {message}")]
    Panicked {
        thread: &'static str,
        message: String,
    },
    /// The load generator could not run (no client could connect, …).
    #[error("load generator: {message}")]
    LoadGen { message: String },
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_owned()
    }
}
