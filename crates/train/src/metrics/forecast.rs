//! Forecast metrics: MAE, RMSE and the quantile (pinball) loss of a forecaster's output against
//! a windowed dataset's horizon targets (original units), over the whole horizon and per step.
//!
//! The output is a point forecast shaped like the target (`[B, H]`, or `[B, H, targets]`), or
//! quantiles with one more dimension of the levels `model.quantiles` names: MAE and RMSE then
//! judge the median (the level nearest 0.5), and the quantile loss is the pinball loss averaged
//! over the levels, as pytorch-forecasting's `QuantileLoss` reduces it.

use std::sync::Arc;

use tch::{Kind, Tensor};

use super::{BatchOutput, Metric};
use crate::TrainError;

/// What a windowed run forecasts: its horizon and the quantile levels of the output, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct ForecastSpec {
    pub horizon: usize,
    pub levels: Option<Vec<f64>>,
}

impl ForecastSpec {
    /// The metrics of the forecast: MAE, RMSE (and the quantile loss with levels) over the
    /// horizon, then each per step (`mae_h1`, `rmse_h1`, `quantile_loss_h1`, …, from 1).
    pub fn metrics(self: &Arc<Self>) -> Vec<Arc<dyn Metric>> {
        let mut measures = vec![Measure::Mae, Measure::Rmse];
        if self.levels.is_some() {
            measures.push(Measure::QuantileLoss);
        }
        let steps = std::iter::once(None).chain((0..self.horizon).map(Some));
        steps
            .flat_map(|step| measures.iter().map(move |&m| (m, step)))
            .map(|(measure, step)| {
                let name = match step {
                    None => measure.name().to_owned(),
                    Some(s) => format!("{}_h{}", measure.name(), s + 1),
                };
                Arc::new(Forecast {
                    measure,
                    step,
                    name,
                    spec: self.clone(),
                }) as Arc<dyn Metric>
            })
            .collect()
    }
}

