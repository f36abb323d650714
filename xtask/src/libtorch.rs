//! libtorch provisioning (`cargo xtask setup`): finds or installs libtorch 2.11 and links it
//! at `.kiln/libtorch` so that plain `cargo` commands in the checkout find it.
//!
//! Resolution order, first hit wins:
//! 1. `LIBTORCH` set by the user: used as is, after checking it is a libtorch 2.11.x;
//! 2. a Python (`KILN_PYTHON`, else `python3`) whose `torch` package is 2.11.x: its `torch/`
//!    directory is a complete libtorch;
//! 3. kiln's own venv in the cache directory (`KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`,
//!    else `~/.cache/kiln`), created with `pip install torch==2.11.0` on first use.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, Error, Result, bail, human_bytes, info};

/// The libtorch version tch 0.24.0 binds.
pub const TORCH_VERSION: &str = "2.11.0";
/// Python versions PyPI has torch 2.11.0 wheels for (checked against PyPI).
const PYTHON_MIN: (u32, u32) = (3, 10);
const PYTHON_MAX: (u32, u32) = (3, 14);
/// Measured for the Linux x86_64 wheel set (torch + its NVIDIA CUDA 13 runtime wheels).
const LINUX_X86_DOWNLOAD_BYTES: u64 = 2_700_000_000;
const LINUX_X86_INSTALLED_BYTES: u64 = 4_600_000_000;
/// Refuse to start an install with less free space than this in the cache directory.
const MIN_FREE_BYTES: u64 = 6_000_000_000;
/// Name of the file that marks a finished venv install: the torch directory, then the
/// requirements it was installed with (a venv made with other requirements is topped up).
const READY_MARKER: &str = "kiln-ready";

/// What setup installs into its venv. On Linux the torch wheel is a CUDA 13 build whose CUDA
/// headers lack `crt/` and CCCL; `cuda-toolkit[crt,cccl]` (the version torch pins, 3 MB) adds them,
/// so the native extension's CUDA part compiles on machines without a GPU or CUDA toolkit.
pub fn requirements() -> Vec<String> {
    // safetensors: so that checkpoint weights can be read from this Python (and are, in tests).
    let mut reqs = vec![
        format!("torch=={TORCH_VERSION}"),
        "safetensors==0.7.0".to_owned(),
    ];
    if cfg!(target_os = "linux") {
        reqs.push("cuda-toolkit[crt,cccl]==13.0.2".to_owned());
    }
    reqs
}

/// Where the libtorch in use came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The user's `LIBTORCH` environment variable.
    EnvVar,
    /// The `torch` package of an existing Python interpreter.
    Python(PathBuf),
    /// kiln's own venv in the cache directory.
    Cache { venv: PathBuf, installed_now: bool },
}

/// A usable libtorch 2.11 installation.
#[derive(Debug, Clone)]
pub struct Libtorch {
    /// The libtorch root: holds `include/` and `lib/`.
    pub dir: PathBuf,
    /// Its full version string, such as `2.11.0+cu130`.
    pub version: String,
    pub source: Source,
}

impl Libtorch {
    pub fn lib_dir(&self) -> PathBuf {
        self.dir.join("lib")
    }

    /// Whether this libtorch was built with CUDA (has `libtorch_cuda`).
    pub fn has_cuda(&self) -> bool {
        self.lib_dir().join("libtorch_cuda.so").exists()
    }
}

/// Everything setup reads from the environment, gathered once so the logic is testable.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `LIBTORCH` as the user set it (`None` when unset, or when it is only our own link,
    /// which `.cargo/config.toml` puts into every cargo-run process).
    pub libtorch_env: Option<PathBuf>,
    /// The interpreter to probe and to create the venv with.
    pub python: OsString,
    /// The cache directory holding kiln's venv.
    pub cache_dir: PathBuf,
    /// The link that `.cargo/config.toml` points `LIBTORCH` at.
    pub link: PathBuf,
}

