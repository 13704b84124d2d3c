//! The float layouts of [`super::encode_tensor`]: the split-float frame
//! (top byte in rANS-32 blocks, the rest stored), the bit-field frames of
//! bf16 and f32, and the byte-plane frame they fall back to.

use super::planes::{
    block_elems, dividing_chunks, encode_plane, rans_chunks, split_planes, stored_plane,
    zstd_blocks_or_stored, MIN_CHUNK,
};
use ckptfs_codec::plane::{self, encode_zstd_blocks};
use ckptfs_codec::transform::{self, BFLOAT16};
use ckptfs_format::frame::{render_z4ai, PlaneOut, Transform};
use rayon::prelude::*;

/// bf16 as a bit-field frame: the sign bits stored, the exponent byte
/// entropy-coded with rANS (where the ratio comes from), the 7-bit mantissa
/// in zstd blocks, one per block of the grid. Trained weights' mantissas
/// are near-uniform (about 6.97 bits of entropy in 7): zstd's Huffman codes
/// them in at most 7 bits, less where a block is skewed, and on AVX2 it
/// decodes them in no more CPU than the uniform rANS table did (which
/// ckptfs wrote before; readers keep decoding it) and encodes them about
/// 30% faster. rANS chunks and zstd blocks share their boundaries only when
/// the chunk count divides the element count; otherwise a byte-plane frame
/// (about 1% larger) keeps random access exact.
pub(super) fn bf16_frame(raw: &[u8]) -> Vec<u8> {
    let n = raw.len() / 2;
    let e = block_elems(2);
    let Some(k) = dividing_chunks(n, e) else {
        return byteplane_frame(raw, 2);
    };
    let tail = &raw[n * 2..];
    let mut sign = vec![0u8; n.div_ceil(8)];
    let mut exp = vec![0u8; n];
    let mut mant = vec![0u8; n];
    raw[..n * 2]
        .par_chunks(e * 2)
        .zip(sign.par_chunks_mut(e / 8))
        .zip(exp.par_chunks_mut(e))
        .zip(mant.par_chunks_mut(e))
        .for_each(|(((b, s), x), m)| transform::bf16_split_into(b, s, x, m));
    let sign_plane = PlaneOut {
        method: plane::STORE,
        orig_len: sign.len() as u64,
        payload: sign,
    };
    let chunks = rans_chunks(n, k, MIN_CHUNK);
    let (x, m) = rayon::join(
        || encode_plane(&exp, chunks, chunks / k),
        || zstd_blocks_or_stored(&mant, n.div_ceil(k).max(1)),
    );
    render_z4ai(Transform::Bitfield(BFLOAT16), tail, &[sign_plane, x, m])
}

/// Bytes of a float tensor encoded both ways to choose the layout: four
/// pieces of a quarter of this, spread over the tensor ([`sample_of`]).
pub(super) const SAMPLE_BYTES: usize = 4 << 20;

/// Four pieces of `SAMPLE_BYTES / 4` (whole `w`-byte elements), at the
/// start, a third, two thirds and the end of `raw`.
pub(super) fn sample_of(raw: &[u8], w: usize) -> Vec<u8> {
    let piece = (SAMPLE_BYTES / 4 / w) * w;
    let elems = raw.len() / w;
    let mut v = Vec::with_capacity(4 * piece);
    for k in 0..4 {
        let start = ((elems - piece / w) * k / 3) * w;
        v.extend_from_slice(&raw[start..start + piece]);
    }
    v
}

/// How much larger than the z4ai layout a split-float frame may be and
/// still be chosen: it decodes faster (doc/FORMAT.md §1).
pub const SPLIT_SLACK: f64 = 0.002;

/// A low-bytes plane goes in zstd blocks only when they save at least
/// 1/`ZSTD_REST_MIN` of it: decoding zstd costs more than the top bytes.
const ZSTD_REST_MIN: usize = 16;

