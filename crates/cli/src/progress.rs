//! What `kiln train` shows while it runs: a progress bar with loss, samples/s and ETA on a
//! terminal, plain lines otherwise (logs, CI), an epoch line after each validation, and the
//! summary at the end.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use kiln_train::TrainError;
use kiln_train::metrics::{MetricValues, is_horizon_step};
use kiln_train::plot::label;
use kiln_train::record::{
    EpochRecord, Observer, Progress, RunReady, RunStart, StepRecord, Summary,
};

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// The progress display; prints to stderr.
#[derive(Debug)]
pub struct ProgressView {
    bar: Option<ProgressBar>,
    total_steps: u64,
}

impl ProgressView {
    pub fn new() -> Self {
        Self {
            bar: None,
            total_steps: 0,
        }
    }

    fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}

impl Observer for ProgressView {
    fn on_ready(&mut self, r: &RunReady) -> Result<(), TrainError> {
        eprintln!("data: {}", r.data);
        eprintln!("run directory: {}", r.run_dir.display());
        Ok(())
    }

    fn on_start(&mut self, s: &RunStart) -> Result<(), TrainError> {
        self.total_steps = s.total_steps;
        eprintln!(
            "model {} ({} parameters) · {} with loss {} · {} · optimizer {} · batch {}{} · {} epochs × {} steps · {} train / {} val samples",
            s.model,
            s.parameters,
            s.task,
            s.loss,
            s.precision,
            s.optimizer,
            s.batch_size,
            if s.grad_accum_steps > 1 {
                format!(" × {} accumulated", s.grad_accum_steps)
            } else {
                String::new()
            },
            s.epochs,
            s.steps_per_epoch,
            s.train_samples,
            s.val_samples
        );
        eprintln!("feed: {}", s.feed);
        if let Some(search) = &s.batch_size_search {
            eprintln!("train.batch_size {search}");
        }
        if let Some(search) = &s.lr_search {
            eprintln!("train.lr {search}");
        }
        if let Some((dir, step)) = &s.resumed_from {
            eprintln!("resumed from {} at step {step}", dir.display());
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(s.total_steps);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30.cyan/blue} {pos}/{len} steps · {msg} · {elapsed_precise} ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(Duration::from_millis(250));
            self.bar = Some(bar);
        }
        Ok(())
    }

    fn on_step(&mut self, p: &Progress) -> Result<(), TrainError> {
        if let Some(bar) = &self.bar {
            bar.set_position(p.step);
        }
        Ok(())
    }

    fn on_log(&mut self, r: &StepRecord) -> Result<(), TrainError> {
        let scale = r
            .loss_scale
            .map_or(String::new(), |s| format!(" · scale {s}"));
        let metric = metric_text("", &r.metrics);
        match &self.bar {
            Some(bar) => bar.set_message(format!(
                "epoch {} · loss {:.4}{metric} · {:.0} samples/s{scale}",
                r.epoch + 1,
                r.metrics.loss(),
                r.samples_per_s
            )),
            None => eprintln!(
                "step {}/{} · epoch {} · loss {:.4}{metric} · lr {:.2e} · {:.1} ms/step · {:.0} samples/s · data wait {}{}{}",
                r.step,
                self.total_steps,
                r.epoch + 1,
                r.metrics.loss(),
                r.lr,
                r.step_time_s * 1e3,
                r.samples_per_s,
                pct(r.data_wait_share),
                scale,
                r.memory
                    .headline()
                    .map_or(String::new(), |(what, b)| format!(" · {what} {}", mib(b)))
            ),
        }
        Ok(())
    }

    fn on_epoch(&mut self, e: &EpochRecord) -> Result<(), TrainError> {
        let mut val = match e.val.get("loss") {
            Some(l) => format!(" · val loss {l:.4}{}", metric_text("val ", &e.val)),
            None => String::new(),
        };
        if let Some(l) = e.val_ema.get("loss") {
            val += &format!(
                " · EMA val loss {l:.4}{}",
                metric_text("EMA val ", &e.val_ema)
            );
        }
        let train = metric_text("train ", &e.train);
        self.line(&format!(
            "epoch {} · train loss {:.4}{train}{val} · {:.1} s · {:.0} samples/s · data wait {}",
            e.epoch + 1,
            e.train.loss(),
            e.seconds,
            e.samples_per_s,
            pct(e.data_wait_share),
        ));
        Ok(())
    }

    fn on_finish(&mut self, s: &Summary) -> Result<(), TrainError> {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let (val, best) = (&s.final_val, &s.best_val);
        let others: Vec<String> = val
            .iter()
            .filter(|(n, _)| *n != "loss" && !is_horizon_step(n))
            .map(|(n, v)| format!("val {} {v:.4}", label(n)))
            .collect();
        let val = match (val.get("accuracy"), best.get("accuracy"), val.get("loss")) {
            (Some(f), Some(b), _) => format!(
                "val accuracy {} (best {}{})",
                pct(f),
                pct(b),
                s.chance_accuracy
                    .map_or(String::new(), |c| format!(", chance {}", pct(c)))
            ),
            _ if !others.is_empty() => others.join(" · "),
            (_, _, Some(l)) => format!("val loss {l:.4}"),
            _ => "no validation set".to_owned(),
        };
        eprintln!(
            "done: {} steps in {:.1} s · {:.1} ms/step · {:.0} samples/s · data wait {} · final train loss {:.4} · {val}{}{}",
            s.steps,
            s.seconds,
            s.mean_step_time_s * 1e3,
            s.samples_per_s,
            pct(s.data_wait_share),
            s.final_train.loss(),
            if s.skipped_steps > 0 {
                format!(" · {} fp16 steps skipped", s.skipped_steps)
            } else {
                String::new()
            },
            s.memory
                .headline()
                .map_or(String::new(), |(what, b)| format!(" · {what} {}", mib(b)))
        );
        Ok(())
    }
}

/// The metrics besides the loss: " · acc 93.1 %" for classification, " · MAE 0.1234 ·
/// RMSE 0.2345" for regression, " · <name> <value>" for any other, nothing for a loss alone
/// (a forecast's values per horizon step are left to the summary and the curves); `prefix` is
/// "", "train " or "val ".
fn metric_text(prefix: &str, values: &MetricValues) -> String {
    values
        .iter()
        .filter(|(n, _)| *n != "loss" && !is_horizon_step(n))
        .map(|(n, v)| match n {
            "accuracy" => format!(" · {prefix}acc {}", pct(v)),
            other => format!(" · {prefix}{} {v:.4}", label(other)),
        })
        .collect()
}
