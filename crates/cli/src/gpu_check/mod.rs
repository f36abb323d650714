//! `kiln gpu-check`: every CUDA path kiln has, exercised in one command with small sizes, each
//! step in its own process (a memory fraction or a CUDA error stays in its step), with a report.
//! Without a GPU the CPU-capable steps run on the CPU and every CUDA step says "not run".

mod benches;
mod compiled;
mod distributed;
mod feeder;
mod report;
mod runtime;
mod serving;
mod sliding;
mod training;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Map, Value};

use report::{Report, Status, StepResult};

/// Bytes in a GiB.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// What a step needs to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// Runs on the GPU when there is one, else on the CPU.
    Any,
    /// Only means something on CUDA.
    Cuda,
}

/// One check.
struct Step {
    name: &'static str,
    needs: Needs,
    /// Seconds before the step's process is stopped.
    timeout_s: u64,
    run: fn(&Ctx) -> anyhow::Result<Outcome>,
}

/// The steps, in order.
const STEPS: &[Step] = &[
    step("doctor", Needs::Any, 60, runtime::doctor),
    step("backend-flags", Needs::Any, 60, runtime::backend_flags),
    step("memory-fraction", Needs::Cuda, 60, runtime::memory_fraction),
    step("memory-stats", Needs::Cuda, 60, runtime::memory_stats),
    step("pinned-feeder", Needs::Cuda, 120, feeder::pinned_feeder),
    step("train-bf16", Needs::Any, 180, training::train_bf16),
    step("train-fp16", Needs::Cuda, 180, training::train_fp16),
    step(
        "checkpoint-resume",
        Needs::Any,
        180,
        training::checkpoint_resume,
    ),
    step(
        "batch-size-auto",
        Needs::Cuda,
        180,
        training::batch_size_auto,
    ),
    step("oom-retry", Needs::Cuda, 120, training::oom_retry),
    step(
        "activation-checkpointing",
        Needs::Cuda,
        120,
        training::activation_checkpointing,
    ),
    step("profiler-trace", Needs::Any, 120, training::profiler_trace),
    step("cuda-graphs", Needs::Cuda, 120, serving::cuda_graphs),
    step("serve", Needs::Any, 120, serving::serve),
    step("profile-model", Needs::Any, 120, serving::profile_model),
    step("compiled-train", Needs::Any, 420, compiled::compiled_train),
    step("onnxruntime", Needs::Any, 60, serving::onnxruntime),
    step("sliding-window", Needs::Any, 120, sliding::sliding_window),
    step("nccl", Needs::Cuda, 180, distributed::nccl),
    step("bench-train", Needs::Cuda, 240, benches::train),
    step("bench-infer", Needs::Cuda, 180, benches::infer),
];

const fn step(
    name: &'static str,
    needs: Needs,
    timeout_s: u64,
    run: fn(&Ctx) -> anyhow::Result<Outcome>,
) -> Step {
    Step {
        name,
        needs,
        timeout_s,
        run,
    }
}

/// Steps listed so the report shows them, but with nothing to run yet.
const NOT_YET: &[(&str, &str)] = &[];

/// What a step has to work with.
pub struct Ctx {
    /// The step's own directory (its files; its log is beside it).
    pub dir: PathBuf,
    /// `cuda:0` when the machine has a CUDA device, else the CPU.
    pub device: tch::Device,
    /// This `kiln` binary, for steps that run its commands.
    pub exe: PathBuf,
    /// Where the benchmark binary is (`kiln-bench`).
    pub bench_dir: Option<PathBuf>,
}

impl Ctx {
    pub fn cuda(&self) -> bool {
        self.device.is_cuda()
    }

    pub fn device_key(&self) -> &'static str {
        if self.cuda() { "cuda:0" } else { "cpu" }
    }
}

/// What a step found.
pub struct Outcome {
    pub pass: bool,
    pub summary: String,
    pub figures: Map<String, Value>,
    /// Why the step could not check what it is for on this machine (the report says "not
    /// run"), for a reason that is the machine's, not kiln's.
    pub not_run: Option<String>,
}

