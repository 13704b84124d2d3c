//! xxh3-64 with seed 0, the digest of every ckptfs checksum (CKX1 blocks,
//! units, heads and indexes; see doc/FORMAT.md), for whole slices.
//!
//! The mount hashes every block it decodes, so this sits on the read path:
//! it uses twox-hash, which picks its AVX2 loop at run time (xxhash-rust,
//! still used for the streaming digests off the hot paths, picks SSE2 on a
//! default x86-64 build, about 1.6x slower here). Both give the same value,
//! which the test below keeps true.

/// The xxh3-64 (seed 0) of `bytes`.
pub fn xxh3_64(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
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

    #[test]
    fn equals_xxhash_rust_on_a_large_block() {
        let v: Vec<u8> = (0..(1usize << 20) + 77)
            .map(|i| ((i * 2_654_435_761) >> 11) as u8)
            .collect();
        assert_eq!(super::xxh3_64(&v), xxhash_rust::xxh3::xxh3_64(&v));
    }
}
