//! Which checkpoints a run keeps: the newest `keep_last`, and where asked the best one by a
//! metric (`checkpoint.keep_best`: the task's own, or one named in the metric vocabulary),
//! decided from the checkpoints' metadata alone. [`super::store::prune`] applies it.

use std::path::{Path, PathBuf};

use kiln_config::{CheckpointPlan, KeepBest, MetricName};

use super::Meta;

/// A retention policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// The newest good checkpoints kept (at least 1).
    pub keep_last: usize,
    /// Also keep the best checkpoint by this.
    pub best: KeepBest,
    /// And the best by the metric early stopping watches, with whether higher is better.
    pub watched: Option<(MetricName, bool)>,
}

impl Retention {
    pub fn new(keep_last: usize, best: KeepBest) -> Self {
        Self {
            keep_last: keep_last.max(1),
            best,
            watched: None,
        }
    }

    /// This policy, also keeping the best checkpoint by `metric` (higher better or not): the
    /// one early stopping judged best.
    pub fn watching(self, metric: MetricName, higher_is_better: bool) -> Self {
        Self {
            watched: Some((metric, higher_is_better)),
            ..self
        }
    }

    /// The policy of a run's checkpoint settings.
    pub fn of(plan: &CheckpointPlan) -> Self {
        Self::new(
            usize::try_from(plan.keep_last).unwrap_or(usize::MAX),
            plan.keep_best,
        )
    }

    /// Of `good` checkpoints (oldest first, with their metadata), those this policy removes.
    pub fn to_remove<'a>(&self, good: &'a [(PathBuf, Meta)]) -> Vec<&'a Path> {
        let keep_from = good.len().saturating_sub(self.keep_last);
        let best = self.best_of(good);
        let watched = self.watched.and_then(|(metric, higher)| {
            let score = |meta: &Meta| metric_of(meta, metric).map(|v| if higher { v } else { -v });
            newest_best(good, score)
        });
        good[..keep_from]
            .iter()
            .map(|(dir, _)| dir.as_path())
            .filter(|dir| Some(*dir) != best && Some(*dir) != watched)
            .collect()
    }

    /// The best checkpoint by the policy's metric, if any checkpoint has a value of it (the
    /// newest of equals).
    fn best_of<'a>(&self, good: &'a [(PathBuf, Meta)]) -> Option<&'a Path> {
        let score = |meta: &Meta| -> Option<f64> {
            let (metric, value) = match self.best {
                KeepBest::Off => return None,
                KeepBest::By(metric) => (metric, metric_of(meta, metric)?),
                KeepBest::TaskDefault => [MetricName::Dice, MetricName::Accuracy]
                    .into_iter()
                    .find_map(|m| Some((m, metric_of(meta, m)?)))
                    .or_else(|| Some((MetricName::Loss, metric_of(meta, MetricName::Loss)?)))?,
            };
            Some(if metric.higher_is_better() {
                value
            } else {
                -value
            })
        };
        newest_best(good, score)
    }
}

/// The checkpoint of the highest `score` (the newest of equals; none without a score).
fn newest_best(good: &[(PathBuf, Meta)], score: impl Fn(&Meta) -> Option<f64>) -> Option<&Path> {
    good.iter()
        .filter_map(|(dir, meta)| Some((score(meta)?, dir.as_path())))
        .filter(|(s, _)| !s.is_nan())
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, dir)| dir)
}

