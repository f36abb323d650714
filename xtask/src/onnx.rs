//! ONNX provisioning: the ONNX Runtime library that kiln loads at run time to serve `.onnx`
//! models (installed by `cargo xtask setup`), and the Python packages that `kiln export
//! --format onnx` needs besides torch (installed on first use).
//!
//! **onnxruntime.** PyPI's `onnxruntime` wheel (CPU) or `onnxruntime-gpu` wheel (a CUDA 13 build
//! that also runs on the CPU) of version [`ORT_VERSION`] is installed with the provisioned
//! Python's pip, `--no-deps --target <cache>/onnxruntime-<version>-<cpu|cuda>/`; the library is
//! its `onnxruntime/capi/libonnxruntime.so.<version>`. Setup picks the GPU wheel on Linux x86_64
//! with an NVIDIA driver and the CPU wheel elsewhere ([`wheel_for`]); `KILN_ONNXRUNTIME_BUILD`
//! overrides that. The checkout's `.kiln/onnxruntime` (beside `.kiln/libtorch`) links to the
//! `capi` directory, which `.cargo/config.toml` and [`crate::kiln::apply_env`] pass to kiln as
//! `KILN_ONNXRUNTIME`; `<cache>/onnxruntime.json` records the library for kiln binaries anywhere
//! on the machine. A failed install warns and does not fail setup: libtorch models still run.
//!
//! **Export packages.** `crates/infer/python/onnx-requirements.txt` pins onnx and its closure;
//! [`ensure_export_packages`] installs them like the bench peers (`--target
//! <cache>/onnx-export/<hash>/`) for `cargo xtask export`, the Python tests of `cargo xtask test`
//! and the `infer` and `serve` benchmarks, and records `<cache>/onnx-export.json` so that a bare
//! `kiln export` finds them. They are not installed by setup: about 157 MB that only exporting
//! needs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::libtorch::Settings;
use crate::util::{self, Error, PinnedInstall, Result, bail};

/// The onnxruntime version setup installs; kiln's `ort` binding (`api-31`) needs at least 1.31.
pub const ORT_VERSION: &str = "1.31.1";
/// Overrides the wheel choice: `cpu` or `cuda`.
pub const ENV_BUILD: &str = "KILN_ONNXRUNTIME_BUILD";
/// Tells kiln where the library is (a file, or a directory holding `libonnxruntime.so*`).
pub const ENV_LIBRARY: &str = "KILN_ONNXRUNTIME";
/// Tells kiln's exporter the directory holding the export packages.
pub const ENV_PYTHONPATH: &str = "KILN_ONNX_PYTHONPATH";
/// Tells kiln's exporter which Python to run.
pub const ENV_PYTHON: &str = "KILN_PYTHON";
/// Present when an NVIDIA kernel driver is loaded.
const NVIDIA_DRIVER: &str = "/proc/driver/nvidia/version";
/// The record of the installed library, in the cache directory.
pub const RECORD: &str = "onnxruntime.json";
/// The record of the installed export packages, in the cache directory.
pub const EXPORT_RECORD: &str = "onnx-export.json";
/// The pinned export packages, relative to the repository root.
const EXPORT_REQUIREMENTS: &str = "crates/infer/python/onnx-requirements.txt";
/// numpy 2.4 (pinned for export) has wheels for CPython 3.11 and newer only.
const EXPORT_PYTHON_MIN: (u32, u32) = (3, 11);
/// Written last into a finished install: the key it was installed for.
const ORT_MARKER: &str = ".kiln-onnxruntime-ready";
const EXPORT_MARKER: &str = ".kiln-onnx-export-ready";

/// Which onnxruntime wheel: both are the same version and expose the same C API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// `onnxruntime`: the CPU execution provider only (about 68 MB).
    Cpu,
    /// `onnxruntime-gpu`: a CUDA 13 build (about 255 MB; it reuses torch's NVIDIA libraries and
    /// also runs on the CPU).
    Cuda,
}

impl Build {
    pub fn name(self) -> &'static str {
        match self {
            Build::Cpu => "cpu",
            Build::Cuda => "cuda",
        }
    }

    /// The PyPI package.
    pub fn package(self) -> &'static str {
        match self {
            Build::Cpu => "onnxruntime",
            Build::Cuda => "onnxruntime-gpu",
        }
    }

    fn size(self) -> &'static str {
        match self {
            Build::Cpu => "about 68 MB",
            Build::Cuda => "about 255 MB, a CUDA 13 build",
        }
    }
}

