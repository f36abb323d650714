//! Optimizer kernels over state kept on the Rust side: fused AdamW and SGD (`torch._fused_adamw_`,
//! `torch._fused_sgd_`, CPU and CUDA), loss-scaler unscale/update, and gradient-norm clipping.
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
    fused_adamw(tensors, config, None, grad_scale, found_inf)
}

/// [`fused_adamw_step`] with the learning rate read from `lr` (a scalar float32 tensor on the
/// parameters' device; `config.lr` is not used), so that a step captured in a CUDA graph
/// replays with the rate of the moment.
pub fn fused_adamw_step_lr_tensor(
    tensors: AdamWTensors<'_>,
    config: &AdamWConfig,
    lr: &tch::Tensor,
    grad_scale: Option<&tch::Tensor>,
    found_inf: Option<&tch::Tensor>,
) -> Result<()> {
    if lr.numel() != 1 || lr.kind() != tch::Kind::Float {
        return Err(Error::InvalidArgument {
            op: "fused AdamW",
            message: format!(
                "the learning-rate tensor must be one float32 value, got {:?} {:?}",
                lr.size(),
                lr.kind()
            ),
        });
    }
    fused_adamw(tensors, config, Some(lr), grad_scale, found_inf)
}

fn fused_adamw(
    tensors: AdamWTensors<'_>,
    config: &AdamWConfig,
    lr_tensor: Option<&tch::Tensor>,
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
            opt(lr_tensor),
        )
    })
}

fn ptrs(list: &[tch::Tensor]) -> Vec<*const std::ffi::c_void> {
    list.iter().map(ffi::tensor_ptr).collect()
}

fn same_count(op: &'static str, n: usize, lists: &[(&str, usize)]) -> Result<()> {
    for (name, len) in lists {
        if *len != n {
            return Err(Error::InvalidArgument {
                op,
                message: format!("{n} params but {len} {name}"),
            });
        }
    }
    Ok(())
}

