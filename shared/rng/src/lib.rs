//! SplitMix64 (Steele, Lea and Flood, 2014): a tiny, fast generator, the same sequence for the
//! same seed. It jitters the functions' retries, decides the simulated service's faults, and
//! drives the simulations. Not for anything that must be unpredictable.
//!
//! A generator is shared by reference (its state is atomic), so one can serve concurrent tasks.
//! [`SplitMix::for_key`] derives a generator from a seed, a key and a purpose, so that every
//! decision about one key is reproducible whatever else happens meanwhile; the key's hash is
//! spelled out here (FNV-1a) rather than taken from the standard library, whose hasher may
//! change between Rust releases.

use std::sync::atomic::{AtomicU64, Ordering};

/// The golden-ratio increment of SplitMix64.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A SplitMix64 generator.
#[derive(Debug)]
pub struct SplitMix {
    state: AtomicU64,
}

impl SplitMix {
    /// A generator starting from `seed`; equal seeds give equal sequences.
    pub fn seeded(seed: u64) -> SplitMix {
        SplitMix { state: AtomicU64::new(seed) }
    }

    /// A generator for one purpose (`salt`) of one key under `seed`: the three are mixed so
    /// that neighbouring seeds, keys or salts give unrelated sequences.
    pub fn for_key(seed: u64, key: &str, salt: u64) -> SplitMix {
        SplitMix::seeded(mix(seed ^ mix(fnv1a(key.as_bytes()) ^ mix(salt.wrapping_mul(GAMMA)))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&self) -> u64 {
        let state = self.state.fetch_add(GAMMA, Ordering::Relaxed).wrapping_add(GAMMA);
        mix(state)
    }

    /// The next number in [0, 1), with 53 bits of precision.
    pub fn unit(&self) -> f64 {
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
pub fn fnv1a(bytes: &[u8]) -> u64 {
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
        let rng = SplitMix::seeded(1_234_567);
        assert_eq!(rng.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(rng.next_u64(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn units_stay_in_the_half_open_interval_and_repeat_with_their_seed() {
        let (rng, again) = (SplitMix::seeded(7), SplitMix::seeded(7));
        let draws: Vec<f64> = (0..10_000).map(|_| rng.unit()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        assert!(draws.iter().all(|&u| u == again.unit()));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }

    #[test]
    fn key_streams_are_reproducible_and_distinct() {
        let a = SplitMix::for_key(1, "o/charge/do", 0).next_u64();
        assert_eq!(a, SplitMix::for_key(1, "o/charge/do", 0).next_u64());
        assert_ne!(a, SplitMix::for_key(2, "o/charge/do", 0).next_u64());
        assert_ne!(a, SplitMix::for_key(1, "o/charge/undo", 0).next_u64());
        assert_ne!(a, SplitMix::for_key(1, "o/charge/do", 1).next_u64());
    }

    #[test]
    fn fnv1a_matches_known_values() {
        assert_eq!(fnv1a(b""), 0xCBF2_9CE4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xAF63_DC4C_8601_EC8C);
    }
}
