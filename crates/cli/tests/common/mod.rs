//! What the CLI tests share: running the `kiln` binary as a user would, and its output as text.

pub mod own_data;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `kiln` binary under test: `KILN_TEST_KILN` where set (a test binary run away from its
/// build, as `run-cuda-tests.sh` of the GPU bundle runs it), else the one cargo built with it.
#[allow(dead_code)] // not every test binary runs kiln from elsewhere
pub fn kiln_exe() -> PathBuf {
    std::env::var_os("KILN_TEST_KILN")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kiln")), PathBuf::from)
}

/// Runs `kiln args…` with no library path, log filter or device request from this environment.
pub fn kiln(args: &[&str]) -> Output {
    kiln_with_env(args, &[])
}

/// [`kiln`] with `env` set for it.
pub fn kiln_with_env<S: AsRef<std::ffi::OsStr>>(args: &[S], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RUST_LOG")
        .env_remove("KILN_DEVICE__REQUEST")
        .envs(env.iter().copied())
        .output()
        .expect("the kiln binary runs")
}

#[allow(dead_code)] // not every test binary reads stdout as text
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Copies the directory tree `from` to `to`.
#[allow(dead_code)] // not every test binary copies a tree
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The Python with libtorch's torch: `KILN_PYTHON` (`cargo xtask test` sets it), else the venv
/// that `.kiln/libtorch` points into. Tests that need it are `#[ignore]`d with the reason and
/// named `…with_python_torch`; `cargo xtask test` runs them.
#[allow(dead_code)] // not every test binary runs Python
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("KILN_PYTHON") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.kiln/libtorch");
    let torch = std::fs::canonicalize(root).expect("a libtorch at .kiln/libtorch");
    // <venv>/lib/python3.X/site-packages/torch
    let python = torch
        .ancestors()
        .nth(4)
        .map(|venv| venv.join("bin").join("python"))
        .filter(|p| p.exists());
    python.expect("no Python beside .kiln/libtorch: set KILN_PYTHON to a Python with torch 2.11")
}

/// The one run directory under `out` (a test that expects exactly one).
#[allow(dead_code)] // not every test binary reads run directories
pub fn only_run(out: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(dirs.len(), 1, "one run directory: {dirs:?}");
    dirs[0].clone()
}

/// The loss of each logged step in a run's metrics.jsonl.
#[allow(dead_code)] // not every test binary reads metrics
pub fn step_losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "step")
        .map(|v| v["loss"].as_f64().unwrap())
        .collect()
}

/// A port on 127.0.0.1 free right now (for a rendezvous).
#[allow(dead_code)] // not every test binary starts ranks
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Reads one f32 tensor of a safetensors file as (shape, values).
#[allow(dead_code)] // not every test binary reads outputs
pub fn read_tensor(path: &Path, name: &str) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    let values = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (t.shape().to_vec(), values)
}
