//! A delta's XOR frames ([`encode_xor`]): the XOR of a tensor with its
//! base is mostly zero, so it goes in byte-plane frames made to decode
//! fast, opaque zstd, per-plane zstd or a `ZSP1` sparse frame, whichever
//! is smallest; and the block grid and digests of such a frame.

use super::float::byteplane_frame_with;
use super::planes::{
    block_elems, counted_o0_bytes, dividing_chunks, encode_plane_counted, rans_chunks,
    split_planes, sum_histograms,
};
use super::{opaque_frame, TINY};
use crate::{PackError, PackOptions};
use ckptfs_codec::plane::{self, encode_zstd_blocks};
use ckptfs_codec::rans;
use ckptfs_codec::zstd::Params;
use ckptfs_format::ckx;
use ckptfs_format::frame::{
    block_grid, render_z4ai, render_zsp1, ElementAccess, Frame, PlaneOut, Transform, BLOCK_BYTES,
};
use ckptfs_format::safetensors::Dtype;
use rayon::prelude::*;

/// Compresses the XOR of a tensor with its base (a DELTA record's frame).
/// Mostly zero with small low-order differences, so the bit-field frame's
/// stored sign plane (1/16 of a bf16 tensor) would dominate: float XORs go
/// in byte-plane frames ([`xor_byteplane_frame`]), opaque zstd, or, where
/// they win, whole-tensor frames, whichever is smallest. Each candidate is
/// tried only where it can win:
/// - opaque zstd below 64 KiB (rANS tables cost more there) or where the
///   byte planes compress 8x (long zero runs, which LZ codes better);
/// - byte planes each in one zstd frame at level 19 ([`small_planes_frame`])
///   up to [`SMALL_XOR`] bytes (biases, norms: one block anyway);
/// - a `ZSP1` sparse frame ([`sparse_frame`]) when at most a quarter of the
///   elements differ, up to [`SPARSE_MAX`] bytes. It is one block of the
///   whole tensor (a read anywhere in it decodes all of it), which is why
///   its size is bounded; it wins where few rows moved (a token embedding
///   after a step that saw a few hundred tokens), as in z4ai.
///
/// Same block grids as [`encode_tensor`](super::encode_tensor) for the
/// byte-plane and opaque frames.
pub fn encode_xor(dtype: Option<Dtype>, xor: &[u8], opts: PackOptions) -> Vec<u8> {
    let w = match dtype {
        _ if xor.len() < TINY => return opaque_frame(xor, opts),
        Some(Dtype::BF16) | Some(Dtype::F16) => 2,
        Some(Dtype::F32) | Some(Dtype::C64) => 4,
        Some(Dtype::F64) => 8,
        _ => return opaque_frame(xor, opts),
    };
    let p = xor_byteplane_frame(xor, w);
    let opaque = xor.len() <= 64 << 10 || p.len() < xor.len() / 8;
    let mut best = p;
    let mut keep = |f: Vec<u8>| {
        if f.len() < best.len() {
            best = f;
        }
    };
    if opaque {
        keep(opaque_frame(xor, opts));
    }
    if xor.len() <= SMALL_XOR {
        keep(small_planes_frame(xor, w));
    }
    if let Some(f) = sparse_frame(xor, w) {
        keep(f);
    }
    best
}

/// True if any byte of `b` is not zero (a word at a time).
fn any_nonzero(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(8);
    let any = words.any(|x| u64::from_ne_bytes(x.try_into().expect("8 bytes")) != 0);
    any || words.remainder().iter().any(|&x| x != 0)
}

/// The largest XOR also tried as one zstd frame per byte plane.
pub const SMALL_XOR: usize = 64 << 10;

/// The largest XOR tried as a `ZSP1` sparse frame, which decodes whole.
pub const SPARSE_MAX: usize = 64 << 20;

