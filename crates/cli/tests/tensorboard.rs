//! TensorBoard event files as a user meets them: `kiln train` writes them into the run
//! directory unless `run.tensorboard = false`, and TensorBoard's own reader finds every scalar
//! of `metrics.jsonl` in them at its step (a resumed run's included) and the resolved
//! configuration as the HParams plugin's hyperparameters.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod common;

use common::{kiln, only_run, python, stderr};
use serde_json::Value;

/// `kiln train` of the MLP for two short epochs of 14 steps, each step logged, a checkpoint
/// every 5 steps.
fn train_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--model",
        "mlp",
        "--device",
        "cpu",
        "--batch-size",
        "32",
        "--set",
        "data.synthetic_samples=512",
        "--set",
        "train.epochs=2",
        "--set",
        "train.log_interval=1",
        "--set",
        "checkpoint.every_steps=5",
        "--set",
        "checkpoint.keep_last=10",
    ]
    .map(str::to_owned)
    .to_vec();
    args.push("--set".to_owned());
    args.push(format!("run.output_dir={}", out.display()));
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

fn train(out: &Path, extra: &[&str]) {
    let args = train_args(out, extra);
    let o = kiln(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// The event files in `run`.
fn event_files(run: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(run)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        })
        .collect();
    files.sort();
    files
}

#[test]
fn event_files_are_written_into_the_run_directory_unless_turned_off() {
    let on = tempfile::tempdir().unwrap();
    train(on.path(), &[]);
    let files = event_files(&only_run(on.path()));
    assert_eq!(files.len(), 1, "{files:?}");
    // events.out.tfevents.<unix seconds>.<host>.<pid>.kiln
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    let parts: Vec<&str> = name.split('.').collect();
    assert_eq!(parts[..3], ["events", "out", "tfevents"], "{name}");
    assert!(parts[3].parse::<u64>().unwrap() > 1_600_000_000, "{name}");
    assert_eq!(parts.last(), Some(&"kiln"), "{name}");
    assert!(std::fs::metadata(&files[0]).unwrap().len() > 1000);

    let off = tempfile::tempdir().unwrap();
    train(off.path(), &["--set", "run.tensorboard=false"]);
    assert_eq!(event_files(&only_run(off.path())), Vec::<PathBuf>::new());
}

/// Reads a run directory with TensorBoard's own `EventAccumulator` and prints its scalars
/// (`{tag: [[step, value], …]}`) and the hyperparameters of the HParams plugin's session start
/// (`{name: {kind: value}}`) as JSON.
const READ_WITH_TENSORBOARD: &str = r#"
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.plugins.hparams import metadata as hp
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
acc.Reload()
scalars = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
hparams = {}
content = acc.PluginTagToContent(hp.PLUGIN_NAME)
info = hp.parse_session_start_info_plugin_data(content[hp.SESSION_START_INFO_TAG])
for name, value in info.hparams.items():
    kind = value.WhichOneof("kind")
    hparams[name] = {kind: getattr(value, kind)}
print(json.dumps({"scalars": scalars, "hparams": hparams}))
"#;

