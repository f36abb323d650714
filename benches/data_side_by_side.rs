//! `cargo xtask bench data`: kiln's loader and `torch.utils.data.DataLoader` side by side on the
//! same safetensors shards, batch size, worker counts (0, 1, 2) and per-sample work (convert to
//! f32, normalize each feature), reporting throughput, first-batch latency and peak memory of
//! the whole process tree (PSS and RSS, polled from /proc) as ratios, and writing a JSON report.
//!
//! `kiln-bench-data probe …` is the kiln side of one run, in its own process so that its memory
//! is measured the way the Python side's is.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_benches::report::{Better, Comparison, SuiteOutput};
use kiln_benches::{bench_root, flag, median, number, python, report_path, suite_out};
use kiln_data::{
    DType, Dataset, Loader, LoaderConfig, Normalize, PrepareOptions, PrepareSource, SamplerConfig,
    ShardFormat, ShardedDataset, SyntheticClassification, Transformed, prepare, write_npy,
};
use serde_json::{Value, json};

const SHAPE: [usize; 2] = [64, 128];
const CLASSES: usize = 10;
const BATCH: usize = 64;
const SEED: u64 = 7;

fn usage() -> ! {
    eprintln!(
        "usage: kiln-bench-data [--quick] [--repeats N] [--out FILE] [--python PY] [--work-dir DIR]\n\
         \x20      kiln-bench-data probe --dir DIR --norm FILE --workers N --batch-size N"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("probe") {
        probe(&args[1..])
    } else {
        compare(&args)
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

type Result<T> = std::result::Result<T, String>;

/// One epoch of kiln's loader over the shards, each batch turned into tensors and checksummed
/// like the Python side does; prints one JSON line.
fn probe(args: &[String]) -> Result<()> {
    let dir = flag(args, "--dir").unwrap_or_else(|| usage());
    let norm = flag(args, "--norm").unwrap_or_else(|| usage());
    let workers = number(args, "--workers", 0)?;
    let batch_size = number(args, "--batch-size", BATCH)?;
    let stats: Value =
        serde_json::from_str(&std::fs::read_to_string(norm).map_err(|e| format!("{norm}: {e}"))?)
            .map_err(|e| format!("{norm}: {e}"))?;
    let floats = |key: &str| -> Vec<f32> {
        stats[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_f64)
                    .map(|v| v as f32)
                    .collect()
            })
            .unwrap_or_default()
    };
    let normalize = Normalize::new(floats("mean"), floats("std")).map_err(|e| e.to_string())?;
    let dataset = ShardedDataset::open(dir).map_err(|e| e.to_string())?;
    let dataset = Arc::new(Transformed::new(dataset, normalize));
    let config = LoaderConfig {
        batch_size,
        num_workers: workers,
        prefetch_factor: 2,
        drop_last: false,
        sampler: SamplerConfig {
            shuffle: true,
            seed: SEED,
            ..SamplerConfig::default()
        },
    };
    // One intra-op thread on both sides: the consumer's tensor work is the same small sum, and
    // idle OpenMP threads spinning on a small machine would only add noise.
    kiln_torch_ext::memory::set_num_threads(1).map_err(|e| e.to_string())?;
    if args.iter().any(|a| a == "--idle") {
        // Report, then hold still until the harness has measured (it closes stdin).
        println!("{}", json!({"impl": "kiln", "idle": true}));
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
        return Ok(());
    }
    let start = Instant::now();
    let mut loader = Loader::new(dataset, config).map_err(|e| e.to_string())?;
    let mut first = None;
    let (mut samples, mut label_sum, mut feature_sum) = (0usize, 0i64, 0f64);
    for batch in loader.epoch(0) {
        let batch = batch.map_err(|e| e.to_string())?;
        let shape: Vec<i64> = batch.shape.iter().map(|&d| d as i64).collect();
        samples += batch.indices.len();
        let labels = match batch.targets {
            kiln_data::Targets::Classes(v) => v,
            kiln_data::Targets::Values(_) => return Err("class labels expected".to_owned()),
        };
        // The batch's buffers become the tensors, as in the trainer's CPU feeder: no copy.
        let x = kiln_torch_ext::transfer::tensor_from_vec_f32(batch.features, &shape)
            .map_err(|e| e.to_string())?;
        let y = kiln_torch_ext::transfer::tensor_from_vec_i64(labels, &shape[..1])
            .map_err(|e| e.to_string())?;
        first.get_or_insert_with(|| start.elapsed());
        label_sum += y
            .f_sum(tch::Kind::Int64)
            .map_err(|e| e.to_string())?
            .int64_value(&[]);
        // A cheap check that both sides produced the same values: the first row of each sample.
        feature_sum += x
            .f_select(1, 0)
            .map_err(|e| e.to_string())?
            .f_sum(tch::Kind::Double)
            .map_err(|e| e.to_string())?
            .double_value(&[]);
    }
    let seconds = start.elapsed().as_secs_f64();
    let stats = loader.stats();
    println!(
        "{}",
        json!({
            "impl": "kiln", "workers": workers, "samples": samples, "seconds": seconds,
            "first_batch_seconds": first.map(|d| d.as_secs_f64()),
            "label_sum": label_sum, "feature_sum": feature_sum,
            "consumer_wait_share": stats.wait_share(),
        })
    );
    Ok(())
}

/// The benchmark dataset: `samples` synthetic f32 samples of [`SHAPE`] in safetensors shards,
/// made once and kept under `work`; plus per-feature normalization statistics.
fn dataset(work: &Path, samples: usize) -> Result<(PathBuf, PathBuf)> {
    let dir = work.join(format!("shards-{samples}x{}x{}", SHAPE[0], SHAPE[1]));
    let norm = dir.join("norm.json");
    if dir.join(kiln_data::MANIFEST_FILE).exists() && norm.exists() {
        return Ok((dir, norm));
    }
    std::fs::create_dir_all(work).map_err(|e| format!("{}: {e}", work.display()))?;
    let synth = SyntheticClassification::new(samples, SHAPE.to_vec(), CLASSES, SEED, 1.0)
        .map_err(|e| e.to_string())?;
    let numel = synth.sample_numel();
    let mut features = Vec::with_capacity(samples * numel * 4);
    let mut labels = Vec::with_capacity(samples * 8);
    let mut buf = vec![0f32; numel];
    for i in 0..samples {
        // Scale and offset so the normalization does real work.
        let label = synth.read(i, &mut buf).map_err(|e| e.to_string())?;
        features.extend(buf.iter().flat_map(|v| (v * 3.0 + 1.5).to_le_bytes()));
        labels.extend(label.to_le_bytes());
    }
    let (fpath, lpath) = (work.join("features.npy"), work.join("labels.npy"));
    write_npy(
        &fpath,
        DType::F32,
        &[samples, SHAPE[0], SHAPE[1]],
        &features,
    )
    .map_err(|e| e.to_string())?;
    write_npy(&lpath, DType::I64, &[samples], &labels).map_err(|e| e.to_string())?;
    drop((features, labels));
    let _ = std::fs::remove_dir_all(&dir); // an incomplete earlier attempt
    let source = PrepareSource::Npy {
        features: fpath.clone(),
        labels: lpath.clone(),
    };
    let options = PrepareOptions {
        shard_samples: 2048,
        format: ShardFormat::Safetensors,
        ..PrepareOptions::default()
    };
    prepare(&source, &dir, &options).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(fpath);
    let _ = std::fs::remove_file(lpath);
    let opened = ShardedDataset::open(&dir).map_err(|e| e.to_string())?;
    let fitted = Normalize::fit(&opened, 512).map_err(|e| e.to_string())?;
    let (mean, std) = fitted.stats();
    std::fs::write(&norm, json!({"mean": mean, "std": std}).to_string())
        .map_err(|e| format!("{}: {e}", norm.display()))?;
    Ok((dir, norm))
}

/// Peak memory of a process tree, in bytes.
#[derive(Debug, Default, Clone, Copy)]
struct Peak {
    pss: u64,
    rss: u64,
}

fn tree(pid: u32, out: &mut Vec<u32>) {
    out.push(pid);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            tree(child, out);
        }
    }
}

