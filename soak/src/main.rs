//! `kiln-soak`: long runs that check kiln survives abuse, outside CI (`cargo xtask soak`
//! builds the release binaries and runs them). `server` ([`server`]): `kiln serve` under mixed,
//! partly hostile traffic at twice its measured capacity, with its memory watched. `kill`
//! ([`kill`]): `kiln train` killed with SIGKILL at chosen phases and resumed, its finished run
//! compared with an uninterrupted one.

mod kill;
mod server;
mod traffic;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use kiln_benches::run_cli::exit_on_error;

/// `kiln-soak`'s command line.
#[derive(Debug, Parser)]
struct SoakCli {
    #[command(subcommand)]
    command: Sub,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// `kiln serve` under mixed traffic at twice its capacity: crashes, statuses, latency,
    /// memory.
    Server(server::ServerArgs),
    /// `kiln train` killed at chosen phases and resumed, 20 times per scenario: every resume
    /// completes, no checkpoint is damaged, the finished run equals an uninterrupted one.
    Kill(kill::KillArgs),
}

fn main() {
    let about = "`kiln-soak`: long abuse runs (cargo xtask soak runs them)";
    let matches = SoakCli::command().about(about).get_matches();
    let cli = SoakCli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    exit_on_error(match cli.command {
        Sub::Server(a) => server::run(&a),
        Sub::Kill(a) => kill::run(&a),
    });
}
