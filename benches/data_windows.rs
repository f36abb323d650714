//! The data suite's windows row: kiln's windowed loader against pytorch-forecasting's
//! `TimeSeriesDataSet` on the same CSV and windows; `kiln-bench data windows-probe` is kiln's side.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use kiln_benches::python_script;
use kiln_benches::report::{SAMPLES_S, SuiteOutput};
use kiln_benches::{Msg, Result, SuiteArgs, command, interleaved, median, num, peers};
use kiln_data::{DType, Loader, TargetNormalizer, WindowColumns, Windows};
use serde_json::{Value, json};
use tch::Kind;

/// History and horizon of a window, in steps; the batch.
const ENCODER: usize = 48;
const HORIZON: usize = 12;
const BATCH: usize = 64;
/// The goal: kiln reads at least this many times the windows per second.
const GOAL: f64 = 3.0;
const NAME: &str = "windowed time series: loader steady state (epoch 2), 0 workers";

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The windowed dataset.
    #[arg(long)]
    dir: PathBuf,
    #[command(flatten)]
    loader: crate::data::LoaderArgs,
}

/// Epochs of kiln's loader over every window of `--dir`, read by name, each batch's arrays
/// copied into tensors (as the trainer's by-name feed does) and summed; prints one JSON line.
pub fn probe(ProbeArgs { dir, loader: a }: &ProbeArgs) -> Result<()> {
    kiln_torch_ext::memory::set_num_threads(a.threads).msg()?;
    let windows = Windows::open(dir).msg()?;
    let (train, _) = windows.split(0).msg()?;
    let mut config = crate::data::loader_config(a.batch_size, a.workers, a.threads);
    config.by_name = true;
    let mut loader = Loader::new(Arc::new(train), config).msg()?;
    let (mut epochs, mut samples, mut target_sum) = (vec![], 0, 0.0);
    for epoch in 0..a.epochs.max(1) {
        let started = Instant::now();
        samples = 0;
        for batch in loader.epoch(epoch as u64) {
            let batch = batch.msg()?;
            target_sum += consume(&batch)?;
            samples += batch.indices.len();
        }
        epochs.push(started.elapsed().as_secs_f64());
    }
    let result = json!({"impl": "kiln", "epoch_seconds": epochs, "samples_per_epoch": samples,
                        "target_sum": target_sum});
    println!("{result}");
    Ok(())
}

/// Every array of `batch` as a tensor, summed; returns the targets' sum.
fn consume(batch: &kiln_data::Batch) -> Result<f64> {
    for a in &batch.arrays {
        let kind = match a.dtype {
            DType::I64 => Kind::Int64,
            _ => Kind::Float,
        };
        let shape: Vec<i64> = a.shape.iter().map(|&d| d as i64).collect();
        let t = tch::Tensor::f_from_data_size(&a.data, &shape, kind).msg()?;
        let _sum = t.f_sum(Kind::Double).msg()?;
    }
    let kiln_data::Targets::Values(y) = &batch.targets else {
        return Err("value targets expected".to_owned());
    };
    let y = tch::Tensor::f_from_slice(y).msg()?;
    y.f_sum(Kind::Double)
        .and_then(|s| s.f_double_value(&[]))
        .msg()
}

/// The long-format CSV (`series` × `steps` rows) and kiln's windows over it, made once.
fn data(work: &Path, series: usize, steps: usize) -> Result<(PathBuf, PathBuf)> {
    let csv = work.join(format!("long-{series}x{steps}.csv"));
    let dir = work.join(format!("windows-{series}x{steps}-e{ENCODER}-h{HORIZON}"));
    if dir.join(kiln_data::WINDOWS_FILE).exists() {
        return Ok((csv, dir));
    }
    std::fs::create_dir_all(work).at(work)?;
    let mut text = String::from("series,t,y,price,holiday,temp,footfall,region\n");
    for s in 0..series {
        for t in 0..steps {
            let x = t as f64;
            let y = 10.0 * s as f64 + (0.2 * x + s as f64).sin() * (1.0 + s as f64 % 5.0);
            let (price, holiday) = (1.0 + 0.01 * x, f64::from(t % 7 == 0));
            let (temp, footfall) = ((0.05 * x).cos() * 10.0, ((t * 13 + s) % 17) as f64);
            let region = ["north", "south", "east"][s % 3];
            text += &format!("s{s:03},{t},{y},{price},{holiday},{temp},{footfall},{region}\n");
        }
    }
    std::fs::write(&csv, text).at(&csv)?;
    let columns = json!({"time": "t", "group": ["series"], "target": ["y"],
                         "known": ["price", "holiday"], "unknown": ["temp", "footfall", "y"],
                         "static_categoricals": ["region"]});
    let source = kiln_data::WindowsSource {
        table: csv.clone(),
        format: kiln_data::TableFormat::Csv,
        delimiter: b',',
        columns: serde_json::from_value::<WindowColumns>(columns).msg()?,
        encoder_length: ENCODER,
        min_encoder_length: None,
        horizon: HORIZON,
        normalize: TargetNormalizer::Group,
    };
    kiln_data::prepare_windows(&source, &dir).msg()?;
    Ok((csv, dir))
}

