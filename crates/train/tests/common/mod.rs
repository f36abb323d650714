//! What the end-to-end training tests share: a configuration request for a simulated 2-core CPU
//! without a GPU, the way `kiln train --set …` would load it.

use std::path::Path;

use kiln_config::{ConfigRequest, Machine, simulated_machine};
use kiln_device::CpuFacts;
use kiln_profiles::ProfileSet;

/// A request for the simulated CPU machine with `sets` as `--set` arguments, in order.
pub fn cpu_request<S: AsRef<str>>(sets: &[S]) -> ConfigRequest {
    let profiles = ProfileSet::builtin().unwrap();
    let cpu = CpuFacts {
        model: "test".into(),
        physical_cores: 2,
        logical_cores: 2,
        total_memory_bytes: 16 << 30,
        available_memory_bytes: 8 << 30,
        avx512: false,
        avx512_bf16: false,
        amx_bf16: false,
    };
    let facts = simulated_machine(&profiles, None, None, None, Some(2), cpu).unwrap();
    let mut req = ConfigRequest::new(Machine::Simulated(facts));
    req.sets = sets.iter().map(|s| s.as_ref().to_owned()).collect();
    req
}

/// [`cpu_request`] with `base` then `extra` as `--set` arguments, writing runs under `out`.
#[allow(dead_code)] // not every test binary writes runs
pub fn run_request(out: &Path, base: &[&str], extra: &[&str]) -> ConfigRequest {
    let sets: Vec<String> = base
        .iter()
        .chain(extra)
        .map(|s| (*s).to_owned())
        .chain([format!("run.output_dir={}", out.display())])
        .collect();
    cpu_request(&sets)
}

/// The one run directory under `out`.
#[allow(dead_code)] // not every test binary writes runs
pub fn only_run(out: &Path) -> std::path::PathBuf {
    let dirs: Vec<std::path::PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

/// The records of `kind` (`start`, `step`, `epoch`) in a run's `metrics.jsonl`.
#[allow(dead_code)] // not every test binary reads records
pub fn records(run: &Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == kind)
        .collect()
}

/// Trains `plan` on the CPU, resuming as `resume` says, without an observer.
#[allow(dead_code)] // not every test binary trains whole runs
pub fn train_quietly(
    plan: &kiln_config::RunPlan,
    resume: Option<kiln_train::run::Resume>,
) -> kiln_train::run::RunOutcome {
    let control = kiln_train::run::RunControl {
        resume,
        ..kiln_train::run::RunControl::default()
    };
    let silent = &mut kiln_train::record::Silent;
    kiln_train::run::train(plan, kiln_device::Device::Cpu, None, control, silent).unwrap()
}

/// The Python whose torch is the libtorch kiln runs on: `KILN_PYTHON` (`cargo xtask test` sets
/// it), else the venv that the libtorch in use lives in. Tests that need it are `#[ignore]`d
/// with the reason and named `…with_python_torch`, which `cargo xtask test` runs.
#[allow(dead_code)] // not every test binary runs Python
pub fn python_with_torch() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("KILN_PYTHON") {
        return p.into();
    }
    let lib = kiln_torch_ext::runtime::libtorch_lib_dir()
        .ok()
        .and_then(|l| l.canonicalize().ok())
        .expect("a libtorch directory");
    lib.ancestors()
        .map(|a| a.join("bin/python"))
        .find(|p| p.is_file())
        .expect("no Python beside this libtorch: set KILN_PYTHON to a Python with torch 2.11")
}
