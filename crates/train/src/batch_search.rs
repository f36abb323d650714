//! `train.batch_size = "auto"`: finds the batch size for this model, machine and precision by
//! measuring real train steps (forward, backward, optimizer) at a few sizes.
//!
//! With a memory limit (CUDA: `performance.memory_fraction` of the GPU, less a margin), the
//! search starts at the profile's batch size, doubles while trials fit and halves while they do
//! not, then bisects between the largest fit and the smallest failure; a trial fits when it
//! neither ran out of memory nor peaked above the budget. Without one (CPU) it climbs by
//! doubling or halving while throughput improves. Either way at most `max_trials` trials run,
//! and among the sizes that fit the one with the best measured throughput wins (within 2% of
//! the best, the smallest such size: the same speed with more headroom and more steps).
//!
//! The answer is cached per (model, hardware, precision) in `batch-size.json` under kiln's
//! cache directory, so later runs skip the search.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use kiln_config::RunPlan;
use kiln_config::keys;
use kiln_data::{Dataset, Loader, LoaderConfig, SamplerConfig};
use serde::{Deserialize, Serialize};
use tch::nn;

use crate::TrainError;
use crate::feed::DeviceFeeder;
use crate::model::{InputSpec, ModelRecipe};
use crate::trainer::{TrainSettings, Trainer};
use kiln_device::measured::{MeasuredCache, hardware_key};

/// What one trial measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum TrialOutcome {
    /// The steps ran: their throughput, and the peak memory when it could be measured.
    Ran {
        samples_per_s: f64,
        peak_bytes: Option<u64>,
    },
    /// The allocator ran out of memory.
    OutOfMemory,
}

/// A measured batch size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub batch_size: u64,
    pub outcome: TrialOutcome,
    /// Whether it fits the memory budget (ran, and peaked within it).
    pub fits: bool,
}

/// Runs trials: real train steps in the run, simulated ones in tests.
pub trait TrialRunner {
    fn run(&mut self, batch_size: u64) -> Result<TrialOutcome, TrainError>;
}

/// Where the search may look.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchSpace {
    /// The first size tried (the profile's batch size).
    pub start: u64,
    /// The largest size worth trying (the training set's size).
    pub max: u64,
    /// The peak bytes a trial may reach; `None` searches by throughput alone.
    pub memory_budget: Option<u64>,
    pub max_trials: usize,
}

/// The search's answer and how it got there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchResult {
    pub batch_size: u64,
    pub trials: Vec<Trial>,
}

impl SearchResult {
    /// "6 trials (64 ✓ 1520/s, 128 ✓ 1710/s, 256 ✗ out of memory, …) → 128".
    pub fn describe(&self) -> String {
        let trials: Vec<String> = self
            .trials
            .iter()
            .map(|t| match t.outcome {
                TrialOutcome::Ran { samples_per_s, .. } if t.fits => {
                    format!("{} ✓ {samples_per_s:.0}/s", t.batch_size)
                }
                TrialOutcome::Ran { peak_bytes, .. } => format!(
                    "{} ✗ peak {:.2} GiB over budget",
                    t.batch_size,
                    peak_bytes.unwrap_or(0) as f64 / f64::from(1u32 << 30)
                ),
                TrialOutcome::OutOfMemory => format!("{} ✗ out of memory", t.batch_size),
            })
            .collect();
        format!(
            "{} trials ({}) → {}",
            self.trials.len(),
            trials.join(", "),
            self.batch_size
        )
    }
}

/// Rounds a size to a multiple of 8 when it is at least 8 (friendlier to the hardware).
fn round(b: u64) -> u64 {
    if b >= 16 { b / 8 * 8 } else { b.max(1) }
}

struct Search<'a> {
    space: SearchSpace,
    runner: &'a mut dyn TrialRunner,
    trials: Vec<Trial>,
}