fn rollup(pid: u32) -> Peak {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    Peak {
        pss: field("Pss:"),
        rss: field("Rss:"),
    }
}

/// Current PSS and RSS of process `pid` and all its descendants, summed.
fn tree_memory(pid: u32) -> Peak {
    let mut pids = Vec::new();
    tree(pid, &mut pids);
    pids.iter()
        .map(|&p| rollup(p))
        .fold(Peak::default(), |a, b| Peak {
            pss: a.pss + b.pss,
            rss: a.rss + b.rss,
        })
}

/// Runs `cmd`; with `poll`, samples its process tree's memory every 10 ms (reading smaps costs
/// the measured process time, so timing runs do not poll). Returns its JSON line and peaks.
fn measured(mut cmd: Command, poll: bool) -> Result<(Value, Peak)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let mut peak = Peak::default();
    if poll {
        loop {
            let now = tree_memory(child.id());
            peak.pss = peak.pss.max(now.pss);
            peak.rss = peak.rss.max(now.rss);
            if child.try_wait().map_err(|e| e.to_string())?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    let value = serde_json::from_str(line)
        .map_err(|e| format!("{cmd:?} printed no result line ({e}): {text}"))?;
    Ok((value, peak))
}

/// Memory of a process that reports ready on stdout and then waits for stdin to close.
fn idle_memory(mut cmd: Command) -> Result<Peak> {
    use std::io::BufRead;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let mut line = String::new();
    if let Some(out) = child.stdout.as_mut() {
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
    }
    let peak = tree_memory(child.id());
    drop(child.stdin.take());
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() || line.trim().is_empty() {
        return Err(format!("{cmd:?} did not report ready ({status})"));
    }
    Ok(peak)
}

fn compare(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        usage();
    }
    let quick = args.iter().any(|a| a == "--quick");
    let repeats = number(args, "--repeats", if quick { 1 } else { 3 })?.max(1);
    let samples = if quick { 1024 } else { 8192 };
    let python = python(args);
    let root = bench_root();
    let script = root.join("python/torch_loader.py");
    let work = flag(args, "--work-dir").map_or_else(|| report_path("data"), PathBuf::from);
    let out = suite_out(args, "data");
    let me = std::env::current_exe().map_err(|e| e.to_string())?;

    eprintln!(
        "preparing {samples} samples of {SHAPE:?} f32 under {}",
        work.display()
    );
    let (dir, norm) = dataset(&work, samples)?;
    // Warm the page cache so neither side pays for the first read from disk.
    for entry in std::fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .flatten()
    {
        let _ = std::fs::read(entry.path());
    }
    // One run of `side` ("kiln" or "torch") at `workers` workers.
    let command = |side: &str, workers: usize| {
        let mut cmd = if side == "kiln" {
            let mut c = Command::new(&me);
            c.arg("probe");
            c
        } else {
            let mut c = Command::new(&python);
            c.arg(&script);
            c
        };
        cmd.args(["--dir", dir.to_str().unwrap_or_default()])
            .args(["--norm", norm.to_str().unwrap_or_default()])
            .args(["--workers", &workers.to_string()])
            .args(["--batch-size", &BATCH.to_string()]);
        cmd
    };

    // Each side's memory with its libraries loaded and the dataset opened, before any loading:
    // the peaks minus these are what the loaders themselves cost.
    let mut idle = Vec::new();
    for side in ["kiln", "torch"] {
        let mut cmd = command(side, 0);
        cmd.arg("--idle");
        idle.push(idle_memory(cmd)?);
    }
    let mib = |b: u64| b as f64 / 1048576.0;
    let mut runs = Vec::new();
    let mut rows = Vec::new();
    let mut suite = SuiteOutput::new(
        "data",
        &format!(
            "kiln's Loader against torch.utils.data.DataLoader over the same {samples} samples \
             of {SHAPE:?} f32 in safetensors shards: batch {BATCH}, shuffle, 0/1/2 workers, \
             the same per-sample work (f32 + per-feature normalize); memory is the process \
             tree's peak PSS"
        ),
    );
    for workers in [0usize, 1, 2] {
        let mut per_impl: Vec<(Vec<f64>, Vec<f64>, Peak, Value)> =
            vec![(Vec::new(), Vec::new(), Peak::default(), Value::Null); 2];
        // The first round measures memory only; the timing rounds follow, unpolled, the two
        // sides alternating so drift on a busy machine hits both alike.
        for run in 0..=repeats {
            for (side, slot) in ["kiln", "torch"].into_iter().zip(per_impl.iter_mut()) {
                let cmd = command(side, workers);
                let (value, p) = measured(cmd, run == 0)?;
                if run == 0 {
                    slot.2 = p;
                    runs.push(json!({"memory_run": value, "peak_pss_bytes": p.pss,
                                     "peak_rss_bytes": p.rss}));
                } else {
                    let secs = value["seconds"].as_f64().unwrap_or(f64::NAN);
                    slot.0.push(value["samples"].as_f64().unwrap_or(0.0) / secs);
                    slot.1
                        .push(value["first_batch_seconds"].as_f64().unwrap_or(f64::NAN));
                    runs.push(json!({"timing_run": value}));
                }
                slot.3 = value;
            }
        }
        let (k, t) = (&per_impl[0], &per_impl[1]);
        if k.3["samples"] != t.3["samples"] || k.3["label_sum"] != t.3["label_sum"] {
            return Err(format!(
                "the two loaders did not see the same data at {workers} workers: kiln {} vs torch {}",
                k.3, t.3
            ));
        }
        let (fk, ft) = (
            k.3["feature_sum"].as_f64().unwrap_or(0.0),
            t.3["feature_sum"].as_f64().unwrap_or(0.0),
        );
        if (fk - ft).abs() > 1e-3 * ft.abs().max(1.0) {
            return Err(format!(
                "feature sums differ at {workers} workers: {fk} vs {ft}"
            ));
        }
        let row = json!({
            "workers": workers,
            "kiln_samples_per_s": median(k.0.clone()),
            "torch_samples_per_s": median(t.0.clone()),
            "throughput_ratio": median(k.0.clone()) / median(t.0.clone()),
            "kiln_first_batch_s": median(k.1.clone()),
            "torch_first_batch_s": median(t.1.clone()),
            "first_batch_ratio": median(k.1.clone()) / median(t.1.clone()),
            "kiln_peak_pss_mib": k.2.pss as f64 / 1048576.0,
            "torch_peak_pss_mib": t.2.pss as f64 / 1048576.0,
            "peak_pss_ratio": k.2.pss as f64 / t.2.pss as f64,
            "kiln_peak_rss_mib": k.2.rss as f64 / 1048576.0,
            "torch_peak_rss_mib": t.2.rss as f64 / 1048576.0,
            "peak_rss_ratio": k.2.rss as f64 / t.2.rss as f64,
            "kiln_loader_pss_mib": mib(k.2.pss.saturating_sub(idle[0].pss)),
            "torch_loader_pss_mib": mib(t.2.pss.saturating_sub(idle[1].pss)),
            "loader_pss_ratio": k.2.pss.saturating_sub(idle[0].pss) as f64
                / t.2.pss.saturating_sub(idle[1].pss).max(1) as f64,
        });
        let baseline = format!("torch DataLoader, {workers} workers");
        let value = |key: &str| row[key].as_f64().unwrap_or(f64::NAN);
        suite.comparisons.push(
            Comparison::new(
                "data",
                "loader",
                format!("loader throughput, {workers} workers"),
                "samples/s",
                Better::Higher,
                (value("kiln_samples_per_s"), value("torch_samples_per_s")),
                baseline.clone(),
            )
            .at_least(2.0)
            .detail("workers", json!(workers)),
        );
        suite.comparisons.push(
            Comparison::new(
                "data",
                "loader",
                format!("loader first batch, {workers} workers"),
                "ms",
                Better::Lower,
                (
                    value("kiln_first_batch_s") * 1e3,
                    value("torch_first_batch_s") * 1e3,
                ),
                baseline.clone(),
            )
            .detail("workers", json!(workers)),
        );
        suite.comparisons.push(
            Comparison::new(
                "data",
                "loader",
                format!("loader peak memory (PSS), {workers} workers"),
                "MiB",
                Better::Lower,
                (value("kiln_peak_pss_mib"), value("torch_peak_pss_mib")),
                baseline,
            )
            .detail("workers", json!(workers))
            .detail(
                "above_idle_mib",
                json!({"kiln": value("kiln_loader_pss_mib"),
                       "baseline": value("torch_loader_pss_mib")}),
            ),
        );
        eprintln!(
            "workers {workers}: throughput {:>8.0} vs {:>8.0} samples/s ({:.2}×), first batch \
             {:.1} vs {:.1} ms ({:.2}×), peak PSS {:.0} vs {:.0} MiB ({:.2}×), RSS {:.0} vs {:.0} \
             MiB ({:.2}×); above idle: {:.0} vs {:.0} MiB PSS ({:.2}×)",
            row["kiln_samples_per_s"].as_f64().unwrap_or(0.0),
            row["torch_samples_per_s"].as_f64().unwrap_or(0.0),
            row["throughput_ratio"].as_f64().unwrap_or(0.0),
            row["kiln_first_batch_s"].as_f64().unwrap_or(0.0) * 1e3,
            row["torch_first_batch_s"].as_f64().unwrap_or(0.0) * 1e3,
            row["first_batch_ratio"].as_f64().unwrap_or(0.0),
            row["kiln_peak_pss_mib"].as_f64().unwrap_or(0.0),
            row["torch_peak_pss_mib"].as_f64().unwrap_or(0.0),
            row["peak_pss_ratio"].as_f64().unwrap_or(0.0),
            row["kiln_peak_rss_mib"].as_f64().unwrap_or(0.0),
            row["torch_peak_rss_mib"].as_f64().unwrap_or(0.0),
            row["peak_rss_ratio"].as_f64().unwrap_or(0.0),
            row["kiln_loader_pss_mib"].as_f64().unwrap_or(0.0),
            row["torch_loader_pss_mib"].as_f64().unwrap_or(0.0),
            row["loader_pss_ratio"].as_f64().unwrap_or(0.0),
        );
        rows.push(row);
    }
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    suite.details = json!({
        "dataset": {"dir": dir, "samples": samples, "sample_shape": SHAPE, "dtype": "f32",
                    "batch_size": BATCH},
        "repeats": repeats,
        "machine": {"cpus": cpus},
        "idle": {"kiln_pss_mib": mib(idle[0].pss), "kiln_rss_mib": mib(idle[0].rss),
                 "torch_pss_mib": mib(idle[1].pss), "torch_rss_mib": mib(idle[1].rss)},
        "results": rows,
        "runs": runs,
    });
    suite.write(&out)
}
