//! The data suite's `data.num_workers = auto` row: `kiln train` (the MLP on the suite's shards)
//! with `auto` against each worker count it would try, fixed; steady-state samples/s.

use std::path::Path;

use kiln_benches::report::{SAMPLES_S, SuiteOutput};
use kiln_benches::run_cli::{kiln_train, read_summary, remove_dir, run};
use kiln_benches::{Msg, Result, alternating, median, median_of};
use kiln_train::workers;
use serde_json::{Value, json};

/// The goal: `auto` keeps at least this share of the best fixed count's samples/s.
const GOAL: f64 = 0.95;
const BATCH: usize = 64;
/// Epochs timed after those the measurement may reach; a run's figure is their median.
const STEADY_EPOCHS: usize = 3;
/// What the row's figures are.
const STEADY: &str = "each run's median samples/s over its last 3 epochs (after auto's \
    measurement), the median over runs";

/// A run's `data.num_workers`: a fixed count, or `auto` (`None`).
fn value(workers: Option<usize>) -> String {
    workers.map_or_else(|| "auto".to_owned(), |n| n.to_string())
}

/// One run of `sets` with `data.num_workers` = `count`: the median samples/s of its last
/// [`STEADY_EPOCHS`] epochs and what `auto` kept.
fn kiln_run(data: &Path, runs: &Path, sets: &[String], count: Option<usize>) -> Result<Value> {
    remove_dir(runs)?;
    let workers = format!("data.num_workers={}", value(count));
    run(kiln_train("data", data, &[sets, &[workers]].concat())?)?;
    let (run_dir, summary) = read_summary(runs)?;
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).at(&run_dir)?;
    let epochs: Vec<f64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["kind"] == "epoch")
        .filter_map(|r| r["samples_per_s"].as_f64())
        .collect();
    if epochs.len() < STEADY_EPOCHS {
        let dir = run_dir.display();
        return Err(format!("{dir}: fewer than {STEADY_EPOCHS} epochs"));
    }
    let steady = &epochs[epochs.len() - STEADY_EPOCHS..];
    Ok(json!({
        "samples_per_s": median(steady.to_vec()), "steady_epochs_samples_per_s": steady,
        "run_samples_per_s": summary["samples_per_s"],
        "num_workers_auto": summary["num_workers_auto"],
    }))
}

/// Measures every fixed count and `auto` on the shards `data`, alternating; pushes the row.
pub fn push_row(
    out: &mut SuiteOutput,
    (data, samples): (&Path, usize),
    work: &Path,
    (repeats, threads): (usize, usize),
) -> Result<()> {
    let ceiling = usize::try_from(kiln_benches::resolve(&[])?.plan.data.num_workers).msg()?;
    let fixed = workers::candidates(ceiling).into_iter().map(Some);
    let sides: Vec<Option<usize>> = fixed.chain([None]).collect();
    // Enough epochs that the last few come after the measurement's steps.
    let measuring = (sides.len() - 1) * (workers::SKIPPED + workers::MAX_MEASURED);
    let epochs = (measuring.div_ceil((samples / BATCH).max(1)) + STEADY_EPOCHS) as u64;
    let runs_dir = work.join("auto-runs");
    // Every run: the MLP, `epochs` epochs of [`BATCH`], no validation or checkpoints.
    let sets = format!(
        "model.name=mlp train.batch_size={BATCH} train.epochs={epochs} data.val_fraction=0 \
         checkpoint.enabled=false performance.intra_op_threads={threads} run.name=auto"
    );
    let mut sets: Vec<String> = sets.split_whitespace().map(str::to_owned).collect();
    sets.push(format!("run.output_dir={}", runs_dir.display()));
    let runs = alternating(repeats, &sides, |_, w| {
        kiln_run(data, &runs_dir, &sets, w).map(Some)
    })?;
    let steady: Vec<f64> = runs.iter().map(|r| median_of(r, "samples_per_s")).collect();
    let (auto, fixed) = steady.split_last().ok_or("no worker count was measured")?;
    let best = (0..fixed.len()).max_by(|&a, &b| fixed[a].total_cmp(&fixed[b]));
    let best = best.ok_or("no worker count was measured")?;
    let counts: Vec<String> = sides.iter().map(|&w| value(w)).collect();
    let per_count: std::collections::BTreeMap<_, _> = counts.iter().zip(&runs).collect();
    let name = "training samples/s, data.num_workers = auto vs the best fixed count";
    let best_count = &counts[best];
    let baseline = format!("kiln, data.num_workers = {best_count} (the best fixed count)");
    let row = out.row("auto", name, SAMPLES_S, (*auto, fixed[best]), baseline);
    let row = row.at_least(GOAL).detail("counts", json!(counts));
    let row = row.detail("runs", json!(per_count));
    let row = row.detail("epochs", json!(epochs));
    out.push(row.detail("steady_state", json!(STEADY)));
    remove_dir(&runs_dir)
}