/// What TensorBoard should show for `metrics.jsonl`: each tag's (step, value)s, in the order
/// written.
fn expected_scalars(run: &Path) -> BTreeMap<String, Vec<(u64, f64)>> {
    let records: Vec<Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let metrics: Vec<String> = records
        .iter()
        .find(|r| r["kind"] == "start")
        .and_then(|r| r["metrics"].as_array())
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    let mut out: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for r in &records {
        let step = r["step"].as_u64();
        let mut put = |tag: String, v: &Value| {
            if let (Some(step), Some(v)) = (step, v.as_f64()) {
                out.entry(tag).or_default().push((step, v));
            }
        };
        match r["kind"].as_str().unwrap() {
            "step" => {
                for m in &metrics {
                    put(format!("train/{m}"), &r[m]);
                }
                for k in [
                    "lr",
                    "samples_per_s",
                    "step_time_s",
                    "data_wait_share",
                    "skipped_steps",
                    "grad_norm",
                    "loss_scale",
                ] {
                    put(k.to_owned(), &r[k]);
                }
                for (field, v) in r["memory"].as_object().unwrap() {
                    put(format!("memory/{field}"), v);
                }
            }
            "epoch" => {
                put("epoch".to_owned(), &r["epoch"]);
                for m in &metrics {
                    put(format!("epoch/train_{m}"), &r[format!("train_{m}")]);
                    put(format!("val/{m}"), &r[format!("val_{m}")]);
                }
                for k in ["samples_per_s", "seconds", "data_wait_share"] {
                    put(format!("epoch/{k}"), &r[k]);
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and the bench peers' tensorboard \
            (KILN_BENCH_PEERS); `cargo xtask test` runs it"]
fn tensorboard_reads_every_logged_scalar_at_its_step_and_the_hparams_with_python_torch() {
    let Some(peers) = std::env::var_os("KILN_BENCH_PEERS") else {
        panic!(
            "KILN_BENCH_PEERS names the installed bench peers (tensorboard): `cargo xtask test` \
             installs them and sets it ({})",
            std::env::var("KILN_BENCH_PEERS_ERROR").unwrap_or_else(|_| "not set".into())
        );
    };
    let out = tempfile::tempdir().unwrap();
    train(out.path(), &[]);
    let run = only_run(out.path());
    // Resumed from step 10 of 28: a second event file, whose restart makes TensorBoard drop
    // what the first recorded after step 10, as the resumed run writes steps 11–28 again.
    let ckpt = run.join("checkpoints").join("step-000000010");
    assert!(ckpt.is_dir(), "{}", ckpt.display());
    // Event files are named by the second they were created in.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    train(out.path(), &["--resume", ckpt.to_str().unwrap()]);
    assert_eq!(event_files(&run).len(), 2);

    let o = std::process::Command::new(python())
        .args(["-c", READ_WITH_TENSORBOARD])
        .arg(&run)
        .env("PYTHONPATH", peers)
        .output()
        .unwrap();
    assert!(o.status.success(), "TensorBoard's reader: {}", stderr(&o));
    let read: Value = serde_json::from_slice(&o.stdout).unwrap();

    let expected = expected_scalars(&run);
    let got: BTreeMap<String, Vec<(u64, f64)>> = read["scalars"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(tag, points)| {
            let points = points
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
                .collect();
            (tag.clone(), points)
        })
        .collect();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "the tags"
    );
    for (tag, want) in &expected {
        assert_eq!(
            steps_of(&got[tag]),
            steps_of(want),
            "{tag}: the steps, once each"
        );
        for ((step, a), (_, b)) in got[tag].iter().zip(want) {
            // TensorBoard's scalars are f32.
            assert_eq!(*a, f64::from(*b as f32), "{tag} at step {step}");
        }
    }
    for tag in ["train/loss", "lr", "grad_norm", "memory/rss_peak"] {
        assert_eq!(got[tag].len(), 28, "{tag}");
    }
    for tag in [
        "epoch",
        "val/loss",
        "epoch/train_loss",
        "epoch/samples_per_s",
    ] {
        assert_eq!(steps_of(&got[tag]), [14, 28], "{tag}");
    }

    // The hyperparameters: every key of config.json, a number, boolean or text as shown.
    let config: Value =
        serde_json::from_slice(&std::fs::read(run.join("config.json")).unwrap()).unwrap();
    let hparams = read["hparams"].as_object().unwrap();
    let config = config.as_array().unwrap();
    assert_eq!(hparams.len(), config.len());
    for entry in config {
        let key = entry["key"].as_str().unwrap();
        let shown = entry["value"].as_str().unwrap();
        let want = match shown {
            "true" | "false" => serde_json::json!({ "bool_value": shown == "true" }),
            _ => match shown.parse::<f64>() {
                Ok(v) if v.is_finite() => serde_json::json!({ "number_value": v }),
                _ => serde_json::json!({ "string_value": shown }),
            },
        };
        assert_eq!(hparams[key], want, "{key} = {shown}");
    }
    assert_eq!(
        hparams["train.epochs"],
        serde_json::json!({"number_value": 2.0})
    );
    assert_eq!(
        hparams["run.tensorboard"],
        serde_json::json!({"bool_value": true})
    );
    assert_eq!(
        hparams["model.name"],
        serde_json::json!({"string_value": "mlp"})
    );
    eprintln!(
        "TensorBoard read {} tags ({} points) and {} hyperparameters",
        got.len(),
        got.values().map(Vec::len).sum::<usize>(),
        hparams.len()
    );
}

fn steps_of(points: &[(u64, f64)]) -> Vec<u64> {
    points.iter().map(|p| p.0).collect()
}