impl Search<'_> {
    fn budget_left(&self) -> bool {
        self.trials.len() < self.space.max_trials
    }

    fn tried(&self, b: u64) -> Option<Trial> {
        self.trials.iter().find(|t| t.batch_size == b).copied()
    }

    fn trial(&mut self, b: u64) -> Result<Trial, TrainError> {
        if let Some(t) = self.tried(b) {
            return Ok(t);
        }
        crate::fault::reached(crate::fault::Point::BatchSearch);
        let outcome = self.runner.run(b)?;
        let fits = match outcome {
            TrialOutcome::OutOfMemory => false,
            TrialOutcome::Ran { peak_bytes, .. } => match (self.space.memory_budget, peak_bytes) {
                (Some(budget), Some(peak)) => peak <= budget,
                _ => true,
            },
        };
        let t = Trial {
            batch_size: b,
            outcome,
            fits,
        };
        tracing::info!(
            "batch size {b}: {}",
            match outcome {
                TrialOutcome::Ran {
                    samples_per_s,
                    peak_bytes,
                } => format!(
                    "{samples_per_s:.0} samples/s{}{}",
                    peak_bytes.map_or_else(String::new, |p| format!(
                        ", peak {:.2} GiB",
                        p as f64 / f64::from(1u32 << 30)
                    )),
                    if fits {
                        ""
                    } else {
                        " (over the memory budget)"
                    }
                ),
                TrialOutcome::OutOfMemory => "out of memory".to_owned(),
            }
        );
        self.trials.push(t);
        Ok(t)
    }

    fn throughput(t: &Trial) -> f64 {
        match t.outcome {
            TrialOutcome::Ran { samples_per_s, .. } if t.fits => samples_per_s,
            _ => 0.0,
        }
    }

    /// Memory-limited: the largest size that fits, bracketed and bisected.
    fn by_memory(&mut self) -> Result<(), TrainError> {
        let max = self.space.max;
        let mut b = round(self.space.start.clamp(1, max));
        let (mut lo, mut hi) = (None::<u64>, None::<u64>);
        // Bracket.
        while self.budget_left() {
            if self.trial(b)?.fits {
                lo = Some(b);
                if b >= max {
                    break;
                }
                b = round((b * 2).min(max));
                if Some(b) == lo {
                    break;
                }
            } else {
                hi = Some(b);
                if lo.is_some() || b == 1 {
                    break;
                }
                b = round(b / 2);
            }
            if lo.is_some() && hi.is_some() {
                break;
            }
        }
        // Bisect while the gap is worth a trial (more than 1/8 of the fitting size).
        while let (Some(l), Some(h)) = (lo, hi) {
            if !self.budget_left() || h - l <= (l / 8).max(1) {
                break;
            }
            let mid = round(l + (h - l) / 2);
            if mid <= l || mid >= h {
                break;
            }
            if self.trial(mid)?.fits {
                lo = Some(mid);
            } else {
                hi = Some(mid);
            }
        }
        Ok(())
    }

    /// Throughput only: climb by doubling (or else halving) while it improves by over 2%.
    fn by_throughput(&mut self) -> Result<(), TrainError> {
        let max = self.space.max;
        let start = round(self.space.start.clamp(1, max));
        let mut best = self.trial(start)?;
        for direction in [2.0f64, 0.5] {
            let mut current = best;
            while self.budget_left() {
                let next = round(((current.batch_size as f64 * direction) as u64).clamp(1, max));
                if next == current.batch_size || self.tried(next).is_some() {
                    break;
                }
                let t = self.trial(next)?;
                if Self::throughput(&t) > Self::throughput(&current) * 1.02 {
                    current = t;
                } else {
                    break;
                }
            }
            if Self::throughput(&current) > Self::throughput(&best) {
                best = current;
            }
            if best.batch_size != start {
                // Doubling helped: no need to look below the start.
                break;
            }
        }
        Ok(())
    }

    fn choose(&self) -> Option<u64> {
        let best = self
            .trials
            .iter()
            .map(Self::throughput)
            .fold(0.0f64, f64::max);
        self.trials
            .iter()
            .filter(|t| t.fits && Self::throughput(t) >= best * 0.98)
            .map(|t| t.batch_size)
            .min()
    }
}

/// Searches `space` with `runner`; fails when no size fits (not even 1).
pub fn search(
    space: SearchSpace,
    runner: &mut dyn TrialRunner,
) -> Result<SearchResult, TrainError> {
    let mut s = Search {
        space: SearchSpace {
            max: space.max.max(1),
            max_trials: space.max_trials.max(1),
            ..space
        },
        runner,
        trials: vec![],
    };
    if space.memory_budget.is_some() {
        s.by_memory()?;
    } else {
        s.by_throughput()?;
    }
    let batch_size = s.choose().ok_or_else(|| TrainError::InvalidPlan {
        key: keys::train::batch_size,
        value: "auto".to_owned(),
        expected: format!(
            "a batch size that fits: none of {} trials did. Set a smaller model, \
             model.activation_checkpointing = true or a lower precision",
            s.trials.len()
        ),
    })?;
    Ok(SearchResult {
        batch_size,
        trials: s.trials,
    })
}

