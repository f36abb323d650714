//! A run's directory, `runs/<name>-<timestamp>/`: the resolved configuration with where each
//! value came from (`config.json`), one JSON line per logged step and epoch (`metrics.jsonl`),
//! the summary (`summary.json`), a plot of the loss and accuracy curves (`curves.png`) and,
//! with `run.tensorboard`, TensorBoard event files (`events.out.tfevents.*`). A run never
//! writes into an existing directory; a resumed run continues its own.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use kiln_config::{Layer, RunPlan};
use serde::Serialize;

use crate::TrainError;
use crate::plot::{PlotSpec, Series, label, write_training_plot};
use crate::record::{EpochRecord, Observer, RunStart, StepRecord, Summary};
use crate::tensorboard::{EventWriter, HParam};

fn file_error(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// `YYYYMMDD-HHMMSS` in UTC for `secs` since the Unix epoch.
pub fn timestamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// [`timestamp`] of now.
pub fn timestamp_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    timestamp(secs)
}

#[derive(Serialize)]
struct ConfigEntry<'a> {
    key: &'a str,
    value: String,
    layer: Option<Layer>,
    source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// The open run directory; as an [`Observer`] it records everything the trainer reports.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    metrics: BufWriter<File>,
    /// (epoch progress, loss, the panel's metric) of each logged step.
    steps: Vec<(f64, f64, f64)>,
    /// (epoch, val loss, the panel's val metric) of each epoch.
    epochs: Vec<(u64, Option<f64>, Option<f64>)>,
    title: String,
    /// What the curves' right panel shows: the run's first metric after the loss (accuracy,
    /// MAE for regression, …).
    metric: String,
    /// TensorBoard's events (`run.tensorboard`).
    events: Option<EventWriter>,
}

/// The right panel's metric of a run whose `metrics.jsonl` starts with `start`: the first
/// after the loss that the start record names; files from before named metrics name none, and
/// show accuracy, or MAE where their first step has one.
fn panel_metric(
    start: Option<&serde_json::Value>,
    first_step: Option<&serde_json::Value>,
) -> String {
    let named = start
        .and_then(|s| s["metrics"].as_array())
        .and_then(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str())
                .find(|n| *n != "loss")
        });
    match (named, first_step) {
        (Some(n), _) => n.to_owned(),
        (None, Some(v)) if v["accuracy"].is_null() && v["mae"].is_f64() => "mae".to_owned(),
        _ => "accuracy".to_owned(),
    }
}

impl RunDir {
    /// The resolved configuration as `config.json` holds it.
    pub fn config_json(plan: &RunPlan) -> serde_json::Value {
        let entries: Vec<ConfigEntry<'_>> = plan
            .entries()
            .into_iter()
            .map(|(key, value)| {
                let p = plan.source_of(key);
                ConfigEntry {
                    key,
                    value,
                    layer: p.map(|p| p.layer),
                    source: p.map_or_else(String::new, |p| p.source.clone()),
                    note: p.and_then(|p| p.note.clone()),
                }
            })
            .collect();
        serde_json::to_value(entries).unwrap_or(serde_json::Value::Null)
    }