/// A byte-plane frame of `raw` with every plane one zstd frame (method 1)
/// at level 19, or stored: for small tensors, where per-block structure
/// buys nothing and the strongest level costs little.
pub(super) fn small_planes_frame(raw: &[u8], w: usize) -> Vec<u8> {
    let n = raw.len() / w;
    let outs: Vec<PlaneOut> = split_planes(raw, w)
        .iter()
        .map(|p| zstd_or_stored(p, &[Params::level(19)]))
        .collect();
    render_z4ai(Transform::BytePlane(w as u8), &raw[n * w..], &outs)
}

/// One zstd frame (method 1) of `p` with the smallest of `params`, or the
/// plane stored if that is not smaller.
fn zstd_or_stored(p: &[u8], params: &[Params]) -> PlaneOut {
    let z = params
        .iter()
        .map(|&c| {
            let mut out = Vec::new();
            ckptfs_codec::zstd::compress_into(p, c, &mut out);
            out
        })
        .reduce(|a, b| if b.len() < a.len() { b } else { a });
    match z {
        Some(z) if z.len() < p.len() => PlaneOut {
            method: plane::ZSTD,
            orig_len: p.len() as u64,
            payload: z,
        },
        _ => PlaneOut {
            method: plane::STORE,
            orig_len: p.len() as u64,
            payload: p.to_vec(),
        },
    }
}

/// `raw` (elements of `w` bytes) as a `ZSP1` sparse frame, as z4ai writes
/// for a sparse XOR: the zstd of a bitmap of the elements that are not all
/// zero, and those elements' byte planes, each one zstd frame (level 1 or
/// [`Params::literal_heavy`], whichever is smaller: the low byte of the
/// moved elements is near uniform, where the optimal parser's literal
/// pricing saves 5-6% over level 1; z4ai writes level 1).
/// `None` when more than a quarter of the elements differ (byte planes win
/// there) or `raw` is above [`SPARSE_MAX`].
pub(super) fn sparse_frame(raw: &[u8], w: usize) -> Option<Vec<u8>> {
    let n = raw.len() / w;
    if n == 0 || raw.len() > SPARSE_MAX {
        return None;
    }
    let body = &raw[..n * w];
    let nonzero = |e: &[u8]| e.iter().any(|&b| b != 0);
    // A dense XOR (every weight matrix of a training step: a quarter to
    // two thirds of the elements move) is ruled out from 32 slices of 256
    // elements before the full count: over 30% of them moved (the sample's
    // standard error is about 0.5%).
    if n >= 1 << 14 {
        let step = n / 32;
        let moved: usize = (0..32)
            .map(|k| {
                let at = k * step * w;
                body[at..at + 256 * w]
                    .chunks_exact(w)
                    .filter(|e| nonzero(e))
                    .count()
            })
            .sum();
        if moved * 10 > 3 * 32 * 256 {
            return None;
        }
    }
    // Groups of 8 elements (one bitmap byte), checked a word at a time:
    // in a sparse XOR nearly all of them are zero.
    let group = 8 * w;
    let nnz: usize = body
        .par_chunks(group << 12)
        .map(|c| {
            c.chunks(group)
                .filter(|g| any_nonzero(g))
                .map(|g| g.chunks_exact(w).filter(|e| nonzero(e)).count())
                .sum::<usize>()
        })
        .sum();
    if nnz * 4 > n {
        return None;
    }
    let mut bitmap = vec![0u8; n.div_ceil(8)];
    let mut planes: Vec<Vec<u8>> = (0..w).map(|_| Vec::with_capacity(nnz)).collect();
    for (bits, c) in bitmap.iter_mut().zip(body.chunks(group)) {
        if !any_nonzero(c) {
            continue;
        }
        for (k, e) in c.chunks_exact(w).enumerate() {
            if nonzero(e) {
                *bits |= 0x80 >> k;
                for (p, &b) in planes.iter_mut().zip(e) {
                    p.push(b);
                }
            }
        }
    }
    let (bitmap_z, values) = rayon::join(
        || ckptfs_codec::zstd::compress(&bitmap, 12),
        || {
            planes
                .par_iter()
                .map(|p| {
                    if nnz == 0 {
                        return None;
                    }
                    Some(zstd_or_stored(
                        p,
                        &[Params::level(1), Params::literal_heavy()],
                    ))
                })
                .collect::<Option<Vec<PlaneOut>>>()
                .unwrap_or_default()
        },
    );
    Some(render_zsp1(
        w as u8,
        n as u64,
        nnz as u64,
        &raw[n * w..],
        &bitmap_z,
        &values,
    ))
}

