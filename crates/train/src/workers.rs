//! `data.num_workers = auto`: the loader's worker count measured on the first training steps.
//!
//! Loader threads compete with the compute threads for the same cores, so what counts is the
//! whole step (waiting for data, forward, backward, optimizer), not the loader's own rate. The
//! tuner tries 0, 1, 2, 4, … workers up to the ceiling (the profile's count, capped by the
//! cores), each for [`SKIPPED`] steps that warm it up (threads starting, the prefetch queue
//! filling) and then timed steps — at least [`MEASURED`], and more until they add up to
//! [`MEASURED_TIME`] (at most [`MAX_MEASURED`]), so that millisecond steps are judged over
//! enough of them to tell counts a few percent apart — and keeps the fewest workers whose
//! mean step is within [`CLOSE`] of the fastest. The mean, not the median: a count whose
//! workers fall behind now and then (a step waiting for its batch every few steps) has a fast
//! median step and a slow epoch, and throughput is what the run gets. It stops early once
//! more workers are clearly slower than the best so far (beyond [`SLOWER`]): adding threads
//! past that point only adds contention.
//! The batches are the same whatever the count, so the measurement changes no result.

use std::time::Duration;

/// Steps after each change that are not timed.
pub const SKIPPED: usize = 2;
/// Steps timed per worker count, at least.
pub const MEASURED: usize = 4;
/// Timed steps per count go on until they add up to this much time…
pub const MEASURED_TIME: Duration = Duration::from_millis(250);
/// …or to this many steps.
pub const MAX_MEASURED: usize = 64;
/// A count whose mean step is within this factor of the fastest counts as fast.
pub const CLOSE: f64 = 1.03;
/// A larger count this much slower than the best so far ends the measurement.
pub const SLOWER: f64 = 1.15;

/// The worker counts tried, in order: 0, 1, 2, 4, … and the ceiling itself.
pub fn candidates(ceiling: usize) -> Vec<usize> {
    let mut out = vec![0];
    let mut n = 1;
    while n < ceiling {
        out.push(n);
        n *= 2;
    }
    if ceiling > 0 {
        out.push(ceiling);
    }
    out
}

/// What the measurement found: the mean step per count tried, and the count kept.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkerChoice {
    /// `(workers, mean step in seconds)`, in the order tried.
    pub measured: Vec<(usize, f64)>,
    pub chosen: usize,
}

impl WorkerChoice {
    /// "0 → 12.1 ms, 1 → 9.8 ms, 2 → 10.0 ms per step; kept 1".
    pub fn describe(&self) -> String {
        if self.measured.is_empty() {
            return format!(
                "a ceiling of 0 leaves nothing to measure; kept {}",
                self.chosen
            );
        }
        let tried: Vec<String> = self
            .measured
            .iter()
            .map(|(w, s)| format!("{w} → {:.1} ms", s * 1e3))
            .collect();
        format!("{} per step; kept {}", tried.join(", "), self.chosen)
    }
}

/// The measurement in progress, fed one whole step's time after another.
#[derive(Debug, Clone)]
pub struct WorkerTuner {
    candidates: Vec<usize>,
    /// Index of the count being measured.
    at: usize,
    /// Steps seen with the current count.
    seen: usize,
    times: Vec<f64>,
    measured: Vec<(usize, f64)>,
    choice: Option<WorkerChoice>,
}

impl WorkerTuner {
    /// A measurement up to `ceiling` workers; with a ceiling of 0 the choice is made (0).
    pub fn new(ceiling: usize) -> Self {
        let candidates = candidates(ceiling);
        let choice = (candidates.len() == 1).then(|| WorkerChoice {
            measured: vec![],
            chosen: 0,
        });
        Self {
            candidates,
            at: 0,
            seen: 0,
            times: vec![],
            measured: vec![],
            choice,
        }
    }

    /// The count to start with.
    pub fn first(&self) -> usize {
        self.candidates[0]
    }

    /// The choice, once made.
    pub fn choice(&self) -> Option<&WorkerChoice> {
        self.choice.as_ref()
    }

    /// Records a whole step's time; returns the count to switch to now, if it changes (the
    /// next count to measure, or the one kept when the measurement ends).
    pub fn record(&mut self, step: Duration) -> Option<usize> {
        if self.choice.is_some() {
            return None;
        }
        self.seen += 1;
        if self.seen > SKIPPED {
            self.times.push(step.as_secs_f64());
        }
        let timed: f64 = self.times.iter().sum();
        let enough = self.times.len() >= MAX_MEASURED || timed >= MEASURED_TIME.as_secs_f64();
        if self.times.len() < MEASURED || !enough {
            return None;
        }
        let workers = self.candidates[self.at];
        self.measured.push((workers, mean(&self.times)));
        self.times.clear();
        self.seen = 0;
        self.at += 1;
        let best = self.fastest();
        let clearly_slower = self.measured.last().is_some_and(|m| m.1 > SLOWER * best);
        if self.at == self.candidates.len() || clearly_slower {
            let chosen = self.decide();
            return (chosen != workers).then_some(chosen);
        }
        Some(self.candidates[self.at])
    }

