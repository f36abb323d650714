//! Random-access datasets: a length, a per-sample shape, and "write sample i here". Nothing here
//! knows about training or tensors.

use crate::DataError;
use crate::rng::SplitMix64;

/// The error for reading sample `index` of a dataset of `len` samples.
pub(crate) fn out_of_range(index: usize, len: usize) -> DataError {
    DataError::Sample {
        index,
        message: format!("out of range (the dataset has {len} samples)"),
    }
}

/// A dataset of float feature arrays with integer labels, readable by index from any thread.
pub trait Dataset: Send + Sync + 'static {
    /// Number of samples.
    fn len(&self) -> usize;

    /// Whether the dataset has no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shape of one sample's features (e.g. `[64, 469]` for a sequence of 64 frames).
    fn sample_shape(&self) -> &[usize];

    /// Number of `f32` values in one sample.
    fn sample_numel(&self) -> usize {
        self.sample_shape().iter().product()
    }

    /// Writes sample `index`'s features into `out` (exactly [`Dataset::sample_numel`] values)
    /// and returns its label.
    fn read(&self, index: usize, out: &mut [f32]) -> Result<i64, DataError>;

    /// The number of classes labels lie in (`0..classes`), where the dataset knows it.
    fn classes(&self) -> Option<usize> {
        None
    }
}

impl Dataset for Box<dyn Dataset> {
    fn len(&self) -> usize {
        (**self).len()
    }

    fn sample_shape(&self) -> &[usize] {
        (**self).sample_shape()
    }

    fn read(&self, index: usize, out: &mut [f32]) -> Result<i64, DataError> {
        (**self).read(index, out)
    }

    fn classes(&self) -> Option<usize> {
        (**self).classes()
    }
}

/// A view of some of another dataset's samples, by index (a train or validation split).
#[derive(Debug)]
pub struct Subset<D> {
    inner: std::sync::Arc<D>,
    indices: Vec<usize>,
}

impl<D: Dataset> Subset<D> {
    /// The samples of `inner` at `indices`, in that order; every index must be in range.
    pub fn new(inner: std::sync::Arc<D>, indices: Vec<usize>) -> Result<Self, DataError> {
        if let Some(&bad) = indices.iter().find(|&&i| i >= inner.len()) {
            return Err(DataError::Sample {
                index: bad,
                message: format!(
                    "subset index out of range (the dataset has {} samples)",
                    inner.len()
                ),
            });
        }
        Ok(Self { inner, indices })
    }

    /// Splits `inner` into (train, validation) at random: `val_fraction` of the samples,
    /// rounded, go to validation, chosen by a shuffle seeded with `seed`.
    pub fn split(
        inner: std::sync::Arc<D>,
        val_fraction: f64,
        seed: u64,
    ) -> Result<(Self, Self), DataError> {
        if !(0.0..1.0).contains(&val_fraction) {
            return Err(DataError::Shape {
                what: "validation fraction".to_owned(),
                expected: "a number in [0, 1)".to_owned(),
                got: val_fraction.to_string(),
            });
        }
        let n = inner.len();
        let mut order: Vec<usize> = (0..n).collect();
        let mut g = SplitMix64::keyed(&[seed, 0x5B1D]);
        for i in (1..n).rev() {
            order.swap(i, g.below(i + 1));
        }
        let n_val = ((n as f64) * val_fraction).round() as usize;
        let train = order.split_off(n_val);
        Ok((
            Self {
                inner: inner.clone(),
                indices: train,
            },
            Self {
                inner,
                indices: order,
            },
        ))
    }

    /// The underlying dataset's indices of this subset's samples.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }
}

impl<D: Dataset> Dataset for Subset<D> {
    fn len(&self) -> usize {
        self.indices.len()
    }

    fn sample_shape(&self) -> &[usize] {
        self.inner.sample_shape()
    }

    fn read(&self, index: usize, out: &mut [f32]) -> Result<i64, DataError> {
        let inner = *self.indices.get(index).ok_or_else(|| DataError::Sample {
            index,
            message: format!(
                "out of range (the subset has {} samples)",
                self.indices.len()
            ),
        })?;
        self.inner.read(inner, out)
    }

