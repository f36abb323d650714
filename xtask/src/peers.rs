//! The pinned Python packages that only some benchmark suites' peers need (PyTorch Lightning for
//! `job`, LitServe for `serve`), installed by `cargo xtask bench` on first use and never by
//! `cargo xtask test`.
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
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::util::{self, Error, Result, bail};

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
    matches!(suite, "job" | "serve")
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
                "the benchmark peers (Lightning, LitServe) are not available, so their rows \
                 will say \"not run\": {why}"
            ));
            Peers::Unavailable(why)
        }
    }
}

fn install(root: &Path, cache_dir: &Path, python: &Path) -> Result<PathBuf> {
    let requirements = root.join(REQUIREMENTS);
    let pins = fs::read_to_string(&requirements)
        .map_err(|e| Error(format!("cannot read {}: {e}", requirements.display())))?;
    let key = format!("{}\n{}\n{pins}", python.display(), python_version(python)?);
    let name = format!("{:016x}", fnv1a(key.as_bytes()));
    let base = cache_dir.join("bench-peers");
    let dir = base.join(&name);
    if is_ready(&dir, &key) {
        return Ok(dir);
    }
    fs::create_dir_all(&base)
        .map_err(|e| Error(format!("cannot create {}: {e}", base.display())))?;
    // One installer at a time; a second bench waits here, then finds the install done.
    let lock_path = base.join(format!("{name}.lock"));
    let lock = fs::File::create(&lock_path)
        .map_err(|e| Error(format!("cannot create {}: {e}", lock_path.display())))?;
    lock.lock()
        .map_err(|e| Error(format!("cannot lock {}: {e}", lock_path.display())))?;
    if is_ready(&dir, &key) {
        return Ok(dir);
    }
    let partial = base.join(format!("{name}.partial"));
    let log = base.join(format!("{name}.log"));
    for old in [&partial, &dir] {
        if old.exists() {
            fs::remove_dir_all(old)
                .map_err(|e| Error(format!("cannot remove {}: {e}", old.display())))?;
        }
    }
    util::step(&format!(
        "installing the benchmarks' pinned Python peers ({}) into {} (once; log: {})",
        headline(&pins),
        dir.display(),
        log.display()
    ));
    let started = Instant::now();
    pip_install(python, &requirements, &partial, &log)?;
    verify(python, &partial, &log)?;
    fs::rename(&partial, &dir).map_err(|e| {
        Error(format!(
            "cannot rename {} to {}: {e}",
            partial.display(),
            dir.display()
        ))
    })?;
    fs::write(dir.join(READY_MARKER), &key)
        .map_err(|e| Error(format!("cannot write {}: {e}", dir.display())))?;
    util::info(&format!(
        "benchmark peers installed in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(dir)
}

fn is_ready(dir: &Path, key: &str) -> bool {
    fs::read_to_string(dir.join(READY_MARKER)).is_ok_and(|k| k == key)
}

/// The Python's `sys.version` (wheels differ between Python versions).
fn python_version(python: &Path) -> Result<String> {
    let out = Command::new(python)
        .args(["-c", "import sys; print(sys.version)"])
        .output()
        .map_err(|e| Error(format!("cannot run {}: {e}", python.display())))?;
    if !out.status.success() {
        bail!(
            "{} -c 'import sys' failed ({})",
            python.display(),
            util::describe_status(out.status)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The pins that name the peers themselves, for the banner ("lightning 2.6.6, litserve 0.2.19").
fn headline(pins: &str) -> String {
    pins.lines()
        .filter_map(|l| l.trim().split_once("=="))
        .filter(|(name, _)| matches!(*name, "lightning" | "litserve"))
        .map(|(name, version)| format!("{name} {version}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn log_file(log: &Path) -> Result<fs::File> {
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| Error(format!("cannot open {}: {e}", log.display())))
}

/// Runs `cmd` with its output appended to `log`; on failure, an error quoting pip's last
/// `ERROR:` line (which names the package) and pointing at the log.
fn logged(mut cmd: Command, log: &Path, what: &str) -> Result<()> {
    let out = log_file(log)?;
    let err = out
        .try_clone()
        .map_err(|e| Error(format!("{}: {e}", log.display())))?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| Error(format!("cannot run {what}: {e}")))?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read_to_string(log).unwrap_or_default();
    bail!(
        "{what} failed ({}): {} (full log: {})",
        util::describe_status(status),
        last_error(&text).unwrap_or("no ERROR line; see the log"),
        log.display()
    )
}

fn pip_install(python: &Path, requirements: &Path, target: &Path, log: &Path) -> Result<()> {
    let mut pip = Command::new(python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--only-binary",
        ":all:",
    ])
    .args([
        "--disable-pip-version-check",
        "--no-input",
        "--retries",
        "2",
    ])
    .arg("--target")
    .arg(target)
    .arg("--requirement")
    .arg(requirements);
    logged(pip, log, "pip install of the pinned peers")
}

/// Imports the peers with the new directory first on the path, and checks that torch is still
/// the provisioned 2.11.0 from outside it.
fn verify(python: &Path, target: &Path, log: &Path) -> Result<()> {
    let check = "import torch, lightning, litserve\n\
                 assert torch.__version__.startswith('2.11.0'), torch.__version__\n\
                 assert not torch.__file__.startswith(TARGET), torch.__file__\n\
                 print('torch', torch.__version__, torch.__file__)\n\
                 print('lightning', lightning.__version__, 'litserve', litserve.__version__)";
    let mut cmd = Command::new(python);
    cmd.env("PYTHONPATH", target).args([
        "-c",
        &check.replace("TARGET", &format!("{:?}", target.display().to_string())),
    ]);
    logged(cmd, log, "importing the installed peers")
}

/// The last line of pip's output that starts with `ERROR:`.
fn last_error(log: &str) -> Option<&str> {
    log.lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with("ERROR:") || l.starts_with("AssertionError"))
}

/// 64-bit FNV-1a (xtask has no dependencies; this only names a cache directory).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_job_and_serve_need_the_peers() {
        assert!(needed_by("job") && needed_by("serve"));
        assert!(!needed_by("train") && !needed_by("quality") && !needed_by("infer"));
    }

    #[test]
    fn fnv1a_is_the_reference_hash() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn pip_errors_and_headline_are_found() {
        let log = "Collecting lightning==2.6.6\n  WARNING: Retrying\n\
                   ERROR: Could not find a version that satisfies the requirement \
                   lightning==2.6.6 (from versions: none)\n\
                   ERROR: No matching distribution found for lightning==2.6.6\n";
        assert_eq!(
            last_error(log),
            Some("ERROR: No matching distribution found for lightning==2.6.6")
        );
        assert_eq!(last_error("all fine\n"), None);
        let pins = "# comment\nlightning==2.6.6\nnumpy==2.4.6\n\nlitserve==0.2.19\n";
        assert_eq!(headline(pins), "lightning 2.6.6, litserve 0.2.19");
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
            2,
            "lightning and litserve are pinned"
        );
    }
}