/// The split-float frame (transform 3) of `w`-byte floats: the top byte
/// of each element (rotated left one bit: the exponent) in rANS-32
/// blocks, the other bytes stored, or in zstd blocks where that saves a
/// sixteenth; both planes cut at the same elements, [`block_elems`] per
/// block. If the top bytes do not compress, both planes are stored.
pub(super) fn split_frame(raw: &[u8], w: usize) -> Vec<u8> {
    let n = raw.len() / w;
    let (top, rest) = ckptfs_codec::split::split(&raw[..n * w], w);
    let e = block_elems(w);
    let (t, r) = rayon::join(
        || ckptfs_codec::rans32::encode_plane(&top, e),
        || {
            let z = encode_zstd_blocks(&rest, e * (w - 1), 1);
            (z.len() + rest.len() / ZSTD_REST_MIN < rest.len()).then_some(z)
        },
    );
    let planes = if t.len() >= top.len() {
        [stored_plane(&top), stored_plane(&rest)]
    } else {
        let t = PlaneOut {
            method: plane::RANS32,
            orig_len: top.len() as u64,
            payload: t,
        };
        let r = match r {
            Some(z) => PlaneOut {
                method: plane::ZSTD_BLOCKS,
                orig_len: rest.len() as u64,
                payload: z,
            },
            None => stored_plane(&rest),
        };
        [t, r]
    };
    render_z4ai(Transform::Split(w as u8), &raw[n * w..], &planes)
}

/// f32 as a bit-field frame: the exponent byte whole in one rANS plane
/// (its low bit is correlated with the rest, which a byte-plane split
/// throws away), the 23-bit mantissa as three byte planes in zstd blocks
/// (the top one holds 7 bits, which Huffman codes in ~7). About 0.4%
/// smaller than byte-plane on real weights. Falls back to byte-plane when no
/// chunk count divides the element count.
pub(super) fn fp32_frame(raw: &[u8]) -> Vec<u8> {
    use ckptfs_codec::transform::FLOAT32;
    let n = raw.len() / 4;
    let e = block_elems(4);
    let Some(k) = dividing_chunks(n, e) else {
        return byteplane_frame(raw, 4);
    };
    // Split straight into the planes, block by block in parallel (the
    // mantissa plane is its three byte planes, low byte first).
    let mut sign = vec![0u8; n.div_ceil(8)];
    let mut exp = vec![0u8; n];
    let mut mant = vec![0u8; 3 * n];
    {
        let (m0, rest) = mant.split_at_mut(n);
        let (m1, m2) = rest.split_at_mut(n);
        raw[..n * 4]
            .par_chunks(e * 4)
            .zip(sign.par_chunks_mut(e / 8))
            .zip(exp.par_chunks_mut(e))
            .zip(m0.par_chunks_mut(e))
            .zip(m1.par_chunks_mut(e))
            .zip(m2.par_chunks_mut(e))
            .for_each(|(((((b, s), x), a), c), d)| transform::f32_split_into(b, s, x, [a, c, d]));
    }
    let block = n / k;
    let chunks = rans_chunks(n, k, MIN_CHUNK);
    let (x, m) = rayon::join(
        || encode_plane(&exp, chunks, chunks / k),
        || zstd_blocks_or_stored(&mant, block.max(1)),
    );
    let sign_plane = PlaneOut {
        method: plane::STORE,
        orig_len: sign.len() as u64,
        payload: sign,
    };
    render_z4ai(
        Transform::Bitfield(FLOAT32),
        &raw[n * 4..],
        &[sign_plane, x, m],
    )
}

/// Chunks as in bit-field frames, one table per block: a block's chunks
/// fill the SIMD decoder's lanes (with the former 64 Ki-symbol chunks,
/// tensors under 3.5 Mi elements had fewer than 7 per block and were
/// decoded one chunk at a time).
pub(super) fn byteplane_frame(raw: &[u8], w: usize) -> Vec<u8> {
    let n = raw.len() / w;
    let blocks = n.div_ceil(block_elems(w)).max(1);
    let k = rans_chunks(n, blocks, MIN_CHUNK);
    byteplane_frame_with(raw, w, k, k / blocks)
}

/// A byte-plane frame whose rANS planes have `k` chunks, a table for each
/// run of `group`.
pub(super) fn byteplane_frame_with(raw: &[u8], w: usize, k: usize, group: usize) -> Vec<u8> {
    let n = raw.len() / w;
    let planes = split_planes(raw, w);
    let outs: Vec<PlaneOut> = planes
        .par_iter()
        .map(|p| encode_plane(p, k, group))
        .collect();
    render_z4ai(Transform::BytePlane(w as u8), &raw[n * w..], &outs)
}