    /// Creates `<output_dir>/<name>-<timestamp>/` (with `-2`, `-3`… if that exists already) and
    /// writes `config.json` into it.
    pub fn create(output_dir: &Path, name: &str, plan: &RunPlan) -> Result<Self, TrainError> {
        std::fs::create_dir_all(output_dir).map_err(|e| file_error(output_dir, e))?;
        let base = format!("{name}-{}", timestamp_now());
        let mut path = output_dir.join(&base);
        let mut n = 1;
        loop {
            match std::fs::create_dir(&path) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {
                    n += 1;
                    path = output_dir.join(format!("{base}-{n}"));
                }
                Err(e) => return Err(file_error(&path, e)),
            }
        }
        let entries = Self::config_json(plan);
        let config_path = path.join("config.json");
        let text =
            serde_json::to_string_pretty(&entries).map_err(|e| file_error(&config_path, e))?;
        std::fs::write(&config_path, text + "\n").map_err(|e| file_error(&config_path, e))?;
        let metrics_path = path.join("metrics.jsonl");
        let metrics = File::create_new(&metrics_path).map_err(|e| file_error(&metrics_path, e))?;
        let events = if plan.run.tensorboard {
            let mut events = EventWriter::create(&path)?;
            let hparams: Vec<(&str, HParam)> = plan
                .entries()
                .into_iter()
                .map(|(key, shown)| (key, HParam::from_shown(&shown)))
                .collect();
            events.hparams(hparams.iter().map(|(k, v)| (*k, v)))?;
            Some(events)
        } else {
            None
        };
        Ok(Self {
            path,
            metrics: BufWriter::new(metrics),
            steps: vec![],
            epochs: vec![],
            title: name.to_owned(),
            metric: String::new(),
            events,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reopens the run directory `path` to continue it from a checkpoint at `step` whose data
    /// position is in `epoch`: `metrics.jsonl` keeps what was logged up to that point (records
    /// written after the checkpoint are dropped, as the resumed run writes them again), and is
    /// rewritten atomically. With `tensorboard` (the resumed run's `run.tensorboard`, which may
    /// differ from the first run's) the run goes on in a new event file, which starts with a
    /// restart at `step + 1`: TensorBoard drops what earlier files hold from there on, as the
    /// resumed run writes it again.
    pub fn reopen(
        path: &Path,
        name: &str,
        (step, epoch): (u64, u64),
        tensorboard: bool,
    ) -> Result<Self, TrainError> {
        let metrics_path = path.join("metrics.jsonl");
        let text =
            std::fs::read_to_string(&metrics_path).map_err(|e| file_error(&metrics_path, e))?;
        let mut kept = String::new();
        let (mut steps, mut epochs) = (vec![], vec![]);
        // A line cut short by a crash is dropped.
        let records: Vec<(&str, serde_json::Value)> = text
            .lines()
            .filter_map(|l| Some((l, serde_json::from_str::<serde_json::Value>(l).ok()?)))
            .collect();
        let of_kind = |k: &str| records.iter().map(|r| &r.1).find(|v| v["kind"] == k);
        let metric = panel_metric(of_kind("start"), of_kind("step"));
        for (line, v) in &records {
            let keep = match v["kind"].as_str() {
                Some("step") => {
                    let ok = v["step"].as_u64().is_some_and(|s| s <= step);
                    if ok {
                        steps.push((
                            v["epoch_progress"].as_f64().unwrap_or(0.0),
                            v["loss"].as_f64().unwrap_or(f64::NAN),
                            v[&metric].as_f64().unwrap_or(f64::NAN),
                        ));
                    }
                    ok
                }
                Some("epoch") => {
                    let ok = v["epoch"].as_u64().is_some_and(|e| e < epoch);
                    if ok {
                        epochs.push((
                            v["epoch"].as_u64().unwrap_or(0),
                            v["val_loss"].as_f64(),
                            v[format!("val_{metric}")].as_f64(),
                        ));
                    }
                    ok
                }
                _ => true,
            };
            if keep {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        let tmp = path.join(".metrics.jsonl.tmp");
        std::fs::write(&tmp, kept).map_err(|e| file_error(&tmp, e))?;
        std::fs::rename(&tmp, &metrics_path).map_err(|e| file_error(&metrics_path, e))?;
        let metrics = std::fs::OpenOptions::new()
            .append(true)
            .open(&metrics_path)
            .map_err(|e| file_error(&metrics_path, e))?;
        let events = if tensorboard {
            let mut events = EventWriter::create(path)?;
            events.restart_at(step + 1)?;
            Some(events)
        } else {
            None
        };
        Ok(Self {
            path: path.to_owned(),
            metrics: BufWriter::new(metrics),
            steps,
            epochs,
            title: name.to_owned(),
            metric,
            events,
        })
    }

    fn append(&mut self, record: &impl Serialize) -> Result<(), TrainError> {
        let metrics_path = self.path.join("metrics.jsonl");
        let line = serde_json::to_string(record).map_err(|e| file_error(&metrics_path, e))?;
        writeln!(self.metrics, "{line}")
            .and_then(|()| self.metrics.flush())
            .map_err(|e| file_error(&metrics_path, e))
    }

    fn plot(&self, path: &Path) -> Result<(), TrainError> {
        let series = |label: &str, points: Vec<(f64, f64)>| Series {
            label: label.to_owned(),
            points,
        };
        let loss = [
            series(
                "train loss",
                self.steps.iter().map(|s| (s.0, s.1)).collect(),
            ),
            series(
                "val loss",
                self.epochs
                    .iter()
                    .filter_map(|e| e.1.map(|v| ((e.0 + 1) as f64, v)))
                    .collect(),
            ),
        ];
        let name = label(&self.metric);
        let accuracy = [
            series(
                &format!("train {name}"),
                self.steps.iter().map(|s| (s.0, s.2)).collect(),
            ),
            series(
                &format!("val {name}"),
                self.epochs
                    .iter()
                    .filter_map(|e| e.2.map(|v| ((e.0 + 1) as f64, v)))
                    .collect(),
            ),
        ];
        write_training_plot(
            path,
            &PlotSpec {
                title: &self.title,
                loss: &loss,
                accuracy: &accuracy,
                metric: &self.metric,
            },
        )
        .map_err(|e| file_error(path, e))
    }
}

/// A logged step's scalars, as TensorBoard tags: `train/<metric>`, the rate and timings, the
/// gradient norm and loss scale where there are, and `memory/<field>` in bytes.
fn step_scalars(r: &StepRecord) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = r
        .metrics
        .iter()
        .map(|(name, v)| (format!("train/{name}"), v))
        .collect();
    let fixed = [
        ("lr", Some(r.lr)),
        ("samples_per_s", Some(r.samples_per_s)),
        ("step_time_s", Some(r.step_time_s)),
        ("data_wait_share", Some(r.data_wait_share)),
        ("skipped_steps", Some(r.skipped_steps as f64)),
        ("grad_norm", r.grad_norm),
        ("loss_scale", r.loss_scale),
    ];
    out.extend(
        fixed
            .into_iter()
            .filter_map(|(tag, v)| Some((tag.to_owned(), v?))),
    );
    let m = &r.memory;
    let memory = [
        ("gpu_allocated", m.gpu_allocated),
        ("gpu_peak", m.gpu_peak),
        ("rss", m.rss),
        ("rss_peak", m.rss_peak),
    ];
    out.extend(
        memory
            .into_iter()
            .filter_map(|(field, v)| Some((format!("memory/{field}"), v? as f64))),
    );
    out
}

/// An epoch's scalars, as TensorBoard tags: `epoch` (counted from 0, as in `metrics.jsonl`),
/// `epoch/train_<metric>`, `val/<metric>`, `val_ema/<metric>` (with `train.ema`) and the
/// epoch's rate, time and data wait.
fn epoch_scalars(r: &EpochRecord) -> Vec<(String, f64)> {
    let mut out = vec![("epoch".to_owned(), r.epoch as f64)];
    out.extend(
        r.train
            .iter()
            .map(|(name, v)| (format!("epoch/train_{name}"), v)),
    );
    out.extend(r.val.iter().map(|(name, v)| (format!("val/{name}"), v)));
    out.extend(
        r.val_ema
            .iter()
            .map(|(name, v)| (format!("val_ema/{name}"), v)),
    );
    out.extend([
        ("epoch/samples_per_s".to_owned(), r.samples_per_s),
        ("epoch/seconds".to_owned(), r.seconds),
        ("epoch/data_wait_share".to_owned(), r.data_wait_share),
    ]);
    out
}

impl Observer for RunDir {
    fn on_start(&mut self, start: &RunStart) -> Result<(), TrainError> {
        if let Some(m) = start.metrics.iter().find(|m| *m != "loss") {
            self.metric.clone_from(m);
        } else if self.metric.is_empty() {
            self.metric = "accuracy".to_owned();
        }
        self.title = format!(
            "{} · {} · {} on {}",
            self.title, start.model, start.precision, start.device
        );
        #[derive(Serialize)]
        struct Start<'a> {
            kind: &'static str,
            #[serde(flatten)]
            start: &'a RunStart,
        }
        self.append(&Start {
            kind: "start",
            start,
        })
    }

    fn on_log(&mut self, record: &StepRecord) -> Result<(), TrainError> {
        let value = record.metrics.get(&self.metric).unwrap_or(f64::NAN);
        self.steps
            .push((record.epoch_progress, record.metrics.loss(), value));
        if let Some(events) = &mut self.events {
            let scalars = step_scalars(record);
            events.scalars(record.step, scalars.iter().map(|(t, v)| (t.as_str(), *v)))?;
        }
        self.append(record)
    }

    fn on_epoch(&mut self, record: &EpochRecord) -> Result<(), TrainError> {
        self.epochs.push((
            record.epoch,
            record.val.get("loss"),
            record.val.get(&self.metric),
        ));
        if let Some(events) = &mut self.events {
            let scalars = epoch_scalars(record);
            events.scalars(record.step, scalars.iter().map(|(t, v)| (t.as_str(), *v)))?;
            events.flush()?;
        }
        self.append(record)
    }

    fn on_finish(&mut self, summary: &Summary) -> Result<(), TrainError> {
        if let Some(events) = &mut self.events {
            events.flush()?;
        }
        let path = self.path.join("summary.json");
        let text = serde_json::to_string_pretty(summary).map_err(|e| file_error(&path, e))?;
        std::fs::write(&path, text + "\n").map_err(|e| file_error(&path, e))?;
        self.plot(&self.path.join("curves.png"))
    }
}

#[cfg(test)]
mod tests {
    use super::{RunDir, timestamp};
    use crate::tensorboard::FILE_MARK;

    /// The TensorBoard event files in `dir`.
    fn event_files(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().starts_with(FILE_MARK)
            })
            .count()
    }

