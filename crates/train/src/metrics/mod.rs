//! The metrics a run reports beside its loss. Each is a [`Metric`]: it adds per-batch sums on
//! the device (no host synchronisation per step) and turns them into a named value when the run
//! reports. [`MetricSet`] holds a task's metrics, [`Tally`] their running sums, and
//! [`MetricValues`] the named values that records, summaries, curves and checkpoints carry.
//!
//! A new metric is one file in this module implementing [`Metric`], plus registering it: in
//! [`MetricSet::for_task`] (which tasks report it) and, for settings to name it
//! (`checkpoint.keep_best`), in the metric vocabulary `kiln_core::options::MetricName`.

mod accuracy;
mod dice;
mod forecast;
mod loss;
mod mae;
mod rmse;
mod tally;
mod values;

use std::cell::OnceCell;
use std::sync::Arc;

use tch::{Kind, Tensor};

pub use self::accuracy::Accuracy;
pub use self::dice::Dice;
pub use self::forecast::{ForecastSpec, is_horizon_step};
pub use self::loss::MeanLoss;
pub use self::mae::Mae;
pub use self::rmse::Rmse;
pub use self::tally::{SavedTally, Tally};
pub use self::values::MetricValues;
use crate::TrainError;

/// Which metrics a task reports besides its loss (see [`MetricSet::for_task`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Share of elements right: arg-max over dimension 1 (classes) or logit > 0 (multi-label).
    Accuracy,
    /// A class map's: accuracy per voxel and the foreground Dice score.
    Segmentation,
    /// Mean absolute and root-mean-square error.
    Regression,
    /// The loss alone (a module's own loss on value targets: its output need not be shaped
    /// like the target, e.g. quantiles).
    LossOnly,
}

/// An output `[B, 1]` for targets `[B]` (one value per sample) as `[B]`; others as they are.
pub(crate) fn one_value_per_sample(output: &Tensor, target: &Tensor) -> Result<Tensor, TrainError> {
    let (out, tgt) = (output.size(), target.size());
    if out.len() == tgt.len() + 1 && out.last() == Some(&1) {
        return Ok(output.f_squeeze_dim(-1)?);
    }
    Ok(output.shallow_clone())
}

/// What a metric sees of one batch (detached from the graph).
#[derive(Debug)]
pub struct BatchOutput<'a> {
    /// The batch's mean loss, a scalar.
    pub loss: &'a Tensor,
    /// The model's output (`[B, 1]` for targets `[B]` already as `[B]`).
    pub output: &'a Tensor,
    pub target: &'a Tensor,
    /// Samples in the batch.
    pub samples: i64,
    error: OnceCell<Option<Tensor>>,
    classes: OnceCell<Option<Tensor>>,
    forecast: OnceCell<Option<forecast::StepSums>>,
}

impl<'a> BatchOutput<'a> {
    pub fn new(loss: &'a Tensor, output: &'a Tensor, target: &'a Tensor) -> Self {
        Self {
            loss,
            output,
            target,
            samples: target.size().first().copied().unwrap_or(0),
            error: OnceCell::new(),
            classes: OnceCell::new(),
            forecast: OnceCell::new(),
        }
    }

    /// The forecast's sums per horizon step under `spec` (`None` where the output is no
    /// forecast of the target); computed once for every forecast metric of the batch.
    pub(crate) fn forecast(
        &self,
        spec: &ForecastSpec,
    ) -> Result<Option<&forecast::StepSums>, TrainError> {
        if self.forecast.get().is_none() {
            let sums = forecast::step_sums(self.output, self.target, spec)?;
            let _ = self.forecast.set(sums);
        }
        Ok(self.forecast.get().and_then(Option::as_ref))
    }

    /// `output − target` in f32 where the output is shaped like the target (regression), else
    /// `None`; computed once for every metric that asks.
    pub fn error(&self) -> Result<Option<&Tensor>, TrainError> {
        if self.error.get().is_none() {
            let error = if self.output.size() == self.target.size() {
                Some(self.output.f_to_kind(Kind::Float)?.f_sub(self.target)?)
            } else {
                None
            };
            let _ = self.error.set(error);
        }
        Ok(self.error.get().and_then(Option::as_ref))
    }