/// Which wheel to install: `requested` (the value of `KILN_ONNXRUNTIME_BUILD`) when given, else
/// the GPU wheel on Linux x86_64 with an NVIDIA driver (the only platform PyPI has it for that
/// kiln claims), else the CPU wheel.
pub fn wheel_for(
    os: &str,
    arch: &str,
    has_nvidia_driver: bool,
    requested: Option<&str>,
) -> Result<Build> {
    match requested.map(str::trim) {
        Some("cpu") => Ok(Build::Cpu),
        Some("cuda") => Ok(Build::Cuda),
        Some(other) => bail!(
            "{ENV_BUILD}={other:?} is not an onnxruntime build; the valid values are `cpu` \
             and `cuda` (or leave {ENV_BUILD} unset: setup then installs `cuda` on Linux x86_64 \
             with an NVIDIA driver and `cpu` elsewhere)"
        ),
        None if os == "linux" && arch == "x86_64" && has_nvidia_driver => Ok(Build::Cuda),
        None => Ok(Build::Cpu),
    }
}

/// `KILN_ONNXRUNTIME_BUILD`, when set to something.
fn requested_build() -> Option<String> {
    std::env::var_os(ENV_BUILD)
        .filter(|v| !v.is_empty())
        .map(|v| v.to_string_lossy().into_owned())
}

/// The library's file name inside `onnxruntime/capi/` (only Linux is claimed; the macOS name is
/// what the wheel is documented to hold, not verified).
fn library_name() -> String {
    if cfg!(target_os = "macos") {
        format!("libonnxruntime.{ORT_VERSION}.dylib")
    } else {
        format!("libonnxruntime.so.{ORT_VERSION}")
    }
}

/// The directory of an install that holds the library.
fn capi_dir(install_dir: &Path) -> PathBuf {
    install_dir.join("onnxruntime").join("capi")
}

/// The checkout's link to the library's directory: beside the libtorch link (`.kiln/onnxruntime`
/// unless `KILN_LIBTORCH_LINK` moved that).
pub fn link(settings: &Settings) -> PathBuf {
    settings.link.with_file_name("onnxruntime")
}

/// `KILN_ONNXRUNTIME` as the user set it: `None` when unset or when it is only our own link,
/// which `.cargo/config.toml` puts into every cargo-run process.
pub fn user_library_env(settings: &Settings) -> Option<PathBuf> {
    let default = crate::libtorch::default_link(&util::repo_root()).with_file_name("onnxruntime");
    std::env::var_os(ENV_LIBRARY)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|p| *p != default && *p != link(settings))
}

/// What `<cache>/onnxruntime.json` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The absolute path of the library.
    pub library: PathBuf,
    pub version: String,
    pub build: Build,
}

impl Record {
    pub fn to_json(&self) -> Result<String> {
        Ok(util::json_object(&[
            ("library", util::utf8_path(&self.library)?),
            ("version", &self.version),
            ("build", self.build.name()),
        ]))
    }

    #[cfg(test)]
    fn parse(text: &str) -> Option<Record> {
        let pairs = util::parse_json_object(text)?;
        let get = |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        Some(Record {
            library: PathBuf::from(get("library")?),
            version: get("version")?.to_owned(),
            build: wheel_for("", "", false, Some(get("build")?)).ok()?,
        })
    }
}

/// A usable onnxruntime, as setup left it.
#[derive(Debug, Clone)]
pub struct Onnxruntime {
    pub build: Build,
    /// The library (absolute).
    pub library: PathBuf,
    /// The checkout's link to the library's directory.
    pub link: PathBuf,
    /// `<cache>/onnxruntime.json`.
    pub record: PathBuf,
    /// Whether this run installed it, relinked it or rewrote the record.
    pub changed: bool,
}