fn same_shapes(
    op: &'static str,
    params: &[tch::Tensor],
    others: &[(&str, &[tch::Tensor])],
) -> Result<()> {
    for (i, param) in params.iter().enumerate() {
        let shape = param.size();
        for (name, list) in others {
            let got = list[i].size();
            if got != shape {
                return Err(Error::InvalidArgument {
                    op,
                    message: format!(
                        "param {i} has shape {shape:?} but its {name} has shape {got:?}"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// SGD hyper-parameters (names as in `torch.optim.SGD`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    pub lr: f64,
    /// 0 = plain SGD (no momentum buffers).
    pub momentum: f64,
    pub dampening: f64,
    /// L2 penalty added to the gradient (coupled, as in `torch.optim.SGD`).
    pub weight_decay: f64,
    pub nesterov: bool,
    pub maximize: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            lr: 1e-2,
            momentum: 0.9,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
        }
    }
}

/// Runs one fused SGD step over all parameters. `momentum_buffers` holds one zero-initialised
/// buffer per parameter when `momentum > 0` (empty otherwise); pass `is_first_step` on the
/// first step so they start from the gradients, as `torch.optim.SGD` does. `grad_scale` and
/// `found_inf` work as in [`fused_adamw_step`].
pub fn fused_sgd_step(
    params: &[tch::Tensor],
    grads: &[tch::Tensor],
    momentum_buffers: &[tch::Tensor],
    config: &SgdConfig,
    is_first_step: bool,
    grad_scale: Option<&tch::Tensor>,
    found_inf: Option<&tch::Tensor>,
) -> Result<()> {
    const OP: &str = "fused SGD";
    let bad = |message: String| Err(Error::InvalidArgument { op: OP, message });
    if !(config.lr.is_finite() && config.lr >= 0.0) {
        return bad(format!(
            "lr must be a finite number >= 0, got {}",
            config.lr
        ));
    }
    if !(config.momentum.is_finite() && config.momentum >= 0.0) {
        return bad(format!("momentum must be >= 0, got {}", config.momentum));
    }
    if !(config.weight_decay.is_finite() && config.weight_decay >= 0.0) {
        return bad(format!(
            "weight_decay must be >= 0, got {}",
            config.weight_decay
        ));
    }
    if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
        return bad("nesterov needs momentum > 0 and dampening 0".to_owned());
    }
    let n = params.len();
    let expected_buffers = if config.momentum > 0.0 { n } else { 0 };
    same_count(OP, n, &[("grads", grads.len())])?;
    if momentum_buffers.len() != expected_buffers {
        return bad(format!(
            "momentum is {} so momentum_buffers must hold {expected_buffers} tensors, got {}",
            config.momentum,
            momentum_buffers.len()
        ));
    }
    let mut others: Vec<(&str, &[tch::Tensor])> = vec![("grad", grads)];
    if expected_buffers > 0 {
        others.push(("momentum buffer", momentum_buffers));
    }
    same_shapes(OP, params, &others)?;
    if n == 0 {
        return Ok(());
    }
    let (p, g, m) = (ptrs(params), ptrs(grads), ptrs(momentum_buffers));
    let opt = |t: Option<&tch::Tensor>| t.map_or(std::ptr::null(), ffi::tensor_ptr);
    // SAFETY: the arrays hold live tensor handles borrowed for the call; the C++ side copies
    // the handles and catches all exceptions.
    ffi::check(OP, unsafe {
        ffi::kiln_fused_sgd(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            n,
            config.weight_decay,
            config.momentum,
            config.lr,
            config.dampening,
            config.nesterov,
            config.maximize,
            is_first_step,
            opt(grad_scale),
            opt(found_inf),
        )
    })
}

/// Multiplies every gradient by `inv_scale` (a one-element float32 tensor) in place and sets
/// `found_inf` (a one-element float32 tensor) to 1 if any of them holds an inf or NaN
/// (`torch._amp_foreach_non_finite_check_and_unscale_`). No host synchronisation.
pub fn amp_unscale(
    grads: &[tch::Tensor],
    found_inf: &tch::Tensor,
    inv_scale: &tch::Tensor,
) -> Result<()> {
    if grads.is_empty() {
        return Ok(());
    }
    let g = ptrs(grads);
    // SAFETY: live handles borrowed for the call.
    ffi::check("AMP unscale", unsafe {
        ffi::kiln_amp_unscale(
            g.as_ptr(),
            g.len(),
            ffi::tensor_ptr(found_inf),
            ffi::tensor_ptr(inv_scale),
        )
    })
}

/// Adds `other` (a one-element tensor on the tensors' device) to every tensor of `tensors` in
/// place (`torch._foreach_add_`): one kernel launch per device and dtype, where adding to each
/// tensor launches one per tensor. No host synchronisation.
pub fn foreach_add_(tensors: &[tch::Tensor], other: &tch::Tensor) -> Result<()> {
    if tensors.is_empty() {
        return Ok(());
    }
    let t = ptrs(tensors);
    // SAFETY: live handles borrowed for the call.
    ffi::check("foreach add", unsafe {
        ffi::kiln_foreach_add_(t.as_ptr(), t.len(), ffi::tensor_ptr(other))
    })
}

/// Moves every tensor of `ends_at` a `weight` of the way towards its partner in `towards`, in
/// place (`torch._foreach_lerp_`: `e += weight · (t − e)`), in one launch per device and dtype:
/// an exponential moving average of weights with `weight = 1 − decay`.
pub fn foreach_lerp_(ends_at: &[tch::Tensor], towards: &[tch::Tensor], weight: f64) -> Result<()> {
    same_count("foreach lerp", ends_at.len(), &[("towards", towards.len())])?;
    if ends_at.is_empty() {
        return Ok(());
    }
    let (e, t) = (ptrs(ends_at), ptrs(towards));
    // SAFETY: live handles borrowed for the call.
    ffi::check("foreach lerp", unsafe {
        ffi::kiln_foreach_lerp_(e.as_ptr(), t.as_ptr(), e.len(), weight)
    })
}

/// Copies every tensor of `src` into its partner in `dst`, in place (`torch._foreach_copy_`).
pub fn foreach_copy_(dst: &[tch::Tensor], src: &[tch::Tensor]) -> Result<()> {
    same_count("foreach copy", dst.len(), &[("src", src.len())])?;
    if dst.is_empty() {
        return Ok(());
    }
    let (d, s) = (ptrs(dst), ptrs(src));
    // SAFETY: live handles borrowed for the call.
    ffi::check("foreach copy", unsafe {
        ffi::kiln_foreach_copy_(d.as_ptr(), s.as_ptr(), d.len())
    })
}

/// Updates a loss scale in place from `found_inf` (`torch._amp_update_scale_`): on an inf/NaN
/// the scale is multiplied by `backoff` and the tracker reset; otherwise the tracker (an int32
/// one-element tensor) counts clean steps, and after `interval` of them the scale is multiplied
/// by `growth`. No host synchronisation.
pub fn amp_update_scale(
    scale: &tch::Tensor,
    growth_tracker: &tch::Tensor,
    found_inf: &tch::Tensor,
    growth: f64,
    backoff: f64,
    interval: i64,
) -> Result<()> {
    // SAFETY: live handles borrowed for the call.
    ffi::check("AMP update scale", unsafe {
        ffi::kiln_amp_update_scale(
            ffi::tensor_ptr(scale),
            ffi::tensor_ptr(growth_tracker),
            ffi::tensor_ptr(found_inf),
            growth,
            backoff,
            interval,
        )
    })
}

/// The global L2 norm of `grads` as a one-element float32 tensor on their device (no host
/// synchronisation). If `max_norm > 0` the gradients are scaled in place so that their norm is
/// at most `max_norm` (`torch.nn.utils.clip_grad_norm_`).
pub fn clip_grad_norm(grads: &[tch::Tensor], max_norm: f64) -> Result<tch::Tensor> {
    if !(max_norm.is_finite() && max_norm >= 0.0) {
        return Err(Error::InvalidArgument {
            op: "clip grad norm",
            message: format!("max_norm must be a finite number >= 0, got {max_norm}"),
        });
    }
    if grads.is_empty() {
        return Err(Error::InvalidArgument {
            op: "clip grad norm",
            message: "no gradients".to_owned(),
        });
    }
    let g = ptrs(grads);
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: live handles borrowed for the call; on success `out` is a new heap tensor we own.
    ffi::check("clip grad norm", unsafe {
        ffi::kiln_clip_grad_norm(g.as_ptr(), g.len(), max_norm, &mut out)
    })?;
    // SAFETY: `out` came from `new at::Tensor`, which tch's Tensor owns and deletes.
    Ok(unsafe { tch::Tensor::from_ptr(out.cast()) })
}

/// Drops the gradients of `params` (`zero_grad(set_to_none=True)`): the next backward writes
/// fresh ones instead of adding into zeroed tensors.
pub fn clear_grads(params: &[tch::Tensor]) -> Result<()> {
    let p = ptrs(params);
    // SAFETY: live handles borrowed for the call.
    ffi::check("clear grads", unsafe {
        ffi::kiln_clear_grads(p.as_ptr(), p.len())
    })
}