/// The batch size for `plan` with `train.batch_size = "auto"`: the cached answer for this
/// model, hardware and precision, or a search (cached afterwards). Returns the size and a line
/// for the report.
pub fn resolve_auto<D: Dataset>(
    plan: &RunPlan,
    recipe: &ModelRecipe<'_>,
    input: &InputSpec,
    data: Arc<D>,
    device: tch::Device,
    cache: Option<&Path>,
) -> Result<(u64, String), TrainError> {
    let hardware = hardware_key(device)?;
    let memory_budget = match device {
        tch::Device::Cuda(i) => {
            let props = kiln_torch_ext::cuda::device_properties(i)?;
            let budget = props.total_memory_bytes as f64
                * plan.performance.backend.memory_fraction
                * (1.0 - MEMORY_MARGIN);
            Some(budget as u64)
        }
        _ => None,
    };
    let key = cache_key(plan, &recipe.identity, input, &hardware);
    let mut store = cache.map(open_batch_size_cache);
    if let Some(hit) = store.as_ref().and_then(|c| c.get(&key)) {
        let note = format!(
            "auto: {} (cached from {} trials in {}; delete the entry to measure again)",
            hit.batch_size,
            hit.trials.len(),
            store
                .as_ref()
                .map_or_else(String::new, |c| c.path().display().to_string())
        );
        return Ok((hit.batch_size, note));
    }
    let max = data.len() as u64;
    let mut runner = StepTrials {
        plan,
        recipe,
        input,
        data,
        device,
    };
    let result = search(
        SearchSpace {
            start: plan.train.batch_size,
            max,
            memory_budget,
            max_trials: MAX_TRIALS,
        },
        &mut runner,
    )?;
    let mut note = format!("auto: {}", result.describe());
    if let Some(c) = store.as_mut() {
        let measured_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        c.store(
            &key,
            CachedAnswer {
                batch_size: result.batch_size,
                trials: result.trials.clone(),
                measured_at,
            },
        )?;
        note.push_str(&format!("; cached in {}", c.path().display()));
    }
    Ok((result.batch_size, note))
}

/// Share of the memory budget kept free for what a trial does not show (fragmentation,
/// evaluation, the data feed's buffers).
pub const MEMORY_MARGIN: f64 = 0.1;

/// At most this many trials per search.
pub const MAX_TRIALS: usize = 8;

/// Trials as real train steps of the plan's model on `device`, over the first samples of
/// `data`. Each trial builds a fresh model (its weights do not matter), warms up one step,
/// then times steps for at least ~0.3 s (2 to 10 steps).
#[derive(Debug)]
pub struct StepTrials<'a, D: Dataset> {
    pub plan: &'a RunPlan,
    pub recipe: &'a ModelRecipe<'a>,
    pub input: &'a InputSpec,
    pub data: Arc<D>,
    pub device: tch::Device,
}

impl<D: Dataset> StepTrials<'_, D> {
    fn measure(&self, batch_size: u64) -> Result<TrialOutcome, TrainError> {
        let vs = nn::VarStore::new(self.device);
        let model = (self.recipe.build)(&vs, self.input)?;
        model.check_inputs(&self.data.inputs())?;
        let settings = TrainSettings::from_plan(&self.plan.train, 0);
        let mut trainer = Trainer::new(model.as_ref(), "trial", &vs, settings, self.device)?;
        trainer.set_retry_out_of_memory(false);
        trainer.set_target(&self.data.target())?;
        let mut loader = Loader::new(
            Arc::clone(&self.data),
            LoaderConfig {
                batch_size: usize::try_from(batch_size).unwrap_or(usize::MAX),
                num_workers: 0,
                prefetch_factor: 1,
                drop_last: false,
                sampler: SamplerConfig {
                    shuffle: false,
                    ..SamplerConfig::default()
                },
                inline_threads: 1,
                by_name: model.reads_by_name(),
            },
        )?;
        let batch = match DeviceFeeder::new(loader.epoch(0), self.device).next() {
            Some(b) => b?,
            None => {
                return Err(TrainError::InvalidPlan {
                    key: keys::train::batch_size,
                    value: "auto".to_owned(),
                    expected: "training data to measure with".to_owned(),
                });
            }
        };
        let cuda = match self.device {
            tch::Device::Cuda(i) => Some(i),
            _ => None,
        };
        let batches = [batch];
        // Warm-up (allocations, kernel selection; a TorchScript module's profiling executor
        // takes its first few steps to settle: see `ModelRecipe::warmup_steps`), then reset
        // the peak and time.
        for _ in 0..self.recipe.warmup_steps.max(1) {
            trainer
                .train_step(&batches, 1e-6)?
                .sums
                .values
                .f_double_value(&[0])?;
        }
        if let Some(i) = cuda {
            kiln_torch_ext::memory::reset_peak(i)?;
        }
        let start = Instant::now();
        let mut steps = 0u64;
        while steps < 2 || (steps < 10 && start.elapsed().as_secs_f64() < 0.3) {
            // Reading the loss waits for the device, so the clock sees finished work.
            trainer
                .train_step(&batches, 1e-6)?
                .sums
                .values
                .f_double_value(&[0])?;
            steps += 1;
        }
        let seconds = start.elapsed().as_secs_f64().max(1e-9);
        let rows = batches[0].targets.size()[0] as f64;
        let peak_bytes = match cuda {
            Some(i) => Some(kiln_torch_ext::memory::stats(i)?.allocated_peak),
            None => None,
        };
        Ok(TrialOutcome::Ran {
            samples_per_s: rows * steps as f64 / seconds,
            peak_bytes,
        })
    }
}

