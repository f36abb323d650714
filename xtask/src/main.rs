//! kiln's task runner (`cargo xtask …`): provisions libtorch, runs the repository checks, and
//! builds and runs the `kiln` CLI with the right environment.
//!
//! It has no dependencies and never links tch, so it builds on a machine without libtorch;
//! that is what lets it install libtorch in the first place.

mod bench;
mod checks;
mod gpu_check;
mod kiln;
mod libtorch;
mod peers;
mod util;

use std::process::ExitCode;

use util::{Error, Result};

const USAGE: &str = "\
usage: cargo xtask <command> [args…]

xtask commands:
  setup             find or install libtorch 2.11 and link it at .kiln/libtorch (idempotent)
  test [--cuda] [args…]
                    setup, then cargo fmt --check, clippy -D warnings, cargo test --workspace
                    (extra args go to cargo test; it also runs the library example), then the
                    tests that need Python's torch; with --cuda (on a machine with a CUDA
                    device), then the tests that need CUDA, which plain cargo test lists as
                    ignored
{bench}{gpu_check}  help              this text

Anything else is a command of the kiln CLI, built in release mode and run with the
provisioned libtorch, for example:
  cargo xtask train            the main job
  cargo xtask infer --model RUN_OR_PT --inputs DATA [--output F]   batched inference
  cargo xtask serve --model RUN_OR_PT                              the HTTP inference server
  cargo xtask version          what kiln was built against
  cargo xtask doctor           what kiln sees on this machine, and what a run would use
  cargo xtask profiles         the hardware profiles
  cargo xtask config --explain every setting of a run and where it came from
  cargo xtask <cmd> --help     the CLI's own help

Environment:
  LIBTORCH        use this libtorch 2.11 instead of installing one
  KILN_PYTHON     the Python to look for torch in and to build the venv with (default python3)
  KILN_CACHE_DIR  where the torch venv lives (default $XDG_CACHE_HOME/kiln or ~/.cache/kiln)
";

/// The usage text, with the benchmark suites listed by `bench`.
fn usage() -> String {
    USAGE
        .replace("{bench}", &bench::usage_text())
        .replace("{gpu_check}", gpu_check::usage_text())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("{}: {err}", util::styled("error", "1;31"));
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode> {
    let root = util::repo_root();
    let Some((command, rest)) = args.split_first() else {
        eprint!("{}", usage());
        return Err(Error("no command given".to_owned()));
    };
    match command.as_str() {
        "help" | "-h" | "--help" => {
            print!("{}", usage());
            Ok(ExitCode::SUCCESS)
        }
        "setup" => {
            if let Some(extra) = rest.first() {
                return Err(Error(format!(
                    "`cargo xtask setup` takes no arguments (got `{extra}`); \
                     configure it with LIBTORCH, KILN_PYTHON or KILN_CACHE_DIR"
                )));
            }
            let settings = libtorch::Settings::from_env(&root)?;
            let found = libtorch::setup(&settings)?;
            libtorch::report(&found, &settings.link);
            Ok(ExitCode::SUCCESS)
        }
        "test" => {
            let settings = libtorch::Settings::from_env(&root)?;
            let found = libtorch::setup(&settings)?;
            libtorch::report(&found, &settings.link);
            let python = kiln::python_of(&found, &settings);
            checks::run_all(&root, &settings, &python, &checks::TestArgs::parse(rest))?;
            Ok(ExitCode::SUCCESS)
        }
        "gpu-check" => {
            let settings = libtorch::Settings::from_env(&root)?;
            let found = libtorch::setup(&settings)?;
            gpu_check::run(&root, &settings, &found, rest)
        }
        "bench" => {
            let settings = libtorch::Settings::from_env(&root)?;
            let found = libtorch::setup(&settings)?;
            bench::run(&root, &settings, &found, rest)
        }
        _ => {
            let settings = libtorch::Settings::from_env(&root)?;
            let found = libtorch::setup(&settings)?;
            if !matches!(
                found.source,
                libtorch::Source::Cache {
                    installed_now: false,
                    ..
                }
            ) {
                libtorch::report(&found, &settings.link);
            }
            kiln::build_and_run(&root, &settings, args)
        }
    }
}
