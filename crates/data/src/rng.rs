//! A small, fast, seedable generator (SplitMix64) for shuffles and synthetic data, so that an
//! order or a sample depends only on its seed, never on threads or timing.

/// SplitMix64: one u64 of state, good statistical quality for shuffling and noise.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for a combination of values (seed, epoch, index…), decorrelated.
    pub(crate) fn keyed(parts: &[u64]) -> Self {
        let mut g = Self(0x9E37_79B9_7F4A_7C15);
        for p in parts {
            g.0 ^= p.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            g.next_u64();
        }
        g
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, n) (Lemire's method, unbiased enough for n far below 2^64).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal (Box–Muller).
    pub(crate) fn normal_f32(&mut self) -> f32 {
        let u1 = self.unit_f32().max(f32::MIN_POSITIVE);
        let u2 = self.unit_f32();
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    }
}
