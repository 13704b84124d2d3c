//! Decoding of z4ai's XOR delta frame (`format::z4dl::Z4dl`): the inner
//! frame decoded by the ordinary frame decoder, then XORed with the
//! reference. Written here, beside `codec::frame`, because `format` parses
//! only. The whole output is one buffer the caller sizes (its length is the
//! reference's, which the caller holds); streaming a large tensor block by
//! block is `z4delta`'s.

use crate::frame::DecodeFrame;
use crate::{CodecError, Result};
use ckptfs_format::z4dl::Z4dl;

/// Decoding of a Z4DL delta against its reference.
pub trait DecodeXor {
    fn decode(&self, reference: &[u8], out: &mut [u8]) -> Result<()>;
}

impl DecodeXor for Z4dl<'_> {
    /// Checks `reference` (length, BLAKE2b-16), then decodes into `out`
    /// (`out.len() == reference.len()`): `out = frame XOR reference`.
    fn decode(&self, reference: &[u8], out: &mut [u8]) -> Result<()> {
        self.check_reference(reference)
            .map_err(|e| CodecError::invalid("Z4DL reference", e.to_string()))?;
        if out.len() != reference.len() {
            return Err(CodecError::LengthMismatch {
                what: "Z4DL output",
                got: out.len() as u64,
                expected: reference.len() as u64,
            });
        }
        if reference.is_empty() {
            return Ok(());
        }
        let frame = self
            .inner()
            .map_err(|e| CodecError::invalid("Z4DL frame", e.to_string()))?;
        frame.decode(out)?;
        xor_into(out, reference);
        Ok(())
    }
}

/// A new buffer holding `a[i] ^ b[i]` over the shorter of the two, written
/// once in parallel slices of `chunk` bytes (no copy of `a` to XOR into,
/// which was a whole extra pass over each delta tensor when packing).
pub fn xor_of(a: &[u8], b: &[u8], chunk: usize) -> Vec<u8> {
    use rayon::prelude::*;
    let n = a.len().min(b.len());
    let mut out = Vec::with_capacity(n);
    out.spare_capacity_mut()[..n]
        .par_chunks_mut(chunk.max(1))
        .zip(a[..n].par_chunks(chunk.max(1)))
        .zip(b[..n].par_chunks(chunk.max(1)))
        .for_each(|((o, x), y)| {
            for ((o, x), y) in o.iter_mut().zip(x).zip(y) {
                o.write(x ^ y);
            }
        });
    // SAFETY: the loop above wrote every one of the first n bytes (the
    // three slices are chunked alike, so the chunks pair up exactly).
    unsafe { out.set_len(n) };
    out
}

/// `out[i] ^= reference[i]` over the shorter of the two.
pub fn xor_into(out: &mut [u8], reference: &[u8]) {
    // Whole words first: the compiler vectorises this form.
    let n = out.len().min(reference.len());
    let (o, r) = (&mut out[..n], &reference[..n]);
    let mut oc = o.chunks_exact_mut(8);
    let mut rc = r.chunks_exact(8);
    for (a, b) in (&mut oc).zip(&mut rc) {
        let x = u64::from_ne_bytes((&*a).try_into().unwrap())
            ^ u64::from_ne_bytes(b.try_into().unwrap());
        a.copy_from_slice(&x.to_ne_bytes());
    }
    for (a, b) in oc.into_remainder().iter_mut().zip(rc.remainder()) {
        *a ^= b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckptfs_format::frame::{render_z4ai, PlaneOut, Transform};
    use ckptfs_format::z4digest::reference_digest;
    use ckptfs_format::z4dl::render_header;

    #[test]
    fn xor_of_equals_xor_into_of_a_copy() {
        let a: Vec<u8> = (0..100_003u32).map(|i| (i * 7 + (i >> 5)) as u8).collect();
        let b: Vec<u8> = (0..100_001u32).map(|i| (i * 13) as u8).collect();
        for chunk in [1, 7, 4096, 1 << 20] {
            let mut want = a[..b.len()].to_vec();
            xor_into(&mut want, &b);
            assert_eq!(xor_of(&a, &b, chunk), want, "chunk {chunk}");
        }
        assert!(xor_of(&[], &b, 16).is_empty());
    }

    #[test]
    fn decodes_frame_xor_reference() {
        let reference: Vec<u8> = (0..37u8).collect();
        let current: Vec<u8> = reference.iter().map(|b| b.wrapping_mul(3)).collect();
        let diff: Vec<u8> = current.iter().zip(&reference).map(|(a, b)| a ^ b).collect();
        let mut blob = render_header(37, &reference_digest(&reference));
        blob.extend(render_z4ai(
            Transform::Opaque,
            &[],
            &[PlaneOut {
                method: 0,
                orig_len: 37,
                payload: diff,
            }],
        ));
        let d = Z4dl::parse(&blob).unwrap();
        let mut out = vec![0u8; 37];
        d.decode(&reference, &mut out).unwrap();
        assert_eq!(out, current);
        let mut wrong = reference.clone();
        wrong[3] ^= 1;
        assert!(d.decode(&wrong, &mut out).is_err());
    }

    #[test]
    fn decodes_z4ais_vector() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/");
        let blob = std::fs::read(format!("{dir}delta_plain.z4dl")).unwrap();
        let reference = std::fs::read(format!("{dir}delta_plain.ref.bin")).unwrap();
        let current = std::fs::read(format!("{dir}delta_plain.cur.bin")).unwrap();
        let d = Z4dl::parse(&blob).unwrap();
        let mut out = vec![0u8; reference.len()];
        d.decode(&reference, &mut out).unwrap();
        assert!(out == current);
    }
}
