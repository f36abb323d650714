//! The pinned Python packages that only some benchmark suites' peers need (PyTorch Lightning for
//! `job`, LitServe for `serve`, pytorch-forecasting for `data`'s windows row), installed on
//! first use by `cargo xtask bench`, and by `cargo xtask test` for its Python step (the windowed
//! dataset is compared with pytorch-forecasting's).
//!
//! `benches/python/peers-requirements.txt` pins the whole closure; pip installs it with
//! `--no-deps --only-binary :all: --target <cache>/bench-peers/<hash>/`, so it resolves nothing
//! and never installs or changes torch (torch and its own dependencies stay the provisioned
//! venv's). `<hash>` covers the pinned list and the Python, so a changed pin or another Python
//! installs afresh; a marker file makes a finished install a no-op. The suites are told through
//! the environment: `KILN_BENCH_PEERS=<dir>` (they put it first on the peers' `PYTHONPATH`), or
//! `KILN_BENCH_PEERS_ERROR=<why>` when the install failed (offline, say): their peer rows then say
//! "not run" with that reason and the rest of the bench goes on.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, Error, PinnedInstall, Result};

/// The variable naming the installed directory.
pub const ENV_DIR: &str = "KILN_BENCH_PEERS";
/// The variable carrying why the peers could not be installed.
pub const ENV_ERROR: &str = "KILN_BENCH_PEERS_ERROR";
/// The pinned list, relative to the repository root.
const REQUIREMENTS: &str = "benches/python/peers-requirements.txt";
/// Written last into a finished install: the key it was installed for.
const READY_MARKER: &str = ".kiln-peers-ready";

/// Whether a suite has peers that need these packages.
pub fn needed_by(suite: &str) -> bool {
    matches!(suite, "job" | "serve" | "data" | "infer" | "quality")
}

/// What the suites are told.
#[derive(Debug)]
pub enum Peers {
    /// Installed in this directory.
    Ready(PathBuf),
    /// Not available, and why.
    Unavailable(String),
}

impl Peers {
    /// Passes the outcome to a suite's process.
    pub fn apply(&self, cmd: &mut Command) {
        match self {
            Peers::Ready(dir) => cmd.env(ENV_DIR, dir).env_remove(ENV_ERROR),
            Peers::Unavailable(why) => cmd.env(ENV_ERROR, why).env_remove(ENV_DIR),
        };
    }
}

/// Installs the pinned peers for `python` unless already done; a failure is reported and
/// returned as [`Peers::Unavailable`] rather than stopping the bench.
pub fn ensure(root: &Path, cache_dir: &Path, python: &Path) -> Peers {
    match install(root, cache_dir, python) {
        Ok(dir) => Peers::Ready(dir),
        Err(Error(why)) => {
            util::info(&format!(
                "the benchmark peers (Lightning, LitServe, pytorch-forecasting, MONAI) are not \
                 available, so their rows will say \"not run\" and the tests comparing windows \
                 with pytorch-forecasting and sliding windows with MONAI fail: {why}"
            ));
            Peers::Unavailable(why)
        }
    }
}

fn install(root: &Path, cache_dir: &Path, python: &Path) -> Result<PathBuf> {
    let requirements = root.join(REQUIREMENTS);
    let pins = fs::read_to_string(&requirements)
        .map_err(|e| Error(format!("cannot read {}: {e}", requirements.display())))?;
    let key = format!(
        "{}\n{}\n{pins}",
        python.display(),
        util::python_facts(python)?.version
    );
    let install = PinnedInstall {
        python,
        base: cache_dir.join("bench-peers"),
        name: format!("{:016x}", util::fnv1a(key.as_bytes())),
        key,
        marker: READY_MARKER,
        what: format!("the benchmarks' pinned Python peers ({})", headline(&pins)),
        packages: vec!["--requirement".into(), requirements.into()],
    };
    let installed = install.ensure(|target, log| verify(python, target, log))?;
    Ok(installed.dir)
}

/// The pins that name the peers themselves, for the banner ("lightning 2.6.6, litserve 0.2.19,
/// pytorch-forecasting 1.8.0, monai 1.6.1").
fn headline(pins: &str) -> String {
    pins.lines()
        .filter_map(|l| l.trim().split_once("=="))
        .filter(|(name, _)| {
            matches!(
                *name,
                "lightning" | "litserve" | "pytorch-forecasting" | "monai"
            )
        })
        .map(|(name, version)| format!("{name} {version}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Imports the peers with the new directory first on the path, and checks that torch is still
/// the provisioned 2.11.0 from outside it.
fn verify(python: &Path, target: &Path, log: &Path) -> Result<()> {
    let check = "import torch, lightning, litserve, pytorch_forecasting, monai\n\
                 from tensorboard.backend.event_processing import event_accumulator\n\
                 assert torch.__version__.startswith('2.11.0'), torch.__version__\n\
                 assert not torch.__file__.startswith(TARGET), torch.__file__\n\
                 print('torch', torch.__version__, torch.__file__)\n\
                 print('lightning', lightning.__version__, 'litserve', litserve.__version__)";
    let mut cmd = Command::new(python);
    cmd.env("PYTHONPATH", target).args([
        "-c",
        &check.replace("TARGET", &format!("{:?}", target.display().to_string())),
    ]);
    util::logged(cmd, log, "importing the installed peers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_job_serve_and_data_need_the_peers() {
        assert!(needed_by("job") && needed_by("serve") && needed_by("data"));
        assert!(needed_by("infer"), "the sliding-window rows run MONAI");
        assert!(needed_by("quality"), "its lr rows run Lightning's lr_find");
        assert!(!needed_by("train") && !needed_by("optimizer"));
    }

    #[test]
    fn the_headline_names_the_peers() {
        let pins = "# comment\nlightning==2.6.6\nnumpy==2.4.6\n\nlitserve==0.2.19\n\
                    pytorch-forecasting==1.8.0\nmonai==1.6.1\n";
        assert_eq!(
            headline(pins),
            "lightning 2.6.6, litserve 0.2.19, pytorch-forecasting 1.8.0, monai 1.6.1"
        );
    }

    #[test]
    fn the_pinned_list_pins_every_line_and_never_torch() {
        let pins = fs::read_to_string(util::repo_root().join(REQUIREMENTS)).unwrap();
        for line in pins.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, version) = line.split_once("==").unwrap();
            assert!(
                !version.is_empty() && !version.contains(['<', '>', '*', ',']),
                "{line}"
            );
            assert_ne!(name.to_lowercase(), "torch", "pip must never change torch");
        }
        assert_eq!(
            headline(&pins).split(", ").count(),
            4,
            "lightning, litserve, pytorch-forecasting and monai are pinned"
        );
    }
}
