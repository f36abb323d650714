//! Log output for the CLI: `tracing` to stderr, level from -v/-q unless RUST_LOG says otherwise.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `RUST_LOG`, when set, wins over the flags.
pub fn init(verbose: u8, quiet: bool) {
    let default = match (quiet, verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    // ONNX Runtime logs its allocator and graph work at info; only its warnings unless -vv.
    let default = if verbose >= 2 {
        default.to_owned()
    } else {
        format!("{default},ort=warn")
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or a CI log gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
