//! Deterministic randomness for fault decisions: a SplitMix64 generator and a stable hash of
//! idempotency keys.
//!
//! Every random choice the simulator makes is derived from the configured seed and the call's
//! idempotency key (and, for per-call choices, how many calls carried that key so far), never
//! from a shared stream. Concurrent calls of different orders therefore cannot change each
//! other's fate, so a run with the same seed and the same calls per key is reproduced exactly
//! whatever the interleaving. The hash is spelled out here (FNV-1a) rather than taken from the
//! standard library, whose `DefaultHasher` may change between Rust releases.

/// The SplitMix64 generator (Steele, Lea and Flood, 2014): tiny, fast, and good enough to
/// decide simulated faults. Not for anything that needs unpredictability.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

/// The golden-ratio increment of SplitMix64.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    /// A generator starting from `seed`; equal seeds give equal sequences.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// A generator for one purpose (`salt`) of one key under `seed`: the three are mixed so
    /// that neighbouring seeds, keys or salts give unrelated sequences.
    pub fn for_key(seed: u64, key: &str, salt: u64) -> Self {
        let mixed = mix(seed ^ mix(fnv1a(key.as_bytes()) ^ mix(salt.wrapping_mul(GAMMA))));
        SplitMix64::new(mixed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// The next number in [0, 1), with 53 bits of precision.
    pub fn unit(&mut self) -> f64 {
        // The top 53 bits fill an f64 mantissa exactly, so every value is equally likely.
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The SplitMix64 output function: a bijective avalanche of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64-bit FNV-1a of `bytes`, stable across platforms and releases.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // First outputs of the reference SplitMix64 seeded with 1234567.
        let mut rng = SplitMix64::new(1_234_567);
        assert_eq!(rng.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(rng.next_u64(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn units_stay_in_the_half_open_interval() {
        let mut rng = SplitMix64::new(7);
        let draws: Vec<f64> = (0..10_000).map(|_| rng.unit()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }

    #[test]
    fn key_streams_are_reproducible_and_distinct() {
        let a = SplitMix64::for_key(1, "o/charge/do", 0).next_u64();
        assert_eq!(a, SplitMix64::for_key(1, "o/charge/do", 0).next_u64());
        assert_ne!(a, SplitMix64::for_key(2, "o/charge/do", 0).next_u64());
        assert_ne!(a, SplitMix64::for_key(1, "o/charge/undo", 0).next_u64());
        assert_ne!(a, SplitMix64::for_key(1, "o/charge/do", 1).next_u64());
    }

    #[test]
    fn fnv1a_matches_known_values() {
        assert_eq!(fnv1a(b""), 0xCBF2_9CE4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xAF63_DC4C_8601_EC8C);
    }
}
