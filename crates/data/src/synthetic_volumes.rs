//! A synthetic 3-D segmentation dataset for the reference 3-D U-Net: noisy volumes of bright
//! ellipsoids ("cells") on an unevenly lit background, with a class per voxel (0 background,
//! 1 object). Generated on the fly from `(seed, index)`, like the other synthetic datasets.

use crate::DataError;
use crate::dataset::Dataset;
use crate::error::out_of_range;
use crate::rng::SplitMix64;
use crate::target::{TargetSlot, TargetSpec};

/// The most objects in one volume.
const MAX_OBJECTS: usize = 4;
/// Standard deviation of the voxel noise (the objects stand 1 to 1.5 above the background).
const NOISE: f32 = 0.8;

/// Volumes of `[1, size, size, size]` holding 1 to 4 ellipsoids whose semi-axes are a tenth to
/// a fifth of the side, each 1 to 1.5 brighter than a background lit by a linear gradient
/// (up to ±0.5 across the volume), plus Gaussian noise of standard deviation 0.8 on every
/// voxel. The target is the class map: 1 inside any ellipsoid, else 0. A single voxel is
/// ambiguous (the noise is comparable to the contrast); a model that looks at neighbourhoods
/// segments the objects well.
#[derive(Debug, Clone)]
pub struct SyntheticVolumes {
    len: usize,
    shape: [usize; 4],
    seed: u64,
}

/// One ellipsoid: centre and semi-axes, in voxels (z, y, x).
#[derive(Debug, Clone, Copy)]
struct Ellipsoid {
    centre: [f32; 3],
    axes: [f32; 3],
    brightness: f32,
}

impl Ellipsoid {
    fn contains(&self, p: [f32; 3]) -> bool {
        (0..3)
            .map(|d| ((p[d] - self.centre[d]) / self.axes[d]).powi(2))
            .sum::<f32>()
            <= 1.0
    }
}

impl SyntheticVolumes {
    /// `len` volumes of side `size` (at least 8 voxels, so that objects have an inside).
    pub fn new(len: usize, size: usize, seed: u64) -> Result<Self, DataError> {
        if size < 8 {
            return Err(DataError::Shape {
                what: "synthetic volumes".to_owned(),
                expected: "a side of at least 8 voxels".to_owned(),
                got: format!("{size}"),
            });
        }
        Ok(Self {
            len,
            shape: [1, size, size, size],
            seed,
        })
    }

    fn objects(&self, g: &mut SplitMix64) -> Vec<Ellipsoid> {
        let side = self.shape[1] as f32;
        let count = 1 + g.below(MAX_OBJECTS);
        (0..count)
            .map(|_| {
                let axes = [(); 3].map(|_| side * (0.1 + 0.1 * g.unit_f32()));
                let mut centre = [0.0; 3];
                for d in 0..3 {
                    centre[d] = axes[d] + g.unit_f32() * (side - 2.0 * axes[d]);
                }
                Ellipsoid {
                    centre,
                    axes,
                    brightness: 1.0 + 0.5 * g.unit_f32(),
                }
            })
            .collect()
    }

    /// Writes volume `index` into `features` and its class map into `labels`.
    fn generate(&self, index: usize, features: &mut [f32], labels: &mut [i64]) {
        let side = self.shape[1];
        let mut g = SplitMix64::keyed(&[self.seed, index as u64, 5]);
        let objects = self.objects(&mut g);
        let light = [(); 3].map(|_| g.unit_f32() - 0.5);
        let scale = 1.0 / side as f32;
        for (v, (f, l)) in features.iter_mut().zip(labels.iter_mut()).enumerate() {
            let p = [v / (side * side), (v / side) % side, v % side].map(|c| c as f32);
            let inside = objects.iter().find(|o| o.contains(p));
            let lit: f32 = (0..3).map(|d| light[d] * (p[d] * scale - 0.5)).sum();
            *f = lit + inside.map_or(0.0, |o| o.brightness) + NOISE * g.normal_f32();
            *l = i64::from(inside.is_some());
        }
    }
}

impl Dataset for SyntheticVolumes {
    fn len(&self) -> usize {
        self.len
    }

    fn sample_shape(&self) -> &[usize] {
        &self.shape
    }

    fn classes(&self) -> Option<usize> {
        Some(2)
    }

    fn target(&self) -> TargetSpec {
        TargetSpec::Classes {
            classes: 2,
            shape: self.shape[1..].to_vec(),
        }
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
        let voxels = self.shape[1..].iter().product::<usize>();
        match target {
            TargetSlot::Classes(labels) if labels.len() == voxels && features.len() == voxels => {
                self.generate(index, features, labels);
                Ok(())
            }
            other => Err(DataError::Sample {
                index,
                message: format!(
                    "a synthetic volume needs {voxels} feature values and {voxels} class \
                     labels; the slots hold {} values and {}",
                    features.len(),
                    other.describe()
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(d: &SyntheticVolumes, index: usize) -> (Vec<f32>, Vec<i64>) {
        let n = d.sample_numel();
        let (mut f, mut l) = (vec![0.0; n], vec![0; n]);
        d.read_sample(index, &mut f, TargetSlot::Classes(&mut l))
            .unwrap();
        (f, l)
    }

    #[test]
    fn volumes_hold_objects_brighter_than_their_background() {
        let d = SyntheticVolumes::new(16, 16, 3).unwrap();
        assert_eq!(d.sample_shape(), &[1, 16, 16, 16]);
        for i in 0..16 {
            let (f, l) = read(&d, i);
            let mean = |want: i64| {
                let v: Vec<f32> = f
                    .iter()
                    .zip(&l)
                    .filter(|(_, c)| **c == want)
                    .map(|(x, _)| *x)
                    .collect();
                (v.iter().sum::<f32>() / v.len() as f32, v.len())
            };
            let ((inside, n_in), (outside, n_out)) = (mean(1), mean(0));
            assert!(
                n_in > 8 && n_out > n_in,
                "volume {i}: {n_in} inside, {n_out} outside"
            );
            assert!(inside - outside > 0.7, "volume {i}: {inside} vs {outside}");
        }
    }

    #[test]
    fn a_volume_is_the_same_on_every_read_and_differs_between_indices() {
        let d = SyntheticVolumes::new(4, 12, 9).unwrap();
        assert_eq!(read(&d, 2), read(&d, 2));
        assert_ne!(read(&d, 2).1, read(&d, 3).1);
        let other_seed = SyntheticVolumes::new(4, 12, 10).unwrap();
        assert_ne!(read(&d, 2).0, read(&other_seed, 2).0);
    }

    #[test]
    fn bad_sizes_and_slots_are_errors() {
        assert!(SyntheticVolumes::new(4, 7, 0).is_err());
        let d = SyntheticVolumes::new(4, 8, 0).unwrap();
        let mut f = vec![0.0; 512];
        let mut wrong = vec![0.0f32; 512];
        let err = d
            .read_sample(0, &mut f, TargetSlot::Values(&mut wrong))
            .unwrap_err();
        assert!(err.to_string().contains("512 class labels"), "{err}");
        let mut l = vec![0; 512];
        assert!(
            d.read_sample(4, &mut f, TargetSlot::Classes(&mut l))
                .is_err()
        );
    }
}
