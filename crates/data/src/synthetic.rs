//! Synthetic datasets with learnable structure for the reference models: sequences with
//! class-specific temporal patterns and images with class-specific oriented gratings. Samples
//! are generated on the fly from `(seed, index)`, so a dataset of any size costs no memory and
//! reads the same from any worker.

use crate::DataError;
use crate::dataset::Dataset;
use crate::error::out_of_range;
use crate::rng::SplitMix64;

/// Uniform noise in [-√3, √3): unit variance, one generator draw per value.
fn unit_noise(g: &mut SplitMix64) -> f32 {
    (g.unit_f32() * 2.0 - 1.0) * 1.732_050_8
}

fn check(what: &str, numel: usize, classes: usize) -> Result<(), DataError> {
    if numel == 0 || classes < 2 {
        return Err(DataError::Shape {
            what: what.to_owned(),
            expected: "a non-empty sample shape and at least 2 classes".to_owned(),
            got: format!("{numel} values per sample, {classes} classes"),
        });
    }
    Ok(())
}

/// Sequences of `[seq_len, features]` frames (like pose keypoints over time). Each class has a
/// sparse direction in feature space and a temporal frequency; a sample is a faint constant
/// offset along that direction plus the direction modulated by a sinusoid of the class's
/// frequency with a random phase, plus unit noise on every feature. One frame says little (the
/// noise dominates); a model that projects features and pools across time separates the
/// classes. Chance is `1 / classes`.
#[derive(Debug, Clone)]
pub struct SyntheticSequences {
    len: usize,
    shape: [usize; 2],
    classes: usize,
    seed: u64,
    amplitude: f32,
    offset: f32,
    /// Per class: `features` weights (unit norm over a few active features).
    directions: Vec<f32>,
    /// Per class: cycles over the sequence.
    frequencies: Vec<f32>,
}

impl SyntheticSequences {
    /// Active features per class.
    const ACTIVE: usize = 24;

    pub fn new(
        len: usize,
        seq_len: usize,
        features: usize,
        classes: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        check("synthetic sequences", seq_len * features, classes)?;
        let mut g = SplitMix64::keyed(&[seed, 0x5E9]);
        let mut directions = vec![0.0f32; classes * features];
        for row in directions.chunks_mut(features) {
            for _ in 0..Self::ACTIVE.min(features) {
                row[g.below(features)] += g.normal_f32();
            }
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            row.iter_mut().for_each(|v| *v /= norm);
        }
        let max_cycles = (seq_len / 4).clamp(1, 8);
        let frequencies = (0..classes)
            .map(|_| 1.0 + g.below(max_cycles) as f32)
            .collect();
        Ok(Self {
            len,
            shape: [seq_len, features],
            classes,
            seed,
            amplitude: 2.0,
            offset: 1.0,
            directions,
            frequencies,
        })
    }

    /// The class of sample `index` (balanced: classes take turns).
    pub fn label_of(&self, index: usize) -> i64 {
        (index % self.classes) as i64
    }
}

impl Dataset for SyntheticSequences {
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
        let [seq_len, features] = self.shape;
        let class = label as usize;
        let direction = &self.directions[class * features..(class + 1) * features];
        let mut g = SplitMix64::keyed(&[self.seed, index as u64, 3]);
        let phase = g.unit_f32() * std::f32::consts::TAU;
        let omega = std::f32::consts::TAU * self.frequencies[class] / seq_len as f32;
        for (t, frame) in out.chunks_mut(features).enumerate() {
            let wave = self.offset + self.amplitude * (omega * t as f32 + phase).sin();
            for (o, d) in frame.iter_mut().zip(direction) {
                *o = wave * d + unit_noise(&mut g);
            }
        }
        Ok(label)
    }

    fn classes(&self) -> Option<usize> {
        Some(self.classes)
    }
}

/// Images of `[channels, size, size]`. Each class has an orientation, a spatial frequency and
/// a colour; a sample is that grating with a random phase, plus unit noise. Chance is
/// `1 / classes`.
#[derive(Debug, Clone)]
pub struct SyntheticImages {
    len: usize,
    shape: [usize; 3],
    classes: usize,
    seed: u64,
    /// Per class: (cos θ, sin θ, cycles across the image).
    gratings: Vec<(f32, f32, f32)>,
    /// Per class: one weight per channel.
    colours: Vec<f32>,
}

