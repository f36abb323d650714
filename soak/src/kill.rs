//! `kiln-soak kill`: `kiln train` (the release CLI beside this binary) killed with SIGKILL
//! `--kills` times (20) in each scenario, each time at a phase chosen in turn, and started again
//! (`--resume` once a checkpoint exists), then run to its end.
//!
//! Phases: at a named fault point (`KILN_FAULT=POINT:N`, `kiln_train::fault`: mid-step,
//! mid-checkpoint-write, mid-validation, during the batch-size search), N drawn from the seed;
//! and `random`, a SIGKILL from here after a random time. Scenarios: `single` (one process;
//! step, checkpoint-write, validation, random), `ddp` (2 ranks started by `kiln train
//! --nproc-per-node 2`; step, checkpoint-write, validation, random) and `batch-search` (a new run with
//! `--batch-size auto` and an empty cache, killed during its search).
//!
//! Goals: every start after a kill completes or is killed again (no other failure); no
//! checkpoint is ever found damaged (kiln writes each under a temporary name and renames it, so
//! a kill leaves none: a resume that reports one, or a `.damaged-` directory, is a miss); and,
//! for `single` and `ddp`, the finished run's step and epoch records (timings and memory aside) equal an
//! uninterrupted run's bit for bit. The batch-size search measures speed, so its scenario's
//! finished run is checked for completing only. The report is JSON (`--out`, default
//! `<target>/kiln-bench/soak-kill.json`); a missed goal fails the command.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use kiln_benches::{Msg, Result, report_path};
use serde_json::{Value, json};

use super::server::write_json;
use super::traffic::splitmix64;
use kiln_benches::run_cli::kiln_exe;

/// `kiln-soak kill`'s options.
#[derive(Debug, Args)]
pub struct KillArgs {
    /// Kills per scenario.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// The scenarios: single, ddp, batch-search.
    #[arg(long, value_delimiter = ',', default_value = "single,ddp,batch-search")]
    scenarios: Vec<String>,
    /// The seed of the phases' arrival counts and the random kills' times.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The JSON report (default: <target>/kiln-bench/soak-kill.json).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Scratch directory (default: a temporary one, removed afterwards).
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
}

/// A way to kill a run: at the Nth arrival at a fault point (N drawn from `1..=most`), or
/// after a random time.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Fault { point: &'static str, most: u64 },
    Random,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Fault { point, .. } => point,
            Phase::Random => "random",
        }
    }
}

const STEP: Phase = Phase::Fault {
    point: "step",
    most: 7,
};
const CHECKPOINT: Phase = Phase::Fault {
    point: "checkpoint-write",
    most: 4,
};
const VALIDATION: Phase = Phase::Fault {
    point: "validation",
    most: 3,
};
const SEARCH: Phase = Phase::Fault {
    point: "batch-search",
    most: 3,
};

/// A scenario: its name, the phases it kills at in turn, the `kiln train` arguments beyond the
/// job's, and whether its finished run must equal an uninterrupted one.
struct Scenario {
    name: &'static str,
    phases: &'static [Phase],
    extra: &'static [&'static str],
    compare: bool,
}

const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "single",
        phases: &[STEP, CHECKPOINT, VALIDATION, Phase::Random],
        extra: &["--batch-size", "16", "--epochs", "8"],
        compare: true,
    },
    Scenario {
        name: "ddp",
        phases: &[STEP, CHECKPOINT, VALIDATION, Phase::Random],
        extra: &[
            "--batch-size",
            "16",
            "--epochs",
            "16",
            "--nproc-per-node",
            "2",
            // Steps long enough that a random kill lands in training, not only in the start.
            "--set",
            "model.hidden=1024,1024",
        ],
        compare: true,
    },
    Scenario {
        name: "batch-search",
        phases: &[SEARCH],
        extra: &["--batch-size", "auto", "--epochs", "1"],
        compare: false,
    },
];

/// The job every scenario trains (its epochs and batch size the scenario's): an MLP on
/// synthetic data (512 samples, a tenth for validation), a checkpoint every 3 steps,
/// validation every epoch, in fp32 on the CPU.
fn job_args(out: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--model",
        "mlp",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--run-name",
        "soak",
        "--workers",
        "1",
        "--set",
        "model.hidden=256,256",
        "--set",
        "data.synthetic_samples=512",
        "--set",
        "checkpoint.every_steps=3",
        "--set",
        "checkpoint.keep_last=2",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend([
        "--set".to_owned(),
        format!("run.output_dir={}", out.display()),
    ]);
    args
}

/// Runs the soak in its scratch directory.
pub fn run(a: &KillArgs) -> Result<()> {
    let temporary = a.work_dir.is_none();
    let work = a.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("kiln-soak-kill-{}", std::process::id()))
    });
    std::fs::create_dir_all(&work).at(&work)?;
    let result = soak(a, &work);
    if temporary {
        let _ = std::fs::remove_dir_all(&work);
    }
    result
}

