//! The loss a run minimises (cross-entropy, MSE, L1, Huber, BCE with logits, or the model's
//! own) and the metrics that follow the task (accuracy per element for classes and
//! multi-label targets, MAE and RMSE for regression), summed on the device without a host
//! synchronisation.

use kiln_config::LossKind;
use kiln_data::TargetSpec;
use tch::{Kind, Reduction, Tensor};

use crate::TrainError;
use crate::model::Model;

/// A resolved loss (never `auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    CrossEntropy,
    Mse,
    L1,
    Huber,
    BceWithLogits,
    /// The model's own [`Model::loss`].
    Module,
}

/// What a run reports besides its loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Share of elements right: arg-max over dimension 1 (classes) or logit > 0 (multi-label).
    Accuracy,
    /// Mean absolute and root-mean-square error.
    Regression,
    /// The loss alone (a module's own loss on value targets: its output need not be shaped
    /// like the target, e.g. quantiles).
    LossOnly,
}

impl Loss {
    /// The loss `kind` asks for, checked against the dataset's target: `auto` is cross-entropy
    /// for class targets and MSE for values; a loss that needs the other kind is an error.
    pub fn resolve(kind: LossKind, target: &TargetSpec) -> Result<Self, TrainError> {
        let classes = matches!(target, TargetSpec::Classes { .. });
        let loss = match kind {
            LossKind::Auto if classes => Loss::CrossEntropy,
            LossKind::Auto => Loss::Mse,
            LossKind::CrossEntropy => Loss::CrossEntropy,
            LossKind::Mse => Loss::Mse,
            LossKind::L1 => Loss::L1,
            LossKind::Huber => Loss::Huber,
            LossKind::BceWithLogits => Loss::BceWithLogits,
            LossKind::Module => Loss::Module,
        };
        let wants_classes = match loss {
            Loss::CrossEntropy => Some(true),
            Loss::Module => None,
            _ => Some(false),
        };
        if let Some(want) = wants_classes.filter(|&w| w != classes) {
            return Err(TrainError::InvalidPlan {
                key: "train.loss",
                value: kind.as_str().to_owned(),
                expected: format!(
                    "a loss for this dataset's targets ({target}): {}",
                    if want {
                        "cross_entropy needs integer class targets; use mse, l1, huber or \
                         bce_with_logits for values"
                    } else {
                        "use cross_entropy (or auto) for class targets"
                    }
                ),
            });
        }
        Ok(loss)
    }

    /// The loss `kind` asks for before the target is known (`auto` as cross-entropy, as for
    /// class labels); [`Loss::resolve`] decides it for a dataset.
    pub fn before_target(kind: LossKind) -> Self {
        match kind {
            LossKind::Auto | LossKind::CrossEntropy => Loss::CrossEntropy,
            LossKind::Mse => Loss::Mse,
            LossKind::L1 => Loss::L1,
            LossKind::Huber => Loss::Huber,
            LossKind::BceWithLogits => Loss::BceWithLogits,
            LossKind::Module => Loss::Module,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Loss::CrossEntropy => "cross_entropy",
            Loss::Mse => "mse",
            Loss::L1 => "l1",
            Loss::Huber => "huber",
            Loss::BceWithLogits => "bce_with_logits",
            Loss::Module => "module",
        }
    }

    /// The task as reports name it: the target's (classification, dense classification,
    /// regression), or multi-label classification for value targets under BCE with logits.
    pub fn task(self, target: &TargetSpec) -> &'static str {
        match (self, target) {
            (Loss::BceWithLogits, TargetSpec::Values { .. }) => "multi-label classification",
            _ => target.task(),
        }
    }

    /// The metrics that go with this loss on `target`.
    pub fn metric(self, target: &TargetSpec) -> MetricKind {
        match (self, target) {
            (Loss::CrossEntropy | Loss::BceWithLogits, _) => MetricKind::Accuracy,
            (Loss::Module, TargetSpec::Classes { .. }) => MetricKind::Accuracy,
            (Loss::Module, TargetSpec::Values { .. }) => MetricKind::LossOnly,
            _ => MetricKind::Regression,
        }
    }

    /// The mean loss of `output` against `target`, in f32. `classes`, where known, is how many
    /// classes class targets lie in: a cross-entropy output with fewer is an error (on CUDA it
    /// would be a device-side assert).
    pub fn compute(
        self,
        model: &dyn Model,
        output: &Tensor,
        target: &Tensor,
        classes: Option<usize>,
    ) -> Result<Tensor, TrainError> {
        if self == Loss::Module {
            return model.loss(output, target);
        }
        let output = &one_value_per_sample(self, output, target)?;
        check_shapes(self, output, target)?;
        if let Some(c) =
            classes.filter(|&c| self == Loss::CrossEntropy && output.size()[1] < c as i64)
        {
            return Err(TrainError::ShapeMismatch {
                what: "train.loss = cross_entropy".to_owned(),
                expected: format!("{c} class scores in dimension 1 (the data's classes)"),
                got: format!("the model's output has shape {:?}", output.size()),
            });
        }
        let output = output.f_to_kind(Kind::Float)?;
        Ok(match self {
            Loss::CrossEntropy => {
                output.f_cross_entropy_loss::<Tensor>(target, None, Reduction::Mean, -100, 0.0)?
            }
            Loss::Mse => output.f_mse_loss(target, Reduction::Mean)?,
            Loss::L1 => output.f_l1_loss(target, Reduction::Mean)?,
            Loss::Huber => output.f_huber_loss(target, Reduction::Mean, 1.0)?,
            Loss::BceWithLogits => output.f_binary_cross_entropy_with_logits::<Tensor>(
                target,
                None,
                None,
                Reduction::Mean,
            )?,
            Loss::Module => model.loss(&output, target)?,
        })
    }
}