    /// The measurement ends when the run stops early: the choice from what was measured.
    pub fn finish(&mut self) -> Option<&WorkerChoice> {
        if self.choice.is_none() && !self.measured.is_empty() {
            self.decide();
        }
        self.choice.as_ref()
    }

    fn fastest(&self) -> f64 {
        self.measured
            .iter()
            .map(|m| m.1)
            .fold(f64::INFINITY, f64::min)
    }

    /// Keeps the fewest workers measured within [`CLOSE`] of the fastest, and returns it.
    fn decide(&mut self) -> usize {
        let best = self.fastest();
        let chosen = self
            .measured
            .iter()
            .filter(|m| m.1 <= CLOSE * best)
            .map(|m| m.0)
            .min()
            .unwrap_or_default();
        self.choice = Some(WorkerChoice {
            measured: self.measured.clone(),
            chosen,
        });
        chosen
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1e3)
    }

    /// Feeds the tuner `per_count[k]` ms for every step while it measures count k (the
    /// skipped steps slow, as a warm-up is); returns the switches it asked for.
    fn run(tuner: &mut WorkerTuner, per_count: &[(usize, f64)]) -> Vec<usize> {
        let mut current = tuner.first();
        let mut switches = vec![];
        for _ in 0..1000 {
            let time = per_count.iter().find(|c| c.0 == current).unwrap().1;
            let warm = tuner.seen < SKIPPED;
            if let Some(next) = tuner.record(ms(if warm { 10.0 * time } else { time })) {
                switches.push(next);
                current = next;
            }
        }
        switches
    }

    #[test]
    fn candidates_double_up_to_the_ceiling() {
        assert_eq!(candidates(0), [0]);
        assert_eq!(candidates(1), [0, 1]);
        assert_eq!(candidates(2), [0, 1, 2]);
        assert_eq!(candidates(6), [0, 1, 2, 4, 6]);
        assert_eq!(candidates(16), [0, 1, 2, 4, 8, 16]);
    }

    #[test]
    fn keeps_the_fastest_count_from_injected_step_times() {
        let mut t = WorkerTuner::new(4);
        let times = [(0, 20.0), (1, 12.0), (2, 10.0), (4, 10.5)];
        assert_eq!(run(&mut t, &times), [1, 2, 4, 2]);
        let c = t.choice().unwrap();
        assert_eq!(c.chosen, 2);
        assert_eq!(
            c.measured.iter().map(|m| m.0).collect::<Vec<_>>(),
            [0, 1, 2, 4]
        );
        assert!((c.measured[2].1 - 0.010).abs() < 1e-9, "{c:?}");
        assert!(c.describe().contains("2 → 10.0 ms"), "{}", c.describe());
    }

    #[test]
    fn prefers_fewer_workers_when_more_are_no_faster() {
        let mut t = WorkerTuner::new(2);
        // 1 and 2 workers within 3 % of each other: 1 is kept (fewer threads, same speed).
        assert_eq!(run(&mut t, &[(0, 15.0), (1, 10.0), (2, 9.9)]), [1, 2, 1]);
        assert_eq!(t.choice().unwrap().chosen, 1);
        // Cheap samples: no worker is fastest, and the measurement stops at the first count
        // that is clearly slower.
        let mut t = WorkerTuner::new(8);
        assert_eq!(run(&mut t, &[(0, 5.0), (1, 6.0), (2, 6.0)]), [1, 0]);
        assert_eq!(t.choice().unwrap().chosen, 0);
        assert_eq!(t.choice().unwrap().measured.len(), 2);
    }

    /// Millisecond steps are timed until they add up to [`MEASURED_TIME`]; slow ones after
    /// [`MEASURED`]; never more than [`MAX_MEASURED`].
    #[test]
    fn short_steps_are_timed_for_longer() {
        let steps_before_switch = |step_ms: f64| {
            let mut t = WorkerTuner::new(2);
            (1..=1000)
                .find(|_| t.record(ms(step_ms)).is_some())
                .unwrap()
        };
        assert_eq!(steps_before_switch(100.0), SKIPPED + MEASURED);
        assert_eq!(steps_before_switch(5.0), SKIPPED + 50);
        assert_eq!(steps_before_switch(0.1), SKIPPED + MAX_MEASURED);
    }

    #[test]
    fn a_ceiling_of_zero_measures_nothing_and_a_short_run_decides_on_what_it_saw() {
        let mut t = WorkerTuner::new(0);
        assert_eq!(t.choice().unwrap().chosen, 0);
        assert_eq!(
            t.choice().unwrap().describe(),
            "a ceiling of 0 leaves nothing to measure; kept 0"
        );
        assert_eq!(t.record(ms(1.0)), None);
        let mut t = WorkerTuner::new(4);
        for _ in 0..SKIPPED + MEASURED {
            t.record(ms(80.0));
        }
        t.record(ms(800.0)); // the first step with 1 worker, then the run ends
        assert_eq!(t.finish().unwrap().chosen, 0);
        assert!(WorkerTuner::new(4).finish().is_none(), "nothing measured");
    }
}