impl Settings {
    pub fn from_env(root: &Path) -> Result<Settings> {
        let link = std::env::var_os("KILN_LIBTORCH_LINK")
            .map(PathBuf::from)
            .unwrap_or_else(|| default_link(root));
        let libtorch_env = std::env::var_os("LIBTORCH")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| *p != default_link(root) && *p != link);
        let python = std::env::var_os("KILN_PYTHON")
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "python3".into());
        Ok(Settings {
            libtorch_env,
            python,
            cache_dir: cache_dir()?,
            link,
        })
    }

    fn venv(&self) -> PathBuf {
        self.cache_dir.join(format!("torch-{TORCH_VERSION}"))
    }
}

/// The link inside the checkout that `.cargo/config.toml` points `LIBTORCH` at.
pub fn default_link(root: &Path) -> PathBuf {
    root.join(".kiln").join("libtorch")
}

/// kiln's cache directory: `KILN_CACHE_DIR`, `$XDG_CACHE_HOME/kiln` or `~/.cache/kiln`.
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("KILN_CACHE_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir).join("kiln"));
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("kiln")),
        None => bail!(
            "cannot choose a cache directory for libtorch: neither KILN_CACHE_DIR, \
             XDG_CACHE_HOME nor HOME is set. Set KILN_CACHE_DIR to a directory with 6 GB free."
        ),
    }
}

/// Finds or installs libtorch 2.11, then points the checkout's link at it.
pub fn setup(settings: &Settings) -> Result<Libtorch> {
    let libtorch = resolve(settings)?;
    update_link(&settings.link, &libtorch.dir)?;
    Ok(libtorch)
}

/// Prints a one-paragraph summary of what setup found or did.
pub fn report(libtorch: &Libtorch, link: &Path) {
    let origin = match &libtorch.source {
        Source::EnvVar => "from LIBTORCH".to_owned(),
        Source::Python(py) => format!("from the torch package of {}", py.display()),
        Source::Cache {
            venv,
            installed_now: true,
        } => format!("installed now into {}", venv.display()),
        Source::Cache {
            venv,
            installed_now: false,
        } => format!("already provisioned in {} (nothing to do)", venv.display()),
    };
    info(&format!(
        "libtorch {} {origin}\n       libtorch: {}\n       linked at: {}\n       CUDA build: {}",
        libtorch.version,
        libtorch.dir.display(),
        link.display(),
        if libtorch.has_cuda() { "yes" } else { "no" }
    ));
}

fn resolve(settings: &Settings) -> Result<Libtorch> {
    if let Some(dir) = &settings.libtorch_env {
        return check_dir(dir, Source::EnvVar).map_err(|e| {
            Error(format!(
                "LIBTORCH={} cannot be used: {e}\n\
                 kiln needs libtorch {TORCH_VERSION} (tch 0.24). Unset LIBTORCH to let \
                 `cargo xtask setup` install it, or point LIBTORCH at a libtorch {TORCH_VERSION}.",
                dir.display()
            ))
        });
    }

    let probe = probe_python(&settings.python);
    if let Ok(PythonProbe {
        executable,
        torch_dir: Some(torch_dir),
        ..
    }) = &probe
    {
        match check_dir(torch_dir, Source::Python(executable.clone())) {
            Ok(found) => return Ok(found),
            Err(why) => info(&format!(
                "not using the torch of {}: {why}; using kiln's own copy instead",
                executable.display()
            )),
        }
    }
    provision_venv(settings, probe)
}