impl Outcome {
    pub fn new(pass: bool, summary: impl Into<String>) -> Self {
        Self {
            pass,
            summary: summary.into(),
            figures: Map::new(),
            not_run: None,
        }
    }

    /// A step that could not run here, and why.
    pub fn not_run(why: impl Into<String>) -> Self {
        let why = why.into();
        Self {
            not_run: Some(why.clone()),
            ..Self::new(false, format!("not run: {why}"))
        }
    }

    pub fn figure(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.figures.insert(key.to_owned(), value.into());
        self
    }
}

/// The command's options.
#[derive(Debug, Clone, clap::Args)]
pub struct GpuCheckArgs {
    /// Directory for report.json, report.md and each step's log (must not exist yet;
    /// default gpu-check-<time>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Exit non-zero when there is no CUDA device (the CUDA steps could not run).
    #[arg(long)]
    pub require_gpu: bool,
    /// Only these steps (comma-separated; default all).
    #[arg(long, value_name = "STEP,…", value_delimiter = ',')]
    pub steps: Option<Vec<String>>,
    /// All steps (or those `--steps` names) but these (comma-separated).
    #[arg(long, value_name = "STEP,…", value_delimiter = ',')]
    pub skip: Vec<String>,
    /// Where the benchmark binaries are (default: beside this binary).
    #[arg(long, value_name = "DIR")]
    pub bench_dir: Option<PathBuf>,
    /// Run one step in this process (used by gpu-check itself).
    #[arg(long, hide = true, value_name = "STEP")]
    pub step: Option<String>,
}

/// `kiln gpu-check`.
pub fn run(args: &GpuCheckArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the kiln binary itself")?;
    let bench_dir = args
        .bench_dir
        .clone()
        .or_else(|| exe.parent().map(Path::to_path_buf));
    if let Some(name) = &args.step {
        let dir = args.out.clone().context("--step needs --out")?;
        return run_step(name, dir, exe, bench_dir);
    }
    let chosen = chosen_steps(args.steps.as_deref(), &args.skip)?;
    let out = out_dir(args.out.as_deref())?;
    let cuda = kiln_device::libtorch::libtorch_info()
        .map(|i| i.cuda_device_count > 0)
        .unwrap_or(false);
    let mut report = new_report(cuda);
    eprintln!("kiln gpu-check: {} → {}", report.gpu, out.display());
    for s in STEPS.iter().filter(|s| chosen.contains(&s.name)) {
        let result = if s.needs == Needs::Cuda && !cuda {
            StepResult::not_run(s.name, "no CUDA device")
        } else {
            spawn_step(s, &out, &exe, bench_dir.as_deref())
        };
        eprintln!(
            "{:<26} {:<7} {}",
            s.name,
            result.status.word(),
            result.summary
        );
        report.steps.push(result);
    }
    for (name, why) in NOT_YET.iter().filter(|(n, _)| chosen.contains(n)) {
        report.steps.push(StepResult::not_run(name, why));
    }
    report.write(&out)?;
    println!("{}", report.table());
    println!("wrote {0}/report.json, {0}/report.md", out.display());
    Ok(exit_code(&report, cuda, args.require_gpu))
}