/// Installs onnxruntime unless it is there, links it and records it. Only a bad
/// `KILN_ONNXRUNTIME_BUILD` is an error; a failed install is a warning (libtorch models do not
/// need onnxruntime) and gives `None`.
pub fn setup(settings: &Settings, python: &Path) -> Result<Option<Onnxruntime>> {
    let build = wheel_for(
        std::env::consts::OS,
        std::env::consts::ARCH,
        Path::new(NVIDIA_DRIVER).exists(),
        requested_build().as_deref(),
    )?;
    match provision(&settings.cache_dir, &link(settings), python, build) {
        Ok(found) => Ok(Some(found)),
        Err(Error(why)) => {
            util::warn(&format!(
                "onnxruntime {ORT_VERSION} ({} build) is not installed, so ONNX models (.onnx) \
                 will not run (libtorch models are not affected): {why}\n       Fix that and \
                 run `cargo xtask setup` again, or set ORT_DYLIB_PATH to a libonnxruntime.so of \
                 version 1.31 or newer.",
                build.name()
            ));
            Ok(None)
        }
    }
}

/// One summary line (and where things are), like libtorch's.
pub fn report(ort: &Onnxruntime) {
    util::info(&format!(
        "onnxruntime {ORT_VERSION} ({} build) at {}{}\n       linked at: {}\n       \
         recorded in: {}",
        ort.build.name(),
        ort.library.display(),
        if ort.changed { "" } else { " (nothing to do)" },
        ort.link.display(),
        ort.record.display()
    ));
}

fn provision(cache_dir: &Path, link: &Path, python: &Path, build: Build) -> Result<Onnxruntime> {
    let cache_dir = std::path::absolute(cache_dir)
        .map_err(|e| Error(format!("cannot resolve {}: {e}", cache_dir.display())))?;
    let install = PinnedInstall {
        python,
        base: cache_dir.clone(),
        name: format!("onnxruntime-{ORT_VERSION}-{}", build.name()),
        key: format!("{}=={ORT_VERSION}\n", build.package()),
        marker: ORT_MARKER,
        what: format!(
            "onnxruntime {ORT_VERSION} ({} build: {}=={ORT_VERSION}, {})",
            build.name(),
            build.package(),
            build.size()
        ),
        packages: vec![format!("{}=={ORT_VERSION}", build.package()).into()],
    };
    let library = capi_dir(&install.dir()).join(library_name());
    if install.is_ready() && !library.is_file() {
        // Marked finished but damaged since: install it again.
        let _ = fs::remove_file(install.dir().join(ORT_MARKER));
    }
    let installed = install.ensure(|partial, _log| {
        let lib = capi_dir(partial).join(library_name());
        if lib.is_file() {
            Ok(())
        } else {
            bail!(
                "pip installed {}=={ORT_VERSION}, but it has no {}",
                build.package(),
                lib.display()
            )
        }
    })?;
    let relinked = update_link(link, &capi_dir(&installed.dir))?;
    let record_path = cache_dir.join(RECORD);
    let record = Record {
        library: library.clone(),
        version: ORT_VERSION.to_owned(),
        build,
    };
    let rewritten = util::write_if_changed(&record_path, &record.to_json()?)?;
    Ok(Onnxruntime {
        build,
        library,
        link: link.to_path_buf(),
        record: record_path,
        changed: installed.installed_now || relinked || rewritten,
    })
}

/// Points `link` at `target` unless it already does; a real file or directory there is an
/// error. Returns whether it changed the link.
fn update_link(link: &Path, target: &Path) -> Result<bool> {
    if let Ok(current) = fs::read_link(link) {
        if current == target {
            return Ok(false);
        }
        fs::remove_file(link)
            .map_err(|e| Error(format!("cannot replace the link {}: {e}", link.display())))?;
    } else if link.symlink_metadata().is_ok() {
        bail!(
            "{} exists and is not a link; kiln keeps a link to onnxruntime there. Move it \
             away and run `cargo xtask setup` again",
            link.display()
        );
    }
    if let Some(parent) = link.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| Error(format!("cannot create {}: {e}", parent.display())))?;
    }
    symlink_dir(target, link)
        .map_err(|e| Error(format!("cannot create the link {}: {e}", link.display())))?;
    Ok(true)
}

#[cfg(unix)]
fn symlink_dir(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(windows)]
fn symlink_dir(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::windows::fs::symlink_dir(target, link)
}

