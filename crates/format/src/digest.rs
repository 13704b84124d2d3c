//! xxh3-64 with seed 0, the digest of every ckptfs checksum (CKX1 blocks,
//! units, heads and indexes; see doc/FORMAT.md), for whole slices and
//! streamed ([`Xxh3`]).
//!
//! The mount hashes every block it decodes, so this sits on the read path:
//! it uses twox-hash, which picks its AVX2 loop at run time (xxhash-rust,
//! used before, picks SSE2 on a default x86-64 build, about 1.6x slower
//! here). The tests below keep the values equal to xxhash-rust's, and so
//! to the files already written.

use std::hash::Hasher as _;

/// The xxh3-64 (seed 0) of `bytes`.
pub fn xxh3_64(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// The xxh3-64 of `bytes` with `seed`.
pub fn xxh3_64_with_seed(bytes: &[u8], seed: u64) -> u64 {
    twox_hash::XxHash3_64::oneshot_with_seed(seed, bytes)
}

/// Streaming xxh3-64 (seed 0): the same value as [`xxh3_64`] of the
/// bytes given to [`Xxh3::update`], in order.
pub struct Xxh3(twox_hash::XxHash3_64);

impl Default for Xxh3 {
    fn default() -> Self {
        Self::new()
    }
}

impl Xxh3 {
    pub fn new() -> Xxh3 {
        Xxh3(twox_hash::XxHash3_64::new())
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    pub fn digest(&self) -> u64 {
        self.0.finish()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// Same digests as xxhash-rust (and so as the files already
        /// written), at every length: short inputs, the 240-byte switch to
        /// the long loop, stripes, blocks and partial tails.
        #[test]
        fn equals_xxhash_rust(data in proptest::collection::vec(any::<u8>(), 0..5000)) {
            for n in [0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 1025, data.len()] {
                let d = &data[..n.min(data.len())];
                prop_assert_eq!(super::xxh3_64(d), xxhash_rust::xxh3::xxh3_64(d));
            }
        }
    }

    proptest! {
        /// Streamed in pieces of any sizes: the one-shot value.
        #[test]
        fn streaming_equals_one_shot(
            data in proptest::collection::vec(any::<u8>(), 0..5000),
            cuts in proptest::collection::vec(0usize..5000, 0..6),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort();
            let mut h = super::Xxh3::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([data.len()]) {
                h.update(&data[at..c]);
                at = c;
            }
            prop_assert_eq!(h.digest(), xxhash_rust::xxh3::xxh3_64(&data));
        }
    }

    #[test]
    fn seeds_and_large_streams_equal_xxhash_rust() {
        let v: Vec<u8> = (0..(3usize << 20) + 5)
            .map(|i| ((i * 2_654_435_761) >> 13) as u8)
            .collect();
        let mut h = super::Xxh3::new();
        for c in v.chunks(1_000_003) {
            h.update(c);
        }
        assert_eq!(h.digest(), xxhash_rust::xxh3::xxh3_64(&v));
        assert_eq!(
            super::xxh3_64_with_seed(&v[..999], 1),
            xxhash_rust::xxh3::xxh3_64_with_seed(&v[..999], 1)
        );
    }

    #[test]
    fn equals_xxhash_rust_on_a_large_block() {
        let v: Vec<u8> = (0..(1usize << 20) + 77)
            .map(|i| ((i * 2_654_435_761) >> 11) as u8)
            .collect();
        assert_eq!(super::xxh3_64(&v), xxhash_rust::xxh3::xxh3_64(&v));
    }
}
