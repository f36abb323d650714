//! Accuracy: the share of target elements right (class targets by arg-max over dimension 1,
//! multi-label targets by the logit's sign against a 0.5 threshold).

use tch::{Kind, Tensor};

use super::{BatchOutput, Metric};
use crate::TrainError;

/// The share of target elements right; not reported where the output cannot be judged that
/// way (a module's own loss on another layout).
#[derive(Debug, Clone, Copy)]
pub struct Accuracy;

impl Metric for Accuracy {
    fn name(&self) -> &str {
        "accuracy"
    }

    fn higher_is_better(&self) -> bool {
        true
    }

    fn sums(&self) -> &'static [&'static str] {
        &["right", "judged"]
    }

    fn batch(&self, batch: &BatchOutput<'_>) -> Result<Vec<Tensor>, TrainError> {
        Ok(match right(batch)? {
            Some(right) => vec![right, batch.constant(batch.target.numel() as f64)?],
            None => vec![batch.constant(0.0)?, batch.constant(0.0)?],
        })
    }

    fn value(&self, sums: &[f64], _samples: u64) -> Option<f64> {
        (sums[1] > 0.0).then(|| sums[0] / sums[1])
    }
}

/// The number of right elements, or `None` for an output that cannot be judged.
fn right(batch: &BatchOutput<'_>) -> Result<Option<Tensor>, TrainError> {
    let (output, target) = (batch.output, batch.target);
    let right = if target.is_floating_point() && output.size() == target.size() {
        output.f_gt(0.0)?.f_eq_tensor(&target.f_gt(0.5)?)?
    } else if let Some(classes) = batch.classes()? {
        classes.f_eq_tensor(target)?
    } else {
        return Ok(None);
    };
    Ok(Some(right.f_sum(Kind::Float)?))
}
