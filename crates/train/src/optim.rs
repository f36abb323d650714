//! Optimizers over the native fused kernels with their state held here, on the Rust side, so it
//! can be checkpointed: AdamW (decoupled weight decay, biases and norms excluded) and SGD with
//! momentum.

use kiln_torch_ext::optim::{
    AdamWConfig, AdamWTensors, SgdConfig, clear_grads, foreach_add_, fused_adamw_step,
    fused_adamw_step_lr_tensor, fused_sgd_step,
};
use tch::{Kind, Tensor, nn};

use crate::TrainError;

/// Parameters that share a weight decay.
#[derive(Debug)]
pub struct ParamGroup {
    pub names: Vec<String>,
    pub params: Vec<Tensor>,
    pub weight_decay: f64,
}

/// Whether a parameter should be decayed, decided by its rank alone (not its name, which a
/// TorchScript module's author chose): matrices and kernels (2-D and up) yes; biases, norm
/// scales and other vectors no, as is usual for AdamW (nanoGPT, timm).
pub fn decays(param: &Tensor) -> bool {
    param.dim() >= 2
}

/// The trainable parameters of `vs`, sorted by name, in two groups: decayed with
/// `weight_decay`, and excluded (biases, norms) with none. Empty groups are left out.
pub fn param_groups(vs: &nn::VarStore, weight_decay: f64) -> Vec<ParamGroup> {
    let mut variables: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .collect();
    variables.sort_by(|a, b| a.0.cmp(&b.0));
    let mut decay = ParamGroup {
        names: vec![],
        params: vec![],
        weight_decay,
    };
    let mut no_decay = ParamGroup {
        names: vec![],
        params: vec![],
        weight_decay: 0.0,
    };
    for (name, t) in variables {
        let group = if decays(&t) {
            &mut decay
        } else {
            &mut no_decay
        };
        group.names.push(name);
        group.params.push(t);
    }
    [decay, no_decay]
        .into_iter()
        .filter(|g| !g.params.is_empty())
        .collect()
}

/// Per-parameter state, in the order of its group's parameters.
#[derive(Debug)]
struct GroupState {
    exp_avgs: Vec<Tensor>,
    exp_avg_sqs: Vec<Tensor>,
    steps: Vec<Tensor>,
    momentum: Vec<Tensor>,
    first_step: bool,
}

fn zeros_like(params: &[Tensor]) -> Result<Vec<Tensor>, TrainError> {
    params
        .iter()
        .map(|p| Ok(p.f_zeros_like()?))
        .collect::<Result<_, TrainError>>()
}

/// Which update rule, with its hyper-parameters (the learning rate comes per step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    AdamW(AdamWConfig),
    Sgd(SgdConfig),
}

/// An optimizer over parameter groups, stepping each group with one fused kernel call.
#[derive(Debug)]
pub struct Optimizer {
    rule: Rule,
    groups: Vec<ParamGroup>,
    state: Vec<GroupState>,
    lr: f64,
    /// The learning rate on the device, read by AdamW's kernel instead of `lr` (for a step
    /// captured in a CUDA graph, which must not bake the rate of its capture in).
    lr_tensor: Option<Tensor>,
}

impl Optimizer {
    /// An optimizer for `groups`; the rule's `weight_decay` is ignored in favour of each
    /// group's.
    pub fn new(rule: Rule, groups: Vec<ParamGroup>) -> Result<Self, TrainError> {
        let lr = match rule {
            Rule::AdamW(c) => {
                c.validate()?;
                c.lr
            }
            Rule::Sgd(c) => c.lr,
        };
        let state = groups
            .iter()
            .map(|g| {
                let adam = matches!(rule, Rule::AdamW(_));
                let sgd_momentum = matches!(rule, Rule::Sgd(c) if c.momentum > 0.0);
                Ok(GroupState {
                    exp_avgs: if adam { zeros_like(&g.params)? } else { vec![] },
                    exp_avg_sqs: if adam { zeros_like(&g.params)? } else { vec![] },
                    steps: if adam {
                        g.params
                            .iter()
                            .map(|p| Ok(Tensor::f_zeros([], (Kind::Float, p.device()))?))
                            .collect::<Result<_, TrainError>>()?
                    } else {
                        vec![]
                    },
                    momentum: if sgd_momentum {
                        zeros_like(&g.params)?
                    } else {
                        vec![]
                    },
                    first_step: true,
                })
            })
            .collect::<Result<_, TrainError>>()?;
        Ok(Self {
            rule,
            groups,
            state,
            lr,
            lr_tensor: None,
        })
    }

    /// From now on AdamW reads the learning rate from a tensor on `device`, which
    /// [`Optimizer::set_lr`] fills (outside any captured graph). SGD is refused.
    pub fn read_lr_from_device(&mut self, device: tch::Device) -> Result<(), TrainError> {
        if !matches!(self.rule, Rule::AdamW(_)) {
            return Err(TrainError::InvalidPlan {
                key: kiln_config::keys::train::optimizer,
                value: "sgd".to_owned(),
                expected: "adamw: only AdamW reads its learning rate from the device (for a \
                           step in a CUDA graph)"
                    .to_owned(),
            });
        }
        self.lr_tensor = Some(Tensor::f_full([], self.lr, (Kind::Float, device))?);
        Ok(())
    }

