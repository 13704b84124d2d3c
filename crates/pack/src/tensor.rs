//! The per-tensor encoder: one tensor's bytes in, one z4ai frame out,
//! plus the CKX1 digests of that frame. Both writers use it, so a tensor is
//! encoded the same way in a `.zstn` and in a `.blz`.
//!
//! Per tensor (default, [`Compat::Ckptfs`]): BF16, F16 and F32 try the
//! split-float frame ([`split_frame`]: top byte in rANS-32 blocks, the
//! other bytes stored), which decodes faster (bf16 about 1.8x per CPU
//! second), and keep it unless the z4ai layout below is smaller by more
//! than [`SPLIT_SLACK`]. Tensors above 8 MiB are compared on a 4 MiB
//! sample first; the z4ai layout is encoded in full only when the sample
//! leaves the choice open.
//!
//! With `--compat z4ai` ([`Compat::Z4ai`]), and as the fallback:
//! - BF16 and F32: bit-field frame (sign stored, exponent rANS, mantissa
//!   zstd), or byte-plane when no chunk count divides the element count;
//! - F16 / F64 (and C64 as pairs of F32): byte-plane frame;
//! - everything else: an opaque frame.
//!
//! Every plane is stored (method 0), adaptive order-0 rANS (method 4) or
//! zstd blocks (method 2), whichever is smaller. All rANS planes of a frame
//! use the same chunk count k, and zstd blocks are n/k elements long, so
//! boundaries coincide across planes and every block of at most about
//! [`BLOCK_BYTES`] decodes on its own. Small or near-constant float tensors
//! also try an opaque zstd frame and keep the smaller. No tensor is stored
//! larger than its raw bytes plus a fixed frame overhead.
//!
//! `dedup` finds tensors whose bytes equal an earlier one's, which the
//! `.zstn` writer stores as REF records instead of encoding them again.
//!
//! No I/O: the writers own the files.

use super::{Compat, PackError, PackOptions};
use ckptfs_codec::plane::{self, encode_zstd_blocks};
use ckptfs_codec::rans;
use ckptfs_codec::transform::{self, BFLOAT16};
use ckptfs_codec::zstd::Params;
use ckptfs_format::ckx;
use ckptfs_format::frame::{
    block_grid, render_z4ai, render_zsp1, ElementAccess, Frame, PlaneOut, Transform, BLOCK_BYTES,
};
use ckptfs_format::safetensors::{self, Dtype};
use rayon::prelude::*;
use std::collections::HashMap;

/// Tensors smaller than this are stored opaque without trying transforms.
const TINY: usize = 64;
/// Float tensors up to this size also try an opaque zstd frame.
const TRY_OPAQUE_BELOW: usize = 1 << 20;