    /// The predicted class of every target element (arg-max over the output's dimension 1)
    /// where the targets are classes and the output holds a score per class for each,
    /// `[B, C, *target[1..]]`; else `None`. Computed once for every metric that asks.
    pub fn classes(&self) -> Result<Option<&Tensor>, TrainError> {
        if self.classes.get().is_none() {
            let (out, tgt) = (self.output.size(), self.target.size());
            let scores = !self.target.is_floating_point()
                && out.len() == tgt.len() + 1
                && out[0] == tgt[0]
                && out[2..] == tgt[1..];
            let classes = if scores {
                Some(self.output.f_argmax(1, false)?)
            } else {
                None
            };
            let _ = self.classes.set(classes);
        }
        Ok(self.classes.get().and_then(Option::as_ref))
    }

    /// A 0-dim f32 tensor holding `value` on the batch's device (no synchronisation).
    pub fn constant(&self, value: f64) -> Result<Tensor, TrainError> {
        Ok(Tensor::f_scalar_tensor(
            value,
            (Kind::Float, self.target.device()),
        )?)
    }
}

/// A metric: sums per batch on the device, a value from the sums when reported.
pub trait Metric: std::fmt::Debug + Send + Sync {
    /// Its name in records (`accuracy`), reported as `train_accuracy`, `val_accuracy`, ….
    fn name(&self) -> &str;

    /// Whether a larger value is better (which validation value is the best so far).
    fn higher_is_better(&self) -> bool {
        false
    }

    /// The names of its sums, as checkpoints save them (`<name>.<sum>`).
    fn sums(&self) -> &'static [&'static str];

    /// One batch's sums: a 0-dim f32 tensor per name of [`Metric::sums`], on the batch's
    /// device, computed without a host synchronisation.
    fn batch(&self, batch: &BatchOutput<'_>) -> Result<Vec<Tensor>, TrainError>;

    /// Its value from its sums over `samples` samples; `None` where nothing could be judged.
    fn value(&self, sums: &[f64], samples: u64) -> Option<f64>;
}

/// One batch's sums of every metric of a set, in the set's order (f32, on the device).
#[derive(Debug)]
pub struct BatchSums {
    pub values: Tensor,
}

impl BatchSums {
    /// Adds `other` (another micro-batch of the same step).
    pub fn add(&mut self, other: &BatchSums) -> Result<(), TrainError> {
        self.values = self.values.f_add(&other.values)?;
        Ok(())
    }
}

/// The metrics a run reports: its task's (the mean loss first), then any added.
#[derive(Debug, Clone)]
pub struct MetricSet {
    kind: MetricKind,
    /// A windowed run's forecast, whose metrics replace the task's besides the loss.
    forecast: Option<Arc<ForecastSpec>>,
    metrics: Vec<Arc<dyn Metric>>,
    /// How many of `metrics`, at the end, were added to the task's.
    added: usize,
}

impl MetricSet {
    /// The metrics of a task: the loss, and accuracy (class and multi-label targets) or MAE
    /// and RMSE (value targets) where the model's output can be judged.
    pub fn for_task(kind: MetricKind) -> Self {
        Self::build(kind, None)
    }

    fn build(kind: MetricKind, forecast: Option<Arc<ForecastSpec>>) -> Self {
        use MetricKind as K;
        let metrics: Vec<Arc<dyn Metric>> = match (&forecast, kind) {
            (Some(f), _) => std::iter::once(Arc::new(MeanLoss) as Arc<dyn Metric>)
                .chain(f.metrics())
                .collect(),
            (None, K::Accuracy) => vec![Arc::new(MeanLoss), Arc::new(Accuracy)],
            (None, K::Segmentation) => vec![Arc::new(MeanLoss), Arc::new(Accuracy), Arc::new(Dice)],
            (None, K::Regression) => vec![Arc::new(MeanLoss), Arc::new(Mae), Arc::new(Rmse)],
            (None, K::LossOnly) => vec![Arc::new(MeanLoss)],
        };
        Self {
            kind,
            forecast,
            metrics,
            added: 0,
        }
    }

