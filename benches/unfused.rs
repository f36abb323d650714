//! AdamW written as separate tensor ops per parameter, the way `torch.optim.AdamW(foreach=False,
//! fused=False)` runs it: the reference the fused kernel is measured against.

use tch::{TchError, Tensor};

// AdamW's betas and epsilon: PyTorch's defaults.
const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;

/// AdamW's state for the per-tensor update.
#[derive(Debug)]
pub struct UnfusedAdamW {
    lr: f64,
    weight_decay: Vec<f64>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    step: i32,
}

impl UnfusedAdamW {
    /// State for `params` (zeros like each), each with its own weight decay.
    pub fn new(params: &[Tensor], weight_decay: Vec<f64>, lr: f64) -> Result<Self, TchError> {
        Ok(Self {
            lr,
            weight_decay,
            exp_avg: zeros_like(params)?,
            exp_avg_sq: zeros_like(params)?,
            step: 0,
        })
    }

    /// One update of every parameter from its gradient, in place, without autograd.
    pub fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<(), TchError> {
        let _guard = tch::no_grad_guard();
        self.step += 1;
        let bc1 = 1.0 - BETA1.powi(self.step);
        let bc2_sqrt = (1.0 - BETA2.powi(self.step)).sqrt();
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let (mut p, mut m) = (p.shallow_clone(), self.exp_avg[i].shallow_clone());
            let mut v = self.exp_avg_sq[i].shallow_clone();
            let _ = p.f_mul_scalar_(1.0 - self.lr * self.weight_decay[i])?;
            let _ = m.f_lerp_(g, tch::Scalar::float(1.0 - BETA1))?;
            let _ = v.f_mul_scalar_(BETA2)?;
            let _ = v.f_add_(&g.f_mul(g)?.f_mul_scalar(1.0 - BETA2)?)?;
            let denom = v.f_sqrt()?.f_div_scalar(bc2_sqrt)?.f_add_scalar(EPS)?;
            let _ = p.f_sub_(&m.f_div(&denom)?.f_mul_scalar(self.lr / bc1)?)?;
        }
        Ok(())
    }
}

/// A tensor of zeros like each of `tensors`.
fn zeros_like(tensors: &[Tensor]) -> Result<Vec<Tensor>, TchError> {
    tensors.iter().map(Tensor::f_zeros_like).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_torch_ext::optim::{AdamWConfig, AdamWTensors, fused_adamw_step};
    use tch::{Device, Kind};

    /// The reference and the fused kernel compute the same update (so timing one against the
    /// other compares like with like).
    #[test]
    fn matches_the_fused_kernel() {
        let opts = (Kind::Float, Device::Cpu);
        let shapes: [&[i64]; 3] = [&[8, 5], &[8], &[3, 8]];
        let a: Vec<Tensor> = shapes.iter().map(|s| Tensor::randn(*s, opts)).collect();
        let b: Vec<Tensor> = a.iter().map(Tensor::copy).collect();
        let initial: Vec<Tensor> = a.iter().map(Tensor::copy).collect();
        let grads: Vec<Tensor> = shapes.iter().map(|s| Tensor::randn(*s, opts)).collect();
        let decay = vec![0.01, 0.0, 0.01];
        let mut unfused = UnfusedAdamW::new(&a, decay.clone(), 1e-2).unwrap();
        let (m, v) = (zeros_like(&b).unwrap(), zeros_like(&b).unwrap());
        let steps: Vec<Tensor> = b.iter().map(|_| Tensor::zeros([], opts)).collect();
        for _ in 0..3 {
            unfused.step(&a, &grads).unwrap();
            for s in &steps {
                let _ = s.shallow_clone().f_add_scalar_(1.0).unwrap();
            }
            for (i, wd) in decay.iter().enumerate() {
                let config = AdamWConfig {
                    lr: 1e-2,
                    weight_decay: *wd,
                    ..AdamWConfig::default()
                };
                let one = |t: &Tensor| vec![t.shallow_clone()];
                let t = AdamWTensors {
                    params: &one(&b[i]),
                    grads: &one(&grads[i]),
                    exp_avgs: &one(&m[i]),
                    exp_avg_sqs: &one(&v[i]),
                    max_exp_avg_sqs: &[],
                    state_steps: &one(&steps[i]),
                };
                fused_adamw_step(t, &config, None, None).unwrap();
            }
        }
        for (x, y) in a.iter().zip(&b) {
            let diff = (x - y).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "max difference {diff}");
        }
        for (x, x0) in a.iter().zip(&initial) {
            let moved = (x - x0).abs().max().double_value(&[]);
            assert!(moved > 1e-3, "the update moved the parameters ({moved})");
        }
    }
}
