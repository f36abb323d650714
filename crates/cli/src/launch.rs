//! `kiln train --nproc-per-node N`: starts N ranks of this same command on this machine with
//! the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
//! MASTER_PORT), waits for them, and when one fails stops the others. On Linux the ranks die
//! with the launcher (a parent-death signal), so a launcher killed with SIGKILL, by the OOM
//! killer or by hand, leaves no rank training on that a restart would run beside.

use std::ffi::OsString;
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;

/// The launcher variables a rank reads; set means this process already is a rank.
pub const LAUNCHED: &str = "RANK";

/// This command's arguments without `--nproc-per-node N` (or `--nproc-per-node=N`).
pub fn rank_args(args: &[OsString]) -> Vec<OsString> {
    let mut out = vec![];
    let mut skip_value = false;
    for a in args {
        if skip_value {
            skip_value = false;
        } else if a == "--nproc-per-node" {
            skip_value = true;
        } else if !a.to_string_lossy().starts_with("--nproc-per-node=") {
            out.push(a.clone());
        }
    }
    out
}

/// A port on 127.0.0.1 free right now, for rank 0's store.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .context("cannot find a free port for the ranks' rendezvous")?;
    Ok(listener.local_addr()?.port())
}

fn spawn_rank(rank: usize, n: usize, port: u16, args: &[OsString]) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("cannot find the kiln binary itself")?;
    let mut cmd = Command::new(exe);
    die_with_launcher(&mut cmd);
    cmd.args(args)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("LOCAL_WORLD_SIZE", n.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env_remove("TORCHELASTIC_USE_AGENT_STORE")
        .spawn()
        .with_context(|| format!("cannot start rank {rank}"))
}

/// Has the child of `cmd` receive SIGKILL when this process ends (Linux's `PR_SET_PDEATHSIG`,
/// kept across `exec`), and end at once if this process is already gone when it starts.
#[cfg(target_os = "linux")]
fn die_with_launcher(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let launcher = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec and makes only async-signal-safe
    // system calls (prctl, getppid); it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            use rustix::process::{Signal, getppid, set_parent_process_death_signal};
            set_parent_process_death_signal(Some(Signal::KILL))?;
            if getppid() != Some(launcher) {
                // The launcher died before the signal was armed: the spawn fails.
                return Err(rustix::io::Errno::SRCH.into());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_launcher(_cmd: &mut Command) {}

/// Starts `n` ranks and waits for all; the first failure stops the rest and is the exit code.
pub fn launch(n: usize) -> anyhow::Result<ExitCode> {
    if std::env::var_os(LAUNCHED).is_some() {
        anyhow::bail!(
            "--nproc-per-node: this process is already a rank ({LAUNCHED} is set by a launcher \
             such as torchrun); drop --nproc-per-node"
        );
    }
    // Ctrl-C reaches every rank (one process group); the launcher waits for them to stop.
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, interrupted.clone())
            .context("cannot install the signal handlers")?;
    }
    let args = rank_args(&std::env::args_os().skip(1).collect::<Vec<_>>());
    let port = free_port()?;
    eprintln!("kiln: starting {n} ranks on this machine (rendezvous 127.0.0.1:{port})");
    let mut ranks = Vec::with_capacity(n);
    for rank in 0..n {
        match spawn_rank(rank, n, port, &args) {
            Ok(child) => ranks.push(Some(child)),
            Err(e) => {
                stop(&mut ranks);
                return Err(e);
            }
        }
    }
    wait_all(ranks)
}

/// Waits for every rank; when one fails, stops the others and returns its status.
fn wait_all(mut ranks: Vec<Option<Child>>) -> anyhow::Result<ExitCode> {
    let mut failed: Option<(usize, ExitStatus)> = None;
    while ranks.iter().any(Option::is_some) {
        for (rank, slot) in ranks.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            if let Some(status) = child.try_wait()? {
                *slot = None;
                if !status.success() && failed.is_none() {
                    failed = Some((rank, status));
                }
            }
        }
        if let Some((rank, status)) = failed
            && ranks.iter().any(Option::is_some)
        {
            eprintln!("kiln: rank {rank} ended with {status}; stopping the other ranks");
            stop(&mut ranks);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(match failed {
        None => ExitCode::SUCCESS,
        Some((rank, status)) => {
            eprintln!("kiln: rank {rank} failed ({status})");
            ExitCode::from(
                status
                    .code()
                    .and_then(|c| u8::try_from(c).ok())
                    .unwrap_or(1),
            )
        }
    })
}

fn stop(ranks: &mut [Option<Child>]) {
    for child in ranks.iter_mut().flatten() {
        let _ = child.kill();
        let _ = child.wait();
    }
    for slot in ranks.iter_mut() {
        *slot = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn rank_args_drop_the_launcher_flag_in_both_spellings() {
        let given = os(&["train", "--nproc-per-node", "2", "--epochs", "1"]);
        assert_eq!(rank_args(&given), os(&["train", "--epochs", "1"]));
        let given = os(&["train", "--nproc-per-node=4", "--model", "mlp"]);
        assert_eq!(rank_args(&given), os(&["train", "--model", "mlp"]));
    }
}
