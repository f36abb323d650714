//! Why a run ends before its last epoch: the limits `train.max_steps` and `train.max_time`
//! (both counted over resumes), and early stopping on a validation metric
//! (`train.early_stopping`, as Lightning's `EarlyStopping`: `patience` epochs in a row without
//! an improvement of more than `min_delta`, or a value that is not finite).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_config::{EarlyStoppingPlan, KeepBest, MetricMode, MetricName, keys};
use serde::{Deserialize, Serialize};

use crate::TrainError;
use crate::metrics::MetricValues;

/// The clock `train.max_time` and `checkpoint.every_seconds` read: the time since it was made,
/// real by default. A test drives one of its own ([`Clock::driven`]) so that what the clock
/// decides does not hang on the machine's speed.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> Duration + Send + Sync>);

impl Clock {
    /// Wall time from now on.
    pub fn real() -> Self {
        let start = Instant::now();
        Self(Arc::new(move || start.elapsed()))
    }

    /// A clock reading whatever `now` says.
    pub fn driven(now: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        Self(Arc::new(now))
    }

    pub fn now(&self) -> Duration {
        (self.0)()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Clock({:?})", self.now())
    }
}

/// Why a run ended before its epochs: which condition, and what it saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StopReason {
    /// `max_steps`, `max_time` or `early_stopping`.
    pub kind: &'static str,
    pub message: String,
}

/// `train.max_steps` and `train.max_time`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub max_steps: Option<u64>,
    pub max_time: Option<Duration>,
}

impl Limits {
    /// The step limit, once `steps` optimizer steps are done.
    pub fn steps_reached(&self, steps: u64) -> Option<StopReason> {
        let max = self.max_steps.filter(|&m| steps >= m)?;
        Some(StopReason {
            kind: "max_steps",
            message: format!(
                "{} = {max} reached after {steps} optimizer steps",
                keys::train::max_steps
            ),
        })
    }

    /// Whether `trained` (over every resume) has reached the time limit.
    pub fn time_up(&self, trained: Duration) -> bool {
        self.max_time.is_some_and(|m| trained >= m)
    }

    /// The time limit's reason, after `trained` and `steps`.
    pub fn time_reason(&self, trained: Duration, steps: u64) -> StopReason {
        let limit = self.max_time.unwrap_or_default();
        StopReason {
            kind: "max_time",
            message: format!(
                "{} = {} s reached after {:.1} s of training ({steps} optimizer steps)",
                keys::train::max_time,
                limit.as_secs(),
                trained.as_secs_f64()
            ),
        }
    }
}

/// Early stopping's count so far, carried by checkpoints so that a resumed run counts on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EarlyStopState {
    /// The best value so far, and the epoch it came from.
    pub best: Option<f64>,
    pub best_epoch: Option<u64>,
    /// Validations in a row since the last improvement.
    pub bad_epochs: u64,
}

/// Early stopping, resolved for a run: the metric watched and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EarlyStopping {
    pub metric: MetricName,
    pub higher_is_better: bool,
    pub patience: u64,
    pub min_delta: f64,
}

impl EarlyStopping {
    /// `plan` for a run reporting the validation metrics `names` (`loss`, `accuracy`, …), with
    /// validation data or not; `None` when it is off. A metric the run does not report, or no
    /// validation data, is an error naming the key.
    pub fn resolve(
        plan: &EarlyStoppingPlan,
        names: &[&str],
        validates: bool,
    ) -> Result<Option<Self>, TrainError> {
        let metric = match plan.metric {
            KeepBest::Off => return Ok(None),
            KeepBest::By(m) => m,
            KeepBest::TaskDefault => [MetricName::Dice, MetricName::Accuracy]
                .into_iter()
                .find(|m| names.contains(&m.key()))
                .unwrap_or(MetricName::Loss),
        };
        let invalid = |expected: String| TrainError::InvalidPlan {
            key: keys::early_stopping::metric,
            value: metric.as_str().to_owned(),
            expected,
        };
        if !names.contains(&metric.key()) {
            let reported: Vec<String> = names.iter().map(|n| format!("val_{n}")).collect();
            return Err(invalid(format!(
                "a metric this run reports: {}",
                reported.join(", ")
            )));
        }
        if !validates {
            return Err(invalid(
                "validation data to watch: this run has none (data.val_fraction > 0, or \
                 data.val_steps for a windowed dataset)"
                    .to_owned(),
            ));
        }
        let higher_is_better = match plan.mode {
            MetricMode::Auto => metric.higher_is_better(),
            MetricMode::Max => true,
            MetricMode::Min => false,
        };
        Ok(Some(Self {
            metric,
            higher_is_better,
            patience: plan.patience.max(1),
            min_delta: plan.min_delta,
        }))
    }

    /// Counts epoch `epoch`'s validation `values` into `state`; the reason to stop, when it is
    /// time (the metric did not improve by more than `min_delta` for `patience` validations in a
    /// row, or is not finite).
    pub fn observe(
        &self,
        state: &mut EarlyStopState,
        epoch: u64,
        values: &MetricValues,
    ) -> Option<StopReason> {
        let name = self.metric.as_str();
        let value = values.get(self.metric.key())?;
        if !value.is_finite() {
            return Some(self.reason(format!("{name} is {value} after epoch {}", epoch + 1)));
        }
        let improved = state.best.is_none_or(|best| match self.higher_is_better {
            true => value > best + self.min_delta,
            false => value < best - self.min_delta,
        });
        if improved {
            *state = EarlyStopState {
                best: Some(value),
                best_epoch: Some(epoch),
                bad_epochs: 0,
            };
            return None;
        }
        state.bad_epochs += 1;
        if state.bad_epochs < self.patience {
            return None;
        }
        let best = state.best.unwrap_or(value);
        let at = state.best_epoch.map_or(0, |e| e + 1);
        Some(self.reason(format!(
            "{name} has not improved by more than {} for {} epochs (best {best:.6} after epoch \
             {at}, now {value:.6})",
            self.min_delta, state.bad_epochs
        )))
    }

