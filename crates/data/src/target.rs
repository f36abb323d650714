//! What a dataset's per-sample target is (an integer class, a class map, real values of any
//! fixed shape), where a sample's target is written, and a batch's targets.

use serde::{Deserialize, Serialize};

use crate::DataError;

/// One sample's target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TargetSpec {
    /// Integer classes in `0..classes`, one per element of `shape`: `[]` is one label per sample
    /// (classification), `[H, W]` a class per pixel (segmentation).
    Classes { classes: usize, shape: Vec<usize> },
    /// `f32` values of `shape`: `[]` or `[H]` for regression (a forecast horizon), `[C]` of 0/1
    /// for multi-label.
    Values { shape: Vec<usize> },
}

impl TargetSpec {
    /// One integer label per sample in `0..classes`.
    pub fn label(classes: usize) -> Self {
        TargetSpec::Classes {
            classes,
            shape: vec![],
        }
    }

    /// The per-sample shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            TargetSpec::Classes { shape, .. } | TargetSpec::Values { shape } => shape,
        }
    }

    /// Elements per sample.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// The number of classes, for class targets.
    pub fn classes(&self) -> Option<usize> {
        match self {
            TargetSpec::Classes { classes, .. } => Some(*classes),
            TargetSpec::Values { .. } => None,
        }
    }

    /// `classification`, `dense classification` or `regression`, as reports say it.
    pub fn task(&self) -> &'static str {
        match self {
            TargetSpec::Classes { shape, .. } if shape.is_empty() => "classification",
            TargetSpec::Classes { .. } => "dense classification",
            TargetSpec::Values { .. } => "regression",
        }
    }

    /// An empty batch of these targets with room for `samples` samples.
    pub fn batch(&self, samples: usize) -> Targets {
        match self {
            TargetSpec::Classes { .. } => Targets::Classes(vec![0; samples * self.numel()]),
            TargetSpec::Values { .. } => Targets::Values(vec![0.0; samples * self.numel()]),
        }
    }
}

impl std::fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetSpec::Classes { classes, shape } if shape.is_empty() => {
                write!(f, "a class label in 0..{classes}")
            }
            TargetSpec::Classes { classes, shape } => {
                write!(f, "classes in 0..{classes} of shape {shape:?}")
            }
            TargetSpec::Values { shape } => write!(f, "f32 values of shape {shape:?}"),
        }
    }
}

/// Where [`crate::Dataset::read_sample`] writes one sample's target (exactly
/// [`TargetSpec::numel`] elements of the dataset's kind), or [`crate::Dataset::read_batch`]
/// several samples' targets, back to back.
#[derive(Debug)]
pub enum TargetSlot<'a> {
    Classes(&'a mut [i64]),
    Values(&'a mut [f32]),
}

impl TargetSlot<'_> {
    /// Stores a single class label; an error for any other kind or size of slot.
    pub fn set_label(&mut self, index: usize, label: i64) -> Result<(), DataError> {
        match self {
            TargetSlot::Classes(slot) if slot.len() == 1 => {
                slot[0] = label;
                Ok(())
            }
            other => Err(DataError::Sample {
                index,
                message: format!(
                    "the dataset gives one class label but the target slot holds {}",
                    other.describe()
                ),
            }),
        }
    }

    /// Elements `start..start + len` of this slot: one sample's part of a batch's slot.
    pub fn part(&mut self, start: usize, len: usize) -> TargetSlot<'_> {
        match self {
            TargetSlot::Classes(s) => TargetSlot::Classes(&mut s[start..start + len]),
            TargetSlot::Values(s) => TargetSlot::Values(&mut s[start..start + len]),
        }
    }

    /// Elements in the slot.
    pub fn len(&self) -> usize {
        match self {
            TargetSlot::Classes(s) => s.len(),
            TargetSlot::Values(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Splits the slot at element `mid` (a batch's slot into the parts threads fill).
    pub fn split_at(self, mid: usize) -> (Self, Self) {
        match self {
            TargetSlot::Classes(s) => {
                let (a, b) = s.split_at_mut(mid);
                (TargetSlot::Classes(a), TargetSlot::Classes(b))
            }
            TargetSlot::Values(s) => {
                let (a, b) = s.split_at_mut(mid);
                (TargetSlot::Values(a), TargetSlot::Values(b))
            }
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            TargetSlot::Classes(s) => format!("{} class values", s.len()),
            TargetSlot::Values(s) => format!("{} f32 values", s.len()),
        }
    }
}

/// A batch's targets, sample after sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Targets {
    Classes(Vec<i64>),
    Values(Vec<f32>),
}

impl Targets {
    /// Number of elements (samples × per-sample elements).
    pub fn len(&self) -> usize {
        match self {
            Targets::Classes(v) => v.len(),
            Targets::Values(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The class labels, for class targets.
    pub fn classes(&self) -> Option<&[i64]> {
        match self {
            Targets::Classes(v) => Some(v),
            Targets::Values(_) => None,
        }
    }

    /// Sample `k`'s slot, `per` elements wide.
    pub fn slot(&mut self, k: usize, per: usize) -> TargetSlot<'_> {
        match self {
            Targets::Classes(v) => TargetSlot::Classes(&mut v[k * per..(k + 1) * per]),
            Targets::Values(v) => TargetSlot::Values(&mut v[k * per..(k + 1) * per]),
        }
    }

    /// The slot of every sample, back to back.
    pub fn all(&mut self) -> TargetSlot<'_> {
        match self {
            Targets::Classes(v) => TargetSlot::Classes(v),
            Targets::Values(v) => TargetSlot::Values(v),
        }
    }
}

/// The largest integer id every smaller one of which `f32` holds exactly: 2^24.
pub const MAX_EXACT_ID: i64 = 1 << 24;

/// Element `j` of a sample of `shape`, as a multi-index (`[]` for a scalar).
pub(crate) fn unravel(mut j: usize, shape: &[usize]) -> Vec<usize> {
    let mut at = vec![0; shape.len()];
    for (a, &d) in at.iter_mut().zip(shape).rev() {
        *a = j % d;
        j /= d;
    }
    at
}

/// The error for a target slot that does not fit a dataset's targets.
pub(crate) fn slot_mismatch(index: usize, slot: &TargetSlot<'_>, spec: &TargetSpec) -> DataError {
    let holds = match slot {
        TargetSlot::Classes(s) => format!("{} class values", s.len()),
        TargetSlot::Values(s) => format!("{} f32 values", s.len()),
    };
    DataError::Sample {
        index,
        message: format!("the target slot holds {holds}, but the dataset's targets are {spec}"),
    }
}

/// The error for reading a non-label dataset with [`crate::Dataset::read`].
pub(crate) fn not_labels(index: usize, spec: &TargetSpec) -> DataError {
    DataError::Sample {
        index,
        message: format!(
            "this dataset's targets are {spec}, not single class labels: read it with \
             `read_sample`"
        ),
    }
}
