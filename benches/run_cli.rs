//! Child processes for the suites: a group's command line, the release CLI, runs and measured runs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::proc_memory::{Peak, mib, peak_until_exit};
use crate::{Msg, Result, SuiteArgs};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use kiln_config::RunPlan;
use serde::Serialize;
use serde_json::Value;

/// A group's command line: a subcommand `S`, or without one the suite's options.
#[derive(Debug, Parser)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli<S: Subcommand> {
    #[command(subcommand)]
    pub command: Option<S>,
    #[command(flatten)]
    pub suite: SuiteArgs,
}

impl<S: Subcommand> Cli<S> {
    /// Parses `args` (`args[0]`: the group's name); `about` is the help's first line.
    pub fn parse_with(args: Vec<OsString>, about: &'static str) -> Self {
        let matches = Self::command().about(about).get_matches_from(args);
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// Ends a suite: on failure, prints the error and exits non-zero.
pub fn exit_on_error(result: Result<()>) {
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// `dir` removed with what it holds, if it exists.
pub fn remove_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).at(dir)?;
    }
    Ok(())
}

/// The suite's scratch directory, empty: `<--work-dir>/<suite>`, else a temporary one of its own.
pub fn fresh_work_dir(a: &SuiteArgs, suite: &str) -> Result<PathBuf> {
    let work = a.work_dir.as_ref().map_or_else(
        || std::env::temp_dir().join(format!("kiln-bench-{suite}-{}", std::process::id())),
        |dir| dir.join(suite),
    );
    remove_dir(&work)?;
    std::fs::create_dir_all(&work).at(&work)?;
    Ok(work)
}

/// The release CLI beside this binary, which the `suite` runs.
pub fn kiln_exe(suite: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().msg()?.with_file_name("kiln");
    if exe.is_file() {
        return Ok(exe);
    }
    Err(format!(
        "{} is missing: the {suite} suite runs the release CLI (cargo xtask bench builds it; by \
         hand: cargo build --release -p kiln-cli)",
        exe.display()
    ))
}

/// `kiln train --data DATA --set S…` with the release CLI beside this binary, for `suite`.
pub fn kiln_train(suite: &str, data: &Path, sets: &[String]) -> Result<Command> {
    let mut cmd = Command::new(kiln_exe(suite)?);
    cmd.arg("train").arg("--data").arg(data);
    cmd.args(sets.iter().flat_map(|s| ["--set", s]));
    Ok(cmd)
}

/// The directory of the `kiln train` run under `runs` and its `summary.json`.
pub fn read_summary(runs: &Path) -> Result<(PathBuf, Value)> {
    let dir = std::fs::read_dir(runs)
        .at(runs)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("summary.json").is_file())
        .ok_or_else(|| format!("kiln train wrote no summary.json under {}", runs.display()))?;
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).at(&path)?;
    Ok((dir, serde_json::from_str(&text).at(&path)?))
}

/// Passes the plan's values that `ddp_step.py` and `lightning_job.py` both take, and `threads`.
pub fn plan_args(cmd: &mut Command, plan: &RunPlan, threads: usize) {
    let (t, m) = (&plan.train, &plan.model);
    for (name, v) in [
        ("--seed", plan.performance.backend.seed.to_string()),
        ("--epochs", t.epochs.to_string()),
        ("--batch", t.batch_size.to_string()),
        ("--lr", t.lr.to_string()),
        ("--weight-decay", t.weight_decay.to_string()),
        ("--warmup", t.warmup_steps.to_string()),
        ("--clip", t.clip_grad_norm.to_string()),
        ("--dropout", m.dropout.to_string()),
        ("--d-model", m.d_model.to_string()),
        ("--heads", m.heads.to_string()),
        ("--layers", m.layers.to_string()),
        ("--ff", m.ff.to_string()),
        ("--threads", threads.to_string()),
    ] {
        cmd.args([name, &v]);
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `cmd`: its output and seconds, or an error with the end of its stderr.
pub fn run(mut cmd: Command) -> Result<(Output, f64)> {
    let started = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        let err = tail(&String::from_utf8_lossy(&out.stderr), 20);
        return Err(format!("{cmd:?} failed ({}):\n{err}", out.status));
    }
    Ok((out, seconds))
}

/// One measured run: its JSON result, wall time and its process tree's peak memory.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub result: Value,
    /// From spawning the process to its exit.
    pub seconds: f64,
    pub peak_pss_mib: f64,
    pub peak_rss_mib: f64,
}

/// Runs `cmd` with stdout and stderr in `log`, sampling its tree's memory every 100 ms.
pub fn measured(cmd: Command, log: &Path) -> Result<Measured> {
    let (result, seconds, peak) = measured_every(cmd, log, Some(Duration::from_millis(100)))?;
    Ok(Measured {
        result,
        seconds,
        peak_pss_mib: mib(peak.pss),
        peak_rss_mib: mib(peak.rss),
    })
}

/// [`measured`], sampling memory `every` so long if at all: its JSON (or null), seconds, peak.
pub fn measured_every(
    mut cmd: Command,
    log: &Path,
    every: Option<Duration>,
) -> Result<(Value, f64, Peak)> {
    let out_path = log.with_extension("stdout");
    let file = |p: &Path| std::fs::File::create(p).at(p);
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(file(&out_path)?)
        .stderr(file(log)?)
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let (status, peak) = match every {
        Some(every) => peak_until_exit(&mut child, every)?,
        None => (child.wait().msg()?, Peak::default()),
    };
    let seconds = started.elapsed().as_secs_f64();
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    if !status.success() {
        let err = tail(&std::fs::read_to_string(log).unwrap_or_default(), 15);
        let log = log.display();
        return Err(format!(
            "{cmd:?} failed ({status}); the end of its log {log}:\n{err}"
        ));
    }
    let result = crate::json_line(&stdout)
        .map_or(Ok(Value::Null), serde_json::from_str)
        .map_err(|e| format!("{cmd:?} printed no JSON result ({e}): {stdout}"))?;
    Ok((result, seconds, peak))
}
