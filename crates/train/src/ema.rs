//! An exponential moving average of a model's weights (`train.ema`): after every optimizer step
//! each trainable floating-point parameter's average moves `1 − decay` of the way towards it,
//! in one fused multi-tensor op (`torch._foreach_lerp_`), and everything else (batch-norm
//! statistics, frozen and integer tensors) is copied, not averaged (`torch._foreach_copy_`).
//! With warm-up the decay is `min(decay, (1 + n) / (10 + n))` after `n` updates, so that early
//! on the average does not hold on to the initial weights. The average is evaluated by swapping
//! it into the model's tensors and back; checkpoints carry it as `ema.<name>` state tensors.

use std::collections::HashMap;

use kiln_config::EmaPlan;
use tch::{Kind, Tensor};

use crate::TrainError;

/// The state tensor counting a checkpoint's average's updates.
pub const UPDATES: &str = "ema.updates";
/// The prefix of the average's tensors among a checkpoint's state tensors.
pub const PREFIX: &str = "ema.";

/// A model's weights averaged over its steps.
#[derive(Debug)]
pub struct Ema {
    decay: f64,
    warmup: bool,
    /// The averages of the trainable floating-point tensors, and the tensors themselves.
    average: Vec<Tensor>,
    live: Vec<Tensor>,
    /// Copies of every other tensor, and the tensors themselves.
    copies: Vec<Tensor>,
    sources: Vec<Tensor>,
    /// Names: `average`'s then `copies`'.
    names: Vec<String>,
    updates: u64,
}

impl Ema {
    /// An average starting at the model's current `tensors` (by name; those that require a
    /// gradient and are floating-point are averaged).
    pub fn new(plan: &EmaPlan, tensors: &[(String, Tensor)]) -> Result<Self, TrainError> {
        let _guard = tch::no_grad_guard();
        let averaged = |t: &Tensor| t.requires_grad() && t.is_floating_point();
        let (mut names, mut copy_names) = (vec![], vec![]);
        let (mut average, mut live, mut copies, mut sources) = (vec![], vec![], vec![], vec![]);
        for (name, t) in tensors {
            let copy = deep_copy(t)?;
            if averaged(t) {
                names.push(name.clone());
                average.push(copy);
                live.push(t.shallow_clone());
            } else {
                copy_names.push(name.clone());
                copies.push(copy);
                sources.push(t.shallow_clone());
            }
        }
        names.extend(copy_names);
        Ok(Self {
            decay: plan.decay,
            warmup: plan.warmup,
            average,
            live,
            copies,
            sources,
            names,
            updates: 0,
        })
    }

    /// The decay of the update after `updates` updates.
    pub fn decay_at(&self, updates: u64) -> f64 {
        match self.warmup {
            true => self
                .decay
                .min((1.0 + updates as f64) / (10.0 + updates as f64)),
            false => self.decay,
        }
    }

    /// One update, after an optimizer step: two fused launches per device and dtype.
    pub fn update(&mut self) -> Result<(), TrainError> {
        let _guard = tch::no_grad_guard();
        let weight = 1.0 - self.decay_at(self.updates);
        kiln_torch_ext::optim::foreach_lerp_(&self.average, &self.live, weight)?;
        kiln_torch_ext::optim::foreach_copy_(&self.copies, &self.sources)?;
        self.updates += 1;
        Ok(())
    }

    /// Runs `f` with the average in the model's tensors, then puts the model's own back.
    pub fn swapped<T>(
        &mut self,
        f: impl FnOnce() -> Result<T, TrainError>,
    ) -> Result<T, TrainError> {
        self.swap()?;
        let out = f();
        self.swap()?;
        out
    }

    fn swap(&mut self) -> Result<(), TrainError> {
        let _guard = tch::no_grad_guard();
        let own: Vec<Tensor> = self.live.iter().map(deep_copy).collect::<Result<_, _>>()?;
        kiln_torch_ext::optim::foreach_copy_(&self.live, &self.average)?;
        kiln_torch_ext::optim::foreach_copy_(&self.average, &own)?;
        Ok(())
    }

    /// The state tensors a checkpoint carries: `ema.<name>` for each tensor, and the update
    /// count.
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>, TrainError> {
        let mut out: Vec<(String, Tensor)> = self
            .names
            .iter()
            .zip(self.average.iter().chain(&self.copies))
            .map(|(n, t)| (format!("{PREFIX}{n}"), t.shallow_clone()))
            .collect();
        let updates = i64::try_from(self.updates).unwrap_or(i64::MAX);
        out.push((UPDATES.to_owned(), Tensor::f_from_slice(&[updates])?));
        Ok(out)
    }