/// Checks that `dir` is a libtorch root of the right version.
fn check_dir(dir: &Path, source: Source) -> Result<Libtorch> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let lib = dir.join("lib");
    let has_lib = ["libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"]
        .iter()
        .any(|name| lib.join(name).exists());
    if !has_lib {
        bail!(
            "{} has no lib/libtorch_cpu library, so it is not a libtorch",
            dir.display()
        );
    }
    if !dir.join("include").join("torch").is_dir() {
        bail!(
            "{} has no include/torch headers (a runtime-only install cannot build kiln)",
            dir.display()
        );
    }
    let Some(version) = version_of(dir) else {
        bail!(
            "cannot tell the version of the libtorch at {} (no build-version or version.py)",
            dir.display()
        );
    };
    if !version_matches(&version) {
        bail!(
            "{} is libtorch {version}, but kiln needs {TORCH_VERSION}",
            dir.display()
        );
    }
    Ok(Libtorch {
        dir: dir.to_path_buf(),
        version,
        source,
    })
}

/// Reads the version of a libtorch root: `build-version` (libtorch zips) or `version.py`
/// (the `torch/` directory of a Python wheel).
pub fn version_of(dir: &Path) -> Option<String> {
    if let Ok(text) = fs::read_to_string(dir.join("build-version")) {
        let v = text.trim();
        if !v.is_empty() {
            return Some(v.to_owned());
        }
    }
    let text = fs::read_to_string(dir.join("version.py")).ok()?;
    parse_version_py(&text)
}

/// Extracts `__version__` from torch's `version.py`.
pub fn parse_version_py(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("__version__")?;
        let (_, value) = rest.split_once('=')?;
        let value = value.trim().trim_matches(|c| c == '\'' || c == '"');
        (!value.is_empty()).then(|| value.to_owned())
    })
}

/// True when a version string such as `2.11.0+cu130` is the libtorch tch binds.
pub fn version_matches(version: &str) -> bool {
    version.split('+').next().map(str::trim) == Some(TORCH_VERSION)
}

/// What a Python interpreter told us about itself.
#[derive(Debug, Clone)]
struct PythonProbe {
    executable: PathBuf,
    version: (u32, u32),
    torch_dir: Option<PathBuf>,
}

/// Asks a Python for its version and where its `torch` package is, without importing torch.
const PROBE_SCRIPT: &str = "\
import os, sys, importlib.util
print('KILN_PY', sys.version_info[0], sys.version_info[1])
print('KILN_EXE', sys.executable)
spec = importlib.util.find_spec('torch')
if spec is not None and spec.origin:
    print('KILN_TORCH', os.path.dirname(spec.origin))
";

fn probe_python(python: &OsString) -> Result<PythonProbe> {
    let out = Command::new(python)
        .arg("-c")
        .arg(PROBE_SCRIPT)
        .output()
        .map_err(|e| {
            Error(format!(
                "`{}` could not be run ({e})",
                python.to_string_lossy()
            ))
        })?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            python.to_string_lossy(),
            util::describe_status(out.status),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    parse_probe(&String::from_utf8_lossy(&out.stdout)).ok_or_else(|| {
        Error(format!(
            "`{}` did not answer like a Python 3 interpreter",
            python.to_string_lossy()
        ))
    })
}

fn parse_probe(stdout: &str) -> Option<PythonProbe> {
    let mut version = None;
    let mut executable = None;
    let mut torch_dir = None;
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("KILN_PY ") {
            let mut parts = rest.split_whitespace().map(str::parse::<u32>);
            version = Some((parts.next()?.ok()?, parts.next()?.ok()?));
        } else if let Some(rest) = line.strip_prefix("KILN_EXE ") {
            executable = Some(PathBuf::from(rest.trim()));
        } else if let Some(rest) = line.strip_prefix("KILN_TORCH ") {
            torch_dir = Some(PathBuf::from(rest.trim()));
        }
    }
    Some(PythonProbe {
        executable: executable?,
        version: version?,
        torch_dir,
    })
}