    pub fn set_lr(&mut self, lr: f64) -> Result<(), TrainError> {
        self.lr = lr;
        if let Some(t) = &self.lr_tensor {
            // A fill, queued on the device like the step itself: no synchronisation.
            let _ = t.shallow_clone().f_fill_(lr)?;
        }
        Ok(())
    }

    pub fn lr(&self) -> f64 {
        self.lr
    }

    pub fn groups(&self) -> &[ParamGroup] {
        &self.groups
    }

    /// Every parameter's gradient that backward produced (parameters it did not reach are
    /// left out).
    pub fn grads(&self) -> Vec<Tensor> {
        self.groups
            .iter()
            .flat_map(|g| g.params.iter().map(Tensor::grad))
            .filter(Tensor::defined)
            .collect()
    }

    /// Drops all gradients (`zero_grad(set_to_none=True)`).
    pub fn zero_grad(&self) -> Result<(), TrainError> {
        for g in &self.groups {
            clear_grads(&g.params)?;
        }
        Ok(())
    }

    /// One update of every parameter that has a gradient. `grad_scale` divides the gradients
    /// inside the kernel (a loss scaler's scale when they were not unscaled yet); a non-zero
    /// `found_inf` skips the update, step counts included.
    pub fn step(
        &mut self,
        grad_scale: Option<&Tensor>,
        found_inf: Option<&Tensor>,
    ) -> Result<(), TrainError> {
        for (group, state) in self.groups.iter().zip(&mut self.state) {
            let with_grad: Vec<usize> = (0..group.params.len())
                .filter(|&i| group.params[i].grad().defined())
                .collect();
            if with_grad.is_empty() {
                continue;
            }
            let pick = |list: &[Tensor]| -> Vec<Tensor> {
                with_grad.iter().map(|&i| list[i].shallow_clone()).collect()
            };
            let params = pick(&group.params);
            let grads: Vec<Tensor> = params.iter().map(Tensor::grad).collect();
            match self.rule {
                Rule::AdamW(config) => {
                    let steps = pick(&state.steps);
                    // Count the step before the kernel reads the counts; a skipped one (found_inf)
                    // adds 0, as in torch.optim.AdamW.
                    let increment = match found_inf {
                        Some(inf) => inf.f_view([])?.f_neg()?.f_add_scalar(1.0)?,
                        None => Tensor::f_ones([], (Kind::Float, params[0].device()))?,
                    };
                    foreach_add_(&steps, &increment)?;
                    let tensors = AdamWTensors {
                        params: &params,
                        grads: &grads,
                        exp_avgs: &pick(&state.exp_avgs),
                        exp_avg_sqs: &pick(&state.exp_avg_sqs),
                        max_exp_avg_sqs: &[],
                        state_steps: &steps,
                    };
                    let config = AdamWConfig {
                        lr: self.lr,
                        weight_decay: group.weight_decay,
                        ..config
                    };
                    match &self.lr_tensor {
                        Some(lr) => {
                            fused_adamw_step_lr_tensor(tensors, &config, lr, grad_scale, found_inf)?
                        }
                        None => fused_adamw_step(tensors, &config, grad_scale, found_inf)?,
                    }
                }
                Rule::Sgd(config) => {
                    let momentum = if state.momentum.is_empty() {
                        vec![]
                    } else {
                        pick(&state.momentum)
                    };
                    fused_sgd_step(
                        &params,
                        &grads,
                        &momentum,
                        &SgdConfig {
                            lr: self.lr,
                            weight_decay: group.weight_decay,
                            ..config
                        },
                        state.first_step,
                        grad_scale,
                        found_inf,
                    )?;
                    state.first_step = false;
                }
            }
        }
        Ok(())
    }

    /// Copies state saved by [`Optimizer::state_tensors`] back in place, by name; every state
    /// tensor must be present with its shape. `steps_taken > 0` marks SGD's momentum as started.
    pub fn load_state(
        &mut self,
        saved: &[(String, Tensor)],
        steps_taken: u64,
    ) -> Result<(), TrainError> {
        let by_name: std::collections::HashMap<&str, &Tensor> =
            saved.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let _guard = tch::no_grad_guard();
        for (name, target) in self.state_tensors() {
            let source = by_name.get(name.as_str()).ok_or_else(|| TrainError::InvalidPlan {
                key: "checkpoint",
                value: name.clone(),
                expected: "optimizer state for every parameter (the checkpoint is of another model or optimizer)".to_owned(),
            })?;
            if source.size() != target.size() {
                return Err(TrainError::InvalidPlan {
                    key: "checkpoint",
                    value: name.clone(),
                    expected: format!(
                        "shape {:?}, the checkpoint has {:?}",
                        target.size(),
                        source.size()
                    ),
                });
            }
            target.shallow_clone().f_copy_(source)?;
        }
        for state in &mut self.state {
            state.first_step = steps_taken == 0;
        }
        Ok(())
    }

    /// The optimizer's state tensors by parameter name (`<name>.exp_avg`, `.exp_avg_sq`,
    /// `.step`, `.momentum`), for checkpoints.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![];
        for (group, state) in self.groups.iter().zip(&self.state) {
            for (i, name) in group.names.iter().enumerate() {
                for (suffix, list) in [
                    ("exp_avg", &state.exp_avgs),
                    ("exp_avg_sq", &state.exp_avg_sqs),
                    ("step", &state.steps),
                    ("momentum", &state.momentum),
                ] {
                    if let Some(t) = list.get(i) {
                        out.push((format!("{name}.{suffix}"), t.shallow_clone()));
                    }
                }
            }
        }
        out
    }
}