    /// The set for a forecast (a windowed dataset): the loss, then MAE, RMSE and, with
    /// quantile levels, the quantile loss over the horizon and per step (see
    /// [`ForecastSpec::metrics`]), then the metrics added to this set.
    pub fn forecasting(&self, spec: Arc<ForecastSpec>) -> Result<Self, TrainError> {
        self.rebuilt(Self::build(self.kind, Some(spec)))
    }

    /// The forecast the set judges, if it is a forecast's.
    pub fn forecast(&self) -> Option<&ForecastSpec> {
        self.forecast.as_deref()
    }

    /// The task's metrics the set was made for.
    pub fn kind(&self) -> MetricKind {
        self.kind
    }

    /// The metrics of task `kind`, with the metrics added to this set.
    pub fn for_other_task(&self, kind: MetricKind) -> Result<Self, TrainError> {
        self.rebuilt(Self::build(kind, self.forecast.clone()))
    }

    /// `base` with the metrics added to this set.
    fn rebuilt(&self, base: Self) -> Result<Self, TrainError> {
        let added = &self.metrics[self.metrics.len() - self.added..];
        added.iter().try_fold(base, |set, m| set.with(m.clone()))
    }

    /// The set with `metric` added (after the others); another of the same name is an error.
    pub fn with(mut self, metric: Arc<dyn Metric>) -> Result<Self, TrainError> {
        if self.get(metric.name()).is_some() {
            return Err(TrainError::InvalidPlan {
                key: "metrics",
                value: metric.name().to_owned(),
                expected: format!(
                    "a metric name not taken already ({})",
                    self.names().collect::<Vec<_>>().join(", ")
                ),
            });
        }
        self.metrics.push(metric);
        self.added += 1;
        Ok(self)
    }

    /// The metric named `name`.
    pub fn get(&self, name: &str) -> Option<&dyn Metric> {
        self.metrics
            .iter()
            .find(|m| m.name() == name)
            .map(|m| m.as_ref())
    }

