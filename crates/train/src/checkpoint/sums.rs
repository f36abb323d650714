//! The training sums a checkpoint carries across a resume (the open epoch's and log interval's
//! metric sums, skipped steps, the best validation values), by metric name; and the fixed
//! fields version 1 wrote, still read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metrics::SavedTally;

/// Training sums that span steps, so that metrics after a resume equal an uninterrupted run's.
// Unknown fields are refused (here and in `Meta`): the checksum covers the fields as read, so a
// damaged key that serde skipped, its field left at its default, would otherwise pass it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunningSums {
    /// The epoch's metric sums so far (the open log interval not included).
    pub epoch: SavedTally,
    /// The open log interval's.
    pub interval: SavedTally,
    pub skipped_steps: u64,
    /// The best validation value of each metric so far (`accuracy`: the highest, `loss`: the
    /// lowest, …), by metric name.
    pub best_val: BTreeMap<String, f64>,
    /// Early stopping's count (absent before its first validation, and in checkpoints from
    /// before early stopping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<crate::stopping::EarlyStopState>,
    /// Seconds trained before this checkpoint, over every resume (`train.max_time` counts
    /// them; absent in checkpoints from before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained_seconds: Option<f64>,
    /// In a data-parallel run, the open epoch's and log interval's sums of ranks 1, 2, … in
    /// order (`epoch` and `interval` above are rank 0's), so that each rank continues its own
    /// (absent with one rank, at an epoch's end, and in checkpoints from before it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_ranks: Vec<RankSums>,
}

/// One rank's open epoch and log interval sums.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankSums {
    pub epoch: SavedTally,
    pub interval: SavedTally,
}

impl RunningSums {
    /// The open epoch's and interval's sums of `rank`: its own where the checkpoint has them;
    /// none for a rank it lacks (a checkpoint from before ranks' sums were saved: that rank's
    /// share of the open epoch goes uncounted rather than counted twice).
    pub fn of_rank(&self, rank: usize) -> RankSums {
        match rank {
            0 => RankSums {
                epoch: self.epoch.clone(),
                interval: self.interval.clone(),
            },
            r => self.other_ranks.get(r - 1).cloned().unwrap_or_default(),
        }
    }
}

/// The running sums of a checkpoint as written: by name (version 2), or version 1's fixed
/// fields. Kept as read, so that the checksum over the fields holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SavedSums {
    Named(RunningSums),
    Legacy(LegacySums),
}

impl Default for SavedSums {
    fn default() -> Self {
        Self::Named(RunningSums::default())
    }
}

impl From<RunningSums> for SavedSums {
    fn from(sums: RunningSums) -> Self {
        Self::Named(sums)
    }
}

impl SavedSums {
    /// The sums by name, whichever version wrote them.
    pub fn running(&self) -> RunningSums {
        match self {
            Self::Named(sums) => sums.clone(),
            Self::Legacy(old) => old.running(),
        }
    }
}

/// Version 1's running sums: loss, accuracy and regression sums as fixed fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegacySums {
    pub epoch_loss: f64,
    pub epoch_correct: f64,
    pub epoch_samples: u64,
    pub interval_loss: f64,
    pub interval_correct: f64,
    pub interval_samples: u64,
    pub skipped_steps: u64,
    pub best_val_accuracy: Option<f64>,
    /// Regression error sums and judged target elements (absent in checkpoints from before
    /// targets other than class labels, which judged one element per sample).
    #[serde(default)]
    pub epoch_abs_err: f64,
    #[serde(default)]
    pub epoch_sq_err: f64,
    #[serde(default)]
    pub epoch_judged: Option<f64>,
    #[serde(default)]
    pub interval_abs_err: f64,
    #[serde(default)]
    pub interval_sq_err: f64,
    #[serde(default)]
    pub interval_judged: Option<f64>,
    #[serde(default)]
    pub best_val_loss: Option<f64>,
}

impl LegacySums {
    /// The same sums by metric name (each metric's `judged` was one shared count).
    pub fn running(&self) -> RunningSums {
        let tally = |loss, correct, abs, sq, judged: Option<f64>, samples: u64| {
            let judged = judged.unwrap_or(samples as f64);
            let sums = [
                ("loss.sum", loss),
                ("accuracy.right", correct),
                ("accuracy.judged", judged),
                ("mae.abs_err", abs),
                ("mae.judged", judged),
                ("rmse.sq_err", sq),
                ("rmse.judged", judged),
            ];
            SavedTally {
                samples,
                sums: sums.map(|(n, v)| (n.to_owned(), v)).into(),
            }
        };
        let best = [
            ("accuracy", self.best_val_accuracy),
            ("loss", self.best_val_loss),
        ];
        RunningSums {
            epoch: tally(
                self.epoch_loss,
                self.epoch_correct,
                self.epoch_abs_err,
                self.epoch_sq_err,
                self.epoch_judged,
                self.epoch_samples,
            ),
            interval: tally(
                self.interval_loss,
                self.interval_correct,
                self.interval_abs_err,
                self.interval_sq_err,
                self.interval_judged,
                self.interval_samples,
            ),
            skipped_steps: self.skipped_steps,
            best_val: best
                .into_iter()
                .filter_map(|(n, v)| Some((n.to_owned(), v?)))
                .collect(),
            ..RunningSums::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version 1's sums, as its JSON, read as they were written and carried over by name.
    #[test]
    fn version_1_sums_read_back_as_written_and_by_name() {
        let v1 = r#"{"epoch_loss":357.2,"epoch_correct":10.0,"epoch_samples":128,
            "interval_loss":86.7,"interval_correct":2.0,"interval_samples":32,"skipped_steps":1,
            "best_val_accuracy":0.25,"epoch_abs_err":0.0,"epoch_sq_err":0.0,"epoch_judged":128.0,
            "interval_abs_err":0.0,"interval_sq_err":0.0,"interval_judged":null,
            "best_val_loss":null}"#;
        let saved: SavedSums = serde_json::from_str(v1).unwrap();
        assert!(matches!(saved, SavedSums::Legacy(_)));
        let again: serde_json::Value = serde_json::to_value(&saved).unwrap();
        assert_eq!(
            again,
            serde_json::from_str::<serde_json::Value>(v1).unwrap()
        );
        let sums = saved.running();
        assert_eq!(sums.epoch.samples, 128);
        assert_eq!(sums.epoch.sums["loss.sum"], 357.2);
        assert_eq!(sums.epoch.sums["accuracy.right"], 10.0);
        assert_eq!(sums.epoch.sums["accuracy.judged"], 128.0);
        // No judged count: one element per sample (class labels).
        assert_eq!(sums.interval.sums["accuracy.judged"], 32.0);
        assert_eq!(sums.skipped_steps, 1);
        assert_eq!(sums.best_val, [("accuracy".to_owned(), 0.25)].into());
        // Version 2's by-name sums read as themselves; a damaged key is refused.
        let v2 = serde_json::to_string(&SavedSums::from(sums.clone())).unwrap();
        assert_eq!(
            serde_json::from_str::<SavedSums>(&v2).unwrap().running(),
            sums
        );
        let bad = v2.replace("skipped_steps", "skipped_stepz");
        assert!(serde_json::from_str::<SavedSums>(&bad).is_err());
    }
}
