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
//!
//! Here: the choice of frame per tensor, the digests and `dedup`. Beside
//! it: `float`, the float layouts (split-float, bit-field, byte-plane);
//! `xor`, a delta's XOR frames; `planes`, a plane's entropy coding, chunk
//! counts and the byte-plane split they share.

use super::{Compat, PackError, PackOptions};
use ckptfs_codec::plane::{self, encode_zstd_blocks};
use ckptfs_format::ckx;
use ckptfs_format::frame::{block_grid, render_z4ai, Frame, PlaneOut, Transform, BLOCK_BYTES};
use ckptfs_format::safetensors::{self, Dtype};
use std::collections::HashMap;

mod float;
mod planes;
mod xor;

pub use float::SPLIT_SLACK;
use float::{bf16_frame, byteplane_frame, fp32_frame, sample_of, split_frame, SAMPLE_BYTES};
pub use xor::{encode_xor, SMALL_XOR, SPARSE_MAX};
pub(super) use xor::{xor_digests, xor_grid};

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