/// Installs the pinned export packages for `python` unless already done, records them in
/// `<cache>/onnx-export.json`, and returns their directory (for `KILN_ONNX_PYTHONPATH`).
pub fn ensure_export_packages(root: &Path, cache_dir: &Path, python: &Path) -> Result<PathBuf> {
    let cache_dir = std::path::absolute(cache_dir)
        .map_err(|e| Error(format!("cannot resolve {}: {e}", cache_dir.display())))?;
    let requirements = root.join(EXPORT_REQUIREMENTS);
    let pins = fs::read_to_string(&requirements)
        .map_err(|e| Error(format!("cannot read {}: {e}", requirements.display())))?;
    let facts = util::python_facts(python)?;
    if let Some(version) = facts.major_minor()
        && version < EXPORT_PYTHON_MIN
    {
        bail!(
            "{} is Python {}.{}, but the pinned ONNX export packages (numpy 2.4) need Python \
             {}.{} or newer. Set KILN_PYTHON to a Python 3.11–3.14 with torch 2.11, or remove \
             {} and run `KILN_PYTHON=python3.12 cargo xtask setup` to make kiln's torch venv \
             with a newer Python",
            python.display(),
            version.0,
            version.1,
            EXPORT_PYTHON_MIN.0,
            EXPORT_PYTHON_MIN.1,
            cache_dir
                .join(format!("torch-{}", crate::libtorch::TORCH_VERSION))
                .display()
        );
    }
    let key = format!("{}\n{}\n{pins}", python.display(), facts.version);
    let install = PinnedInstall {
        python,
        base: cache_dir.join("onnx-export"),
        name: format!("{:016x}", util::fnv1a(key.as_bytes())),
        key,
        marker: EXPORT_MARKER,
        what: format!(
            "the pinned ONNX export packages ({})",
            pinned_version(&pins, "onnx").map_or("onnx".to_owned(), |v| format!("onnx {v}"))
        ),
        packages: vec!["--requirement".into(), requirements.into()],
    };
    let installed = install.ensure(|target, log| verify_export(python, target, log))?;
    let record = export_record(&facts.executable, &installed.dir)?;
    util::write_if_changed(&cache_dir.join(EXPORT_RECORD), &record)?;
    Ok(installed.dir)
}

/// Tells a kiln process (or a test or bench that runs kiln's exporter) which Python to export
/// with and where its packages are.
pub fn apply_export_env(cmd: &mut Command, python: &Path, pythonpath: &Path) {
    cmd.env(ENV_PYTHON, python).env(ENV_PYTHONPATH, pythonpath);
}

/// `<cache>/onnx-export.json`: `{"python": …, "pythonpath": …}`, both absolute.
fn export_record(python: &Path, pythonpath: &Path) -> Result<String> {
    Ok(util::json_object(&[
        ("python", util::utf8_path(python)?),
        ("pythonpath", util::utf8_path(pythonpath)?),
    ]))
}

/// The version pinned for `package` in a requirements text.
fn pinned_version<'a>(pins: &'a str, package: &str) -> Option<&'a str> {
    pins.lines()
        .filter_map(|l| l.trim().split_once("=="))
        .find(|(name, _)| *name == package)
        .map(|(_, version)| version.trim())
}

