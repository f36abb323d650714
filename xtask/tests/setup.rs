//! `cargo xtask setup` as a user meets it: each way of finding libtorch, and each way it fails.
//!
//! Every test runs the real xtask binary in its own temporary cache and link location, with
//! fake libtorch directories and fake Python interpreters (shell scripts that answer xtask's
//! probe), so nothing here touches the checkout's own `.kiln/libtorch`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Sandbox {
    root: PathBuf,
}

impl Sandbox {
    fn new(name: &str) -> Sandbox {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "kiln-xtask-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        Sandbox { root }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn link(&self) -> PathBuf {
        self.path("checkout/.kiln/libtorch")
    }

    /// A directory that looks like a libtorch root of `version`.
    fn fake_libtorch(&self, rel: &str, version: &str, wheel_layout: bool) -> PathBuf {
        let dir = self.path(rel);
        fs::create_dir_all(dir.join("lib")).unwrap();
        fs::create_dir_all(dir.join("include/torch")).unwrap();
        fs::write(dir.join("lib/libtorch_cpu.so"), b"").unwrap();
        if wheel_layout {
            fs::write(
                dir.join("version.py"),
                format!("__version__ = '{version}'\n"),
            )
            .unwrap();
        } else {
            fs::write(dir.join("build-version"), format!("{version}\n")).unwrap();
        }
        dir
    }

    /// A script that answers xtask's Python probe like an interpreter would.
    fn fake_python(
        &self,
        name: &str,
        major_minor: (u32, u32),
        torch_dir: Option<&Path>,
    ) -> PathBuf {
        let exe = self.path(name);
        let mut body = format!(
            "#!/bin/sh\necho 'KILN_PY {} {}'\necho 'KILN_EXE {}'\n",
            major_minor.0,
            major_minor.1,
            exe.display()
        );
        if let Some(dir) = torch_dir {
            body.push_str(&format!("echo 'KILN_TORCH {}'\n", dir.display()));
        }
        fs::write(&exe, body).unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        exe
    }