    /// A resumed run writes TensorBoard events when its own `run.tensorboard` says so, whatever
    /// the first run did: turned on at the resume, a first event file appears; turned off, none
    /// is added.
    #[test]
    fn a_resumed_run_follows_its_own_tensorboard_setting() {
        let dir = tempfile::tempdir().unwrap();
        let step = r#"{"kind":"step","step":1,"epoch_progress":0.5,"loss":1.0}"#;
        std::fs::write(dir.path().join("metrics.jsonl"), format!("{step}\n")).unwrap();
        RunDir::reopen(dir.path(), "run", (1, 0), false).unwrap();
        assert_eq!(event_files(dir.path()), 0);
        RunDir::reopen(dir.path(), "run", (1, 0), true).unwrap();
        assert_eq!(event_files(dir.path()), 1);
        RunDir::reopen(dir.path(), "run", (1, 0), false).unwrap();
        assert_eq!(event_files(dir.path()), 1);
    }

    #[test]
    fn timestamps_are_utc_calendar_times() {
        assert_eq!(timestamp(0), "19700101-000000");
        // 2000-02-29 12:34:56 UTC (a leap day).
        assert_eq!(timestamp(951_827_696), "20000229-123456");
        // 2026-11-21 00:00:00 UTC.
        assert_eq!(timestamp(1_795_219_200), "20261121-000000");
    }
}
