//! The data suite's `data.num_workers = auto` row: `kiln train` over the suite's shards, whole
//! training steps of a fixed model (the MLP), with each worker count the measurement would try
//! (0, 1, 2, 4, … up to the profile's count, capped by the cores) fixed, and with `auto`. The
//! row compares `auto`'s steady state (the median samples/s of the last epochs, after its
//! measurement on the first steps) with the best fixed count's; the details keep every run's
//! figures and the counts `auto` kept.

use std::path::Path;

use kiln_benches::report::{SAMPLES_S, SuiteOutput};
use kiln_benches::{Msg, Result, alternating, median, median_of};
use kiln_train::workers;
use serde_json::{Value, json};

use kiln_benches::run_cli::{kiln_train, read_summary, remove_dir, run};

/// The goal: `auto` keeps at least this share of the best fixed count's samples/s.
const GOAL: f64 = 0.95;

/// A run's `data.num_workers`: a fixed count, or `auto` (`None`).
fn value(workers: Option<usize>) -> String {
    workers.map_or_else(|| "auto".to_owned(), |n| n.to_string())
}

/// The batch size of every run.
const BATCH: usize = 64;

/// The settings of every run: the MLP on the shards, `epochs` epochs of batch [`BATCH`], no
/// validation, no checkpoints.
fn sets(threads: usize, epochs: u64, runs: &Path, count: Option<usize>) -> Vec<String> {
    vec![
        "model.name=mlp".to_owned(),
        format!("train.batch_size={BATCH}"),
        format!("train.epochs={epochs}"),
        "data.val_fraction=0".to_owned(),
        "checkpoint.enabled=false".to_owned(),
        format!("performance.intra_op_threads={threads}"),
        format!("run.output_dir={}", runs.display()),
        "run.name=auto".to_owned(),
        format!("data.num_workers={}", value(count)),
    ]
}

/// Epochs timed after those the measurement may reach; a run's figure is their median.
const STEADY_EPOCHS: usize = 3;
/// What the row's figures are.
const STEADY: &str = "each run's median samples/s over its last 3 epochs (after auto's \
    measurement), the median over runs";

/// One run: the median samples/s of its last [`STEADY_EPOCHS`] epochs and what `auto` kept
/// (null for a fixed count).
fn kiln_run(data: &Path, sets: &[String], runs: &Path) -> Result<Value> {
    remove_dir(runs)?;
    run(kiln_train("data", data, sets)?)?;
    let (run_dir, summary) = read_summary(runs)?;
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).at(&run_dir)?;
    let epochs: Vec<f64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["kind"] == "epoch")
        .filter_map(|r| r["samples_per_s"].as_f64())
        .collect();
    if epochs.len() < STEADY_EPOCHS {
        return Err(format!(
            "{}: fewer than {STEADY_EPOCHS} epochs",
            run_dir.display()
        ));
    }
    let steady = epochs[epochs.len() - STEADY_EPOCHS..].to_vec();
    Ok(json!({
        "samples_per_s": median(steady.clone()), "steady_epochs_samples_per_s": steady,
        "run_samples_per_s": summary["samples_per_s"],
        "num_workers_auto": summary["num_workers_auto"],
    }))
}

/// Measures every fixed count and `auto` over the `samples` samples in `data`, alternating, and
/// pushes the row.
pub fn auto_row(
    out: &mut SuiteOutput,
    (data, samples): (&Path, usize),
    work: &Path,
    (repeats, threads): (usize, usize),
) -> Result<()> {
    let ceiling = kiln_benches::resolve(&[])?.plan.data.num_workers;
    let ceiling = usize::try_from(ceiling).msg()?;
    let fixed = workers::candidates(ceiling).into_iter().map(Some);
    let sides: Vec<Option<usize>> = fixed.chain([None]).collect();
    // Enough epochs that the last few come after the measurement's steps.
    let measuring = (sides.len() - 1) * (workers::SKIPPED + workers::MAX_MEASURED);
    let epochs = (measuring.div_ceil((samples / BATCH).max(1)) + STEADY_EPOCHS) as u64;
    let runs_dir = work.join("auto-runs");
    let runs = alternating(repeats, &sides, |_, w| {
        kiln_run(data, &sets(threads, epochs, &runs_dir, w), &runs_dir).map(Some)
    })?;
    let steady = |runs: &[Value]| median_of(runs, "samples_per_s");
    let fixed: Vec<f64> = runs[..runs.len() - 1].iter().map(|r| steady(r)).collect();
    let (best, best_rate) = fixed
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, &r)| (sides[i], r))
        .ok_or("no worker count was measured")?;
    let per_count: Value = sides
        .iter()
        .zip(&runs)
        .map(|(&w, r)| (value(w), json!(r)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let name = "training samples/s, data.num_workers = auto vs the best fixed count";
    let baseline = format!(
        "kiln, data.num_workers = {} (the best fixed count)",
        value(best)
    );
    let figures = (steady(&runs[runs.len() - 1]), best_rate);
    let counts: Vec<String> = sides.iter().map(|&w| value(w)).collect();
    let row = out.row("auto", name, SAMPLES_S, figures, baseline);
    let row = row.at_least(GOAL).detail("counts", json!(counts));
    let row = row
        .detail("runs", per_count)
        .detail("epochs", json!(epochs));
    out.push(row.detail("steady_state", json!(STEADY)));
    remove_dir(&runs_dir)
}