/// Compresses one tensor's bytes into a frame.
pub fn encode_tensor(dtype: Option<Dtype>, raw: &[u8], opts: PackOptions) -> Vec<u8> {
    if raw.len() < TINY {
        return opaque_frame(raw, opts);
    }
    let old_of = |raw: &[u8], w: usize| match w {
        2 if dtype == Some(Dtype::BF16) => bf16_frame(raw),
        2 => byteplane_frame(raw, 2),
        _ => fp32_frame(raw),
    };
    let old = |w: usize| old_of(raw, w);
    let split_w = match dtype {
        Some(Dtype::BF16) | Some(Dtype::F16) => Some(2),
        Some(Dtype::F32) => Some(4),
        _ => None,
    };
    let primary = match dtype {
        _ if opts.compat == Compat::Ckptfs && split_w.is_some() => {
            let w = split_w.expect("checked");
            let keep_split =
                |s: &[u8], o: &[u8]| s.len() as f64 <= o.len() as f64 * (1.0 + SPLIT_SLACK);
            if raw.len() <= 2 * SAMPLE_BYTES {
                let (s, o) = rayon::join(|| split_frame(raw, w), || old(w));
                Some(if keep_split(&s, &o) { s } else { o })
            } else {
                // Encoding both layouts in full cut compression speed to
                // a third, and the z4ai layout wins on few tensors: it is
                // encoded in full only when a sample of the tensor (four
                // pieces spread over it) does not keep the split frame by
                // half the slack (a split frame chosen so is at most about
                // SPLIT_SLACK larger than the z4ai one).
                let sample = sample_of(raw, w);
                let (s, (ss, so)) = rayon::join(
                    || split_frame(raw, w),
                    || rayon::join(|| split_frame(&sample, w), || old_of(&sample, w)),
                );
                if ss.len() as f64 <= so.len() as f64 * (1.0 + SPLIT_SLACK / 2.0) {
                    Some(s)
                } else {
                    let o = old(w);
                    Some(if keep_split(&s, &o) { s } else { o })
                }
            }
        }
        Some(Dtype::BF16) | Some(Dtype::F16) | Some(Dtype::F32) => {
            Some(old(split_w.expect("float")))
        }
        Some(Dtype::C64) => Some(byteplane_frame(raw, 4)),
        Some(Dtype::F64) => Some(byteplane_frame(raw, 8)),
        _ => None,
    };
    match primary {
        None => opaque_frame(raw, opts),
        Some(p) => {
            if raw.len() <= TRY_OPAQUE_BELOW || p.len() < raw.len() / 8 {
                let o = opaque_frame(raw, opts);
                if o.len() < p.len() {
                    return o;
                }
            }
            p
        }
    }
}

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
/// Same block grids as [`encode_tensor`] for the byte-plane and opaque
/// frames.
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
fn small_planes_frame(raw: &[u8], w: usize) -> Vec<u8> {
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
fn sparse_frame(raw: &[u8], w: usize) -> Option<Vec<u8>> {
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
/// Element counts without such a divisor keep [`byteplane_frame`].
fn xor_byteplane_frame(raw: &[u8], w: usize) -> Vec<u8> {
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
fn non_stationary(len: usize, chunks: &[[u64; 256]], runs: &[[u64; 256]]) -> bool {
    if runs.len() >= chunks.len() || len > 1 << 20 {
        return false;
    }
    let own: f64 = chunks.iter().map(counted_o0_bytes).sum();
    let shared: f64 = runs.iter().map(counted_o0_bytes).sum();
    own + (chunks.len() - runs.len()) as f64 * 256.0 < 0.98 * shared
}

/// The element-wise sum of byte histograms.
fn sum_histograms(hs: &[[u64; 256]]) -> [u64; 256] {
    let mut sum = [0u64; 256];
    for h in hs {
        sum.iter_mut().zip(h).for_each(|(a, b)| *a += b);
    }
    sum
}

/// Order-0 entropy in bytes of the bytes a histogram counted.
fn counted_o0_bytes(h: &[u64; 256]) -> f64 {
    hist_o0_bytes(h, h.iter().sum::<u64>() as usize)
}

/// zstd level of an XOR's zstd-block planes. On the low-entropy planes of
/// `scripts/bench-delta.sh`'s training steps level 1 is 1-9% smaller than
/// level 3 in total (level 3's extra short matches in sparse data cost
/// more than the literals they replace) and about twice as fast.
const XOR_ZSTD_LEVEL: i32 = 1;

/// Elements per block for an element size.
fn block_elems(elem_bytes: usize) -> usize {
    (BLOCK_BYTES as usize / elem_bytes).max(8)
}

/// Entropy-codes a plane with `k` rANS chunks, runs of `group` chunks
/// sharing one table (1: a table per chunk), or stores it if that is not
/// smaller.
fn encode_plane(data: &[u8], k: usize, group: usize) -> PlaneOut {
    if data.is_empty() {
        return stored_plane(data);
    }
    // Shared tables come from the runs' histograms, which for a plane of
    // at most the estimate's sample also give its estimate (one count of
    // the plane, not two).
    let runs = (group > 1).then(|| rans::run_histograms(data, k, group));
    let estimate = match &runs {
        Some(h) if data.len() <= O0_SAMPLE => counted_o0_bytes(&sum_histograms(h)),
        _ => estimate_o0_bytes(data),
    };
    encode_estimated(data, k, group, runs.as_deref(), estimate)
}

/// [`encode_plane`] with the histograms of its runs of `group` chunks and
/// of the whole plane already counted.
fn encode_plane_counted(
    data: &[u8],
    k: usize,
    group: usize,
    runs: &[[u64; 256]],
    total: &[u64; 256],
) -> PlaneOut {
    if data.is_empty() {
        return stored_plane(data);
    }
    encode_estimated(data, k, group, Some(runs), counted_o0_bytes(total))
}

fn stored_plane(data: &[u8]) -> PlaneOut {
    PlaneOut {
        method: plane::STORE,
        orig_len: data.len() as u64,
        payload: data.to_vec(),
    }
}

/// The rANS plane of `data` (tables from `runs` when given, else one per
/// chunk counted here), or the plane stored when its order-0 `estimate`
/// in bytes says rANS cannot win, or when it does not.
fn encode_estimated(
    data: &[u8],
    k: usize,
    group: usize,
    runs: Option<&[[u64; 256]]>,
    estimate: f64,
) -> PlaneOut {
    if estimate >= data.len() as f64 * 0.995 {
        return stored_plane(data);
    }
    let payload = match runs {
        Some(h) => rans::encode_method4_runs(data, k, group, h),
        None => rans::encode_method4(data, k),
    };
    if payload.len() >= data.len() {
        return stored_plane(data);
    }
    PlaneOut {
        method: plane::RANS_ADAPT,
        orig_len: data.len() as u64,
        payload,
    }
}

/// Planes larger than this estimate their entropy from their first bytes.
const O0_SAMPLE: usize = 1 << 20;

/// Order-0 entropy of `data` in bytes, from a sample for large planes.
fn estimate_o0_bytes(data: &[u8]) -> f64 {
    let sample: &[u8] = if data.len() > O0_SAMPLE {
        &data[..O0_SAMPLE]
    } else {
        data
    };
    o0_bytes(sample) * (data.len() as f64 / sample.len().max(1) as f64)
}

/// Order-0 entropy of `data` in bytes.
fn o0_bytes(data: &[u8]) -> f64 {
    hist_o0_bytes(&rans::histogram(data), data.len())
}

/// Order-0 entropy in bytes of `len` bytes with histogram `hist`.
fn hist_o0_bytes(hist: &[u64; 256], len: usize) -> f64 {
    let n = len as f64;
    let bits: f64 = hist
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -(c as f64) * p.log2()
        })
        .sum();
    bits / 8.0
}

/// Shortest rANS chunk in a frame of values. Shorter chunks fill more of
/// the SIMD decoder's 16 lanes in blocks of small tensors: 16 Ki gave
/// MiniLM's 384 x 384 matrices 9 chunks a block, 8 Ki gives 16 (MiniLM fp32
/// decodes about 30% faster, bf16 10%, for under 0.03% more bytes).
const MIN_CHUNK: usize = 8 << 10;
/// Shortest rANS chunk in an XOR delta frame: 8 Ki made
/// `scripts/bench-delta.sh`'s deltas 0.04-0.1% larger, over z4ai's.
const XOR_MIN_CHUNK: usize = 16 << 10;

/// rANS chunks for `blocks` blocks of `n` elements in total: up to
/// CHUNK_GROUP per block (the SIMD decoder decodes that many at once), none
/// shorter than `min` symbols.
fn rans_chunks(n: usize, blocks: usize, min: usize) -> usize {
    let per_block = n / blocks.max(1);
    blocks.max(1) * (per_block / min).clamp(1, rans::CHUNK_GROUP)
}

/// A chunk count k that divides n with chunks of at most `max` and at least
/// `max / 8` elements, so that zstd blocks of n/k elements and rANS chunks
/// `floor(j*n/k)` share their boundaries.
fn dividing_chunks(n: usize, max: usize) -> Option<usize> {
    if n <= max {
        return Some(1);
    }
    (n.div_ceil(max)..=n / (max / 8).max(1)).find(|k| n.is_multiple_of(*k))
}

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
fn bf16_frame(raw: &[u8]) -> Vec<u8> {
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
const SAMPLE_BYTES: usize = 4 << 20;

/// Four pieces of `SAMPLE_BYTES / 4` (whole `w`-byte elements), at the
/// start, a third, two thirds and the end of `raw`.
fn sample_of(raw: &[u8], w: usize) -> Vec<u8> {
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
fn split_frame(raw: &[u8], w: usize) -> Vec<u8> {
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
fn fp32_frame(raw: &[u8]) -> Vec<u8> {
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
fn byteplane_frame(raw: &[u8], w: usize) -> Vec<u8> {
    let n = raw.len() / w;
    let blocks = n.div_ceil(block_elems(w)).max(1);
    let k = rans_chunks(n, blocks, MIN_CHUNK);
    byteplane_frame_with(raw, w, k, k / blocks)
}

/// A byte-plane frame whose rANS planes have `k` chunks, a table for each
/// run of `group`.
fn byteplane_frame_with(raw: &[u8], w: usize, k: usize, group: usize) -> Vec<u8> {
    let n = raw.len() / w;
    let planes = split_planes(raw, w);
    let outs: Vec<PlaneOut> = planes
        .par_iter()
        .map(|p| encode_plane(p, k, group))
        .collect();
    render_z4ai(Transform::BytePlane(w as u8), &raw[n * w..], &outs)
}

/// The `w` byte planes of `raw`'s whole elements, split block by block in
/// parallel.
fn split_planes(raw: &[u8], w: usize) -> Vec<Vec<u8>> {
    let n = raw.len() / w;
    let e = block_elems(w);
    let mut planes: Vec<Vec<u8>> = (0..w).map(|_| vec![0u8; n]).collect();
    {
        // Split block by block in parallel: transpose each plane's chunks.
        let mut per_plane: Vec<Vec<&mut [u8]>> = planes
            .iter_mut()
            .map(|p| p.chunks_mut(e).collect())
            .collect();
        let mut jobs: Vec<(usize, Vec<&mut [u8]>)> = Vec::new();
        let nchunks = n.div_ceil(e);
        for j in (0..nchunks).rev() {
            let parts: Vec<&mut [u8]> = per_plane
                .iter_mut()
                .map(|v| v.pop().expect("chunk"))
                .collect();
            jobs.push((j, parts));
        }
        jobs.into_par_iter().for_each(|(j, mut parts)| {
            let a = j * e * w;
            let b = ((j + 1) * e).min(n) * w;
            transform::byteplane_split_into(&raw[a..b], &mut parts);
        });
    }
    planes
}

pub(super) fn opaque_frame(raw: &[u8], opts: PackOptions) -> Vec<u8> {
    let stored = || PlaneOut {
        method: plane::STORE,
        orig_len: raw.len() as u64,
        payload: raw.to_vec(),
    };
    let p = if raw.len() < TINY {
        stored()
    } else {
        let payload = encode_zstd_blocks(raw, BLOCK_BYTES as usize, opts.level);
        if payload.len() >= raw.len() {
            stored()
        } else {
            PlaneOut {
                method: plane::ZSTD_BLOCKS,
                orig_len: raw.len() as u64,
                payload,
            }
        }
    };
    render_z4ai(Transform::Opaque, &[], &[p])
}

/// A plane in zstd blocks of `block` bytes (level 1: the planes it is used
/// for are near-uniform, where Huffman does the work), or stored when that
/// is not smaller.
fn zstd_blocks_or_stored(data: &[u8], block: usize) -> PlaneOut {
    let payload = encode_zstd_blocks(data, block, 1);
    if payload.len() >= data.len() {
        PlaneOut {
            method: plane::STORE,
            orig_len: data.len() as u64,
            payload: data.to_vec(),
        }
    } else {
        PlaneOut {
            method: plane::ZSTD_BLOCKS,
            orig_len: data.len() as u64,
            payload,
        }
    }
}

/// The digests of a delta's XOR frame: as [`digests`], except that a
/// `ZSP1` frame longer than a block, which decodes only whole, is listed
/// in blocks of about [`BLOCK_BYTES`] (whole bytes of its bitmap: 8
/// elements), its tail in the last, which a reader decodes one at a time
/// from the frame's bitmap and values (`codec::sparse`). Every block's
/// payload is the whole frame, so its meta digest is that of one block.
pub(super) fn xor_digests(frame_bytes: &[u8], raw: &[u8]) -> Result<ckx::UnitDigests, PackError> {
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
pub(super) fn xor_grid<'a>(
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

/// The digests of one frame, computed exactly as the reader will.
pub(super) fn digests(frame_bytes: &[u8], raw: &[u8]) -> Result<ckx::UnitDigests, PackError> {
    let f = Frame::parse(frame_bytes)
        .map_err(|e| PackError::Internal(format!("own frame does not parse: {e}")))?;
    if f.decoded_len() != raw.len() as u64 {
        return Err(PackError::Internal("own frame has the wrong length".into()));
    }
    let (bounds, eb, access) =
        block_grid(&f, raw.len() as u64).map_err(|e| PackError::Internal(e.to_string()))?;
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

/// Assigns each tensor (in data order) a FRAME or a REF to an earlier one
/// with identical bytes.
pub(super) fn dedup(order: &[&safetensors::TensorEntry], data: &[u8]) -> Vec<Option<usize>> {
    // Candidates by length and a sampled fingerprint (head, middle, tail);
    // a full byte comparison decides. Hashing every byte would cost a full
    // pass over the input for what is almost always a miss.
    let fingerprint = |t: &safetensors::TensorEntry| -> (u64, u64) {
        let b = &data[t.begin as usize..t.end as usize];
        const S: usize = 4096;
        let mut h = ckptfs_format::digest::Xxh3::new();
        if b.len() <= 3 * S {
            h.update(b);
        } else {
            let mid = b.len() / 2 - S / 2;
            h.update(&b[..S]);
            h.update(&b[mid..mid + S]);
            h.update(&b[b.len() - S..]);
        }
        (t.len(), h.digest())
    };
    let mut seen: HashMap<(u64, u64), Vec<usize>> = HashMap::new();
    let mut refs = vec![None; order.len()];
    for (i, t) in order.iter().enumerate() {
        let bytes = &data[t.begin as usize..t.end as usize];
        let cands = seen.entry(fingerprint(t)).or_default();
        if let Some(&j) = cands
            .iter()
            .find(|&&j| &data[order[j].begin as usize..order[j].end as usize] == bytes)
        {
            refs[i] = Some(j);
        } else {
            cands.push(i);
        }
    }
    refs
}

#[cfg(test)]
mod tests;