fn soak(a: &KillArgs, work: &Path) -> Result<()> {
    let kiln = kiln_exe("soak")?;
    let mut reports = vec![];
    for name in &a.scenarios {
        let scenario = SCENARIOS
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| format!("no scenario `{name}` (single, ddp, batch-search)"))?;
        let mut soaker = Soaker {
            kiln: &kiln,
            work: work.join(scenario.name),
            scenario,
            rng: a.seed,
        };
        reports.push(soaker.run(a.kills)?);
    }
    let missed: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r["missed"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|m| format!("{}: {}", r["scenario"].as_str().unwrap_or("?"), m))
        })
        .collect();
    let report = json!({"kills_per_scenario": a.kills, "seed": a.seed, "scenarios": reports});
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| report_path("soak-kill.json"));
    write_json(&out, &report)?;
    eprintln!("report: {}", out.display());
    if missed.is_empty() {
        Ok(())
    } else {
        Err(format!("the kill soak missed: {}", missed.join("; ")))
    }
}

/// How one start of `kiln train` ended.
struct Ended {
    status: ExitStatus,
    stderr: String,
    killed: bool,
}

/// One scenario's soak.
struct Soaker<'a> {
    kiln: &'a Path,
    work: PathBuf,
    scenario: &'a Scenario,
    rng: u64,
}

impl Soaker<'_> {
    fn next(&mut self) -> u64 {
        self.rng = splitmix64(self.rng);
        self.rng
    }

    /// `kiln train` for this scenario writing under `out`, with `resume`, and `env`.
    fn command(&self, out: &Path, resume: bool, env: Option<(&str, String)>) -> Command {
        let mut cmd = Command::new(self.kiln);
        cmd.args(job_args(out))
            .args(self.scenario.extra)
            .env("KILN_CACHE_DIR", self.work.join("cache"))
            .env_remove("KILN_FAULT")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if resume {
            cmd.arg("--resume");
        }
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs `cmd`; with `kill_after`, kills it (SIGKILL) after that long.
    fn start(cmd: &mut Command, kill_after: Option<Duration>) -> Result<Ended> {
        let mut child = cmd.spawn().msg()?;
        let mut stderr = child.stderr.take().ok_or("no stderr")?;
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        let mut killed = false;
        if let Some(after) = kill_after {
            let start = Instant::now();
            while start.elapsed() < after {
                if child.try_wait().msg()?.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if child.try_wait().msg()?.is_none() {
                child.kill().msg()?;
                killed = true;
            }
        }
        let status = child.wait().msg()?;
        let stderr = reader.join().map_err(|_| "the stderr reader panicked")?;
        let killed = killed || stderr.contains("KILN_FAULT: killing");
        Ok(Ended {
            status,
            stderr,
            killed,
        })
    }

    /// The uninterrupted run's learning curve, where the scenario compares.
    fn baseline(&self) -> Result<Option<(Vec<Value>, f64)>> {
        if !self.scenario.compare {
            return Ok(None);
        }
        let out = self.work.join("baseline");
        let start = Instant::now();
        let ended = Self::start(&mut self.command(&out, false, None), None)?;
        if !ended.status.success() {
            return Err(format!(
                "the uninterrupted {} run failed: {}",
                self.scenario.name,
                last_lines(&ended.stderr)
            ));
        }
        Ok(Some((learning_curve(&out)?, start.elapsed().as_secs_f64())))
    }

    fn run(&mut self, kills: usize) -> Result<Value> {
        eprintln!("soak kill: scenario {}", self.scenario.name);
        let baseline = self.baseline()?;
        let typical = baseline.as_ref().map_or(6.0, |(_, s)| *s);
        let out = self.work.join("soaked");
        let mut tally = Tally::default();
        let mut missed = vec![];
        for k in 0..kills {
            let phase = self.scenario.phases[k % self.scenario.phases.len()];
            let resume = has_checkpoint(&out);
            if !resume {
                // Nothing to resume: a new run, in place of the one killed before its first
                // checkpoint.
                let _ = std::fs::remove_dir_all(&out);
            }
            let (env, after) = match phase {
                Phase::Fault { point, most } => {
                    let n = 1 + self.next() % most;
                    (Some(("KILN_FAULT", format!("{point}:{n}"))), None)
                }
                Phase::Random => {
                    // Within a sixteenth of an uninterrupted run, past kiln's start.
                    let ms = 300 + self.next() % (typical * 62.5).max(1.0) as u64;
                    (None, Some(Duration::from_millis(ms)))
                }
            };
            let ended = Self::start(&mut self.command(&out, resume, env), after)?;
            tally.count(phase.name(), resume, &ended);
            if !ended.killed && !ended.status.success() {
                missed.push(format!(
                    "start {k} ({}) failed otherwise than killed: {}",
                    phase.name(),
                    last_lines(&ended.stderr)
                ));
            }
        }
        let resume = has_checkpoint(&out);
        if !resume {
            let _ = std::fs::remove_dir_all(&out);
        }
        let last = Self::start(&mut self.command(&out, resume, None), None)?;
        tally.count("final", resume, &last);
        if !last.status.success() {
            missed.push(format!(
                "the final start failed: {}",
                last_lines(&last.stderr)
            ));
        }
        let damaged = damaged_dirs(&out);
        if tally.damaged_reported > 0 || !damaged.is_empty() {
            missed.push(format!(
                "damaged checkpoints: {} reported on resume, {damaged:?} moved aside",
                tally.damaged_reported
            ));
        }
        let equal = match (&baseline, last.status.success()) {
            (Some((curve, _)), true) => {
                let soaked = learning_curve(&out)?;
                let same = &soaked == curve;
                if !same {
                    missed.push(first_difference(curve, &soaked));
                }
                Some(same)
            }
            _ => None,
        };
        let report = json!({
            "scenario": self.scenario.name,
            "kills": tally.kills,
            "kills_per_phase": tally.per_phase,
            "finished_early": tally.finished,
            "resumes": tally.resumes,
            "new_starts": tally.new_starts,
            "damaged_reported": tally.damaged_reported,
            "damaged_moved_aside": damaged,
            "equal_to_uninterrupted": equal,
            "missed": missed,
        });
        eprintln!("{}", serde_json::to_string(&report).unwrap_or_default());
        Ok(report)
    }
}

/// What the starts of a scenario did.
#[derive(Default)]
struct Tally {
    kills: u64,
    per_phase: serde_json::Map<String, Value>,
    finished: u64,
    resumes: u64,
    new_starts: u64,
    damaged_reported: u64,
}

impl Tally {
    fn count(&mut self, phase: &str, resumed: bool, ended: &Ended) {
        if resumed {
            self.resumes += 1;
        } else {
            self.new_starts += 1;
        }
        if ended.stderr.contains("damaged") {
            self.damaged_reported += 1;
        }
        if ended.killed {
            self.kills += 1;
            let n = self
                .per_phase
                .get(phase)
                .and_then(Value::as_u64)
                .unwrap_or(0);
            self.per_phase.insert(phase.to_owned(), json!(n + 1));
        } else if ended.status.success() && phase != "final" {
            self.finished += 1;
        }
    }
}

/// Whether the run under `out` has a checkpoint to resume.
fn has_checkpoint(out: &Path) -> bool {
    run_dirs(out).iter().any(|run| {
        std::fs::read_dir(run.join("checkpoints"))
            .map(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with("step-") && !name.contains('.')
                })
            })
            .unwrap_or(false)
    })
}