/// An XOR as a byte-plane frame made to decode fast: the decoder's cost
/// is per symbol, and most symbols of an XOR are zeros.
/// - Blocks divide the element count (as bit-field frames do), so rANS
///   chunks and zstd blocks share their boundaries. Each block has up to
///   16 rANS chunks of at least 16 Ki symbols sharing one table, so small
///   tensors (a 384x384 projection: 9 chunks, not 2) take the AVX-512
///   decoder, which needs 7 chunks at once, and it reads one table.
/// - A plane whose order-0 entropy is under one bit per symbol (the high
///   bytes of a training step, every byte of an embedding whose rows mostly
///   did not move) also tries zstd blocks, and keeps them unless they cost
///   more than 1/256 bit per symbol over rANS: LZ skips a run of zeros in
///   one match, where rANS decodes each zero (blocks at [`XOR_ZSTD_LEVEL`]). On the bf16 embedding of
///   `scripts/bench-delta.sh`'s step 0->1 zstd is also the smaller. rANS
///   is not run when zstd is already within that margin of the entropy
///   (which no rANS plane beats), which saves packing time.
///
/// Element counts without such a divisor keep
/// [`byteplane_frame`](super::float::byteplane_frame).
pub(super) fn xor_byteplane_frame(raw: &[u8], w: usize) -> Vec<u8> {
    let n = raw.len() / w;
    let Some(b) = dividing_chunks(n, block_elems(w)) else {
        // Chunks of 64 Ki symbols with a table each, as when the deltas
        // were measured against z4ai's (the value frames' chunking below
        // is finer).
        let blocks = n.div_ceil(block_elems(w)).max(1);
        let k = rans_chunks(n, blocks, 4 * XOR_MIN_CHUNK);
        return byteplane_frame_with(raw, w, k, 1);
    };
    let planes = split_planes(raw, w);
    let k = rans_chunks(n, b, XOR_MIN_CHUNK);
    let group = k / b;
    let outs: Vec<PlaneOut> = planes
        .par_iter()
        .map(|p| {
            let slack = p.len() / 2048;
            // One count of the plane, chunk by chunk: its entropy, each
            // block's (a block is a run of `group` chunks), the shared
            // tables and the stationarity check all come from it.
            let chunks = rans::run_histograms(p, k, 1);
            let runs: Vec<[u64; 256]> = chunks.chunks(group).map(sum_histograms).collect();
            let total = sum_histograms(&runs);
            // Order-0 entropy per block: no rANS plane is smaller, so zstd
            // within the slack of it is kept without running rANS at all.
            let entropy = if counted_o0_bytes(&total) < p.len() as f64 / 8.0 {
                runs.iter().map(counted_o0_bytes).sum::<f64>()
            } else {
                f64::INFINITY
            };
            let shared = || encode_plane_counted(p, k, group, &runs, &total);
            if entropy >= p.len() as f64 / 8.0 {
                let shared = shared();
                if !non_stationary(p.len(), &chunks, &runs) {
                    return shared;
                }
                let own = encode_plane_counted(p, k, 1, &chunks, &total);
                return if own.payload.len() < shared.payload.len() {
                    own
                } else {
                    shared
                };
            }
            let z = PlaneOut {
                method: plane::ZSTD_BLOCKS,
                orig_len: p.len() as u64,
                payload: encode_zstd_blocks(p, n / b, XOR_ZSTD_LEVEL),
            };
            if z.payload.len() as f64 <= entropy + slack as f64 {
                return z;
            }
            let r = shared();
            if r.method != plane::STORE && z.payload.len() <= r.payload.len() + slack {
                z
            } else {
                r
            }
        })
        .collect();
    render_z4ai(Transform::BytePlane(w as u8), &raw[n * w..], &outs)
}

