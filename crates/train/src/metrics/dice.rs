//! The Dice score of a segmentation: how well the predicted class map overlaps the target's
//! foreground (every class but 0), 2·|P ∩ T| / (|P| + |T|), over all of an epoch's voxels.

use tch::{Kind, Tensor};

use super::{BatchOutput, Metric};
use crate::TrainError;

/// The foreground Dice score of class-map targets (`[B, *spatial]` against scores
/// `[B, C, *spatial]`, the class by arg-max): summed over the foreground classes and the epoch's
/// voxels before dividing (micro-averaged), so that with one foreground class it is that
/// class's Dice. Not reported for other outputs, or where neither side has any foreground.
#[derive(Debug, Clone, Copy)]
pub struct Dice;

impl Metric for Dice {
    fn name(&self) -> &str {
        "dice"
    }

    fn higher_is_better(&self) -> bool {
        true
    }

    fn sums(&self) -> &'static [&'static str] {
        &["overlap", "predicted", "actual"]
    }

    fn batch(&self, batch: &BatchOutput<'_>) -> Result<Vec<Tensor>, TrainError> {
        let class_map = batch.target.dim() >= 2;
        let Some(predicted) = batch.classes()?.filter(|_| class_map) else {
            return (0..3).map(|_| batch.constant(0.0)).collect();
        };
        let actual = batch.target;
        let overlap = predicted
            .f_eq_tensor(actual)?
            .f_logical_and(&actual.f_ne(0)?)?;
        Ok(vec![
            overlap.f_sum(Kind::Float)?,
            predicted.f_ne(0)?.f_sum(Kind::Float)?,
            actual.f_ne(0)?.f_sum(Kind::Float)?,
        ])
    }

    fn value(&self, sums: &[f64], _samples: u64) -> Option<f64> {
        let total = sums[1] + sums[2];
        (total > 0.0).then(|| 2.0 * sums[0] / total)
    }
}
