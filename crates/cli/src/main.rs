//! The `kiln` command-line interface: parses arguments, sets up logging, and hands each command
//! to the library crates. The only place that uses `anyhow`.

mod logging;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for a command that exists in the interface but is not built yet.
const EXIT_NOT_BUILT: u8 = 3;

/// kiln: fast PyTorch-style training and inference on whatever hardware this is.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about, propagate_version = true)]
struct Cli {
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Only warnings and errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show kiln's version and the libtorch it runs on (location, CUDA support).
    Version,
    /// Train a model (the main job).
    Train,
    /// Run the benchmark suites.
    Bench,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.verbose, cli.quiet);
    match run(cli.command) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Version => {
            print_version()?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Train => not_built("train", "training", 5),
        Command::Bench => not_built("bench", "benchmarking", 8),
    }
}

fn print_version() -> anyhow::Result<()> {
    let info = kiln_device::libtorch::libtorch_info()?;
    println!("kiln {}", env!("CARGO_PKG_VERSION"));
    println!("libtorch {} at {}", info.version, info.lib_dir.display());
    let cuda_library = match info.cuda_library {
        kiln_device::libtorch::CudaLibraryState::NotShipped => "not shipped (CPU build)",
        kiln_device::libtorch::CudaLibraryState::Linked => "linked",
        kiln_device::libtorch::CudaLibraryState::LoadedAtRuntime => "loaded at run time",
    };
    println!("libtorch_cuda: {cuda_library}");
    println!(
        "CUDA available: {} ({} device(s))",
        if info.cuda_available { "yes" } else { "no" },
        info.cuda_device_count
    );
    Ok(())
}

/// Says plainly that a command is not built yet, after showing that kiln itself runs.
fn not_built(command: &str, what: &str, issue: u32) -> anyhow::Result<ExitCode> {
    let info = kiln_device::libtorch::libtorch_info()?;
    tracing::info!(
        "kiln {} on libtorch {} ({} CUDA device(s))",
        env!("CARGO_PKG_VERSION"),
        info.version,
        info.cuda_device_count
    );
    eprintln!(
        "kiln {command}: {what} is not built yet (tracked as issue {issue}). kiln and libtorch {} \
         are installed and working; see `kiln version`.",
        info.version
    );
    Ok(ExitCode::from(EXIT_NOT_BUILT))
}