/// Returns kiln's venv libtorch, installing it first when it is not there yet.
fn provision_venv(settings: &Settings, probe: Result<PythonProbe>) -> Result<Libtorch> {
    let venv = settings.venv();
    if let Some(found) = ready_venv(&venv) {
        return Ok(found);
    }

    let python = match probe {
        Ok(py) => py,
        Err(why) => bail!(
            "kiln needs libtorch {TORCH_VERSION} and found none: LIBTORCH is not set, and {why}.\n\
             Fix one of:\n  \
             - install Python {}.{}–{}.{} with pip (setup then installs torch into {}), or set \
             KILN_PYTHON to such an interpreter;\n  \
             - set LIBTORCH to an unpacked libtorch {TORCH_VERSION}.",
            PYTHON_MIN.0,
            PYTHON_MIN.1,
            PYTHON_MAX.0,
            PYTHON_MAX.1,
            venv.display()
        ),
    };
    if python.version < PYTHON_MIN || python.version > PYTHON_MAX {
        bail!(
            "{} is Python {}.{}, but torch {TORCH_VERSION} has wheels for Python {}.{}–{}.{} \
             only.\nSet KILN_PYTHON to a supported interpreter (e.g. KILN_PYTHON=python3.12), \
             or set LIBTORCH to an unpacked libtorch {TORCH_VERSION}.",
            python.executable.display(),
            python.version.0,
            python.version.1,
            PYTHON_MIN.0,
            PYTHON_MIN.1,
            PYTHON_MAX.0,
            PYTHON_MAX.1,
        );
    }

    fs::create_dir_all(&settings.cache_dir).map_err(|e| {
        Error(format!(
            "cannot create the cache directory {}: {e}. Set KILN_CACHE_DIR to a writable \
             directory.",
            settings.cache_dir.display()
        ))
    })?;
    // One installer at a time; a second `cargo xtask` waits here, then finds the venv ready.
    let lock_path = settings
        .cache_dir
        .join(format!("torch-{TORCH_VERSION}.lock"));
    let lock = fs::File::create(&lock_path)
        .map_err(|e| Error(format!("cannot create {}: {e}", lock_path.display())))?;
    if lock.try_lock().is_err() {
        info("another kiln setup is installing torch; waiting for it to finish");
        lock.lock()
            .map_err(|e| Error(format!("cannot lock {}: {e}", lock_path.display())))?;
    }
    if let Some(found) = ready_venv(&venv) {
        return Ok(found);
    }

    if venv_python(&venv).exists() {
        info(&format!(
            "completing the unfinished or older install in {} (pip fetches only what is missing)",
            venv.display()
        ));
    } else {
        check_free_space(&settings.cache_dir)?;
        announce_download(&venv);
        create_venv(&python.executable, &venv)?;
    }
    pip_install_torch(&venv)?;

    let venv_python = venv_python(&venv);
    let installed = probe_python(&venv_python.clone().into_os_string())?;
    let torch_dir = installed.torch_dir.ok_or_else(|| {
        Error(format!(
            "pip reported success, but {} cannot find the torch package; remove {} and run \
             `cargo xtask setup` again",
            venv_python.display(),
            venv.display()
        ))
    })?;
    let found = check_dir(
        &torch_dir,
        Source::Cache {
            venv: venv.clone(),
            installed_now: true,
        },
    )?;
    let marker = format!("{}\n{}\n", found.dir.display(), requirements().join(" "));
    crate::util::write_atomically(&venv.join(READY_MARKER), marker.as_bytes())?;
    Ok(found)
}

/// A finished venv install, if there is one.
fn ready_venv(venv: &Path) -> Option<Libtorch> {
    let marker = fs::read_to_string(venv.join(READY_MARKER)).ok()?;
    let mut lines = marker.lines();
    let torch_dir = lines.next()?;
    if lines.next() != Some(requirements().join(" ").as_str()) {
        return None;
    }
    check_dir(
        Path::new(torch_dir.trim()),
        Source::Cache {
            venv: venv.to_path_buf(),
            installed_now: false,
        },
    )
    .ok()
}

fn venv_python(venv: &Path) -> PathBuf {
    if cfg!(windows) {
        venv.join("Scripts").join("python.exe")
    } else {
        venv.join("bin").join("python")
    }
}

