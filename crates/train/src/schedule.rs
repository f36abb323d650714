//! Learning-rate schedules: constant, or linear warmup followed by cosine decay.

use kiln_config::ScheduleKind;

/// The learning rate for each optimizer step of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    pub kind: ScheduleKind,
    pub base_lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
    /// Optimizer steps in the whole run (the cosine reaches `min_lr` there).
    pub total_steps: u64,
}

impl LrSchedule {
    /// The rate for optimizer step `step` (0 = the first). Warmup (both kinds) ramps linearly
    /// from `base_lr / warmup_steps` to `base_lr`; then constant stays there and cosine decays
    /// to `min_lr` at `total_steps`.
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.base_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.kind {
            ScheduleKind::Constant => self.base_lr,
            ScheduleKind::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
                let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
                self.min_lr
                    + (self.base_lr - self.min_lr)
                        * 0.5
                        * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

/// The optimizer steps of a run: `batches` a epoch by `accum` (a partial group still steps),
/// times `epochs`, capped by `max_steps`.
pub fn total_steps(batches: u64, accum: u64, epochs: u64, max_steps: Option<u64>) -> u64 {
    let steps = batches.div_ceil(accum.max(1)) * epochs;
    max_steps.map_or(steps, |m| m.min(steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn warmup_is_linear_then_cosine_reaches_min_lr_at_the_end() {
        let s = LrSchedule {
            kind: ScheduleKind::Cosine,
            base_lr: 1e-3,
            min_lr: 1e-5,
            warmup_steps: 10,
            total_steps: 110,
        };
        assert!(close(s.lr_at(0), 1e-4));
        assert!(close(s.lr_at(4), 5e-4));
        assert!(close(s.lr_at(9), 1e-3), "warmup ends at the base rate");
        assert!(close(s.lr_at(10), 1e-3), "cosine starts at the base rate");
        // Half way through the decay: the midpoint of base and min.
        assert!(close(s.lr_at(60), (1e-3 + 1e-5) / 2.0));
        assert!(close(s.lr_at(110), 1e-5));
        assert!(close(s.lr_at(500), 1e-5), "stays at min_lr past the end");
        let lrs: Vec<f64> = (10..=110).map(|i| s.lr_at(i)).collect();
        assert!(lrs.windows(2).all(|w| w[1] <= w[0]), "decay is monotone");
    }

    #[test]
    fn constant_keeps_the_base_rate_after_warmup() {
        let s = LrSchedule {
            kind: ScheduleKind::Constant,
            base_lr: 0.1,
            min_lr: 0.0,
            warmup_steps: 0,
            total_steps: 5,
        };
        assert!((0..20).all(|i| close(s.lr_at(i), 0.1)));
        let warm = LrSchedule {
            warmup_steps: 4,
            ..s
        };
        assert!(close(warm.lr_at(1), 0.05));
        assert!(close(warm.lr_at(100), 0.1));
    }
}
