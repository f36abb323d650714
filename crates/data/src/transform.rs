//! Per-sample work done by the loader's workers after a sample is read: a [`Transform`]
//! applied in place to the sample's `f32` values.

use crate::{DataError, Dataset};

/// Work on one sample, in place, on a worker thread.
pub trait Transform: Send + Sync + 'static {
    /// Transforms sample `index`'s values (shape: the dataset's sample shape).
    fn apply(&self, index: usize, sample: &mut [f32]) -> Result<(), DataError>;
}

impl<F> Transform for F
where
    F: Fn(usize, &mut [f32]) -> Result<(), DataError> + Send + Sync + 'static,
{
    fn apply(&self, index: usize, sample: &mut [f32]) -> Result<(), DataError> {
        self(index, sample)
    }
}

/// Standardizes the last dimension: `(x - mean[f]) / std[f]` for feature `f`, the usual
/// per-channel normalization.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    mean: Vec<f32>,
    inv_std: Vec<f32>,
}

impl Normalize {
    /// One mean and standard deviation per feature of the last dimension.
    pub fn new(mean: Vec<f32>, std: Vec<f32>) -> Result<Self, DataError> {
        if mean.len() != std.len() || mean.is_empty() {
            return Err(DataError::Shape {
                what: "normalization statistics".to_owned(),
                expected: "as many standard deviations as means, at least one".to_owned(),
                got: format!("{} means, {} standard deviations", mean.len(), std.len()),
            });
        }
        if let Some(s) = std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(DataError::InvalidConfig {
                key: "std",
                value: s.to_string(),
                expected: "finite and positive".to_owned(),
            });
        }
        Ok(Self {
            mean,
            inv_std: std.iter().map(|s| 1.0 / s).collect(),
        })
    }

    /// The mean and standard deviation of each feature (last dimension) over the first
    /// `samples` samples of `dataset` (all of them if it has fewer).
    pub fn fit<D: Dataset>(dataset: &D, samples: usize) -> Result<Self, DataError> {
        let shape = dataset.sample_shape();
        let features = *shape.last().unwrap_or(&1);
        let mut sum = vec![0f64; features];
        let mut sq = vec![0f64; features];
        let mut buf = vec![0f32; dataset.sample_numel()];
        let n = samples.min(dataset.len());
        for i in 0..n {
            dataset.read(i, &mut buf)?;
            for row in buf.chunks_exact(features) {
                for (f, &v) in row.iter().enumerate() {
                    sum[f] += f64::from(v);
                    sq[f] += f64::from(v) * f64::from(v);
                }
            }
        }
        let count = (n * dataset.sample_numel() / features).max(1) as f64;
        let mean: Vec<f32> = sum.iter().map(|s| (s / count) as f32).collect();
        let std = sq
            .iter()
            .zip(&sum)
            .map(|(q, s)| {
                let var = (q / count - (s / count).powi(2)).max(0.0);
                (var.sqrt() as f32).max(1e-6)
            })
            .collect();
        Self::new(mean, std)
    }
}

impl Normalize {
    /// The means and standard deviations, per feature.
    pub fn stats(&self) -> (Vec<f32>, Vec<f32>) {
        (
            self.mean.clone(),
            self.inv_std.iter().map(|s| 1.0 / s).collect(),
        )
    }
}

impl Transform for Normalize {
    fn apply(&self, index: usize, sample: &mut [f32]) -> Result<(), DataError> {
        let features = self.mean.len();
        if !sample.len().is_multiple_of(features) {
            return Err(DataError::Sample {
                index,
                message: format!(
                    "{} values do not split into rows of {features} normalized features",
                    sample.len()
                ),
            });
        }
        for row in sample.chunks_exact_mut(features) {
            for ((v, m), s) in row.iter_mut().zip(&self.mean).zip(&self.inv_std) {
                *v = (*v - m) * s;
            }
        }
        Ok(())
    }
}

/// A dataset whose samples pass through a [`Transform`] as they are read.
#[derive(Debug, Clone)]
pub struct Transformed<D, T> {
    inner: D,
    transform: T,
}