impl<D: Dataset> TrialRunner for StepTrials<'_, D> {
    fn run(&mut self, batch_size: u64) -> Result<TrialOutcome, TrainError> {
        let outcome = match self.measure(batch_size) {
            Err(e) if e.is_out_of_memory() => Ok(TrialOutcome::OutOfMemory),
            other => other,
        };
        if self.device.is_cuda() {
            kiln_torch_ext::memory::empty_cache()?;
        }
        outcome
    }
}

/// One cached answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedAnswer {
    pub batch_size: u64,
    pub trials: Vec<Trial>,
    /// Unix seconds when it was measured.
    pub measured_at: u64,
}

/// Answers by (model, hardware, precision) key, in `<dir>/batch-size.json`.
pub type BatchSizeCache = MeasuredCache<CachedAnswer>;

/// Opens the batch-size cache in `dir`.
pub fn open_batch_size_cache(dir: &Path) -> BatchSizeCache {
    MeasuredCache::open_file(dir, "batch-size.json", "batch-size cache")
}

/// The cache key: everything the answer depends on.
pub fn cache_key(plan: &RunPlan, identity: &str, input: &InputSpec, hardware: &str) -> String {
    format!(
        "{identity} on {:?}×{} | {hardware} | {} | memory_fraction {} | {} accum {} | kiln {}",
        input.sample_shape,
        input.classes,
        plan.train.amp,
        plan.performance.backend.memory_fraction,
        plan.train.optimizer,
        plan.train.grad_accum_steps,
        env!("CARGO_PKG_VERSION"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model whose peak memory is `fixed + per_sample · b` and that runs out of memory above
    /// `limit`; throughput rises with the batch, half of its ceiling at `knee` samples.
    struct Simulated {
        fixed: u64,
        per_sample: u64,
        limit: u64,
        knee: f64,
        calls: Vec<u64>,
    }

    impl TrialRunner for Simulated {
        fn run(&mut self, b: u64) -> Result<TrialOutcome, TrainError> {
            self.calls.push(b);
            let peak = self.fixed + self.per_sample * b;
            if peak > self.limit {
                return Ok(TrialOutcome::OutOfMemory);
            }
            let bf = b as f64;
            Ok(TrialOutcome::Ran {
                samples_per_s: 1000.0 * bf / (bf + self.knee),
                peak_bytes: Some(peak),
            })
        }
    }

    fn gpu(limit_gib: u64, knee: f64) -> Simulated {
        Simulated {
            fixed: 2 << 30,
            per_sample: 64 << 20,
            limit: limit_gib << 30,
            knee,
            calls: vec![],
        }
    }

    #[test]
    fn memory_search_finds_the_largest_batch_under_the_budget_within_eight_trials() {
        // 80 GiB card at 0.9, 10% margin: budget 64.8 GiB → (64.8 - 2) GiB / 64 MiB ≈ 1004.
        let mut sim = gpu(80, 2000.0);
        let budget = (80.0 * 0.9 * 0.9 * f64::from(1u32 << 30)) as u64;
        let result = search(
            SearchSpace {
                start: 256,
                max: 100_000,
                memory_budget: Some(budget),
                max_trials: 8,
            },
            &mut sim,
        )
        .unwrap();
        assert!(sim.calls.len() <= 8, "{:?}", sim.calls);
        let largest_fit = (budget - (2 << 30)) / (64 << 20);
        assert!(
            result.batch_size <= largest_fit
                && result.batch_size as f64 >= 0.85 * largest_fit as f64,
            "chose {} of at most {largest_fit}: {}",
            result.batch_size,
            result.describe()
        );
        // Every size it tried above the budget was rejected, whether it crashed or not.
        for t in &result.trials {
            assert_eq!(t.fits, t.batch_size <= largest_fit, "{t:?}");
        }
    }

    #[test]
    fn memory_search_halves_from_a_start_that_does_not_fit() {
        let mut sim = gpu(16, 2000.0);
        let result = search(
            SearchSpace {
                start: 1024,
                max: 100_000,
                memory_budget: Some(16 << 30),
                max_trials: 8,
            },
            &mut sim,
        )
        .unwrap();
        // (16 - 2) GiB / 64 MiB = 224 fits, 225 does not.
        assert_eq!(sim.calls[..3], [1024, 512, 256]);
        assert!(
            (192..=224).contains(&result.batch_size),
            "{}",
            result.describe()
        );
        assert!(result.trials.len() <= 8);
    }

    #[test]
    fn among_sizes_that_fit_throughput_decides() {
        // Throughput saturates early (knee 8): beyond ~64 samples more is not faster, so the
        // smallest size within 2% of the best wins, not the largest that fits.
        let mut sim = gpu(80, 8.0);
        let result = search(
            SearchSpace {
                start: 64,
                max: 100_000,
                memory_budget: Some(60 << 30),
                max_trials: 8,
            },
            &mut sim,
        )
        .unwrap();
        let best = result
            .trials
            .iter()
            .filter(|t| t.fits)
            .map(Search::throughput)
            .fold(0.0, f64::max);
        let chosen = result
            .trials
            .iter()
            .find(|t| t.batch_size == result.batch_size)
            .unwrap();
        assert!(Search::throughput(chosen) >= 0.98 * best);
        let largest_fit = result
            .trials
            .iter()
            .filter(|t| t.fits)
            .map(|t| t.batch_size)
            .max();
        assert!(
            Some(result.batch_size) < largest_fit,
            "{}",
            result.describe()
        );
    }

    #[test]
    fn cpu_search_climbs_by_throughput_and_stops_when_it_stops_improving() {
        // No memory budget: throughput peaks at 128 and falls after (cache effects).
        struct Cpu(Vec<u64>);
        impl TrialRunner for Cpu {
            fn run(&mut self, b: u64) -> Result<TrialOutcome, TrainError> {
                self.0.push(b);
                let x = (b as f64).log2();
                Ok(TrialOutcome::Ran {
                    samples_per_s: 1000.0 - 40.0 * (x - 7.0).powi(2),
                    peak_bytes: None,
                })
            }
        }
        let mut up = Cpu(vec![]);
        let r = search(
            SearchSpace {
                start: 32,
                max: 10_000,
                memory_budget: None,
                max_trials: 8,
            },
            &mut up,
        )
        .unwrap();
        assert_eq!(up.0, [32, 64, 128, 256]);
        assert_eq!(r.batch_size, 128);
        let mut down = Cpu(vec![]);
        let r = search(
            SearchSpace {
                start: 1024,
                max: 10_000,
                memory_budget: None,
                max_trials: 8,
            },
            &mut down,
        )
        .unwrap();
        assert_eq!(down.0, [1024, 2048, 512, 256, 128, 64]);
        assert_eq!(r.batch_size, 128);
    }

    #[test]
    fn nothing_fits_is_a_clear_error_and_the_dataset_caps_the_search() {
        let mut sim = gpu(1, 2000.0);
        let err = search(
            SearchSpace {
                start: 64,
                max: 1000,
                memory_budget: Some(1 << 30),
                max_trials: 8,
            },
            &mut sim,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("train.batch_size") && err.contains("auto"),
            "{err}"
        );

        let mut sim = gpu(80, 2000.0);
        let r = search(
            SearchSpace {
                start: 64,
                max: 100,
                memory_budget: Some(70 << 30),
                max_trials: 8,
            },
            &mut sim,
        )
        .unwrap();
        assert!(sim.calls.iter().all(|&b| b <= 100), "{:?}", sim.calls);
        assert_eq!(r.batch_size, 96);
    }

    #[test]
    fn the_cache_round_trips_and_survives_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = open_batch_size_cache(dir.path());
        assert!(cache.get("k").is_none());
        let answer = CachedAnswer {
            batch_size: 96,
            trials: vec![],
            measured_at: 1,
        };
        cache.store("k", answer.clone()).unwrap();
        assert_eq!(open_batch_size_cache(dir.path()).get("k"), Some(&answer));
        std::fs::write(cache.path(), "{ not json").unwrap();
        let mut damaged = open_batch_size_cache(dir.path());
        assert!(damaged.get("k").is_none());
        damaged.store("k2", answer.clone()).unwrap();
        assert_eq!(open_batch_size_cache(dir.path()).get("k2"), Some(&answer));
    }
}
