//! The loss a run minimises (cross-entropy, MSE, L1, Huber, BCE with logits, or the model's
//! own), and which of [`crate::metrics`]' sets the task reports (accuracy per element for
//! classes and multi-label targets, with the Dice score for class maps; MAE and RMSE for
//! regression).

use kiln_config::LossKind;
use kiln_config::keys;
use kiln_data::TargetSpec;
use tch::{Kind, Reduction, Tensor};

use crate::TrainError;
use crate::metrics::{MetricKind, one_value_per_sample};
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
                key: keys::train::loss,
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
            (Loss::CrossEntropy | Loss::Module, TargetSpec::Classes { shape, .. })
                if !shape.is_empty() =>
            {
                MetricKind::Segmentation
            }
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
        let output = &per_sample_for(self, output, target)?;
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
/// (Cross-entropy's `[B, 1]` is one class score per sample and stays as it is.)
fn per_sample_for(loss: Loss, output: &Tensor, target: &Tensor) -> Result<Tensor, TrainError> {
    match loss {
        Loss::CrossEntropy => Ok(output.shallow_clone()),
        _ => one_value_per_sample(output, target),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TchModule;

    fn values(v: &[f32], shape: &[i64]) -> Tensor {
        Tensor::from_slice(v).view(shape)
    }

    #[test]
    fn auto_follows_the_target_and_mismatched_kinds_are_refused() {
        let label = TargetSpec::label(3);
        let horizon = TargetSpec::Values { shape: vec![4] };
        assert_eq!(
            Loss::resolve(LossKind::Auto, &label).unwrap(),
            Loss::CrossEntropy
        );
        assert_eq!(Loss::resolve(LossKind::Auto, &horizon).unwrap(), Loss::Mse);
        let e = Loss::resolve(LossKind::CrossEntropy, &horizon).unwrap_err();
        assert!(e.to_string().contains("integer class targets"), "{e}");
        let e = Loss::resolve(LossKind::Huber, &label).unwrap_err();
        assert!(e.to_string().contains("train.loss"), "{e}");
        assert_eq!(
            Loss::BceWithLogits.task(&TargetSpec::Values { shape: vec![5] }),
            "multi-label classification"
        );
    }

    #[test]
    fn losses_equal_their_definitions_and_name_bad_shapes() {
        let model = TchModule(tch::nn::func(|x| x.shallow_clone()));
        let out = values(&[0.5, -1.0, 2.0, 0.0], &[2, 2]);
        let y = values(&[1.0, 1.0, 0.0, -2.0], &[2, 2]);
        let mse = Loss::Mse.compute(&model, &out, &y, None).unwrap();
        assert!((mse.double_value(&[]) - (0.25 + 4.0 + 4.0 + 4.0) / 4.0).abs() < 1e-6);
        let l1 = Loss::L1.compute(&model, &out, &y, None).unwrap();
        assert!((l1.double_value(&[]) - (0.5 + 2.0 + 2.0 + 2.0) / 4.0).abs() < 1e-6);
        // [B, 1] outputs for [B] targets are one value per sample.
        let one = Loss::Mse
            .compute(
                &model,
                &values(&[1.0, 3.0], &[2, 1]),
                &values(&[0.0, 1.0], &[2]),
                None,
            )
            .unwrap();
        assert!((one.double_value(&[]) - 2.5).abs() < 1e-6);
        let e = Loss::Mse
            .compute(&model, &out, &values(&[1.0, 2.0, 3.0], &[1, 3]), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("[1, 3]") && e.contains("[2, 2]"), "{e}");
        // Cross-entropy over a class map: logits [B, C, H, W] for targets [B, H, W].
        let logits = Tensor::zeros([2, 3, 4, 4], (Kind::Float, tch::Device::Cpu));
        let masks = Tensor::zeros([2, 4, 4], (Kind::Int64, tch::Device::Cpu));
        let ce = Loss::CrossEntropy
            .compute(&model, &logits, &masks, Some(3))
            .unwrap();
        assert!((ce.double_value(&[]) - 3f64.ln()).abs() < 1e-6);
        let e = Loss::CrossEntropy
            .compute(&model, &logits, &masks, Some(5))
            .unwrap_err()
            .to_string();
        assert!(e.contains("5 class scores"), "{e}");
    }
}