fn run_dirs(out: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(out)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// The checkpoints moved aside as damaged under `out`.
fn damaged_dirs(out: &Path) -> Vec<String> {
    run_dirs(out)
        .iter()
        .flat_map(|run| {
            std::fs::read_dir(run.join("checkpoints"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".damaged-"))
        .collect()
}

/// The step and epoch records of the one run under `out`, timings left out: what it learned.
fn learning_curve(out: &Path) -> Result<Vec<Value>> {
    let runs = run_dirs(out);
    let [run] = runs.as_slice() else {
        return Err(format!(
            "{}: {} run directories, expected one",
            out.display(),
            runs.len()
        ));
    };
    let path = run.join("metrics.jsonl");
    // Everything a record says but its timings and memory.
    let timing = [
        "data_wait_share",
        "memory",
        "samples_per_s",
        "seconds",
        "step_time_s",
    ];
    let text = std::fs::read_to_string(&path).at(&path)?;
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).at(&path))
        .filter(|v| {
            v.as_ref()
                .map_or(true, |v| v["kind"] == "step" || v["kind"] == "epoch")
        })
        .map(|v| {
            v.map(|mut v| {
                if let Some(record) = v.as_object_mut() {
                    record.retain(|k, _| !timing.contains(&k.as_str()));
                }
                v
            })
        })
        .collect()
}

fn first_difference(want: &[Value], got: &[Value]) -> String {
    let at = want.iter().zip(got).position(|(w, g)| w != g);
    match at {
        Some(i) => format!(
            "the finished run differs from the uninterrupted one at record {i}: {} vs {}",
            got[i], want[i]
        ),
        None => format!(
            "the finished run has {} step and epoch records, the uninterrupted one {}",
            got.len(),
            want.len()
        ),
    }
}

/// The last lines of a process's stderr, for a message.
fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}