impl<D: Dataset, T: Transform> Transformed<D, T> {
    pub fn new(inner: D, transform: T) -> Self {
        Self { inner, transform }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: Dataset, T: Transform> Dataset for Transformed<D, T> {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn sample_shape(&self) -> &[usize] {
        self.inner.sample_shape()
    }

    fn read(&self, index: usize, out: &mut [f32]) -> Result<i64, DataError> {
        let label = self.inner.read(index, out)?;
        self.transform.apply(index, out)?;
        Ok(label)
    }

    fn classes(&self) -> Option<usize> {
        self.inner.classes()
    }

    fn target(&self) -> crate::TargetSpec {
        self.inner.target()
    }

    fn integer_features(&self) -> bool {
        self.inner.integer_features()
    }

    fn read_sample(
        &self,
        index: usize,
        features: &mut [f32],
        target: crate::TargetSlot<'_>,
    ) -> Result<(), DataError> {
        self.inner.read_sample(index, features, target)?;
        self.transform.apply(index, features)
    }

    fn read_batch(
        &self,
        indices: &[usize],
        features: &mut [f32],
        targets: crate::TargetSlot<'_>,
    ) -> Result<(), DataError> {
        self.inner.read_batch(indices, features, targets)?;
        let numel = self.sample_numel();
        for (k, &index) in indices.iter().enumerate() {
            self.transform
                .apply(index, &mut features[k * numel..(k + 1) * numel])?;
        }
        Ok(())
    }

    /// The inner dataset's arrays; one array, transformed, is `f32` (ids stay `i64`).
    fn inputs(&self) -> Vec<crate::ArraySpec> {
        let mut inputs = self.inner.inputs();
        if let [one] = &mut inputs[..]
            && !self.integer_features()
        {
            one.dtype = crate::DType::F32;
        }
        inputs
    }

    /// One array: transformed, through [`Dataset::read_batch`]. Several: an error, since a
    /// transform applies to one features array.
    fn read_arrays(
        &self,
        indices: &[usize],
        inputs: &mut [&mut [u8]],
        targets: crate::TargetSlot<'_>,
    ) -> Result<(), DataError> {
        let arrays = self.inner.inputs();
        if arrays.len() == 1 {
            return crate::dataset::read_features_as_array(self, indices, inputs, targets);
        }
        let names: Vec<&str> = arrays.iter().map(|a| a.name.as_str()).collect();
        Err(DataError::InvalidConfig {
            key: "transform",
            value: format!(
                "a per-sample transform over {} named arrays ({})",
                names.len(),
                names.join(", ")
            ),
            expected: "a dataset of one features array: a transform applies to its f32 values"
                .to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InMemory;

    #[test]
    fn normalize_standardizes_each_feature_of_the_last_dimension() {
        // Two samples of shape [2, 2]: feature 0 takes 1, 3, 5, 7 and feature 1 takes 10 × that.
        let data = InMemory::new(
            vec![1.0, 10.0, 3.0, 30.0, 5.0, 50.0, 7.0, 70.0],
            vec![0, 1],
            vec![2, 2],
        )
        .unwrap();
        let norm = Normalize::fit(&data, 100).unwrap();
        let ds = Transformed::new(data, norm);
        let (mut a, mut b) = ([0f32; 4], [0f32; 4]);
        ds.read(0, &mut a).unwrap();
        ds.read(1, &mut b).unwrap();
        let all = [a, b].concat();
        for f in 0..2 {
            let col: Vec<f32> = all.iter().skip(f).step_by(2).copied().collect();
            let mean = col.iter().sum::<f32>() / 4.0;
            let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0;
            assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5, "{col:?}");
        }
        assert!((a[0] - (1.0 - 4.0) / 5f32.sqrt()).abs() < 1e-6);
    }

    #[test]
    fn bad_statistics_and_mismatched_samples_are_errors() {
        assert!(Normalize::new(vec![0.0], vec![0.0]).is_err());
        assert!(Normalize::new(vec![0.0, 1.0], vec![1.0]).is_err());
        let norm = Normalize::new(vec![0.0; 3], vec![1.0; 3]).unwrap();
        let e = norm.apply(7, &mut [0.0; 4]).unwrap_err().to_string();
        assert!(e.contains("sample 7"), "{e}");
    }
}