/// 1 when a step failed; 2 when `--require-gpu` and there is no CUDA device; else 0.
fn exit_code(report: &Report, cuda: bool, require_gpu: bool) -> ExitCode {
    if report.count(Status::Fail) > 0 {
        ExitCode::FAILURE
    } else if require_gpu && !cuda {
        eprintln!("kiln gpu-check: --require-gpu and no CUDA device: the CUDA steps did not run");
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

/// The step names chosen with `--steps` (validated), or all of them.
fn chosen_steps(
    wanted: Option<&[String]>,
    skipped: &[String],
) -> anyhow::Result<Vec<&'static str>> {
    let all: Vec<&'static str> = STEPS
        .iter()
        .map(|s| s.name)
        .chain(NOT_YET.iter().map(|(n, _)| *n))
        .collect();
    for (flag, names) in [("--steps", wanted.unwrap_or_default()), ("--skip", skipped)] {
        if let Some(w) = names.iter().find(|w| !all.contains(&w.as_str())) {
            anyhow::bail!(
                "{flag}: `{w}` is not a gpu-check step; the steps are: {}",
                all.join(", ")
            );
        }
    }
    Ok(all
        .into_iter()
        .filter(|n| wanted.is_none_or(|w| w.iter().any(|w| w == n)))
        .filter(|n| !skipped.iter().any(|s| s == n))
        .collect())
}

/// The report directory: `--out` (which must not exist or be empty) or `gpu-check-<time>`.
fn out_dir(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = given.map_or_else(
        || PathBuf::from(format!("gpu-check-{}", kiln_train::rundir::timestamp_now())),
        Path::to_path_buf,
    );
    let occupied = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some());
    if occupied || dir.is_file() {
        anyhow::bail!(
            "--out {}: already exists and is not empty; gpu-check never overwrites a report \
             (give a new directory)",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir.join("steps"))
        .with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

fn new_report(cuda: bool) -> Report {
    let info = kiln_device::libtorch::libtorch_info().ok();
    let gpu = if cuda {
        kiln_torch_ext::cuda::device_properties(0)
            .map(|p| {
                format!(
                    "cuda:0: {} ({:.0} GiB)",
                    p.name,
                    p.total_memory_bytes as f64 / GIB
                )
            })
            .unwrap_or_else(|e| format!("cuda:0 (properties unreadable: {e})"))
    } else {
        "none: no CUDA device (the CUDA steps do not run)".to_owned()
    };
    Report {
        kiln_version: env!("CARGO_PKG_VERSION").to_owned(),
        libtorch: info.map_or_else(
            || "unknown".to_owned(),
            |i| format!("{} at {}", i.version, i.lib_dir.display()),
        ),
        gpu,
        cpu: kiln_device::probe::probe_cpu().model,
        created: kiln_train::rundir::timestamp_now(),
        steps: vec![],
    }
}

/// Runs `step` as `kiln gpu-check --step NAME --out DIR/steps/NAME`, its output in
/// `steps/NAME.log`, and reads the `result.json` it leaves.
fn spawn_step(step: &Step, out: &Path, exe: &Path, bench_dir: Option<&Path>) -> StepResult {
    let dir = out.join("steps").join(step.name);
    let log_rel = format!("steps/{}.log", step.name);
    let started = Instant::now();
    let mut result = match spawn_and_wait(step, &dir, &out.join(&log_rel), exe, bench_dir) {
        Ok(()) => read_result(step.name, &dir),
        Err(e) => failed(step.name, format!("{e:#}")),
    };
    result.seconds = started.elapsed().as_secs_f64();
    result.log = Some(log_rel);
    result
}

fn spawn_and_wait(
    step: &Step,
    dir: &Path,
    log: &Path,
    exe: &Path,
    bench_dir: Option<&Path>,
) -> anyhow::Result<()> {
    let log_file =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut cmd = Command::new(exe);
    cmd.args(["gpu-check", "--step", step.name, "--out"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    if let Some(b) = bench_dir {
        cmd.arg("--bench-dir").arg(b);
    }
    let mut child = cmd.spawn().context("cannot start the step's process")?;
    let deadline = Instant::now() + Duration::from_secs(step.timeout_s);
    loop {
        if let Some(status) = child.try_wait()? {
            return if status.success() || dir.join("result.json").is_file() {
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "the step's process ended with {status} and no result"
                ))
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("timed out after {} s (stopped)", step.timeout_s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read_result(name: &str, dir: &Path) -> StepResult {
    let path = dir.join("result.json");
    std::fs::read_to_string(&path)
        .map_err(anyhow::Error::from)
        .and_then(|t| Ok(serde_json::from_str::<StepResult>(&t)?))
        .unwrap_or_else(|e| failed(name, format!("no readable {}: {e}", path.display())))
}

fn failed(name: &str, why: String) -> StepResult {
    let mut r = StepResult::not_run(name, "");
    r.status = Status::Fail;
    r.summary = why;
    r
}

/// The step process: runs one step and writes its `result.json`.
fn run_step(
    name: &str,
    dir: PathBuf,
    exe: PathBuf,
    bench_dir: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let step = STEPS
        .iter()
        .find(|s| s.name == name)
        .with_context(|| format!("`{name}` is not a gpu-check step"))?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let _ = kiln_device::libtorch::ensure_cuda_library();
    let cuda = kiln_torch_ext::cuda::device_count().unwrap_or(0) > 0;
    let device = if cuda {
        tch::Device::Cuda(0)
    } else {
        tch::Device::Cpu
    };
    let ctx = Ctx {
        dir: dir.clone(),
        device,
        exe,
        bench_dir,
    };
    let started = Instant::now();
    let outcome = (step.run)(&ctx).unwrap_or_else(|e| Outcome::new(false, format!("{e:#}")));
    let result = StepResult {
        step: name.to_owned(),
        status: match (&outcome.not_run, outcome.pass) {
            (Some(_), _) => Status::NotRun,
            (None, true) => Status::Pass,
            (None, false) => Status::Fail,
        },
        summary: outcome.summary,
        figures: outcome.figures,
        device: Some(ctx.device_key().to_owned()),
        seconds: started.elapsed().as_secs_f64(),
        log: None,
    };
    let json = serde_json::to_string_pretty(&result)?;
    std::fs::write(dir.join("result.json"), json)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes a new file; an existing one is an error, never overwritten.
pub fn write_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {} (it must not exist)", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Seconds `f` takes, with the device synchronised before and after.
pub fn timed<T>(
    device: tch::Device,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, f64)> {
    kiln_torch_ext::cuda::synchronize(device)?;
    let t = Instant::now();
    let v = f()?;
    kiln_torch_ext::cuda::synchronize(device)?;
    Ok((v, t.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_named_once_and_chosen_by_name() {
        let all = chosen_steps(None, &[]).unwrap();
        let mut unique = all.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), all.len());
        let some = chosen_steps(Some(&["serve".to_owned(), "doctor".to_owned()]), &[]).unwrap();
        assert_eq!(
            some,
            vec!["doctor", "serve"],
            "report order is the steps' order"
        );
        let err = chosen_steps(Some(&["nope".to_owned()]), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`nope` is not a gpu-check step") && err.contains("cuda-graphs"));
        let skipped = ["bench-train".to_owned(), "doctor".to_owned()];
        let rest = chosen_steps(None, &skipped).unwrap();
        assert_eq!(rest.len(), all.len() - 2);
        assert!(!rest.contains(&"doctor") && rest.contains(&"serve"));
        let err = chosen_steps(None, &["nope".to_owned()])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--skip: `nope`"), "{err}");
    }

    #[test]
    fn an_occupied_out_dir_is_refused_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("keep.txt"), "mine").unwrap();
        let err = out_dir(Some(tmp.path())).unwrap_err().to_string();
        assert!(err.contains("already exists and is not empty"), "{err}");
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("keep.txt")).unwrap(),
            "mine"
        );
        let fresh = tmp.path().join("new");
        assert!(out_dir(Some(&fresh)).unwrap().join("steps").is_dir());
    }

    #[test]
    fn exit_codes_follow_failures_and_require_gpu() {
        let mut r = new_report(false);
        r.steps
            .push(StepResult::not_run("cuda-graphs", "no CUDA device"));
        assert_eq!(exit_code(&r, false, false), ExitCode::SUCCESS);
        assert_eq!(exit_code(&r, false, true), ExitCode::from(2));
        r.steps.push(failed("doctor", "broken".to_owned()));
        assert_eq!(exit_code(&r, false, false), ExitCode::FAILURE);
    }
}
