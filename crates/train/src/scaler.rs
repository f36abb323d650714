//! The dynamic loss scaler for fp16 training: multiplies the loss before backward so small
//! gradients survive fp16, finds inf/NaN gradients (the step is then skipped), backs the scale off
//! on overflow and grows it after a run of clean steps. The state stays on the device, so a step
//! needs no host synchronisation.

use kiln_config::LossScalePlan;
use kiln_torch_ext::optim::{amp_unscale, amp_update_scale};
use tch::{Device, Kind, Tensor};

use crate::TrainError;

/// GradScaler state: the scale, the count of clean steps since the last change, and whether
/// this step's gradients held an inf or NaN.
#[derive(Debug)]
pub struct LossScaler {
    plan: LossScalePlan,
    scale: Tensor,
    growth_tracker: Tensor,
    found_inf: Tensor,
    unit: Tensor,
}

impl LossScaler {
    pub fn new(plan: LossScalePlan, device: Device) -> Result<Self, TrainError> {
        Ok(Self {
            plan,
            scale: Tensor::f_full([1], plan.init, (Kind::Float, device))?,
            growth_tracker: Tensor::f_zeros([1], (Kind::Int, device))?,
            found_inf: Tensor::f_zeros([1], (Kind::Float, device))?,
            unit: Tensor::f_ones([1], (Kind::Float, device))?,
        })
    }

    /// `loss × scale`, to call backward on.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor, TrainError> {
        Ok(loss.f_mul(&self.scale)?)
    }

    /// Checks `grads` for inf/NaN into [`LossScaler::found_inf`]. With `divide`, also divides
    /// them by the scale in place (needed before clipping); without, the optimizer divides them
    /// inside its fused kernel with [`LossScaler::scale_tensor`].
    pub fn check_and_unscale(&mut self, grads: &[Tensor], divide: bool) -> Result<(), TrainError> {
        let _ = self.found_inf.f_zero_()?;
        let inv = if divide {
            self.scale.f_reciprocal()?
        } else {
            self.unit.shallow_clone()
        };
        amp_unscale(grads, &self.found_inf, &inv)?;
        Ok(())
    }

    /// Backs off or grows the scale from this step's `found_inf`.
    pub fn update(&mut self) -> Result<(), TrainError> {
        amp_update_scale(
            &self.scale,
            &self.growth_tracker,
            &self.found_inf,
            self.plan.growth,
            self.plan.backoff,
            i64::try_from(self.plan.growth_interval).unwrap_or(i64::MAX),
        )?;
        Ok(())
    }

    /// One-element tensor, non-zero when the last checked gradients held an inf or NaN.
    pub fn found_inf(&self) -> &Tensor {
        &self.found_inf
    }

    /// The current scale as a one-element tensor on the device.
    pub fn scale_tensor(&self) -> &Tensor {
        &self.scale
    }

    /// The current scale (synchronises with the device).
    pub fn scale(&self) -> Result<f64, TrainError> {
        Ok(self.scale.f_double_value(&[0])?)
    }

    /// (scale, clean steps since the last change), for checkpoints (synchronises).
    pub fn state(&self) -> Result<(f64, i64), TrainError> {
        Ok((
            self.scale.f_double_value(&[0])?,
            self.growth_tracker.f_int64_value(&[0])?,
        ))
    }

    /// Restores [`LossScaler::state`].
    pub fn set_state(&mut self, scale: f64, growth_tracker: i64) -> Result<(), TrainError> {
        let _ = self.scale.f_fill_(scale)?;
        let _ = self.growth_tracker.f_fill_(growth_tracker)?;
        Ok(())
    }

    /// Whether the last checked step was skipped (synchronises with the device).
    pub fn skipped(&self) -> Result<bool, TrainError> {
        Ok(self.found_inf.f_double_value(&[0])? != 0.0)
    }
}
