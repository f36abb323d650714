//! Random-access datasets: a length, a per-sample shape, and "write sample i here". Nothing here
//! knows about training or tensors.

use crate::error::out_of_range;
use crate::rng::SplitMix64;
use crate::target::{TargetSlot, TargetSpec, Targets};
use crate::{ArraySpec, DType, DataError, FEATURES_TENSOR};

/// A dataset of float feature arrays with a target per sample, readable by index from any
/// thread.
///
/// A classification dataset implements [`Dataset::read`] (features in, class label out) and
/// [`Dataset::classes`]. A dataset with any other target (regression values, a class map)
/// implements [`Dataset::target`] and [`Dataset::read_sample`] instead.
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
    /// and returns its class label. Datasets whose targets are not single labels need not
    /// implement it (they implement [`Dataset::read_sample`]); the default is an error.
    fn read(&self, index: usize, _out: &mut [f32]) -> Result<i64, DataError> {
        Err(DataError::Sample {
            index,
            message: format!(
                "this dataset's targets are {}, not single class labels: read it with \
                 `read_sample`",
                self.target()
            ),
        })
    }

    /// The number of classes labels lie in (`0..classes`), where the dataset knows it.
    fn classes(&self) -> Option<usize> {
        None
    }

    /// What one sample's target is. Default: one class label in `0..classes()`.
    fn target(&self) -> TargetSpec {
        TargetSpec::label(self.classes().unwrap_or(0))
    }

    /// Whether the features are integer ids (token ids, stored exactly in the `f32` buffer),
    /// which reach the model as `int64`. Default: no.
    fn integer_features(&self) -> bool {
        false
    }

    /// Writes sample `index`'s features into `features` and its target into `target` (exactly
    /// [`TargetSpec::numel`] elements of [`Dataset::target`]'s kind). Default: through
    /// [`Dataset::read`].
    fn read_sample(
        &self,
        index: usize,
        features: &mut [f32],
        mut target: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        let label = self.read(index, features)?;
        target.set_label(index, label)
    }

    /// Writes the samples at `indices` into `features` (sample after sample,
    /// `indices.len() × sample_numel` values) and their targets into `targets` (as many
    /// elements per sample as [`TargetSpec::numel`]). Default: one [`Dataset::read_sample`] per
    /// index. A dataset that can read several samples at once (a contiguous run of a shard in
    /// one read) overrides it; the result must be the same.
    fn read_batch(
        &self,
        indices: &[usize],
        features: &mut [f32],
        mut targets: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        let (numel, per) = (self.sample_numel(), self.target().numel());
        check_batch_slots(indices.len(), (numel, features.len()), (per, targets.len()))?;
        for (k, &index) in indices.iter().enumerate() {
            let slot = &mut features[k * numel..(k + 1) * numel];
            self.read_sample(index, slot, targets.part(k * per, per))?;
        }
        Ok(())
    }

    /// The named arrays a sample gives a model that takes its inputs by name, in order: each
    /// array's name, stored type and per-sample shape (it reaches the model as
    /// [`DType::model`] of its type). Default: one array, `features`, of
    /// [`Dataset::sample_shape`]: `f32`, or `i64` for integer ids.
    fn inputs(&self) -> Vec<ArraySpec> {
        let dtype = if self.integer_features() {
            DType::I64
        } else {
            DType::F32
        };
        vec![ArraySpec {
            name: FEATURES_TENSOR.to_owned(),
            dtype,
            shape: self.sample_shape().to_vec(),
            ids: false,
        }]
    }

    /// Reads the samples at `indices` by name: input array `k` of [`Dataset::inputs`] into
    /// `inputs[k]` (`indices.len()` samples of its [`DType::model`] elements, in the machine's
    /// byte order), the targets into `targets` as [`Dataset::read_batch`] does. Default: the
    /// one `features` array through [`Dataset::read_batch`].
    fn read_arrays(
        &self,
        indices: &[usize],
        inputs: &mut [&mut [u8]],
        targets: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        read_features_as_array(self, indices, inputs, targets)
    }
}