fn check_free_space(cache_dir: &Path) -> Result<()> {
    if let Some(free) = util::free_bytes(cache_dir)
        && free < MIN_FREE_BYTES
    {
        bail!(
            "not enough disk space to install torch {TORCH_VERSION}: {} is free at {}, \
             about {} is needed.\nFree some space, or set KILN_CACHE_DIR to a disk with room \
             (or LIBTORCH to an existing libtorch {TORCH_VERSION}).",
            human_bytes(free),
            cache_dir.display(),
            human_bytes(MIN_FREE_BYTES)
        );
    }
    Ok(())
}

fn announce_download(venv: &Path) {
    let size = if cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        format!(
            "about {} to download (the torch wheel and its NVIDIA CUDA 13 runtime wheels), \
             {} on disk",
            human_bytes(LINUX_X86_DOWNLOAD_BYTES),
            human_bytes(LINUX_X86_INSTALLED_BYTES)
        )
    } else {
        "the torch wheel for this platform".to_owned()
    };
    info(&format!(
        "no libtorch {TORCH_VERSION} found; installing torch=={TORCH_VERSION} from PyPI into \
         {}\n       {size}. This happens once; later runs reuse it.",
        venv.display()
    ));
}

fn create_venv(python: &Path, venv: &Path) -> Result<()> {
    let out = Command::new(python)
        .args(["-m", "venv"])
        .arg(venv)
        .output()
        .map_err(|e| Error(format!("cannot run {}: {e}", python.display())))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let hint = if stderr.contains("ensurepip") || stdout.contains("ensurepip") {
            "\nThis Python lacks the venv/ensurepip module; on Debian or Ubuntu install it with \
             `apt-get install python3-venv`."
        } else {
            ""
        };
        // Leave nothing half-made behind that would look like a venv next time.
        let _ = fs::remove_dir_all(venv);
        bail!(
            "`{} -m venv {}` failed ({}):\n{}{}{hint}",
            python.display(),
            venv.display(),
            util::describe_status(out.status),
            stdout.trim(),
            stderr.trim()
        );
    }
    Ok(())
}

fn pip_install_torch(venv: &Path) -> Result<()> {
    let log = venv.join("kiln-pip.log");
    let _ = fs::remove_file(&log);
    let python = venv_python(venv);
    let mut cmd = Command::new(&python);
    cmd.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--log",
    ])
    .arg(&log)
    .args(requirements());
    let status = util::status_of(&mut cmd)?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read_to_string(&log).unwrap_or_default();
    bail!(
        "installing torch {TORCH_VERSION} with pip failed ({}).\n{}\nFull pip log: {}",
        util::describe_status(status),
        diagnose_pip_failure(&text, venv),
        log.display()
    )
}

/// Turns a pip log into the one thing the user should do about it.
pub fn diagnose_pip_failure(log: &str, venv: &Path) -> String {
    if crate::util::pip_disk_full(log) {
        return format!(
            "The disk is full. Free some space (the install needs about {}), or set \
             KILN_CACHE_DIR to a disk with room, then run `cargo xtask setup` again; it resumes \
             in {}.",
            human_bytes(LINUX_X86_INSTALLED_BYTES),
            venv.display()
        );
    }
    if crate::util::pip_offline(log) {
        return "PyPI could not be reached (a network error). Check the connection or proxy \
                (pip honours HTTPS_PROXY and PIP_INDEX_URL), or set LIBTORCH to an unpacked \
                libtorch 2.11.0 to skip the download."
            .to_owned();
    }
    if log.contains("No matching distribution found for torch") {
        return format!(
            "PyPI has no torch {TORCH_VERSION} wheel for this Python or platform. Use Python \
             {}.{}–{}.{} on Linux x86_64/aarch64, macOS arm64 or Windows x86_64 (set \
             KILN_PYTHON), or set LIBTORCH.",
            PYTHON_MIN.0, PYTHON_MIN.1, PYTHON_MAX.0, PYTHON_MAX.1
        );
    }
    let tail: Vec<&str> = log.lines().rev().take(12).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    format!("The end of pip's log:\n{}", tail.join("\n"))
}