    fn classes(&self) -> Option<usize> {
        self.inner.classes()
    }
}

/// A dataset held in memory: one contiguous feature array and a label per sample.
#[derive(Debug, Clone)]
pub struct InMemory {
    features: Vec<f32>,
    labels: Vec<i64>,
    shape: Vec<usize>,
}

impl InMemory {
    /// `features` holds `labels.len()` samples of `shape`, back to back.
    pub fn new(features: Vec<f32>, labels: Vec<i64>, shape: Vec<usize>) -> Result<Self, DataError> {
        let numel: usize = shape.iter().product();
        if numel == 0 {
            return Err(DataError::Shape {
                what: "in-memory dataset sample shape".to_owned(),
                expected: "no zero dimensions".to_owned(),
                got: format!("{shape:?}"),
            });
        }
        if features.len() != labels.len() * numel {
            return Err(DataError::Shape {
                what: "in-memory dataset features".to_owned(),
                expected: format!(
                    "{} labels × {numel} values = {}",
                    labels.len(),
                    labels.len() * numel
                ),
                got: format!("{} values", features.len()),
            });
        }
        Ok(Self {
            features,
            labels,
            shape,
        })
    }

    /// Every sample's features, back to back.
    pub fn features(&self) -> &[f32] {
        &self.features
    }

    /// Every sample's label.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }
}

impl Dataset for InMemory {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn sample_shape(&self) -> &[usize] {
        &self.shape
    }

    fn read(&self, index: usize, out: &mut [f32]) -> Result<i64, DataError> {
        let numel = out.len();
        let label = *self
            .labels
            .get(index)
            .ok_or_else(|| out_of_range(index, self.len()))?;
        out.copy_from_slice(&self.features[index * numel..(index + 1) * numel]);
        Ok(label)
    }
}

/// Deterministic synthetic classification data with learnable structure: each class has a
/// fixed centroid, and sample `i` is its class centroid plus Gaussian noise, all derived from
/// `(seed, i)`. A model that learns the centroids reaches high accuracy; chance is
/// `1 / classes`.
#[derive(Debug, Clone)]
pub struct SyntheticClassification {
    len: usize,
    shape: Vec<usize>,
    classes: usize,
    seed: u64,
    noise: f32,
    centroids: Vec<f32>,
}

impl SyntheticClassification {
    /// `len` samples of `shape` in `classes` classes; `noise` is the noise's standard deviation
    /// relative to centroids of unit scale.
    pub fn new(
        len: usize,
        shape: Vec<usize>,
        classes: usize,
        seed: u64,
        noise: f32,
    ) -> Result<Self, DataError> {
        let numel: usize = shape.iter().product();
        if numel == 0 || classes < 2 {
            return Err(DataError::Shape {
                what: "synthetic dataset".to_owned(),
                expected: "a non-empty sample shape and at least 2 classes".to_owned(),
                got: format!("shape {shape:?}, {classes} classes"),
            });
        }
        let mut g = SplitMix64::keyed(&[seed, u64::MAX]);
        let centroids = (0..classes * numel).map(|_| g.normal_f32()).collect();
        Ok(Self {
            len,
            shape,
            classes,
            seed,
            noise,
            centroids,
        })
    }

    /// The class of sample `index` (balanced: classes take turns).
    pub fn label_of(&self, index: usize) -> i64 {
        (index % self.classes) as i64
    }
}

impl Dataset for SyntheticClassification {
    fn len(&self) -> usize {
        self.len
    }

    fn sample_shape(&self) -> &[usize] {
        &self.shape
    }

    fn read(&self, index: usize, out: &mut [f32]) -> Result<i64, DataError> {
        if index >= self.len {
            return Err(out_of_range(index, self.len));
        }
        let label = self.label_of(index);
        let numel = out.len();
        let centroid = &self.centroids[label as usize * numel..(label as usize + 1) * numel];
        let mut g = SplitMix64::keyed(&[self.seed, index as u64, 2]);
        for (o, c) in out.iter_mut().zip(centroid) {
            *o = c + self.noise * g.normal_f32();
        }
        Ok(label)
    }

    fn classes(&self) -> Option<usize> {
        Some(self.classes)
    }
}
