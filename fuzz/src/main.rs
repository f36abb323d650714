//! `kiln-fuzz`: runs fuzz targets (all but the self-checks by default) for a number of inputs or
//! seconds each, and prints a row per target: inputs, seconds, panics, hangs, the slowest
//! input and memory. Exits non-zero when any input panicked or hung; the watchdog ends the
//! process (code 3: an input never returned; 4: an input asked for memory past the limits),
//! writing the input out, when it cannot be counted and moved past.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kiln_fuzz::runner::{self, Options, Replayed, Report, Watchdog};
use kiln_fuzz::{Target, alloc, targets};

#[global_allocator]
static ALLOC: alloc::CountingAlloc = alloc::CountingAlloc;

/// Fuzzes kiln's parsers with mutated real files (see `--list`).
#[derive(Debug, Parser)]
#[command(name = "kiln-fuzz")]
struct Args {
    /// A target to run (repeatable); default: every target but the self-checks.
    #[arg(long = "target", value_name = "NAME")]
    targets: Vec<String>,
    /// Inputs per target (seeds included).
    #[arg(long)]
    inputs: Option<u64>,
    /// Seconds per target (default 10 where no other limit is given).
    #[arg(long)]
    seconds: Option<f64>,
    /// Seconds for all the targets run, split evenly between them.
    #[arg(long, conflicts_with = "seconds")]
    total_seconds: Option<f64>,
    /// The run's seed: the same seed and input number give the same input.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where failing inputs are written.
    #[arg(long, default_value = "target/fuzz-findings")]
    out: PathBuf,
    /// An input slower than this is a hang.
    #[arg(long, default_value_t = 1000)]
    hang_ms: u64,
    /// The watchdog ends the run when an input has run this long.
    #[arg(long, default_value_t = 30)]
    give_up_s: u64,
    /// The largest single allocation an input may make, in MiB.
    #[arg(long, default_value_t = 256)]
    alloc_limit_mib: usize,
    /// The most memory live at once, in MiB.
    #[arg(long, default_value_t = 2048)]
    live_limit_mib: usize,
    /// Runs the one `--target` on the input in this file and prints its outcome.
    #[arg(long, value_name = "FILE")]
    replay: Option<PathBuf>,
    /// Lists the targets.
    #[arg(long)]
    list: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kiln-fuzz: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> Result<ExitCode, String> {
    if args.list {
        for t in targets::all() {
            println!("{:<18} {}", t.name, t.about);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let chosen = chosen(&args.targets)?;
    alloc::set_limits(args.alloc_limit_mib << 20, args.live_limit_mib << 20);
    if let Some(file) = &args.replay {
        return replay(&chosen, file);
    }
    runner::quiet_panics();
    let watchdog = Watchdog::start(Duration::from_secs(args.give_up_s))?;
    let split = args.total_seconds.map(|s| s / chosen.len().max(1) as f64);
    let options = Options {
        inputs: args.inputs,
        seconds: args
            .seconds
            .or(split)
            .or_else(|| args.inputs.is_none().then_some(10.0)),
        seed: args.seed,
        out_dir: args.out.clone(),
        hang: Duration::from_millis(args.hang_ms),
    };
    println!("{}", header());
    let mut passed = true;
    for target in &chosen {
        let report = runner::run(target, &options, &watchdog)?;
        println!("{}", row(&report));
        passed &= report.passed();
        for f in &report.failures {
            let file = f
                .file
                .as_ref()
                .map_or(String::new(), |p| format!(" (input in {})", p.display()));
            println!("  {} at input {}: {}{file}", f.kind, f.input, f.message);
        }
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The targets named, or all but the self-checks.
fn chosen(names: &[String]) -> Result<Vec<Target>, String> {
    if names.is_empty() {
        return Ok(targets::all().into_iter().filter(|t| !t.selftest).collect());
    }
    names
        .iter()
        .map(|n| {
            targets::find(n).ok_or_else(|| {
                let all: Vec<&str> = targets::all().iter().map(|t| t.name).collect();
                format!("no target `{n}` (the targets: {})", all.join(", "))
            })
        })
        .collect()
}

fn replay(chosen: &[Target], file: &std::path::Path) -> Result<ExitCode, String> {
    let [target] = chosen else {
        return Err("--replay takes exactly one --target".to_owned());
    };
    match runner::replay(target, file)? {
        Replayed::Answered(outcome) => {
            println!("{}: {outcome:?}", target.name);
            Ok(ExitCode::SUCCESS)
        }
        Replayed::Panicked(panic) => {
            println!("{}: panicked: {panic}", target.name);
            Ok(ExitCode::FAILURE)
        }
    }
}

fn header() -> String {
    format!(
        "{:<18} {:>11} {:>9} {:>9} {:>6} {:>5} {:>10} {:>9} {:>11} {:>6}",
        "target",
        "inputs",
        "seconds",
        "inputs/s",
        "panics",
        "hangs",
        "slowest_ms",
        "peak_MiB",
        "largest_MiB",
        "corpus"
    )
}

fn row(r: &Report) -> String {
    let mib = |b: usize| b as f64 / f64::from(1 << 20);
    format!(
        "{:<18} {:>11} {:>9.1} {:>9.0} {:>6} {:>5} {:>10.1} {:>9.1} {:>11.1} {:>6}",
        r.target,
        r.inputs,
        r.seconds,
        r.inputs as f64 / r.seconds.max(1e-9),
        r.panics,
        r.hangs,
        r.slowest.as_secs_f64() * 1e3,
        mib(r.memory.peak),
        mib(r.memory.largest),
        r.corpus
    )
}
