//! Which sample indices an epoch visits, in which order, on which rank.

use crate::DataError;
use crate::rng::SplitMix64;

/// How to order and shard samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplerConfig {
    /// Shuffle each epoch (a different, reproducible order per epoch).
    pub shuffle: bool,
    pub seed: u64,
    /// This process's rank in data-parallel training, and how many ranks there are.
    pub rank: usize,
    pub world_size: usize,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            shuffle: false,
            seed: 0,
            rank: 0,
            world_size: 1,
        }
    }
}

/// Where a run is within its data: the epoch and how many batches of it were consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    pub epoch: u64,
    pub batch: usize,
}

/// Produces each epoch's index order for one rank.
#[derive(Debug, Clone)]
pub struct Sampler {
    len: usize,
    config: SamplerConfig,
}

impl Sampler {
    pub fn new(len: usize, config: SamplerConfig) -> Result<Self, DataError> {
        if config.world_size == 0 {
            return Err(DataError::InvalidConfig {
                key: "world_size",
                value: "0".to_owned(),
                expected: "at least 1".to_owned(),
            });
        }
        if config.rank >= config.world_size {
            return Err(DataError::InvalidConfig {
                key: "rank",
                value: config.rank.to_string(),
                expected: format!("below world_size ({})", config.world_size),
            });
        }
        Ok(Self { len, config })
    }

    /// How many indices this rank gets per epoch (the length of [`Sampler::epoch_indices`]).
    pub fn epoch_len(&self) -> usize {
        self.len
            .saturating_sub(self.config.rank)
            .div_ceil(self.config.world_size)
    }

    /// This rank's indices for `epoch`. Every rank shuffles the same permutation (same seed and
    /// epoch) and takes every `world_size`-th entry from its rank on, so across ranks each sample
    /// appears exactly once per epoch.
    pub fn epoch_indices(&self, epoch: u64) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.config.shuffle {
            let mut g = SplitMix64::keyed(&[self.config.seed, epoch]);
            for i in (1..all.len()).rev() {
                let j = g.below(i + 1);
                all.swap(i, j);
            }
        }
        all.into_iter()
            .skip(self.config.rank)
            .step_by(self.config.world_size)
            .collect()
    }
}
