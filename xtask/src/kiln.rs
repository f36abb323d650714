//! Builds the `kiln` CLI in release mode and runs it with the provisioned libtorch (and
//! onnxruntime).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::libtorch::{Libtorch, Settings, Source};
use crate::onnx;
use crate::util::{self, Result, bail};

/// Gives a cargo (or kiln) process the same `LIBTORCH` and `KILN_ONNXRUNTIME` that
/// `.cargo/config.toml` gives plain cargo commands, so switching between `cargo xtask` and
/// `cargo` never rebuilds torch-sys, and kiln finds the onnxruntime that setup linked. Values the
/// user set win.
pub fn apply_env(cmd: &mut Command, settings: &Settings) {
    match &settings.libtorch_env {
        Some(user) => cmd.env("LIBTORCH", user),
        None => cmd.env("LIBTORCH", &settings.link),
    };
    match onnx::user_library_env(settings) {
        Some(user) => cmd.env(onnx::ENV_LIBRARY, user),
        None => cmd.env(onnx::ENV_LIBRARY, onnx::link(settings)),
    };
}

pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// `cargo build --release -p kiln-cli --bin kiln`: the very binary users get.
pub fn build_cli(root: &Path, settings: &Settings) -> Result<()> {
    let args = [
        "build",
        "--release",
        "--package",
        "kiln-cli",
        "--bin",
        "kiln",
    ];
    cargo_build(root, settings, &args, "the kiln CLI")
}

/// `cargo ARGS` (a build) with [`apply_env`]'s environment; an error names `what` was built.
pub fn cargo_build<S: AsRef<std::ffi::OsStr>>(
    root: &Path,
    settings: &Settings,
    args: &[S],
    what: &str,
) -> Result<()> {
    let mut build = Command::new(util::cargo());
    build.current_dir(root).args(args);
    apply_env(&mut build, settings);
    let status = util::status_of(&mut build)?;
    if !status.success() {
        bail!(
            "building {what} failed ({}); see the compiler output above",
            util::describe_status(status)
        );
    }
    Ok(())
}

/// `cargo build --release -p kiln-cli`, then runs `kiln <args>` (with `envs` besides
/// [`apply_env`]'s) and returns its exit code.
pub fn build_and_run(
    root: &Path,
    settings: &Settings,
    args: &[String],
    envs: &[(&str, PathBuf)],
) -> Result<ExitCode> {
    build_cli(root, settings)?;
    let exe = target_dir(root).join("release").join("kiln");
    let mut run = Command::new(&exe);
    run.args(args);
    apply_env(&mut run, settings);
    run.envs(envs.iter().map(|(k, v)| (*k, v)));
    let status = util::status_of(&mut run)?;
    Ok(util::exit_code_of(status, "kiln"))
}

/// The Python whose torch kiln uses (the cache's venv, or the one that provided libtorch),
/// for baselines and for tests that export models from PyTorch.
pub fn python_of(libtorch: &Libtorch, settings: &Settings) -> PathBuf {
    match &libtorch.source {
        Source::Cache { venv, .. } => venv.join("bin").join("python"),
        Source::Python(python) => python.clone(),
        Source::EnvVar => PathBuf::from(&settings.python),
    }
}