    /// The reason to stop at once, for a run resumed from a checkpoint whose count had already
    /// reached the patience (a resumed run that stopped early stays stopped, unless the
    /// patience grew).
    pub fn already_met(&self, state: Option<&EarlyStopState>) -> Option<StopReason> {
        let state = state.filter(|s| s.bad_epochs >= self.patience)?;
        Some(self.reason(format!(
            "{} had not improved for {} epochs when the run was checkpointed (patience {})",
            self.metric.as_str(),
            state.bad_epochs,
            self.patience
        )))
    }

    fn reason(&self, why: String) -> StopReason {
        StopReason {
            kind: "early_stopping",
            message: format!("early stopping: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(
        metric: KeepBest,
        mode: MetricMode,
        patience: u64,
        min_delta: f64,
    ) -> EarlyStoppingPlan {
        EarlyStoppingPlan {
            metric,
            mode,
            patience,
            min_delta,
        }
    }

    fn values(name: &str, v: f64) -> MetricValues {
        let mut m = MetricValues::default();
        m.push(name, v);
        m
    }

    #[test]
    fn stops_after_patience_validations_without_an_improvement_beyond_min_delta() {
        let p = plan(KeepBest::By(MetricName::Loss), MetricMode::Auto, 2, 0.01);
        let es = EarlyStopping::resolve(&p, &["loss", "accuracy"], true)
            .unwrap()
            .unwrap();
        let mut state = EarlyStopState::default();
        let losses = [1.0, 0.8, 0.795, 0.7, 0.71, 0.695];
        let stops: Vec<bool> = losses
            .iter()
            .enumerate()
            .map(|(e, &l)| {
                es.observe(&mut state, e as u64, &values("loss", l))
                    .is_some()
            })
            .collect();
        // 0.795 is not 0.01 better than 0.8 (1 bad), 0.7 is (reset); 0.71 and 0.695 are not.
        assert_eq!(stops, [false, false, false, false, false, true]);
        assert_eq!(state.best, Some(0.7));
        assert_eq!(state.best_epoch, Some(3));
        let why = es
            .observe(&mut state.clone(), 6, &values("loss", 0.9))
            .unwrap();
        assert_eq!(why.kind, "early_stopping");
        assert!(
            why.message.contains("val_loss has not improved"),
            "{}",
            why.message
        );
    }

    #[test]
    fn the_direction_follows_the_metric_or_the_mode_and_nan_stops_at_once() {
        let names = ["loss", "accuracy"];
        let task = EarlyStopping::resolve(
            &plan(KeepBest::TaskDefault, MetricMode::Auto, 1, 0.0),
            &names,
            true,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (task.metric, task.higher_is_better),
            (MetricName::Accuracy, true)
        );
        let mut state = EarlyStopState::default();
        assert!(
            task.observe(&mut state, 0, &values("accuracy", 0.5))
                .is_none()
        );
        assert!(
            task.observe(&mut state, 1, &values("accuracy", 0.6))
                .is_none()
        );
        assert!(
            task.observe(&mut state, 2, &values("accuracy", 0.6))
                .is_some()
        );
        let max_loss = EarlyStopping::resolve(
            &plan(KeepBest::By(MetricName::Loss), MetricMode::Max, 5, 0.0),
            &names,
            true,
        )
        .unwrap()
        .unwrap();
        assert!(max_loss.higher_is_better);
        let mut state = EarlyStopState::default();
        let nan = max_loss.observe(&mut state, 0, &values("loss", f64::NAN));
        assert!(nan.unwrap().message.contains("val_loss is NaN"));
        // A regression has no accuracy: the task's metric is the loss.
        let reg = EarlyStopping::resolve(
            &plan(KeepBest::TaskDefault, MetricMode::Auto, 1, 0.0),
            &["loss", "mae", "rmse"],
            true,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (reg.metric, reg.higher_is_better),
            (MetricName::Loss, false)
        );
    }

    #[test]
    fn a_metric_the_run_lacks_or_no_validation_data_is_named() {
        let dice = plan(KeepBest::By(MetricName::Dice), MetricMode::Auto, 3, 0.0);
        let err = EarlyStopping::resolve(&dice, &["loss", "accuracy"], true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("train.early_stopping.metric") && err.contains("val_loss, val_accuracy"),
            "{err}"
        );
        let loss = plan(KeepBest::By(MetricName::Loss), MetricMode::Auto, 3, 0.0);
        let err = EarlyStopping::resolve(&loss, &["loss"], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("data.val_fraction"), "{err}");
        let off = plan(KeepBest::Off, MetricMode::Auto, 3, 0.0);
        assert_eq!(
            EarlyStopping::resolve(&off, &["loss"], false).unwrap(),
            None
        );
    }

    #[test]
    fn limits_name_what_was_reached() {
        let limits = Limits {
            max_steps: Some(10),
            max_time: Some(Duration::from_secs(60)),
        };
        assert!(limits.steps_reached(9).is_none());
        let r = limits.steps_reached(10).unwrap();
        assert_eq!(r.kind, "max_steps");
        assert!(r.message.contains("train.max_steps = 10"), "{}", r.message);
        assert!(!limits.time_up(Duration::from_secs(59)));
        assert!(limits.time_up(Duration::from_secs(60)));
        let r = limits.time_reason(Duration::from_secs(61), 7);
        assert!(r.message.contains("train.max_time = 60 s"), "{}", r.message);
        assert!(!Limits::default().time_up(Duration::MAX));
    }
}