/// Imports the packages with the new directory first on the path and checks that onnx comes
/// from it.
fn verify_export(python: &Path, target: &Path, log: &Path) -> Result<()> {
    let check = "import onnx, numpy, ml_dtypes, google.protobuf, onnxscript, onnx_ir\n\
                 assert onnx.__file__.startswith(TARGET), onnx.__file__\n\
                 print('onnx', onnx.__version__, 'numpy', numpy.__version__, \
                 'protobuf', google.protobuf.__version__, 'ml_dtypes', ml_dtypes.__version__, \
                 'onnxscript', onnxscript.__version__, 'onnx-ir', onnx_ir.__version__)";
    let mut cmd = Command::new(python);
    cmd.env("PYTHONPATH", target).args([
        "-c",
        &check.replace("TARGET", &format!("{:?}", target.display().to_string())),
    ]);
    util::logged(cmd, log, "importing the installed ONNX export packages")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_wheel_is_chosen_only_on_linux_x86_64_with_an_nvidia_driver() {
        let pick = |os, arch, driver| wheel_for(os, arch, driver, None).unwrap();
        assert_eq!(pick("linux", "x86_64", true), Build::Cuda);
        assert_eq!(pick("linux", "x86_64", false), Build::Cpu);
        assert_eq!(pick("linux", "aarch64", true), Build::Cpu);
        assert_eq!(pick("macos", "aarch64", false), Build::Cpu);
        assert_eq!(Build::Cuda.package(), "onnxruntime-gpu");
        assert_eq!(Build::Cpu.package(), "onnxruntime");
    }

    #[test]
    fn the_override_wins_and_a_bad_one_says_what_is_valid() {
        assert_eq!(
            wheel_for("linux", "x86_64", true, Some("cpu")).unwrap(),
            Build::Cpu
        );
        assert_eq!(
            wheel_for("linux", "x86_64", false, Some("cuda")).unwrap(),
            Build::Cuda
        );
        let err = wheel_for("linux", "x86_64", true, Some("gpu"))
            .unwrap_err()
            .0;
        assert!(
            err.contains("KILN_ONNXRUNTIME_BUILD=\"gpu\" is not an onnxruntime build"),
            "{err}"
        );
        assert!(err.contains("`cpu` and `cuda`"), "{err}");
    }

    #[test]
    fn the_record_is_json_that_reads_back() {
        let record = Record {
            library: PathBuf::from("/c/onnxruntime-1.31.1-cuda/onnxruntime/capi/lib.so"),
            version: ORT_VERSION.to_owned(),
            build: Build::Cuda,
        };
        let text = record.to_json().unwrap();
        assert_eq!(
            text,
            "{\n  \"library\": \"/c/onnxruntime-1.31.1-cuda/onnxruntime/capi/lib.so\",\n  \
             \"version\": \"1.31.1\",\n  \"build\": \"cuda\"\n}\n"
        );
        assert_eq!(Record::parse(&text), Some(record));
        assert_eq!(Record::parse("{\"library\": \"/x\"}"), None);

        let export = export_record(Path::new("/v/bin/python"), Path::new("/c/x")).unwrap();
        assert_eq!(
            util::parse_json_object(&export).unwrap(),
            [
                ("python".to_owned(), "/v/bin/python".to_owned()),
                ("pythonpath".to_owned(), "/c/x".to_owned())
            ]
        );
    }

    #[test]
    fn the_export_pins_pin_every_line_and_never_torch() {
        let pins = fs::read_to_string(util::repo_root().join(EXPORT_REQUIREMENTS)).unwrap();
        let mut names = vec![];
        for line in pins.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, version) = line.split_once("==").unwrap();
            assert!(
                !version.is_empty() && !version.contains(['<', '>', '*', ',']),
                "{line}"
            );
            names.push(name.to_lowercase());
        }
        assert!(
            !names.contains(&"torch".to_owned()),
            "pip must never change torch"
        );
        assert_eq!(pinned_version(&pins, "onnx"), Some("1.21.0"));
        assert_eq!(
            names,
            [
                "onnx",
                "numpy",
                "protobuf",
                "ml_dtypes",
                "onnxscript",
                "onnx-ir",
                "packaging"
            ]
        );
    }

    /// A sandbox with a fake Python whose pip "installs" onnxruntime by creating its library.
    #[cfg(unix)]
    struct Sandbox(PathBuf);

    #[cfg(unix)]
    impl Sandbox {
        fn new(name: &str) -> Sandbox {
            let dir =
                std::env::temp_dir().join(format!("kiln-xtask-onnx-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Sandbox(dir)
        }

        /// `pip install … --target DIR PKG` creates DIR's library and logs its arguments;
        /// with `fail`, it prints a network error instead and exits 1.
        fn python(&self, fail: bool) -> PathBuf {
            use std::os::unix::fs::PermissionsExt;
            let exe = self.0.join(if fail { "python-offline" } else { "python" });
            let install = if fail {
                "echo \"WARNING: Retrying NewConnectionError('Failed to establish a new \
                 connection')\"\n  echo 'ERROR: No matching distribution found'\n  exit 1"
                    .to_owned()
            } else {
                format!(
                    "mkdir -p \"$target/onnxruntime/capi\" && touch \
                     \"$target/onnxruntime/capi/{}\"\n  echo \"$@\" >> \"{}\"",
                    library_name(),
                    self.0.join("pip-calls").display()
                )
            };
            let body = format!(
                "#!/bin/sh\n\
                 if [ \"$3\" = --version ]; then echo 'pip 24.0 from /x (python 3.11)'; exit 0; fi\n\
                 target=''\nprev=''\n\
                 for a in \"$@\"; do [ \"$prev\" = --target ] && target=\"$a\"; prev=\"$a\"; done\n\
                 if [ -n \"$target\" ]; then\n  {install}\nfi\n"
            );
            fs::write(&exe, body).unwrap();
            fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
            exe
        }

        fn pip_calls(&self) -> usize {
            fs::read_to_string(self.0.join("pip-calls")).map_or(0, |t| t.lines().count())
        }
    }

    #[cfg(unix)]
    impl Drop for Sandbox {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[cfg(unix)]
    #[test]
    fn an_install_is_finished_linked_recorded_and_then_left_alone() {
        let sb = Sandbox::new("ok");
        let python = sb.python(false);
        let cache = sb.0.join("cache");
        let link = sb.0.join("checkout/.kiln/onnxruntime");
        // A stale half-install from an interrupted run is thrown away.
        fs::create_dir_all(cache.join("onnxruntime-1.31.1-cpu.partial/junk")).unwrap();

        let first = provision(&cache, &link, &python, Build::Cpu).unwrap();
        assert!(first.changed);
        let dir = cache.join("onnxruntime-1.31.1-cpu");
        assert_eq!(first.library, capi_dir(&dir).join(library_name()));
        assert!(first.library.is_file());
        assert!(!cache.join("onnxruntime-1.31.1-cpu.partial").exists());
        assert!(!dir.join("junk").exists());
        assert_eq!(
            fs::read_to_string(dir.join(ORT_MARKER)).unwrap(),
            "onnxruntime==1.31.1\n"
        );
        assert_eq!(fs::read_link(&link).unwrap(), capi_dir(&dir));
        let record = Record::parse(&fs::read_to_string(cache.join(RECORD)).unwrap()).unwrap();
        assert_eq!(record.library, first.library);
        assert_eq!(record.build, Build::Cpu);
        assert_eq!(sb.pip_calls(), 1);
        let calls = fs::read_to_string(sb.0.join("pip-calls")).unwrap();
        assert!(
            calls.contains("--no-deps --only-binary :all:")
                && calls.ends_with("onnxruntime==1.31.1\n"),
            "{calls}"
        );

        let second = provision(&cache, &link, &python, Build::Cpu).unwrap();
        assert!(!second.changed, "a second run has nothing to do");
        assert_eq!(sb.pip_calls(), 1);

        // A damaged install (library gone) is installed again.
        fs::remove_file(&first.library).unwrap();
        let third = provision(&cache, &link, &python, Build::Cpu).unwrap();
        assert!(third.changed && third.library.is_file());
        assert_eq!(sb.pip_calls(), 2);

        // Another build goes into its own directory; link and record follow it.
        let cuda = provision(&cache, &link, &python, Build::Cuda).unwrap();
        assert!(cuda.changed);
        let calls = fs::read_to_string(sb.0.join("pip-calls")).unwrap();
        assert!(calls.ends_with("onnxruntime-gpu==1.31.1\n"), "{calls}");
        assert_eq!(
            fs::read_link(&link).unwrap(),
            capi_dir(&cache.join("onnxruntime-1.31.1-cuda"))
        );
        let record = Record::parse(&fs::read_to_string(cache.join(RECORD)).unwrap()).unwrap();
        assert_eq!(record.build, Build::Cuda);
    }

    #[cfg(unix)]
    #[test]
    fn a_failed_install_is_diagnosed_and_nothing_is_marked_ready() {
        let sb = Sandbox::new("offline");
        let python = sb.python(true);
        let cache = sb.0.join("cache");
        let link = sb.0.join("checkout/.kiln/onnxruntime");
        let err = provision(&cache, &link, &python, Build::Cpu).unwrap_err().0;
        assert!(err.contains("PyPI could not be reached"), "{err}");
        assert!(err.contains("onnxruntime-1.31.1-cpu.log"), "{err}");
        assert!(!cache.join("onnxruntime-1.31.1-cpu").exists());
        assert!(!cache.join(RECORD).exists());
        assert!(link.symlink_metadata().is_err());
    }

    #[cfg(unix)]
    #[test]
    fn a_python_without_pip_creates_nothing() {
        let sb = Sandbox::new("no-pip");
        let cache = sb.0.join("cache");
        let link = sb.0.join("checkout/.kiln/onnxruntime");
        let err = provision(&cache, &link, &sb.0.join("no-such-python"), Build::Cpu)
            .unwrap_err()
            .0;
        assert!(err.contains("cannot run"), "{err}");
        assert!(
            !cache.exists(),
            "nothing is created before pip is known to work"
        );
    }
}
