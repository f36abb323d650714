//! RMSE: the root-mean-square error per target element (value targets).

use tch::{Kind, Tensor};

use super::{BatchOutput, Metric};
use crate::TrainError;

/// The root of the mean squared error per target element; not reported where the output is
/// not shaped like the target.
#[derive(Debug, Clone, Copy)]
pub struct Rmse;

impl Metric for Rmse {
    fn name(&self) -> &str {
        "rmse"
    }

    fn sums(&self) -> &'static [&'static str] {
        &["sq_err", "judged"]
    }

    fn batch(&self, batch: &BatchOutput<'_>) -> Result<Vec<Tensor>, TrainError> {
        Ok(match batch.error()? {
            Some(err) => vec![
                err.f_square()?.f_sum(Kind::Float)?,
                batch.constant(err.numel() as f64)?,
            ],
            None => vec![batch.constant(0.0)?, batch.constant(0.0)?],
        })
    }

    fn value(&self, sums: &[f64], _samples: u64) -> Option<f64> {
        (sums[1] > 0.0).then(|| (sums[0] / sums[1]).sqrt())
    }
}
