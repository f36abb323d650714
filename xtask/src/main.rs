//! kiln's task runner (`cargo xtask …`): provisions libtorch and onnxruntime, runs the
//! repository checks, and builds and runs the `kiln` CLI with the right environment.
//!
//! It has no dependencies and never links tch, so it builds on a machine without libtorch;
//! that is what lets it install libtorch in the first place.

mod bench;
mod bench_docs;
mod checks;
mod cuda_tests;
mod fuzz;
mod gpu_check;
mod kiln;
mod libtorch;
mod onnx;
mod peers;
mod soak;
mod util;

use std::path::PathBuf;
use std::process::ExitCode;

use util::{Error, Result};

const USAGE: &str = "\
usage: cargo xtask <command> [args…]

xtask commands:
  setup             find or install libtorch 2.11 and link it at .kiln/libtorch; install
                    onnxruntime 1.31.1 (for .onnx models) and link it at .kiln/onnxruntime
                    (idempotent; every command below does this first)
  test [--cuda] [args…]
                    setup, then cargo fmt --check, clippy -D warnings, cargo test --workspace
                    (extra args go to cargo test; it also runs the library example), a
                    minute of every fuzz target, then the tests that need Python's torch; with
                    --cuda (on a machine with a CUDA device), then the tests that need CUDA,
                    which plain cargo test lists as ignored
{bench}{gpu_check}{fuzz}{soak}  help              this text

Anything else is a command of the kiln CLI, built in release mode and run with the
provisioned libtorch, for example:
  cargo xtask train            the main job
  cargo xtask infer --model RUN_OR_PT --inputs DATA [--output F]   batched inference
  cargo xtask serve --model RUN_OR_PT                              the HTTP inference server
  cargo xtask export --model RUN --format onnx|torchscript --out F export a trained model
                               (installs the pinned ONNX export packages on first use)
  cargo xtask version          what kiln was built against
  cargo xtask doctor           what kiln sees on this machine, and what a run would use
  cargo xtask profiles         the hardware profiles
  cargo xtask config --explain every setting of a run and where it came from
  cargo xtask <cmd> --help     the CLI's own help

Environment:
  LIBTORCH        use this libtorch 2.11 instead of installing one
  KILN_PYTHON     the Python to look for torch in and to build the venv with (default python3)
  KILN_CACHE_DIR  where the torch venv and onnxruntime live (default $XDG_CACHE_HOME/kiln or
                  ~/.cache/kiln)
  KILN_ONNXRUNTIME_BUILD
                  cpu or cuda: which onnxruntime wheel setup installs (default cuda on Linux
                  x86_64 with an NVIDIA driver, cpu elsewhere)
  KILN_ONNXRUNTIME
                  the onnxruntime library kiln uses (default .kiln/onnxruntime)
";

/// The usage text, with the benchmark suites listed by `bench`.
fn usage() -> String {
    USAGE
        .replace("{bench}", &bench::usage_text())
        .replace("{gpu_check}", gpu_check::usage_text())
        .replace("{fuzz}", fuzz::usage_text())
        .replace("{soak}", soak::usage_text())
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
                    "`cargo xtask setup` takes no arguments (got `{extra}`); configure it with \
                     LIBTORCH, KILN_PYTHON, KILN_CACHE_DIR or KILN_ONNXRUNTIME_BUILD"
                )));
            }
            provision(&root, Report::Always)?;
            Ok(ExitCode::SUCCESS)
        }
        "test" => {
            let p = provision(&root, Report::Always)?;
            checks::run_all(
                &root,
                &p.settings,
                &p.python,
                &checks::TestArgs::parse(rest),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        "gpu-check" => {
            let p = provision(&root, Report::Never)?;
            gpu_check::run(&root, &p.settings, &p.libtorch, rest)
        }
        "bench" => {
            let p = provision(&root, Report::Never)?;
            bench::run(&root, &p.settings, &p.libtorch, rest)
        }
        "soak" => {
            let p = provision(&root, Report::Never)?;
            soak::run(&root, &p.settings, rest)
        }
        "fuzz" => {
            let p = provision(&root, Report::Never)?;
            fuzz::run(&root, &p.settings, rest)
        }
        _ => {
            let p = provision(&root, Report::WhenChanged)?;
            let mut envs = vec![];
            if command == "export" {
                // `kiln export --format onnx` runs PyTorch's exporter in this Python, with the
                // pinned onnx packages. Without them a TorchScript export still works, and an
                // ONNX export fails with kiln's own message.
                match onnx::ensure_export_packages(&root, &p.settings.cache_dir, &p.python) {
                    Ok(dir) => {
                        envs.push((onnx::ENV_PYTHON, p.python.clone()));
                        envs.push((onnx::ENV_PYTHONPATH, dir));
                    }
                    Err(Error(why)) => util::warn(&format!(
                        "the ONNX export packages are not installed, so an ONNX export will \
                         fail: {why}"
                    )),
                }
            }
            kiln::build_and_run(&root, &p.settings, args, &envs)
        }
    }
}

/// When [`provision`] prints what it found (an install prints its own progress regardless).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Report {
    Always,
    /// Only what is new: a libtorch not from kiln's cache, an onnxruntime installed or relinked.
    WhenChanged,
    Never,
}

/// What every command but `help` starts from.
#[derive(Debug)]
struct Provisioned {
    settings: libtorch::Settings,
    libtorch: libtorch::Libtorch,
    /// The Python with libtorch's torch.
    python: PathBuf,
}

/// Finds or installs libtorch (an error stops the command), then onnxruntime (a failure is a
/// warning: only `.onnx` models need it).
fn provision(root: &std::path::Path, report: Report) -> Result<Provisioned> {
    let settings = libtorch::Settings::from_env(root)?;
    let found = libtorch::setup(&settings)?;
    let quiet = matches!(
        found.source,
        libtorch::Source::Cache {
            installed_now: false,
            ..
        }
    );
    if report == Report::Always || (report == Report::WhenChanged && !quiet) {
        libtorch::report(&found, &settings.link);
    }
    let python = kiln::python_of(&found, &settings);
    if let Some(ort) = onnx::setup(&settings, &python)?
        && (report == Report::Always || (report == Report::WhenChanged && ort.changed))
    {
        onnx::report(&ort);
    }
    Ok(Provisioned {
        settings,
        libtorch: found,
        python,
    })
}