/// An output `[B, 1]` for targets `[B]` (one value per sample) as `[B]`; others as they are.
fn one_value_per_sample(
    loss: Loss,
    output: &Tensor,
    target: &Tensor,
) -> Result<Tensor, TrainError> {
    let (out, tgt) = (output.size(), target.size());
    if loss != Loss::CrossEntropy && out.len() == tgt.len() + 1 && out.last() == Some(&1) {
        return Ok(output.f_squeeze_dim(-1)?);
    }
    Ok(output.shallow_clone())
}

/// The output shape a loss needs for a target of `target` shape, or an error naming both.
fn check_shapes(loss: Loss, output: &Tensor, target: &Tensor) -> Result<(), TrainError> {
    let (out, tgt) = (output.size(), target.size());
    let fits = match loss {
        // [B, C] for [B]; [B, C, H, W] for [B, H, W].
        Loss::CrossEntropy => {
            out.len() == tgt.len() + 1 && out[0] == tgt[0] && out[2..] == tgt[1..] && out[1] >= 1
        }
        _ => out == tgt,
    };
    if fits {
        return Ok(());
    }
    let expected = match loss {
        Loss::CrossEntropy => {
            let mut e = vec![tgt.first().copied().unwrap_or(0)];
            e.push(-1);
            e.extend_from_slice(tgt.get(1..).unwrap_or(&[]));
            format!(
                "an output of shape [{}] (the classes in dimension 1) for targets of shape {tgt:?}",
                e.iter()
                    .map(|d| if *d < 0 {
                        "classes".to_owned()
                    } else {
                        d.to_string()
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        _ => format!("an output of the targets' shape {tgt:?}"),
    };
    Err(TrainError::ShapeMismatch {
        what: format!("train.loss = {}", loss.name()),
        expected,
        got: format!("the model's output has shape {out:?}"),
    })
}

/// Per-batch sums of a run's metrics, as one f64 tensor `[5]` on the device (f64: a count of
/// right pixels passes f32's exact integers within an epoch): loss × samples, right elements,
/// judged elements (those an accuracy or error was measured on), absolute error, squared error.
pub fn batch_sums(
    metric: MetricKind,
    loss: &Tensor,
    output: &Tensor,
    target: &Tensor,
) -> Result<Tensor, TrainError> {
    let n = target.size().first().copied().unwrap_or(0) as f64;
    let weighted = loss.f_detach()?.f_to_kind(Kind::Double)?.f_mul_scalar(n)?;
    let zero = || Tensor::f_zeros([], (Kind::Double, output.device()));
    let output = one_value_per_sample(Loss::Mse, &output.f_detach()?, target)?;
    let judged = || Tensor::f_full([], target.numel() as f64, (Kind::Double, output.device()));
    let [right, counted, abs, sq] = match metric {
        MetricKind::Accuracy => {
            let (right, counted) = correct(&output, target)?;
            [right, counted, zero()?, zero()?]
        }
        MetricKind::Regression if output.size() == target.size() => {
            let err = output.f_to_kind(Kind::Double)?.f_sub(target)?;
            [
                zero()?,
                judged()?,
                err.f_abs()?.f_sum(Kind::Double)?,
                err.f_square()?.f_sum(Kind::Double)?,
            ]
        }
        MetricKind::Regression | MetricKind::LossOnly => [zero()?, zero()?, zero()?, zero()?],
    };
    Ok(Tensor::f_stack(&[weighted, right, counted, abs, sq], 0)?)
}

/// Right and judged elements: class targets by arg-max over dimension 1, value targets
/// (multi-label) by the sign of the logit against a 0.5 threshold. An output that cannot be
/// judged that way (a module's own loss on another layout) counts nothing.
fn correct(output: &Tensor, target: &Tensor) -> Result<(Tensor, Tensor), TrainError> {
    let device = output.device();
    let (out, tgt) = (output.size(), target.size());
    let right = if target.is_floating_point() && out == tgt {
        output.f_gt(0.0)?.f_eq_tensor(&target.f_gt(0.5)?)?
    } else if !target.is_floating_point()
        && out.len() == tgt.len() + 1
        && out[0] == tgt[0]
        && out[2..] == tgt[1..]
    {
        output.f_argmax(1, false)?.f_eq_tensor(target)?
    } else {
        let zero = Tensor::f_zeros([], (Kind::Double, device))?;
        return Ok((zero.shallow_clone(), zero));
    };
    let judged = Tensor::f_full([], target.numel() as f64, (Kind::Double, device))?;
    Ok((right.f_sum(Kind::Double)?, judged))
}