/// Whether `name` is a forecast metric's value at one horizon step (`mae_h3`): progress lines
/// leave those to the summary and the curves.
pub fn is_horizon_step(name: &str) -> bool {
    let measures = [Measure::Mae, Measure::Rmse, Measure::QuantileLoss];
    measures.iter().any(|m| {
        name.strip_prefix(m.name())
            .and_then(|rest| rest.strip_prefix("_h"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Measure {
    Mae,
    Rmse,
    QuantileLoss,
}

impl Measure {
    fn name(self) -> &'static str {
        match self {
            Measure::Mae => "mae",
            Measure::Rmse => "rmse",
            Measure::QuantileLoss => "quantile_loss",
        }
    }
}

/// One measure of the forecast, over the horizon or at one step.
#[derive(Debug)]
struct Forecast {
    measure: Measure,
    /// The horizon step (from 0), or `None` for the whole horizon.
    step: Option<usize>,
    name: String,
    spec: Arc<ForecastSpec>,
}

impl Metric for Forecast {
    fn name(&self) -> &str {
        &self.name
    }

    fn sums(&self) -> &'static [&'static str] {
        match self.measure {
            Measure::Mae => &["abs_err", "judged"],
            Measure::Rmse => &["sq_err", "judged"],
            Measure::QuantileLoss => &["pinball", "judged"],
        }
    }

    fn batch(&self, batch: &BatchOutput<'_>) -> Result<Vec<Tensor>, TrainError> {
        let Some(sums) = batch.forecast(&self.spec)? else {
            return Ok(vec![batch.constant(0.0)?, batch.constant(0.0)?]);
        };
        let per_step = match self.measure {
            Measure::Mae => &sums.abs_err,
            Measure::Rmse => &sums.sq_err,
            Measure::QuantileLoss => match &sums.pinball {
                Some(p) => p,
                None => return Ok(vec![batch.constant(0.0)?, batch.constant(0.0)?]),
            },
        };
        let judged = sums.judged_per_step;
        Ok(match self.step {
            Some(s) => vec![
                per_step.f_select(0, s as i64)?,
                batch.constant(judged as f64)?,
            ],
            None => vec![
                per_step.f_sum(Kind::Float)?,
                batch.constant((judged * sums.steps) as f64)?,
            ],
        })
    }

    fn value(&self, sums: &[f64], _samples: u64) -> Option<f64> {
        (sums[1] > 0.0).then(|| match self.measure {
            Measure::Rmse => (sums[0] / sums[1]).sqrt(),
            _ => sums[0] / sums[1],
        })
    }
}

/// One batch's sums per horizon step (`[H]` f32 tensors on the device), computed once for
/// every forecast metric of the batch.
#[derive(Debug)]
pub(crate) struct StepSums {
    abs_err: Tensor,
    sq_err: Tensor,
    pinball: Option<Tensor>,
    /// Elements judged at each step (samples × targets).
    judged_per_step: i64,
    steps: i64,
}

/// The per-step sums of `output` against `target` (`[B, H, …]`), or `None` where the output
/// is neither shaped like the target nor like it with a last dimension of `spec`'s levels.
pub(crate) fn step_sums(
    output: &Tensor,
    target: &Tensor,
    spec: &ForecastSpec,
) -> Result<Option<StepSums>, TrainError> {
    let (out, tgt) = (output.size(), target.size());
    if tgt.len() < 2 || tgt[1] != spec.horizon as i64 {
        return Ok(None);
    }
    let target = target.f_to_kind(Kind::Float)?;
    let output = output.f_to_kind(Kind::Float)?;
    let levels = spec.levels.as_deref().unwrap_or(&[]);
    let quantiles = out.len() == tgt.len() + 1
        && out[..tgt.len()] == tgt[..]
        && out.last() == Some(&(levels.len() as i64))
        && !levels.is_empty();
    let point = match (out == tgt, quantiles) {
        (true, _) => output.shallow_clone(),
        (false, true) => output.f_select(-1, median(levels) as i64)?,
        (false, false) => return Ok(None),
    };
    let steps = tgt[1];
    let per_step = |t: Tensor| -> Result<Tensor, TrainError> {
        Ok(t.f_transpose(0, 1)?
            .f_reshape([steps, -1])?
            .f_sum_dim_intlist(1, false, Kind::Float)?)
    };
    let err = point.f_sub(&target)?;
    let pinball = match quantiles {
        true => {
            let q = Tensor::f_from_slice(levels)?
                .f_to_kind(Kind::Float)?
                .f_to_device(output.device())?;
            let e = target.f_unsqueeze(-1)?.f_sub(&output)?;
            let loss = e.f_mul(&q)?.f_maximum(&e.f_mul(&q.f_sub_scalar(1.0)?)?)?;
            let mean = loss.f_mean_dim(-1, false, Kind::Float)?;
            Some(per_step(mean)?)
        }
        false => None,
    };
    Ok(Some(StepSums {
        abs_err: per_step(err.f_abs()?)?,
        sq_err: per_step(err.f_square()?)?,
        pinball,
        judged_per_step: tgt[0] * tgt[2..].iter().product::<i64>(),
        steps,
    }))
}

/// The index of the level nearest 0.5 (the first of two as near).
fn median(levels: &[f64]) -> usize {
    let far = |q: f64| (q - 0.5).abs();
    (0..levels.len())
        .min_by(|&a, &b| far(levels[a]).total_cmp(&far(levels[b])))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tch::Tensor;

    use super::*;
    use crate::metrics::{MetricKind, MetricSet};

    fn values_of(
        set: &MetricSet,
        output: &Tensor,
        target: &Tensor,
    ) -> crate::metrics::MetricValues {
        let sums = set
            .batch_sums(&Tensor::from(0.5f32), output, target)
            .unwrap();
        let sums: Vec<f64> = Vec::<f32>::try_from(&sums.values)
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect();
        set.values(&sums, target.size()[0] as u64)
    }

    /// A slow reference: the pinball loss of one prediction, averaged over the levels.
    fn pinball(levels: &[f64], y: f64, preds: &[f64]) -> f64 {
        let each = levels.iter().zip(preds).map(|(&q, &p)| {
            let e = y - p;
            (q * e).max((q - 1.0) * e)
        });
        each.sum::<f64>() / levels.len() as f64
    }

    #[test]
    fn quantile_forecasts_are_judged_per_step_against_a_reference() {
        let levels = vec![0.1, 0.5, 0.9];
        let spec = Arc::new(ForecastSpec {
            horizon: 2,
            levels: Some(levels.clone()),
        });
        let set = MetricSet::for_task(MetricKind::LossOnly)
            .forecasting(spec)
            .unwrap();
        // Two windows, two steps, three quantiles each.
        let y = [[1.0, 4.0], [2.0, -1.0]];
        let p = [
            [[0.0, 1.5, 2.0], [3.0, 3.5, 5.0]],
            [[1.0, 2.0, 2.5], [-3.0, 0.0, 1.0]],
        ];
        let flat: Vec<f32> = p.iter().flatten().flatten().map(|&v| v as f32).collect();
        let output = Tensor::from_slice(&flat).view([2, 2, 3]);
        let target = Tensor::from_slice(&[1.0f32, 4.0, 2.0, -1.0]).view([2, 2]);
        let v = values_of(&set, &output, &target);
        for h in 0..2 {
            let errs: Vec<f64> = (0..2).map(|b| p[b][h][1] - y[b][h]).collect();
            let mae = errs.iter().map(|e| e.abs()).sum::<f64>() / 2.0;
            let mse = errs.iter().map(|e| e * e).sum::<f64>() / 2.0;
            let ql = (0..2)
                .map(|b| pinball(&levels, y[b][h], &p[b][h]))
                .sum::<f64>()
                / 2.0;
            let close = |name: String, want: f64| {
                let got = v.get(&name).unwrap_or_else(|| panic!("no {name}: {v:?}"));
                assert!((got - want).abs() < 1e-6, "{name}: {got} against {want}");
            };
            close(format!("mae_h{}", h + 1), mae);
            close(format!("rmse_h{}", h + 1), mse.sqrt());
            close(format!("quantile_loss_h{}", h + 1), ql);
        }
        let all: f64 = (0..2)
            .flat_map(|b| (0..2).map(move |h| (b, h)))
            .map(|(b, h)| pinball(&levels, y[b][h], &p[b][h]))
            .sum();
        assert!((v.get("quantile_loss").unwrap() - all / 4.0).abs() < 1e-6);
        assert_eq!(v.get("loss"), Some(0.5));
    }

    #[test]
    fn point_forecasts_have_no_quantile_loss_and_other_outputs_are_not_judged() {
        let spec = Arc::new(ForecastSpec {
            horizon: 3,
            levels: None,
        });
        let set = MetricSet::for_task(MetricKind::Regression)
            .forecasting(spec)
            .unwrap();
        let target = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).view([1, 3]);
        let output = Tensor::from_slice(&[2.0f32, 2.0, 0.0]).view([1, 3]);
        let v = values_of(&set, &output, &target);
        assert_eq!(v.get("mae"), Some(4.0 / 3.0));
        assert_eq!(v.get("mae_h3"), Some(3.0));
        assert_eq!(v.get("rmse_h1"), Some(1.0));
        assert_eq!(v.get("quantile_loss"), None);
        assert_eq!(set.names().filter(|n| n.starts_with("mae")).count(), 4);
        // Quantiles without levels to name them: nothing judged, nothing reported.
        let v = values_of(
            &set,
            &Tensor::zeros([1, 3, 3], tch::kind::FLOAT_CPU),
            &target,
        );
        assert_eq!((v.get("mae"), v.get("mae_h1")), (None, None));
        assert_eq!(v.get("loss"), Some(0.5));
    }

    #[test]
    fn horizon_step_names_are_told_apart() {
        assert!(is_horizon_step("mae_h1") && is_horizon_step("quantile_loss_h12"));
        assert!(!is_horizon_step("mae") && !is_horizon_step("rmse_h") && !is_horizon_step("x_h1"));
    }

    #[test]
    fn the_median_is_the_level_nearest_one_half() {
        assert_eq!(median(&[0.1, 0.5, 0.9]), 1);
        assert_eq!(median(&[0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98]), 3);
        assert_eq!(median(&[0.2, 0.4, 0.9]), 1);
        assert_eq!(median(&[0.7]), 0);
    }
}