/// [`Dataset::read_arrays`] of a dataset of one features array: read as `f32` by
/// [`Dataset::read_batch`], delivered as `f32`, or `i64` for integer ids.
pub(crate) fn read_features_as_array<D: Dataset + ?Sized>(
    dataset: &D,
    indices: &[usize],
    inputs: &mut [&mut [u8]],
    targets: TargetSlot<'_>,
) -> Result<(), DataError> {
    let n = indices.len() * dataset.sample_numel();
    let ids = dataset.integer_features();
    let size = if ids { 8 } else { 4 };
    let [out] = inputs else {
        return Err(array_slots_error(&dataset.inputs(), indices.len(), inputs));
    };
    if out.len() != n * size {
        return Err(array_slots_error(&dataset.inputs(), indices.len(), inputs));
    }
    let mut features = vec![0f32; n];
    dataset.read_batch(indices, &mut features, targets)?;
    if ids {
        for (o, v) in out.chunks_exact_mut(8).zip(&features) {
            o.copy_from_slice(&(*v as i64).to_ne_bytes());
        }
    } else {
        out.copy_from_slice(bytemuck::cast_slice(&features));
    }
    Ok(())
}

/// The error for `inputs`, slots that do not hold `samples` samples of each of `specs` in the
/// type it reaches the model as.
pub(crate) fn array_slots_error(
    specs: &[ArraySpec],
    samples: usize,
    inputs: &[&mut [u8]],
) -> DataError {
    let want: Vec<usize> = specs
        .iter()
        .map(|a| samples * a.numel() * a.dtype.model().size())
        .collect();
    let have: Vec<usize> = inputs.iter().map(|b| b.len()).collect();
    let names: Vec<&str> = specs.iter().map(|a| a.name.as_str()).collect();
    DataError::Shape {
        what: format!("batch slots of arrays {}", names.join(", ")),
        expected: format!("{want:?} bytes for {samples} samples"),
        got: format!("{have:?}"),
    }
}

