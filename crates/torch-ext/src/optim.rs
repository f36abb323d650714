//! The fused AdamW kernel (`torch._fused_adamw_`, CPU and CUDA) over state kept on the Rust side.
//!
//! The caller owns every tensor: parameters, gradients, first and second moments, and the step
//! counters. That is what makes optimizer state checkpointable, which `tch`'s `torch::optim`
//! wrappers are not.

use crate::error::{Error, Result};
use crate::ffi;

/// AdamW hyper-parameters (names as in `torch.optim.AdamW`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// Decoupled weight decay: each step multiplies parameters by `1 - lr * weight_decay`.
    pub weight_decay: f64,
    pub eps: f64,
    /// Use the maximum of past second moments (AMSGrad); needs `max_exp_avg_sqs`.
    pub amsgrad: bool,
    /// Maximize the objective instead of minimizing it.
    pub maximize: bool,
}

impl Default for AdamWConfig {
    /// PyTorch's defaults.
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            weight_decay: 1e-2,
            eps: 1e-8,
            amsgrad: false,
            maximize: false,
        }
    }
}

impl AdamWConfig {
    /// Checks the values the way `torch.optim.AdamW` does, naming the one at fault.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| {
            Err(Error::InvalidArgument {
                op: "fused AdamW",
                message,
            })
        };
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return bad(format!("lr must be a finite number >= 0, got {}", self.lr));
        }
        for (name, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return bad(format!("{name} must be in [0, 1), got {beta}"));
            }
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return bad(format!(
                "eps must be a finite number >= 0, got {}",
                self.eps
            ));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(format!(
                "weight_decay must be a finite number >= 0, got {}",
                self.weight_decay
            ));
        }
        Ok(())
    }
}

/// The tensors one fused AdamW step reads and updates in place, one entry per parameter.
#[derive(Debug, Clone, Copy)]
pub struct AdamWTensors<'a> {
    /// Parameters, updated in place.
    pub params: &'a [tch::Tensor],
    /// Their gradients (same shapes).
    pub grads: &'a [tch::Tensor],
    /// First moments, updated in place (same shapes, zero-initialised).
    pub exp_avgs: &'a [tch::Tensor],
    /// Second moments, updated in place (same shapes, zero-initialised).
    pub exp_avg_sqs: &'a [tch::Tensor],
    /// Running maxima of the second moments when `amsgrad`; empty otherwise.
    pub max_exp_avg_sqs: &'a [tch::Tensor],
    /// Step counters: scalar float32 tensors on the parameters' device. The kernel reads them
    /// for bias correction but does not increment them: add 1 before each call.
    pub state_steps: &'a [tch::Tensor],
}

/// Runs one fused AdamW step over all parameters at once.
///
/// `grad_scale` (a scalar float32 tensor) divides the gradients first, which folds loss-scaler
/// unscaling into the kernel; `found_inf` (a scalar float32 tensor, non-zero when any gradient
/// was not finite) makes the kernel skip the update entirely.
pub fn fused_adamw_step(
    tensors: AdamWTensors<'_>,
    config: &AdamWConfig,
    grad_scale: Option<&tch::Tensor>,
    found_inf: Option<&tch::Tensor>,
) -> Result<()> {
    config.validate()?;
    let n = tensors.params.len();
    for (name, len) in [
        ("grads", tensors.grads.len()),
        ("exp_avgs", tensors.exp_avgs.len()),
        ("exp_avg_sqs", tensors.exp_avg_sqs.len()),
        ("state_steps", tensors.state_steps.len()),
    ] {
        if len != n {
            return Err(Error::InvalidArgument {
                op: "fused AdamW",
                message: format!("{n} params but {len} {name}"),
            });
        }
    }
    let expected_max = if config.amsgrad { n } else { 0 };
    if tensors.max_exp_avg_sqs.len() != expected_max {
        return Err(Error::InvalidArgument {
            op: "fused AdamW",
            message: format!(
                "amsgrad is {} so max_exp_avg_sqs must hold {expected_max} tensors, got {}",
                config.amsgrad,
                tensors.max_exp_avg_sqs.len()
            ),
        });
    }
    // libtorch's CPU kernel does not check shapes (a mismatch reads out of bounds), so we do.
    for (i, param) in tensors.params.iter().enumerate() {
        let shape = param.size();
        let mut same_shape = vec![
            ("grad", &tensors.grads[i]),
            ("exp_avg", &tensors.exp_avgs[i]),
            ("exp_avg_sq", &tensors.exp_avg_sqs[i]),
        ];
        if config.amsgrad {
            same_shape.push(("max_exp_avg_sq", &tensors.max_exp_avg_sqs[i]));
        }
        for (name, t) in same_shape {
            if t.size() != shape {
                return Err(Error::InvalidArgument {
                    op: "fused AdamW",
                    message: format!(
                        "param {i} has shape {shape:?} but its {name} has shape {:?}",
                        t.size()
                    ),
                });
            }
        }
        if tensors.state_steps[i].numel() != 1 {
            return Err(Error::InvalidArgument {
                op: "fused AdamW",
                message: format!(
                    "state_step {i} must be a scalar tensor, got shape {:?}",
                    tensors.state_steps[i].size()
                ),
            });
        }
    }
    if n == 0 {
        return Ok(());
    }
    let ptrs = |list: &[tch::Tensor]| list.iter().map(ffi::tensor_ptr).collect::<Vec<_>>();
    let (p, g, m, v, vmax, s) = (
        ptrs(tensors.params),
        ptrs(tensors.grads),
        ptrs(tensors.exp_avgs),
        ptrs(tensors.exp_avg_sqs),
        ptrs(tensors.max_exp_avg_sqs),
        ptrs(tensors.state_steps),
    );
    let opt = |t: Option<&tch::Tensor>| t.map_or(std::ptr::null(), ffi::tensor_ptr);
    // SAFETY: every pointer array holds `n` (or `vmax.len()`) live tensor handles borrowed for
    // the duration of the call; the C++ side copies the handles and catches all exceptions.
    ffi::check("fused AdamW", unsafe {
        ffi::kiln_fused_adamw(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            vmax.as_ptr(),
            vmax.len(),
            s.as_ptr(),
            n,
            config.lr,
            config.beta1,
            config.beta2,
            config.weight_decay,
            config.eps,
            config.amsgrad,
            config.maximize,
            opt(grad_scale),
            opt(found_inf),
        )
    })
}
