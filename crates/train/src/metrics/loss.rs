//! The mean loss per sample: the first metric of every run.

use tch::{Kind, Tensor};

use super::{BatchOutput, Metric};
use crate::TrainError;

/// The mean of the batches' mean losses, weighted by their samples.
#[derive(Debug, Clone, Copy)]
pub struct MeanLoss;

impl Metric for MeanLoss {
    fn name(&self) -> &str {
        "loss"
    }

    fn sums(&self) -> &'static [&'static str] {
        &["sum"]
    }

    fn batch(&self, batch: &BatchOutput<'_>) -> Result<Vec<Tensor>, TrainError> {
        let weighted = batch
            .loss
            .f_mul_scalar(batch.samples as f64)?
            .f_to_kind(Kind::Float)?;
        Ok(vec![weighted])
    }

    fn value(&self, sums: &[f64], samples: u64) -> Option<f64> {
        Some(sums[0] / samples.max(1) as f64)
    }
}
