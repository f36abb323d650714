//! Random-access datasets: a length, a per-sample shape, and "write sample i here". Nothing here
//! knows about training or tensors.

use crate::DataError;
use crate::rng::SplitMix64;

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
        let label = *self.labels.get(index).ok_or_else(|| DataError::Sample {
            index,
            message: format!("out of range (the dataset has {} samples)", self.len()),
        })?;
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
            return Err(DataError::Sample {
                index,
                message: format!("out of range (the dataset has {} samples)", self.len),
            });
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
}
