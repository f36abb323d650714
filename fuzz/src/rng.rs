//! The fuzzer's random numbers: a small, seeded generator (SplitMix64), so that a run is the
//! same sequence of inputs for the same seed on any machine.

/// SplitMix64: one `u64` of state, every output from one multiply-xorshift chain.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 for `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// True once in `n` times.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A position in `0..len` and a length that fits after it (at least 1 where `len > 0`),
    /// short ones more often than long ones.
    pub fn range(&mut self, len: usize) -> (usize, usize) {
        let start = self.below(len);
        let room = len - start;
        let cap = if self.one_in(4) { room } else { room.min(16) };
        (
            start,
            1 + self.below(cap.max(1)).min(room.saturating_sub(1)),
        )
    }
}

/// FNV-1a of `bytes`: a stable hash (std's `DefaultHasher` may change between Rust releases),
/// for seeding a target's generator from its name and for outcome signatures.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
