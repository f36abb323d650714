//! Running sums of a run's metrics over some steps (a log interval, an epoch): kept on the
//! device so that steps never wait for the host, read (one synchronisation) when reported, and
//! saved in checkpoints by name so that a resumed run reports what an uninterrupted one would.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::{BatchSums, MetricSet, MetricValues};
use crate::TrainError;

/// A tally as checkpoints save it: its sums by name (`accuracy.right`) and its samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedTally {
    pub samples: u64,
    pub sums: BTreeMap<String, f64>,
}

/// A [`MetricSet`]'s sums on the device (f64) and the samples they cover, on the host.
#[derive(Debug)]
pub struct Tally {
    set: MetricSet,
    sums: Tensor,
    samples: u64,
}

impl Tally {
    /// An empty tally of `set`'s sums on `device`.
    pub fn new(set: &MetricSet, device: Device) -> Result<Self, TrainError> {
        Ok(Self {
            set: set.clone(),
            sums: Tensor::f_zeros([set.sums_len() as i64], (Kind::Double, device))?,
            samples: 0,
        })
    }

    /// A tally continuing `saved` (a sum it lacks starts from zero: a metric added since).
    pub fn restore(
        set: &MetricSet,
        saved: &SavedTally,
        device: Device,
    ) -> Result<Self, TrainError> {
        let values: Vec<f64> = set
            .sum_names()
            .iter()
            .map(|n| saved.sums.get(n).copied().unwrap_or(0.0))
            .collect();
        Ok(Self {
            set: set.clone(),
            sums: Tensor::f_from_slice(&values)?.f_to_device(device)?,
            samples: saved.samples,
        })
    }

    /// Adds the sums of `samples` samples.
    pub fn add(&mut self, sums: &BatchSums, samples: u64) -> Result<(), TrainError> {
        self.sums = self.sums.f_add(&sums.values)?;
        self.samples += samples;
        Ok(())
    }

    /// Adds another tally and empties it.
    pub fn absorb(&mut self, other: &mut Tally) -> Result<(), TrainError> {
        self.sums = self.sums.f_add(&other.sums)?;
        self.samples += other.samples;
        *other = Tally::new(&other.set, other.sums.device())?;
        Ok(())
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The sums as numbers, in the set's order (synchronises).
    pub fn sums(&self) -> Result<Vec<f64>, TrainError> {
        Ok(Vec::<f64>::try_from(&self.sums)?)
    }

    /// The sums by name, for a checkpoint (synchronises).
    pub fn saved(&self) -> Result<SavedTally, TrainError> {
        Ok(SavedTally {
            samples: self.samples,
            sums: self.set.sum_names().into_iter().zip(self.sums()?).collect(),
        })
    }

    /// The metrics' values (synchronises).
    pub fn read(&self) -> Result<MetricValues, TrainError> {
        Ok(self.set.values(&self.sums()?, self.samples))
    }
}