/// True when an XOR plane of at most 1 MiB (`len` bytes), coded in rANS
/// chunks with one table per run of chunks, would be clearly smaller with a
/// table per chunk (z4ai's method 4): its order-0 entropy summed per chunk,
/// plus about 256 bytes per extra table, is under 98% of that per run.
/// That is a plane whose statistics change along it, such as a position
/// embedding whose first rows moved much further than the rest; a weight
/// matrix's planes are stationary, and larger planes are not checked.
/// `chunks` and `runs` are the histograms of its chunks and of its runs.
pub(super) fn non_stationary(len: usize, chunks: &[[u64; 256]], runs: &[[u64; 256]]) -> bool {
    if runs.len() >= chunks.len() || len > 1 << 20 {
        return false;
    }
    let own: f64 = chunks.iter().map(counted_o0_bytes).sum();
    let shared: f64 = runs.iter().map(counted_o0_bytes).sum();
    own + (chunks.len() - runs.len()) as f64 * 256.0 < 0.98 * shared
}

/// zstd level of an XOR's zstd-block planes. On the low-entropy planes of
/// `scripts/bench-delta.sh`'s training steps level 1 is 1-9% smaller than
/// level 3 in total (level 3's extra short matches in sparse data cost
/// more than the literals they replace) and about twice as fast.
const XOR_ZSTD_LEVEL: i32 = 1;

/// Shortest rANS chunk in an XOR delta frame: 8 Ki made
/// `scripts/bench-delta.sh`'s deltas 0.04-0.1% larger, over z4ai's.
const XOR_MIN_CHUNK: usize = 16 << 10;

/// The digests of a delta's XOR frame: as [`digests`](super::digests), except that a
/// `ZSP1` frame longer than a block, which decodes only whole, is listed
/// in blocks of about [`BLOCK_BYTES`] (whole bytes of its bitmap: 8
/// elements), its tail in the last, which a reader decodes one at a time
/// from the frame's bitmap and values (`codec::sparse`). Every block's
/// payload is the whole frame, so its meta digest is that of one block.
pub(crate) fn xor_digests(frame_bytes: &[u8], raw: &[u8]) -> Result<ckx::UnitDigests, PackError> {
    let f = Frame::parse(frame_bytes)
        .map_err(|e| PackError::Internal(format!("own frame does not parse: {e}")))?;
    let (bounds, eb, access) = xor_grid(&f, raw.len() as u64)?;
    let blocks: Vec<&[u8]> = bounds
        .windows(2)
        .map(|w| &raw[w[0] as usize..w[1] as usize])
        .collect();
    Ok(ckx::unit_digests(
        frame_bytes,
        access.as_ref(),
        &bounds,
        eb,
        &blocks,
    ))
}

/// The block grid [`xor_digests`] lists for an XOR frame decoding to
/// `len` bytes: (block bounds, element bytes, element access), as
/// `format::frame::block_grid` gives them, except that a `ZSP1` sparse
/// frame above one block is listed in slices of about [`BLOCK_BYTES`].
pub(crate) fn xor_grid<'a>(
    f: &Frame<'a>,
    len: u64,
) -> Result<(Vec<u64>, u64, Option<ElementAccess<'a>>), PackError> {
    if f.decoded_len() != len {
        return Err(PackError::Internal("own frame has the wrong length".into()));
    }
    if let Frame::Sparse(sparse) = f {
        if len > BLOCK_BYTES {
            let group = 8 * sparse.width as u64;
            let body = sparse.count * sparse.width as u64;
            let step = (BLOCK_BYTES / group).max(1) * group;
            let mut bounds: Vec<u64> = (0..body).step_by(step as usize).collect();
            bounds.push(len);
            return Ok((bounds, 0, None));
        }
    }
    block_grid(f, len).map_err(|e| PackError::Internal(e.to_string()))
}