/// The error for batch slots that do not hold `samples` samples of `(per-sample, given)`
/// feature and target elements.
pub(crate) fn check_batch_slots(
    samples: usize,
    (numel, features): (usize, usize),
    (per, targets): (usize, usize),
) -> Result<(), DataError> {
    if features == samples * numel && targets == samples * per {
        return Ok(());
    }
    Err(DataError::Shape {
        what: "batch slots".to_owned(),
        expected: format!(
            "{} feature and {} target elements for {samples} samples",
            samples * numel,
            samples * per
        ),
        got: format!("{features} and {targets}"),
    })
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

    fn target(&self) -> TargetSpec {
        (**self).target()
    }

    fn integer_features(&self) -> bool {
        (**self).integer_features()
    }

    fn read_sample(
        &self,
        index: usize,
        features: &mut [f32],
        target: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        (**self).read_sample(index, features, target)
    }

    fn read_batch(
        &self,
        indices: &[usize],
        features: &mut [f32],
        targets: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        (**self).read_batch(indices, features, targets)
    }

    fn inputs(&self) -> Vec<ArraySpec> {
        (**self).inputs()
    }

    fn read_arrays(
        &self,
        indices: &[usize],
        inputs: &mut [&mut [u8]],
        targets: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        (**self).read_arrays(indices, inputs, targets)
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

impl<D: Dataset> Subset<D> {
    fn inner_indices(&self, indices: &[usize]) -> Result<Vec<usize>, DataError> {
        indices.iter().map(|&i| self.inner_index(i)).collect()
    }

    fn inner_index(&self, index: usize) -> Result<usize, DataError> {
        self.indices
            .get(index)
            .copied()
            .ok_or_else(|| DataError::Sample {
                index,
                message: format!(
                    "out of range (the subset has {} samples)",
                    self.indices.len()
                ),
            })
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
        self.inner.read(self.inner_index(index)?, out)
    }

    fn classes(&self) -> Option<usize> {
        self.inner.classes()
    }

    fn target(&self) -> TargetSpec {
        self.inner.target()
    }

    fn integer_features(&self) -> bool {
        self.inner.integer_features()
    }

    fn read_sample(
        &self,
        index: usize,
        features: &mut [f32],
        target: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        self.inner
            .read_sample(self.inner_index(index)?, features, target)
    }

    fn read_batch(
        &self,
        indices: &[usize],
        features: &mut [f32],
        targets: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        self.inner
            .read_batch(&self.inner_indices(indices)?, features, targets)
    }

    fn inputs(&self) -> Vec<ArraySpec> {
        self.inner.inputs()
    }

    fn read_arrays(
        &self,
        indices: &[usize],
        inputs: &mut [&mut [u8]],
        targets: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        self.inner
            .read_arrays(&self.inner_indices(indices)?, inputs, targets)
    }
}

/// A dataset held in memory: one contiguous feature array and a target per sample (a class
/// label, or with [`InMemory::with_targets`] a tensor of classes or values).
#[derive(Debug, Clone)]
pub struct InMemory {
    features: Vec<f32>,
    shape: Vec<usize>,
    len: usize,
    target: TargetSpec,
    targets: Targets,
    /// The class count, where the constructor was told it.
    classes: Option<usize>,
    integer_features: bool,
}

impl InMemory {
    /// `features` holds `labels.len()` samples of `shape`, back to back.
    pub fn new(features: Vec<f32>, labels: Vec<i64>, shape: Vec<usize>) -> Result<Self, DataError> {
        let len = labels.len();
        check_feature_count(&features, len, &shape, "labels")?;
        Ok(Self {
            features,
            shape,
            len,
            target: TargetSpec::label(0),
            targets: Targets::Classes(labels),
            classes: None,
            integer_features: false,
        })
    }

    /// `features` holds samples of `shape` back to back, and `targets` a target of `target`
    /// per sample, back to back: class targets in `0..classes` (`Targets::Classes`), or finite
    /// values (`Targets::Values`).
    ///
    /// # Shapes
    /// `features`: `[samples, shape…]`; `targets`: `[samples, target.shape()…]`, flattened.
    pub fn with_targets(
        features: Vec<f32>,
        shape: Vec<usize>,
        target: TargetSpec,
        targets: Targets,
    ) -> Result<Self, DataError> {
        let per = target.numel();
        let kinds_match = matches!(
            (&target, &targets),
            (TargetSpec::Classes { .. }, Targets::Classes(_))
                | (TargetSpec::Values { .. }, Targets::Values(_))
        );
        if per == 0 || !kinds_match || !targets.len().is_multiple_of(per) {
            return Err(DataError::Shape {
                what: "in-memory dataset targets".to_owned(),
                expected: format!(
                    "a whole number of samples of {target}, in a Targets of that kind"
                ),
                got: format!("{} {}", targets.len(), targets_kind(&targets)),
            });
        }
        let len = targets.len() / per;
        check_feature_count(&features, len, &shape, "targets")?;
        check_target_values(&target, &targets)?;
        Ok(Self {
            features,
            shape,
            len,
            classes: target.classes(),
            target,
            targets,
            integer_features: false,
        })
    }

    /// Marks the features as integer ids (token ids) that reach the model as `int64`; every
    /// feature must be a whole number within ±2^24 (exact in `f32`).
    pub fn with_integer_features(mut self) -> Result<Self, DataError> {
        let numel = self.shape.iter().product::<usize>();
        let limit = crate::target::MAX_EXACT_ID as f32;
        if let Some(i) = self
            .features
            .iter()
            .position(|v| v.fract() != 0.0 || v.abs() > limit || !v.is_finite())
        {
            return Err(DataError::Sample {
                index: i / numel,
                message: format!(
                    "feature {} at element {} is not an integer id (whole numbers within \
                     ±{limit} are)",
                    self.features[i],
                    i % numel
                ),
            });
        }
        self.integer_features = true;
        Ok(self)
    }

    /// Every sample's features, back to back.
    pub fn features(&self) -> &[f32] {
        &self.features
    }

    /// Every sample's class targets, back to back (empty for value targets).
    pub fn labels(&self) -> &[i64] {
        self.targets.classes().unwrap_or(&[])
    }

    /// Every sample's targets, back to back.
    pub fn targets(&self) -> &Targets {
        &self.targets
    }
}

fn targets_kind(targets: &Targets) -> &'static str {
    match targets {
        Targets::Classes(_) => "class values",
        Targets::Values(_) => "f32 values",
    }
}

fn check_feature_count(
    features: &[f32],
    len: usize,
    shape: &[usize],
    per: &str,
) -> Result<(), DataError> {
    let numel: usize = shape.iter().product();
    if numel == 0 {
        return Err(DataError::Shape {
            what: "in-memory dataset sample shape".to_owned(),
            expected: "no zero dimensions".to_owned(),
            got: format!("{shape:?}"),
        });
    }
    if features.len() != len * numel {
        return Err(DataError::Shape {
            what: "in-memory dataset features".to_owned(),
            expected: format!("{len} {per} × {numel} values = {}", len * numel),
            got: format!("{} values", features.len()),
        });
    }
    Ok(())
}

/// Classes within `0..classes`, values finite; errors name the sample and element.
fn check_target_values(target: &TargetSpec, targets: &Targets) -> Result<(), DataError> {
    let per = target.numel();
    let bad = match (target, targets) {
        (TargetSpec::Classes { classes, .. }, Targets::Classes(v)) => v
            .iter()
            .position(|&c| c < 0 || c as u64 >= *classes as u64)
            .map(|i| (i, format!("class {} is outside 0..{classes}", v[i]))),
        (_, Targets::Values(v)) => v
            .iter()
            .position(|x| !x.is_finite())
            .map(|i| (i, format!("target value {} is not a finite number", v[i]))),
        _ => None,
    };
    match bad {
        Some((i, what)) => Err(DataError::Sample {
            index: i / per,
            message: format!(
                "{what} (target element {:?})",
                crate::target::unravel(i % per, target.shape())
            ),
        }),
        None => Ok(()),
    }
}

impl Dataset for InMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn sample_shape(&self) -> &[usize] {
        &self.shape
    }

    fn read(&self, index: usize, out: &mut [f32]) -> Result<i64, DataError> {
        if !self.target.shape().is_empty() || self.target.classes().is_none() {
            return Err(crate::target::not_labels(index, &self.target));
        }
        let mut label = [0i64];
        self.read_sample(index, out, TargetSlot::Classes(&mut label))?;
        Ok(label[0])
    }

    fn classes(&self) -> Option<usize> {
        self.classes
    }

    fn target(&self) -> TargetSpec {
        self.target.clone()
    }

    fn integer_features(&self) -> bool {
        self.integer_features
    }

    fn read_sample(
        &self,
        index: usize,
        features: &mut [f32],
        target: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        if index >= self.len {
            return Err(out_of_range(index, self.len));
        }
        let (numel, per) = (features.len(), self.target.numel());
        match (target, &self.targets) {
            (TargetSlot::Classes(out), Targets::Classes(v)) if out.len() == per => {
                out.copy_from_slice(&v[index * per..(index + 1) * per]);
            }
            (TargetSlot::Values(out), Targets::Values(v)) if out.len() == per => {
                out.copy_from_slice(&v[index * per..(index + 1) * per]);
            }
            (other, _) => return Err(crate::target::slot_mismatch(index, &other, &self.target)),
        }
        if numel != self.sample_numel() {
            return Err(DataError::Sample {
                index,
                message: format!(
                    "the feature slot holds {numel} values, a sample {}",
                    self.sample_numel()
                ),
            });
        }
        features.copy_from_slice(&self.features[index * numel..(index + 1) * numel]);
        Ok(())
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
