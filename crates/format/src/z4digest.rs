//! The digests z4ai's delta formats record of their base, in one place:
//! BLAKE2b with its output-length parameter set to 8 bytes (a `Z4DM`'s
//! digest of the base file's data buffer) or 16 bytes (a `Z4DL`'s digest
//! of its reference). A BLAKE2b with a shorter output length is a different
//! function from BLAKE2b-512 truncated, so both set the parameter.
//!
//! The implementation is the `blake2b_simd` crate (AVX2 when the CPU has
//! it, about twice the speed of the RustCrypto `blake2` crate used before):
//! a `Z4DM` must carry the digest of the whole base, so `pack --base` hashes
//! every byte of the base once, and each DELTA base tensor again, and with
//! the slower crate that was about a quarter of its CPU.
//!
//! [`Z4Digest`] is streaming, so a base of any size is hashed in chunks
//! without being held in memory. Pure: no I/O.

use blake2b_simd::{Params, State};

/// Length of a `Z4DM` base digest (BLAKE2b, digest_size=8).
pub const BASE_DIGEST_LEN: usize = 8;
/// Length of a `Z4DL` reference digest (BLAKE2b, digest_size=16).
pub const REF_DIGEST_LEN: usize = 16;

/// A streaming BLAKE2b of a chosen output length (8 or 16 bytes here).
#[derive(Clone)]
pub struct Z4Digest {
    inner: State,
}

impl Z4Digest {
    /// The digest a `Z4DM` records of its base's data buffer.
    pub fn base_data() -> Self {
        Self::with_len(BASE_DIGEST_LEN)
    }

    /// The digest a `Z4DL` records of its reference.
    pub fn reference() -> Self {
        Self::with_len(REF_DIGEST_LEN)
    }

    fn with_len(len: usize) -> Self {
        Z4Digest {
            // 1..=64 is always accepted; 8 and 16 are constants.
            inner: Params::new().hash_length(len).to_state(),
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.inner.update(bytes);
    }

    /// The digest: 8 or 16 bytes, as chosen at construction.
    pub fn finish(self) -> Vec<u8> {
        self.inner.finalize().as_bytes().to_vec()
    }
}

/// BLAKE2b-8 of a base's data buffer (the bytes after its `8 + hlen`
/// safetensors header), as a `Z4DM` records it.
pub fn base_data_digest(data: &[u8]) -> [u8; BASE_DIGEST_LEN] {
    let h = Params::new().hash_length(BASE_DIGEST_LEN).hash(data);
    h.as_bytes().try_into().expect("8 bytes")
}

/// BLAKE2b-16 of a reference, as a `Z4DL` records it.
pub fn reference_digest(reference: &[u8]) -> [u8; REF_DIGEST_LEN] {
    let h = Params::new().hash_length(REF_DIGEST_LEN).hash(reference);
    h.as_bytes().try_into().expect("16 bytes")
}

/// [`base_data_digest`] of `data` and [`reference_digest`] of each of
/// `references`, in one pass on this thread: the digests of different
/// inputs run side by side in the SIMD lanes (four with AVX2), so the
/// references cost little beside the long one.
pub fn base_and_reference_digests(
    data: &[u8],
    references: &[&[u8]],
) -> ([u8; BASE_DIGEST_LEN], Vec<[u8; REF_DIGEST_LEN]>) {
    use blake2b_simd::many::{hash_many, HashManyJob};
    let mut base = Params::new();
    base.hash_length(BASE_DIGEST_LEN);
    let mut reference = Params::new();
    reference.hash_length(REF_DIGEST_LEN);
    let mut jobs: Vec<HashManyJob> = std::iter::once(HashManyJob::new(&base, data))
        .chain(references.iter().map(|r| HashManyJob::new(&reference, r)))
        .collect();
    hash_many(jobs.iter_mut());
    let b = jobs[0].to_hash().as_bytes().try_into().expect("8 bytes");
    let refs = jobs[1..]
        .iter()
        .map(|j| j.to_hash().as_bytes().try_into().expect("16 bytes"))
        .collect();
    (b, refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    // Values from Python: hashlib.blake2b(b"abc", digest_size=N).hexdigest().
    #[test]
    fn matches_pythons_hashlib_for_both_lengths() {
        assert_eq!(hex(&base_data_digest(b"abc")), "d8bb14d833d59559");
        assert_eq!(
            hex(&reference_digest(b"abc")),
            "cf4ab791c62b8d2b2109c90275287816"
        );
        assert_eq!(hex(&base_data_digest(b"")), "e4a6a0577479b2b4");
    }

    #[test]
    fn batched_digests_equal_the_single_ones() {
        let data: Vec<u8> = (0..300_000u32).map(|i| ((i * 13) >> 3) as u8).collect();
        let refs: Vec<&[u8]> = vec![&data[..0], &data[5..70_000], &data[..1], &data[1000..]];
        let (b, r) = base_and_reference_digests(&data, &refs);
        assert_eq!(b, base_data_digest(&data));
        assert_eq!(r.len(), refs.len());
        for (x, want) in refs.iter().zip(&r) {
            assert_eq!(&reference_digest(x), want);
        }
    }

    #[test]
    fn streaming_equals_one_shot() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut d = Z4Digest::reference();
        for c in data.chunks(333) {
            d.update(c);
        }
        assert_eq!(d.finish(), reference_digest(&data));
    }
}