/// Points `link` at `target`, replacing an older link; a real directory there is an error.
fn update_link(link: &Path, target: &Path) -> Result<()> {
    if let Ok(current) = fs::read_link(link) {
        if current == target {
            return Ok(());
        }
        info(&format!(
            "relinking {} from {} to {}; cargo rebuilds torch-sys against it",
            link.display(),
            current.display(),
            target.display()
        ));
        fs::remove_file(link)
            .map_err(|e| Error(format!("cannot replace the link {}: {e}", link.display())))?;
    } else if link.symlink_metadata().is_ok() {
        bail!(
            "{} exists and is not a link; kiln keeps a link to libtorch there. Move it away \
             and run `cargo xtask setup` again.",
            link.display()
        );
    }
    if let Some(parent) = link.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| Error(format!("cannot create {}: {e}", parent.display())))?;
    }
    symlink_dir(target, link)
        .map_err(|e| Error(format!("cannot create the link {}: {e}", link.display())))
}

#[cfg(unix)]
fn symlink_dir(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(windows)]
fn symlink_dir(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::windows::fs::symlink_dir(target, link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_py_of_a_wheel_is_parsed() {
        let text = "from typing import Optional\n\n__all__ = ['__version__']\n\
                    __version__ = '2.11.0+cu130'\ndebug = False\n";
        assert_eq!(parse_version_py(text).as_deref(), Some("2.11.0+cu130"));
        let typed = "__version__: str = \"2.5.1\"\n";
        assert_eq!(parse_version_py(typed).as_deref(), Some("2.5.1"));
        assert_eq!(parse_version_py("debug = False\n"), None);
    }

    #[test]
    fn only_2_11_0_matches() {
        assert!(version_matches("2.11.0"));
        assert!(version_matches("2.11.0+cu130"));
        assert!(version_matches("2.11.0+cpu\n"));
        assert!(!version_matches("2.11.1"));
        assert!(!version_matches("2.5.1+cu121"));
        assert!(!version_matches("12.11.0"));
    }

    #[test]
    fn python_probe_output_is_parsed() {
        let out = "KILN_PY 3 11\nKILN_EXE /usr/bin/python3\nKILN_TORCH /x/site-packages/torch\n";
        let probe = parse_probe(out).unwrap();
        assert_eq!(probe.version, (3, 11));
        assert_eq!(probe.executable, PathBuf::from("/usr/bin/python3"));
        assert_eq!(
            probe.torch_dir,
            Some(PathBuf::from("/x/site-packages/torch"))
        );
        let no_torch = parse_probe("KILN_PY 3 12\nKILN_EXE /p\n").unwrap();
        assert_eq!(no_torch.torch_dir, None);
        assert!(parse_probe("Python 2.7\n").is_none());
    }

    #[test]
    fn pip_failures_are_diagnosed() {
        let venv = Path::new("/cache/torch-2.11.0");
        let disk = "ERROR: Could not install packages due to an OSError: [Errno 28] No space \
                    left on device";
        assert!(diagnose_pip_failure(disk, venv).contains("disk is full"));
        let net = "WARNING: Retrying ... NewConnectionError('<pip._vendor.urllib3.connection.\
                   HTTPSConnection>: Failed to establish a new connection: [Errno -3] Temporary \
                   failure in name resolution')\nERROR: No matching distribution found for \
                   torch==2.11.0";
        assert!(diagnose_pip_failure(net, venv).contains("PyPI could not be reached"));
        let wheel = "ERROR: Could not find a version that satisfies the requirement \
                     torch==2.11.0 (from versions: 2.15.0)\nERROR: No matching distribution \
                     found for torch==2.11.0";
        assert!(diagnose_pip_failure(wheel, venv).contains("no torch 2.11.0 wheel"));
        let other = "line one\nsomething odd happened";
        assert!(diagnose_pip_failure(other, venv).contains("something odd happened"));
    }
}
