//! Data-parallel `kiln train` across processes on c10d/Gloo over loopback: 2 ranks × batch 32
//! learn as 1 rank × batch 64 (per-step losses within 1e-5), started by
//! `kiln train --nproc-per-node 2` or by PyTorch's own torchrun (`--no-python`); rank 0 alone
//! writes the run; a rank that dies ends the other with an error within `distributed.timeout_s`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, kiln, kiln_exe, only_run, stderr, step_losses};

/// The settings every run here shares: the MLP on its synthetic data (640 training samples:
/// 10 steps of 64 per epoch), fp32, dropout 0, every step logged.
fn settings(out: &Path, batch: u64) -> Vec<String> {
    [
        "--model",
        "mlp",
        "--epochs",
        "2",
        "--set",
        "data.synthetic_samples=712",
        "--set",
        "train.amp=fp32",
        "--set",
        "model.dropout=0",
        "--set",
        "data.num_workers=1",
        "--set",
        "train.log_interval=1",
        "--set",
        "distributed.timeout_s=60",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([
        "--set".to_owned(),
        format!("train.batch_size={batch}"),
        "--set".to_owned(),
        format!("run.output_dir={}", out.display()),
    ])
    .collect()
}

/// The losses of the same job on one rank with batch 64.
fn one_rank_of_64() -> Vec<f64> {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["train".to_owned()];
    args.extend(settings(tmp.path(), 64));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = kiln(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    step_losses(&only_run(tmp.path()))
}

fn assert_same_losses(reference: &[f64], got: &[f64]) {
    assert_eq!(reference.len(), 20, "2 epochs of 10 steps");
    assert_eq!(got.len(), reference.len());
    for (step, (a, b)) in reference.iter().zip(got).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "step {}: 1×64 {a} vs 2×32 {b}",
            step + 1
        );
    }
}

#[test]
fn two_local_ranks_learn_as_one_rank_of_twice_the_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["train".to_owned(), "--nproc-per-node".into(), "2".into()];
    args.extend(settings(tmp.path(), 32));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = kiln(&args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("data-parallel: 2 ranks on c10d/Gloo"), "{err}");
    assert!(err.contains("global batch 64"), "{err}");
    assert_same_losses(&one_rank_of_64(), &step_losses(&only_run(tmp.path())));
}

#[test]
#[ignore = "needs Python with torch (torchrun); `cargo xtask test` runs it"]
fn two_ranks_under_torchrun_learn_as_one_rank_of_twice_the_batch_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let o = Command::new(common::python())
        .args(["-m", "torch.distributed.run", "--nproc-per-node", "2"])
        .args(["--master-addr", "127.0.0.1", "--master-port"])
        .arg(port.to_string())
        .args(["--no-python", env!("CARGO_BIN_EXE_kiln"), "train"])
        .args(settings(tmp.path(), 32))
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("data-parallel: 2 ranks on c10d/Gloo"), "{err}");
    assert_same_losses(&one_rank_of_64(), &step_losses(&only_run(tmp.path())));
}

/// Starts rank `rank` of 2 as a launcher would; its stderr is piped.
fn spawn_rank(rank: usize, port: u16, out: &Path, timeout_s: u64) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["train", "--model", "mlp", "--epochs", "1000"])
        .args([
            "--set",
            "data.synthetic_samples=4096",
            "--set",
            "train.amp=fp32",
        ])
        .args([
            "--set",
            "data.num_workers=1",
            "--set",
            "train.batch_size=32",
        ])
        .arg("--set")
        .arg(format!("distributed.timeout_s={timeout_s}"))
        .arg("--set")
        .arg(format!("run.output_dir={}", out.display()))
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Starts both ranks and reads rank 0's output until training runs (its progress starts
/// after the run directory line); returns the ranks and rank 0's remaining lines.
fn start_pair(
    out: &Path,
    timeout_s: u64,
) -> (
    std::process::Child,
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStderr>>,
) {
    let port = free_port();
    let mut first = spawn_rank(0, port, out, timeout_s);
    let second = spawn_rank(1, port, out, timeout_s);
    let mut lines = BufReader::new(first.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.starts_with("run directory:") {
            break;
        }
    }
    assert!(seen.contains("data-parallel: 2 ranks"), "{seen}");
    (first, second, lines)
}

#[test]
fn sigterm_to_one_rank_stops_every_rank_at_the_same_step_with_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut first, mut second, lines) = start_pair(tmp.path(), 60);
    let killed = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let tail = lines.map(Result::unwrap).collect::<Vec<_>>().join("\n");
    let (a, b) = (first.wait().unwrap(), second.wait().unwrap());
    assert_eq!((a.code(), b.code()), (Some(130), Some(130)), "{tail}");
    assert!(tail.contains("stopped at step"), "{tail}");
    let checkpoints = only_run(tmp.path()).join("checkpoints");
    assert!(
        std::fs::read_dir(checkpoints).unwrap().count() >= 1,
        "rank 0 wrote the stop's checkpoint"
    );
}

#[test]
fn killing_one_rank_ends_the_other_with_an_error_within_the_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let timeout = 10;
    let (mut first, mut second, lines) = start_pair(tmp.path(), timeout);
    second.kill().unwrap();
    second.wait().unwrap();
    let killed = Instant::now();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = first.wait().unwrap();
    let took = killed.elapsed();
    let tail = rest.join("\n");
    assert!(!status.success(), "rank 0 went on: {tail}");
    assert!(
        took < Duration::from_secs(timeout + 20),
        "rank 0 took {took:?} to end"
    );
    assert!(tail.contains("rank 0 of 2"), "{tail}");
    assert!(
        tail.contains("Another rank has probably stopped or died"),
        "{tail}"
    );
}

#[test]
#[ignore = "needs CUDA; `cargo xtask test --cuda` runs it"]
fn one_rank_on_cuda_joins_with_nccl_and_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let o = Command::new(kiln_exe())
        .arg("train")
        .args(settings(tmp.path(), 64))
        .args(["--set", "device.request=cuda"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("data-parallel: 1 ranks on c10d/NCCL"), "{err}");
    assert_eq!(step_losses(&only_run(tmp.path())).len(), 20);
}

/// The children of process `pid` (Linux's `/proc/PID/task/PID/children`).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
#[cfg(target_os = "linux")]
fn ranks_die_with_a_launcher_killed_by_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "train",
            "--nproc-per-node",
            "2",
            "--model",
            "mlp",
            "--epochs",
            "1000",
        ])
        .args([
            "--set",
            "data.synthetic_samples=4096",
            "--set",
            "data.num_workers=1",
        ])
        .arg("--set")
        .arg(format!("run.output_dir={}", tmp.path().display()))
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Rank 0's log reaches the launcher's stderr: once a run directory is named, both train.
    let mut lines = BufReader::new(launcher.stderr.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.starts_with("run directory"))),
        "the ranks never started training"
    );
    let ranks = children_of(launcher.id());
    assert_eq!(ranks.len(), 2, "the launcher's children: {ranks:?}");
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ranks.iter().all(|&r| gone(r)) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    let alive: Vec<u32> = ranks.iter().copied().filter(|&r| !gone(r)).collect();
    for &r in &alive {
        let _ = Command::new("kill").args(["-9", &r.to_string()]).status();
    }
    assert!(alive.is_empty(), "ranks {alive:?} outlived their launcher");
}