    /// The metrics' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.metrics.iter().map(|m| m.name())
    }

    /// How many sums a batch of the set has.
    pub fn sums_len(&self) -> usize {
        self.metrics.iter().map(|m| m.sums().len()).sum()
    }

    /// The names of the sums, `<metric>.<sum>`, in order.
    pub fn sum_names(&self) -> Vec<String> {
        self.metrics
            .iter()
            .flat_map(|m| m.sums().iter().map(|s| format!("{}.{s}", m.name())))
            .collect()
    }

    /// One batch's sums of every metric, with no host synchronisation.
    pub fn batch_sums(
        &self,
        loss: &Tensor,
        output: &Tensor,
        target: &Tensor,
    ) -> Result<BatchSums, TrainError> {
        let loss = loss.f_detach()?;
        let output = one_value_per_sample(&output.f_detach()?, target)?;
        let batch = BatchOutput::new(&loss, &output, target);
        let mut parts = Vec::with_capacity(self.sums_len());
        for m in &self.metrics {
            let sums = m.batch(&batch)?;
            debug_assert_eq!(sums.len(), m.sums().len(), "{}", m.name());
            for s in sums {
                // (Most sums are 0-dim f32 already: checked on the host, no op dispatched.)
                let s = match s.kind() == Kind::Float && s.dim() == 0 {
                    true => s,
                    false => s.f_to_kind(Kind::Float)?.f_reshape([])?,
                };
                parts.push(s);
            }
        }
        Ok(BatchSums {
            values: Tensor::f_stack(&parts, 0)?,
        })
    }

    /// The named values of `sums` (laid out as [`MetricSet::batch_sums`]) over `samples`.
    pub fn values(&self, sums: &[f64], samples: u64) -> MetricValues {
        let mut at = 0;
        let mut values = MetricValues::default();
        for m in &self.metrics {
            let n = m.sums().len();
            let own = sums.get(at..at + n).unwrap_or(&[]);
            if own.len() == n
                && let Some(v) = m.value(own, samples)
            {
                values.push(m.name(), v);
            }
            at += n;
        }
        values
    }

    /// Whether the metric named `name` is better higher (unknown names: lower is better).
    pub fn higher_is_better(&self, name: &str) -> bool {
        self.get(name).is_some_and(|m| m.higher_is_better())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tch::{Kind, Tensor};

    use super::MetricKind;
    use super::*;

    fn values(v: &[f32], shape: &[i64]) -> Tensor {
        Tensor::from_slice(v).view(shape)
    }

    fn sums_of(set: &MetricSet, loss: f32, output: &Tensor, target: &Tensor) -> Vec<f32> {
        let sums = set.batch_sums(&Tensor::from(loss), output, target).unwrap();
        Vec::<f32>::try_from(&sums.values).unwrap()
    }

    #[test]
    fn metric_sums_judge_what_they_can() {
        let acc = MetricSet::for_task(MetricKind::Accuracy);
        // Per-pixel accuracy: 3 of 4 pixels right.
        let logits = values(&[1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0], &[1, 2, 2, 2]);
        let mask = Tensor::from_slice(&[0i64, 0, 1, 0]).view([1, 2, 2]);
        assert_eq!(sums_of(&acc, 0.0, &logits, &mask), [0.0, 3.0, 4.0]);
        // Multi-label: logit sign against 0/1 labels.
        let multi = sums_of(
            &acc,
            0.0,
            &values(&[2.0, -1.0, 0.5], &[1, 3]),
            &values(&[1.0, 0.0, 0.0], &[1, 3]),
        );
        assert_eq!(multi, [0.0, 2.0, 3.0]);
        // Regression: the loss times the samples, |e| and e² over every element, each counted.
        let reg = MetricSet::for_task(MetricKind::Regression);
        let sums = sums_of(
            &reg,
            2.0,
            &values(&[1.0, 2.0], &[2, 1]),
            &values(&[0.0, 4.0], &[2]),
        );
        assert_eq!(sums, [4.0, 3.0, 2.0, 5.0, 2.0]);
        let v = reg.values(&sums.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(), 2);
        assert_eq!(v.get("loss"), Some(2.0));
        assert_eq!(v.get("mae"), Some(1.5));
        assert!((v.get("rmse").unwrap() - 2.5f64.sqrt()).abs() < 1e-12);
        // An output of another layout (a module's own loss) is not judged: no accuracy at all.
        let unjudged = sums_of(
            &acc,
            0.0,
            &values(&[1.0, 2.0, 3.0], &[1, 3]),
            &Tensor::from_slice(&[0i64, 1]).view([1, 2]),
        );
        assert_eq!(unjudged, [0.0, 0.0, 0.0]);
        let v = acc.values(&[0.0, 0.0, 0.0], 1);
        assert_eq!((v.get("loss"), v.get("accuracy")), (Some(0.0), None));
    }

    /// The foreground Dice score of class maps, per class by a slow loop over voxels, summed
    /// over classes and batches, equals the metric's from its on-device sums.
    #[test]
    fn dice_matches_a_voxel_by_voxel_reference() {
        let set = MetricSet::for_task(MetricKind::Segmentation);
        assert_eq!(
            set.names().collect::<Vec<_>>(),
            ["loss", "accuracy", "dice"]
        );
        tch::manual_seed(3);
        let (mut total, mut reference) = (vec![0.0f64; set.sums_len()], [0.0f64; 3]);
        for _ in 0..3 {
            let scores = Tensor::randn([2, 3, 4, 5, 6], (Kind::Float, tch::Device::Cpu));
            let target = Tensor::randint(3, [2, 4, 5, 6], (Kind::Int64, tch::Device::Cpu));
            let sums = sums_of(&set, 0.0, &scores, &target);
            total
                .iter_mut()
                .zip(&sums)
                .for_each(|(t, s)| *t += f64::from(*s));
            let predicted = Vec::<i64>::try_from(scores.argmax(1, false).flatten(0, -1)).unwrap();
            let actual = Vec::<i64>::try_from(target.flatten(0, -1)).unwrap();
            for class in 1..3 {
                for (p, a) in predicted.iter().zip(&actual) {
                    let (p, a) = (*p == class, *a == class);
                    reference[0] += f64::from(u8::from(p && a));
                    reference[1] += f64::from(u8::from(p));
                    reference[2] += f64::from(u8::from(a));
                }
            }
        }
        let dice = set.values(&total, 6).get("dice").unwrap();
        let expected = 2.0 * reference[0] / (reference[1] + reference[2]);
        assert!((dice - expected).abs() < 1e-9, "{dice} vs {expected}");
        assert!(
            dice > 0.2 && dice < 0.9,
            "random scores give a middling Dice: {dice}"
        );
        // Neither side has foreground: not reported; labels per sample: not judged.
        assert_eq!(set.values(&[0.0; 6], 1).get("dice"), None);
        let labels = sums_of(
            &set,
            0.0,
            &values(&[1.0, 0.0], &[1, 2]),
            &Tensor::from_slice(&[1i64]),
        );
        assert_eq!(labels[3..], [0.0, 0.0, 0.0]);
    }

    /// Built-in metrics agree with the vocabulary settings name them by: every name settings
    /// accept is reported by some task, in the same direction.
    #[test]
    fn the_registry_and_the_setting_vocabulary_agree() {
        let sets = [
            MetricKind::Accuracy,
            MetricKind::Segmentation,
            MetricKind::Regression,
            MetricKind::LossOnly,
        ]
        .map(MetricSet::for_task);
        for name in kiln_config::MetricName::ALL {
            let metric = sets
                .iter()
                .find_map(|s| s.get(name.key()))
                .unwrap_or_else(|| panic!("no task reports the setting's metric {name}"));
            assert_eq!(metric.higher_is_better(), name.higher_is_better(), "{name}");
        }
        for set in &sets {
            assert_eq!(set.names().next(), Some("loss"));
            assert_eq!(set.sum_names().len(), set.sums_len());
        }
    }

    /// A metric of one's own: one type, added to a set; it is tallied, read and saved by name.
    #[derive(Debug)]
    struct MaxAbsOutput;

    impl Metric for MaxAbsOutput {
        fn name(&self) -> &str {
            "max_abs_output"
        }
        fn sums(&self) -> &'static [&'static str] {
            &["max_sum", "batches"]
        }
        fn batch(&self, batch: &BatchOutput<'_>) -> Result<Vec<Tensor>, crate::TrainError> {
            Ok(vec![
                batch.output.f_abs()?.f_max()?.f_to_kind(Kind::Float)?,
                batch.constant(1.0)?,
            ])
        }
        fn value(&self, sums: &[f64], _samples: u64) -> Option<f64> {
            (sums[1] > 0.0).then(|| sums[0] / sums[1])
        }
    }

    #[test]
    fn a_new_metric_is_one_type_added_to_the_set() {
        let set = MetricSet::for_task(MetricKind::LossOnly)
            .with(Arc::new(MaxAbsOutput))
            .unwrap();
        let e = set.clone().with(Arc::new(MaxAbsOutput)).unwrap_err();
        assert!(e.to_string().contains("max_abs_output"), "{e}");
        let mut tally = Tally::new(&set, tch::Device::Cpu).unwrap();
        for (loss, out) in [(1.0, [3.0, -5.0]), (3.0, [1.0, 2.0])] {
            let sums = set
                .batch_sums(
                    &Tensor::from(loss as f32),
                    &values(&out, &[2]),
                    &values(&[0.0; 2], &[2]),
                )
                .unwrap();
            tally.add(&sums, 2).unwrap();
        }
        let v = tally.read().unwrap();
        assert_eq!(v.get("loss"), Some(2.0));
        assert_eq!(v.get("max_abs_output"), Some(3.5));
        let saved = tally.saved().unwrap();
        assert_eq!(saved.sums["max_abs_output.max_sum"], 7.0);
        let back = Tally::restore(&set, &saved, tch::Device::Cpu).unwrap();
        assert_eq!(back.read().unwrap(), v);
        // Written out as one key per value, behind a prefix where asked.
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"loss":2.0,"max_abs_output":3.5}"#
        );
        let mut under = Vec::new();
        v.serialize_under("val_", &mut serde_json::Serializer::new(&mut under))
            .unwrap();
        assert_eq!(
            String::from_utf8(under).unwrap(),
            r#"{"val_loss":2.0,"val_max_abs_output":3.5}"#
        );
    }
}