/// A checkpoint's validation value of `metric` (checkpoints from before named metrics hold the
/// loss and the accuracy only).
pub fn metric_of(meta: &Meta, metric: MetricName) -> Option<f64> {
    meta.val_metrics
        .get(metric.as_str())
        .copied()
        .or(match metric {
            MetricName::Accuracy => meta.val_accuracy,
            MetricName::Loss => meta.val_loss,
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Metadata with these validation values (the rest as a checkpoint of step `step` has it).
    fn meta(step: u64, accuracy: Option<f64>, loss: Option<f64>, named: &[(&str, f64)]) -> Meta {
        Meta {
            format: super::super::FORMAT.to_owned(),
            version: super::super::VERSION,
            kiln_version: "test".into(),
            libtorch_version: "test".into(),
            step,
            epoch: 0,
            batch: 0,
            batch_size: None,
            lr: None,
            world_size: None,
            loss_scale: None,
            loss_scale_growth_tracker: None,
            model_rng: vec![],
            val_accuracy: accuracy,
            val_loss: loss,
            val_metrics: named.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            sums: Default::default(),
            config: serde_json::Value::Null,
            input: None,
            files: Default::default(),
            file_bytes: Default::default(),
            meta_sha256: String::new(),
        }
    }

    fn removed(r: Retention, good: &[(PathBuf, Meta)]) -> Vec<u64> {
        r.to_remove(good)
            .iter()
            .map(|p| p.to_string_lossy().parse().unwrap())
            .collect()
    }

    fn at(step: u64, m: Meta) -> (PathBuf, Meta) {
        (PathBuf::from(step.to_string()), m)
    }

    #[test]
    fn keeps_the_newest_and_the_best_by_the_named_metric() {
        let good = vec![
            at(1, meta(1, Some(0.5), Some(1.0), &[("val_mae", 0.9)])),
            at(2, meta(2, Some(0.9), Some(0.7), &[("val_mae", 0.2)])),
            at(3, meta(3, Some(0.6), Some(0.4), &[("val_mae", 0.5)])),
            at(4, meta(4, Some(0.7), Some(0.5), &[("val_mae", 0.6)])),
            at(5, meta(5, Some(0.8), Some(0.6), &[("val_mae", 0.7)])),
        ];
        assert_eq!(removed(Retention::new(2, KeepBest::Off), &good), [1, 2, 3]);
        // The task's own: accuracy, higher is better.
        assert_eq!(
            removed(Retention::new(2, KeepBest::TaskDefault), &good),
            [1, 3]
        );
        // By name: the loss and the MAE, lower is better.
        let by = |m| Retention::new(2, KeepBest::By(m));
        assert_eq!(removed(by(MetricName::Loss), &good), [1, 2]);
        assert_eq!(removed(by(MetricName::Mae), &good), [1, 3]);
        // No checkpoint has an RMSE: only the newest are kept.
        assert_eq!(removed(by(MetricName::Rmse), &good), [1, 2, 3]);
        // Early stopping's metric is kept besides keep_best's: the lowest MAE (step 2), and
        // with max as its mode, the highest (step 1).
        let both = Retention::new(2, KeepBest::TaskDefault).watching(MetricName::Mae, false);
        assert_eq!(removed(both, &good), [1, 3]);
        let both =
            Retention::new(2, KeepBest::By(MetricName::Loss)).watching(MetricName::Mae, true);
        assert_eq!(removed(both, &good), [2]);
        // keep_last 0 still keeps one.
        assert_eq!(
            removed(Retention::new(0, KeepBest::Off), &good),
            [1, 2, 3, 4]
        );
    }

    #[test]
    fn without_an_accuracy_the_task_default_is_the_lowest_loss_and_old_checkpoints_count() {
        // Checkpoints of earlier versions carry the loss and accuracy fields only.
        let good = vec![
            at(1, meta(1, None, Some(0.3), &[])),
            at(2, meta(2, None, Some(0.9), &[("val_loss", 0.2)])),
            at(3, meta(3, None, Some(0.8), &[])),
        ];
        assert_eq!(
            removed(Retention::new(1, KeepBest::TaskDefault), &good),
            [1]
        );
        assert_eq!(metric_of(&good[0].1, MetricName::Loss), Some(0.3));
        assert_eq!(metric_of(&good[1].1, MetricName::Loss), Some(0.2));
        assert_eq!(metric_of(&good[0].1, MetricName::Mae), None);
    }
}