    fn xtask(&self, envs: &[(&str, &Path)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
        cmd.arg("setup")
            .env_remove("LIBTORCH")
            .env("KILN_CACHE_DIR", self.path("cache"))
            .env("KILN_LIBTORCH_LINK", self.link())
            .env("KILN_PYTHON", self.path("no-such-python"));
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output().expect("xtask runs")
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn libtorch_env_var_of_the_right_version_is_used_and_linked() {
    let sb = Sandbox::new("env-ok");
    let dir = sb.fake_libtorch("libtorch", "2.11.0+cpu", false);
    let out = sb.xtask(&[("LIBTORCH", &dir)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("libtorch 2.11.0+cpu from LIBTORCH"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read_link(sb.link()).unwrap(), dir);
    assert!(!sb.path("cache").exists(), "nothing may be downloaded");
}

#[test]
fn libtorch_env_var_of_another_version_is_an_actionable_error() {
    let sb = Sandbox::new("env-old");
    let dir = sb.fake_libtorch("libtorch", "2.5.1+cu121", false);
    let out = sb.xtask(&[("LIBTORCH", &dir)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("LIBTORCH={} cannot be used", dir.display())),
        "{err}"
    );
    assert!(
        err.contains("is libtorch 2.5.1+cu121, but kiln needs 2.11.0"),
        "{err}"
    );
    assert!(err.contains("Unset LIBTORCH"), "{err}");
    assert!(sb.link().symlink_metadata().is_err(), "no link on failure");
}

#[test]
fn libtorch_env_var_that_is_not_a_libtorch_is_named() {
    let sb = Sandbox::new("env-bogus");
    let dir = sb.path("empty");
    fs::create_dir_all(&dir).unwrap();
    let out = sb.xtask(&[("LIBTORCH", &dir)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("has no lib/libtorch_cpu library"), "{err}");
}

#[test]
fn a_python_with_torch_2_11_is_used_without_downloading() {
    let sb = Sandbox::new("py-ok");
    let torch = sb.fake_libtorch("site-packages/torch", "2.11.0+cu130", true);
    let python = sb.fake_python("python3", (3, 12), Some(&torch));
    let out = sb.xtask(&[("KILN_PYTHON", &python)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("from the torch package of"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read_link(sb.link()).unwrap(), torch);
    assert!(!sb.path("cache").exists(), "nothing may be downloaded");
}

#[test]
fn a_python_with_another_torch_falls_back_to_the_cache_and_reruns_do_nothing() {
    let sb = Sandbox::new("py-old");
    let old = sb.fake_libtorch("site-packages/torch", "2.5.1", true);
    let python = sb.fake_python("python3", (3, 11), Some(&old));
    // A cache venv that an earlier setup finished.
    let venv = sb.path("cache/torch-2.11.0");
    let cached = sb.fake_libtorch(
        "cache/torch-2.11.0/lib/python3.11/site-packages/torch",
        "2.11.0+cu130",
        true,
    );
    let requirements = if cfg!(target_os = "linux") {
        "torch==2.11.0 safetensors==0.7.0 cuda-toolkit[crt,cccl]==13.0.2"
    } else {
        "torch==2.11.0 safetensors==0.7.0"
    };
    fs::write(
        venv.join("kiln-ready"),
        format!("{}\n{requirements}\n", cached.display()),
    )
    .unwrap();

    let first = sb.xtask(&[("KILN_PYTHON", &python)]);
    let err = stderr(&first);
    assert!(first.status.success(), "{err}");
    assert!(
        err.contains("is libtorch 2.5.1, but kiln needs 2.11.0"),
        "{err}"
    );
    assert!(err.contains("already provisioned"), "{err}");
    assert_eq!(fs::read_link(sb.link()).unwrap(), cached);

    let second = sb.xtask(&[("KILN_PYTHON", &python)]);
    assert!(second.status.success());
    assert!(
        stderr(&second).contains("(nothing to do)"),
        "{}",
        stderr(&second)
    );
    assert_eq!(fs::read_link(sb.link()).unwrap(), cached);
}

#[test]
fn no_python_and_no_libtorch_says_what_to_install() {
    let sb = Sandbox::new("no-py");
    let out = sb.xtask(&[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("kiln needs libtorch 2.11.0 and found none"),
        "{err}"
    );
    assert!(err.contains("could not be run"), "{err}");
    assert!(err.contains("install Python 3.10–3.14 with pip"), "{err}");
    assert!(err.contains("set LIBTORCH"), "{err}");
}

#[test]
fn an_unsupported_python_is_refused_before_downloading() {
    let sb = Sandbox::new("py39");
    let python = sb.fake_python("python3.9", (3, 9), None);
    let out = sb.xtask(&[("KILN_PYTHON", &python)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is Python 3.9, but torch 2.11.0 has wheels for Python 3.10–3.14"),
        "{err}"
    );
    assert!(err.contains("KILN_PYTHON"), "{err}");
    assert!(
        !sb.path("cache/torch-2.11.0").exists(),
        "no venv for a refused python"
    );
}

#[test]
fn an_unreachable_pypi_is_diagnosed_and_nothing_is_marked_ready() {
    // A real venv and a real pip, pointed at a closed local port.
    let sb = Sandbox::new("no-net");
    let python = which_python3();
    let empty_links = sb.path("no-wheels");
    fs::create_dir_all(&empty_links).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.arg("setup")
        .env_remove("LIBTORCH")
        .env("KILN_CACHE_DIR", sb.path("cache"))
        .env("KILN_LIBTORCH_LINK", sb.link())
        .env("KILN_PYTHON", &python)
        .env("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
        .env("PIP_FIND_LINKS", &empty_links)
        .env("PIP_RETRIES", "0")
        .env("PIP_TIMEOUT", "2");
    let out = cmd.output().unwrap();
    let err = stderr(&out);
    if err.contains("from the torch package of") {
        eprintln!("this machine's python3 already has torch 2.11: nothing to download, skipped");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("installing torch 2.11.0 with pip failed"),
        "{err}"
    );
    assert!(err.contains("PyPI could not be reached"), "{err}");
    assert!(!sb.path("cache/torch-2.11.0/kiln-ready").exists());
    assert!(sb.link().symlink_metadata().is_err());
}

fn which_python3() -> PathBuf {
    std::env::var_os("KILN_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}