/// Measures both sides, alternating, and pushes the row (a skip without pytorch-forecasting).
pub fn push_row(out: &mut SuiteOutput, a: &SuiteArgs, work: &Path, threads: usize) -> Result<()> {
    let Ok(peers) = peers::dir().map_err(|why| out.skip(NAME, &why)) else {
        return Ok(());
    };
    let repeats = a.repeats_or(if a.quick { 1 } else { 3 }).max(1);
    let (series, steps) = if a.quick { (8, 120) } else { (48, 240) };
    let (csv, dir) = data(work, series, steps)?;
    let me = std::env::current_exe().msg()?;
    let common = format!("--batch-size {BATCH} --workers 0 --epochs 2 --threads {threads}");
    let runs = interleaved(repeats, 2, |side| {
        let mut cmd = if side == 0 {
            command(&me, &["data", "windows-probe", "--dir"])
        } else {
            let mut c = python_script(&a.python, "pf_loader.py");
            let window = format!("--encoder-length {ENCODER} --horizon {HORIZON} --csv");
            peers::put_first_on_path(&mut c, &peers);
            c.args(window.split_whitespace());
            c
        };
        cmd.arg(if side == 0 { &dir } else { &csv });
        cmd.args(common.split_whitespace());
        cmd
    })?;
    let (kiln, theirs) = (&runs[0], &runs[1]);
    let (a, b) = (&kiln[0], &theirs[0]);
    let (ka, kb) = (a["target_sum"].as_f64(), b["target_sum"].as_f64());
    let same = a["samples_per_epoch"] == b["samples_per_epoch"]
        && matches!((ka, kb), (Some(x), Some(y)) if (x - y).abs() <= 1e-4 * y.abs().max(1.0));
    if !same {
        return Err(format!(
            "the windows differ: kiln read {} windows (targets summing to {ka:?}), \
             pytorch-forecasting {} ({kb:?})",
            a["samples_per_epoch"], b["samples_per_epoch"]
        ));
    }
    // The last epoch's samples/s, the median over runs.
    let steady = |r: &Value| {
        let last = r["epoch_seconds"].as_array().and_then(|e| e.last());
        num(&r["samples_per_epoch"]) / last.map_or(f64::NAN, num)
    };
    let rate = |runs: &[Value]| median(runs.iter().map(steady).collect());
    let baseline = "pytorch-forecasting TimeSeriesDataSet + its DataLoader (to_dataloader), 0 \
                    workers";
    let what = "every window trains; target normalised per series (GroupNormalizer) and among \
                the unknown reals, 2 known and 2 more unknown reals, 1 static categorical; \
                shuffled; each batch's tensors summed on both sides; the figure is the second \
                epoch's samples/s, the median over runs";
    let setup = json!({"series": series, "steps": steps, "encoder_length": ENCODER,
                       "horizon": HORIZON, "batch_size": BATCH, "threads": threads,
                       "windows": a["samples_per_epoch"], "what": what});
    let figures = (rate(kiln), rate(theirs));
    let row = out.row("windows", NAME, SAMPLES_S, figures, baseline);
    let row = row.at_least(GOAL).detail("setup", setup);
    out.push(row.detail("runs", json!({"kiln": kiln, "pytorch_forecasting": theirs})));
    Ok(())
}