impl SyntheticImages {
    pub fn new(
        len: usize,
        channels: usize,
        size: usize,
        classes: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        check("synthetic images", channels * size * size, classes)?;
        let mut g = SplitMix64::keyed(&[seed, 0x1A6]);
        let gratings = (0..classes)
            .map(|c| {
                let theta = std::f32::consts::PI * c as f32 / classes as f32;
                (theta.cos(), theta.sin(), 2.0 + (c % 3) as f32)
            })
            .collect();
        let colours = (0..classes * channels)
            .map(|_| 0.5 + g.unit_f32())
            .collect();
        Ok(Self {
            len,
            shape: [channels, size, size],
            classes,
            seed,
            gratings,
            colours,
        })
    }

    pub fn label_of(&self, index: usize) -> i64 {
        (index % self.classes) as i64
    }
}

impl Dataset for SyntheticImages {
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
        let class = label as usize;
        let [channels, size, _] = self.shape;
        let (cos, sin, cycles) = self.gratings[class];
        let mut g = SplitMix64::keyed(&[self.seed, index as u64, 4]);
        let phase = g.unit_f32() * std::f32::consts::TAU;
        let k = std::f32::consts::TAU * cycles / size as f32;
        for (ch, plane) in out.chunks_mut(size * size).enumerate() {
            let colour = 1.5 * self.colours[class * channels + ch];
            for (p, o) in plane.iter_mut().enumerate() {
                let (y, x) = ((p / size) as f32, (p % size) as f32);
                *o = colour * (k * (x * cos + y * sin) + phase).sin() + unit_noise(&mut g);
            }
        }
        Ok(label)
    }

    fn classes(&self) -> Option<usize> {
        Some(self.classes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_abs_corr(a: &[f32], b: &[f32]) -> f32 {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
        (dot / (na * nb)).abs()
    }

    #[test]
    fn sequences_are_deterministic_and_class_structured() {
        let d = SyntheticSequences::new(40, 32, 200, 4, 7).unwrap();
        let (mut a, mut b) = (vec![0.0; 32 * 200], vec![0.0; 32 * 200]);
        assert_eq!(d.read(5, &mut a).unwrap(), 1);
        d.read(5, &mut b).unwrap();
        assert_eq!(a, b, "same index, same sample");
        // Project every frame onto each class direction: the sample's own class carries far
        // more energy than the others.
        let energy = |sample: &[f32], class: usize| -> f32 {
            let dir = &d.directions[class * 200..(class + 1) * 200];
            sample
                .chunks(200)
                .map(|f| f.iter().zip(dir).map(|(x, w)| x * w).sum::<f32>().powi(2))
                .sum()
        };
        for index in 0..8 {
            d.read(index, &mut a).unwrap();
            let own = index % 4;
            for other in (0..4).filter(|&c| {
                c != own
                    && mean_abs_corr(
                        &d.directions[c * 200..(c + 1) * 200],
                        &d.directions[own * 200..(own + 1) * 200],
                    ) < 0.5
            }) {
                assert!(energy(&a, own) > 2.0 * energy(&a, other), "sample {index}");
            }
        }
        assert!(d.read(40, &mut a).is_err());
        assert_eq!(d.classes(), Some(4));
    }

    #[test]
    fn images_carry_their_class_grating() {
        let (size, classes) = (16usize, 5usize);
        let d = SyntheticImages::new(40, 3, size, classes, 1).unwrap();
        // Phase-free energy of a sample at class c's orientation and frequency.
        let energy = |x: &[f32], c: usize| -> f32 {
            let (cos, sin, cycles) = d.gratings[c];
            let k = std::f32::consts::TAU * cycles / size as f32;
            let (mut re, mut im) = (0.0f32, 0.0f32);
            for plane in x.chunks(size * size) {
                for (p, v) in plane.iter().enumerate() {
                    let (y, xx) = ((p / size) as f32, (p % size) as f32);
                    let a = k * (xx * cos + y * sin);
                    re += v * a.cos();
                    im += v * a.sin();
                }
            }
            re * re + im * im
        };
        let mut x = vec![0.0; 3 * size * size];
        let mut y = vec![0.0; 3 * size * size];
        for index in 0..10 {
            let own = d.read(index, &mut x).unwrap() as usize;
            assert_eq!(own, index % classes);
            for other in (0..classes).filter(|&c| c != own) {
                assert!(energy(&x, own) > 3.0 * energy(&x, other), "sample {index}");
            }
        }
        d.read(3, &mut y).unwrap();
        d.read(3, &mut x).unwrap();
        assert_eq!(x, y, "same index, same sample");
        assert!(d.read(40, &mut x).is_err());
        assert!(SyntheticImages::new(1, 3, 16, 1, 0).is_err());
    }
}