    /// Continues the average a checkpoint's `state` carries; `false` (the average starts from
    /// the restored weights) when it carries none.
    pub fn restore(&mut self, state: &[(String, Tensor)]) -> Result<bool, TrainError> {
        let by_name: HashMap<&str, &Tensor> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let Some(updates) = by_name.get(UPDATES) else {
            return Ok(false);
        };
        let _guard = tch::no_grad_guard();
        for (name, target) in self
            .names
            .iter()
            .zip(self.average.iter().chain(&self.copies))
        {
            let key = format!("{PREFIX}{name}");
            let source = by_name
                .get(key.as_str())
                .ok_or_else(|| TrainError::InvalidPlan {
                    key: "checkpoint",
                    value: key.clone(),
                    expected:
                        "the EMA weights of every tensor (the checkpoint is of another model)"
                            .to_owned(),
                })?;
            target.shallow_clone().f_copy_(source)?;
        }
        self.updates =
            u64::try_from(updates.f_to_kind(Kind::Int64)?.f_int64_value(&[0])?).unwrap_or(0);
        Ok(true)
    }
}

/// A copy of `t`'s values in storage of its own, outside autograd.
fn deep_copy(t: &Tensor) -> Result<Tensor, TrainError> {
    let mut copy = t.f_detach()?.f_empty_like()?;
    copy.f_copy_(t)?;
    Ok(copy)
}

/// The EMA weights in a checkpoint's `state`, by the model's tensor names; `None` when it has
/// none.
pub fn weights_in(state: &[(String, Tensor)]) -> Option<Vec<(String, Tensor)>> {
    state.iter().find(|(n, _)| n == UPDATES)?;
    Some(
        state
            .iter()
            .filter(|(n, _)| n != UPDATES)
            .filter_map(|(n, t)| Some((n.strip_prefix(PREFIX)?.to_owned(), t.shallow_clone())))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(decay: f64, warmup: bool) -> EmaPlan {
        EmaPlan { decay, warmup }
    }

    #[test]
    fn the_average_equals_a_reference_and_buffers_are_copied() {
        let w = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
        let stat = Tensor::from_slice(&[5.0f32]);
        let named = vec![
            ("w".to_owned(), w.shallow_clone()),
            ("bn".to_owned(), stat.shallow_clone()),
        ];
        let mut ema = Ema::new(&plan(0.9, true), &named).unwrap();
        let mut reference = [1.0f64, 2.0];
        for (updates, step) in (1..=20u64).enumerate() {
            tch::no_grad(|| {
                let _ = w.shallow_clone().f_add_(&Tensor::from(0.5f32)).unwrap();
                let _ = stat.shallow_clone().f_fill_(step as f64).unwrap();
            });
            ema.update().unwrap();
            let d = 0.9f64.min((1.0 + updates as f64) / (10.0 + updates as f64));
            let now = [1.0 + 0.5 * step as f64, 2.0 + 0.5 * step as f64];
            for (r, x) in reference.iter_mut().zip(now) {
                *r = d * *r + (1.0 - d) * x;
            }
        }
        let state = ema.state_tensors().unwrap();
        let avg: Vec<f32> = Vec::try_from(&state[0].1).unwrap();
        for (a, r) in avg.iter().zip(reference) {
            assert!((f64::from(*a) - r).abs() < 1e-5, "{a} vs {r}");
        }
        assert_eq!(state[1].0, "ema.bn");
        assert_eq!(Vec::<f32>::try_from(&state[1].1).unwrap(), [20.0]);
        assert_eq!(state[2].0, UPDATES);
        // Swapped in, the model holds the average; then its own weights again.
        let own: Vec<f32> = Vec::try_from(&w).unwrap();
        let inside: Vec<f32> = ema.swapped(|| Ok(Vec::try_from(&w).unwrap())).unwrap();
        assert_eq!(inside, avg);
        assert_eq!(Vec::<f32>::try_from(&w).unwrap(), own);
        // A checkpoint's average continues where it was.
        let mut again = Ema::new(&plan(0.9, true), &named).unwrap();
        assert!(again.restore(&state).unwrap());
        assert_eq!(again.updates, 20);
        let back = weights_in(&state).unwrap();
        assert_eq!(back[0].0, "w");
        assert!(!again.restore(&[]).unwrap());
    }

    #[test]
    fn warm_up_lowers_the_decay_early_only() {
        let ema = Ema::new(&plan(0.999, true), &[]).unwrap();
        assert!((ema.decay_at(0) - 0.1).abs() < 1e-12);
        assert!((ema.decay_at(90) - 0.91).abs() < 1e-12);
        assert_eq!(ema.decay_at(100_000), 0.999);
        let flat = Ema::new(&plan(0.999, false), &[]).unwrap();
        assert_eq!(flat.decay_at(0), 0.999);
    }
}
