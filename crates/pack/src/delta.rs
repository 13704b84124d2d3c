//! The delta writer: a target `.safetensors` and the presented bytes of its
//! base in, ckptfs's delta archive (`.z4dm`: a z4ai `Z4DM` plus the `CKD1`
//! trailer, `format::delta`) out.
//!
//! Tensors are matched by name, dtype and byte length, as z4ai does (a
//! reshape to the same length keeps its bytes: the target header, stored
//! verbatim, carries the new shape). Per target tensor:
//! - equal to its match: COPY (nothing stored);
//! - a match that differs: the XOR of both ([`super::tensor::encode_xor`]:
//!   byte-plane rANS or opaque zstd, on the per-tensor encoder's block
//!   grids, so any block decodes alone), and the tensor alone; the smaller
//!   is kept (DELTA or FULL). A float tensor is not packed alone when its
//!   delta is well below what its own frame can reach ([`full_cannot_win`]);
//!   that halves the work of a dense training step;
//! - no match (new, renamed, resized, other dtype): FULL.
//!
//! Frames are encoded in parallel in windows of about 256 MiB of target
//! and written as they complete. No I/O beyond `out`; the caller owns the
//! files and resolves the base.

use super::tensor::{digests, encode_tensor, encode_xor, xor_digests};
use super::{PackError, PackOptions};
use ckptfs_codec::xor_delta::xor_of;
use ckptfs_format::ckx::{BlockDigest, UnitDigests};
use ckptfs_format::delta::{
    self, render_head, render_record_head, DeltaKind, Trailer, UnitEntry, COPY_BLOCK,
};
use ckptfs_format::digest::xxh3_64;
use ckptfs_format::safetensors::{self, Dtype, TensorEntry};
use ckptfs_format::z4digest::base_and_reference_digests;
use rayon::prelude::*;
use std::collections::HashMap;
use std::io::Write;

/// The base as the writer needs it.
pub struct DeltaBase<'a> {
    /// Its presented bytes (a whole `.safetensors`).
    pub bytes: &'a [u8],
    /// Its stored path relative to the output's directory.
    pub rel_path: String,
    /// Its chain depth: 0 standalone, else its own trailer's depth.
    pub depth: u32,
    /// `ArchiveView::fingerprint` of the base archive (0: none).
    pub fingerprint: u64,
}

/// What [`pack_delta`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeltaStats {
    pub tensors: usize,
    pub copy: usize,
    pub delta: usize,
    pub full: usize,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
}

/// One encoded record, ready to write.
pub(super) struct Encoded {
    pub(super) kind: DeltaKind,
    pub(super) frame: Vec<u8>,
    /// DELTA: the base tensor's length (its digest is added when written).
    pub(super) reference: Option<u64>,
    pub(super) unit: UnitDigests,
}

pub(super) fn copy_unit(raw: &[u8]) -> UnitDigests {
    let n = raw.len() as u64;
    let mut blocks = Vec::new();
    let mut pos = 0u64;
    loop {
        let end = (pos + COPY_BLOCK).min(n);
        blocks.push(BlockDigest {
            end,
            payload: 0,
            data: xxh3_64(&raw[pos as usize..end as usize]),
        });
        pos = end;
        if pos >= n {
            break;
        }
    }
    UnitDigests {
        frame: 0,
        meta: 0,
        blocks,
    }
}

pub(super) fn encode(
    t: &TensorEntry,
    raw: &[u8],
    base: Option<&[u8]>,
    opts: PackOptions,
) -> Result<Encoded, PackError> {
    let dtype = t.known_dtype();
    let Some(b) = base else {
        let frame = encode_tensor(dtype, raw, opts);
        let unit = digests(&frame, raw)?;
        return Ok(Encoded {
            kind: DeltaKind::Full,
            frame,
            reference: None,
            unit,
        });
    };
    if b == raw {
        return Ok(Encoded {
            kind: DeltaKind::Copy,
            frame: Vec::new(),
            reference: None,
            unit: copy_unit(raw),
        });
    }
    let xor = xor_of(raw, b, XOR_CHUNK);
    let d = encode_xor(dtype, &xor, opts);
    let f = (!full_cannot_win(dtype, raw, d.len())).then(|| encode_tensor(dtype, raw, opts));
    if f.as_ref()
        .is_none_or(|f| d.len() + delta::Z4DL_HEADER < f.len())
    {
        // Block digests cover the target bytes each block serves (the
        // frame decodes to the XOR, of the same length and block grid).
        let unit = xor_digests(&d, raw)?;
        Ok(Encoded {
            kind: DeltaKind::Delta,
            frame: d,
            reference: Some(b.len() as u64),
            unit,
        })
    } else {
        let f = f.expect("kept only when smaller");
        let unit = digests(&f, raw)?;
        Ok(Encoded {
            kind: DeltaKind::Full,
            frame: f,
            reference: None,
            unit,
        })
    }
}

/// Bytes per job of the parallel XOR.
const XOR_CHUNK: usize = 1 << 20;

/// True when a float tensor's own frame cannot beat a delta of
/// `delta_len` bytes, so packing it alone is skipped (about half the work
/// of a dense training step): the delta is below 80% of an estimate of the
/// smallest the tensor's frame can be, from up to four 64 KiB slices of
/// it: the order-0 entropy of their byte planes (ckptfs's float frames come
/// within a few percent of it on weights) or their zstd level-1 size,
/// whichever is smaller (repeats that an order-0 model misses, such as a
/// tiled tensor, show there, if they are much closer than the slice
/// length). Other dtypes and tensors under 64 KiB are always packed both
/// ways.
fn full_cannot_win(dtype: Option<Dtype>, raw: &[u8], delta_len: usize) -> bool {
    const SLICE: usize = 64 << 10;
    let w = match dtype {
        Some(Dtype::BF16) | Some(Dtype::F16) => 2,
        Some(Dtype::F32) => 4,
        Some(Dtype::F64) => 8,
        _ => return false,
    };
    if raw.len() < 64 << 10 {
        return false;
    }
    let parts: Vec<&[u8]> = if raw.len() > 4 * SLICE {
        (0..4)
            .map(|k| {
                let at = (raw.len() - SLICE) / 3 * k;
                &raw[at - at % w..][..SLICE]
            })
            .collect()
    } else {
        raw.chunks(SLICE).collect()
    };
    let sampled: usize = parts.iter().map(|p| p.len()).sum();
    let (o0_bits, lz): (f64, usize) = parts
        .par_iter()
        .map(|c| {
            let mut h = vec![[0u64; 256]; w];
            for e in c.chunks_exact(w) {
                for (hj, &x) in h.iter_mut().zip(e) {
                    hj[x as usize] += 1;
                }
            }
            let bits: f64 = h
                .iter()
                .map(|h| {
                    let n = h.iter().sum::<u64>() as f64;
                    h.iter()
                        .filter(|&&c| c > 0)
                        .map(|&c| -(c as f64) * (c as f64 / n).log2())
                        .sum::<f64>()
                })
                .sum();
            (bits, ckptfs_codec::zstd::compress(c, 1).len())
        })
        .reduce(|| (0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let estimate = (o0_bits / 8.0).min(lz as f64) * (raw.len() as f64 / sampled as f64);
    (delta_len as f64) < 0.8 * estimate
}

/// Writes `target` (a whole `.safetensors`) as a delta against `base` into
/// `out`. Both are validated before the first byte is written.
pub fn pack_delta(
    target: &[u8],
    base: &DeltaBase<'_>,
    out: &mut dyn Write,
    opts: PackOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<DeltaStats, PackError> {
    let (header, data) = safetensors::split_file(target)?;
    let (bheader, bdata) = safetensors::split_file(base.bytes)?;
    if !header.tiles(data.len() as u64) {
        return Err(PackError::Internal(
            "the tensors do not tile the data buffer (holes or aliasing), which a Z4DM cannot \
             record: pack it standalone"
                .into(),
        ));
    }
    delta::check_base_path(&base.rel_path).map_err(PackError::Internal)?;
    let depth = base.depth + 1;
    if depth > delta::MAX_CHAIN {
        return Err(PackError::Internal(format!(
            "the base is a delta of depth {}: a chain is at most {} deltas (re-base first)",
            base.depth,
            delta::MAX_CHAIN
        )));
    }
    let by_name: HashMap<&str, &TensorEntry> = bheader
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let order = header.data_order();
    let matched = |t: &TensorEntry| -> Option<&[u8]> {
        let b = by_name.get(t.name.as_str())?;
        (b.dtype == t.dtype && b.len() == t.len()).then(|| &bdata[b.begin as usize..b.end as usize])
    };
    let mut stats = DeltaStats {
        tensors: order.len(),
        raw_bytes: target.len() as u64,
        ..Default::default()
    };
    let mut units = Vec::with_capacity(order.len());
    let mut heads = Vec::with_capacity(order.len());
    // The base's whole-content digests (z4ai's BLAKE2b of its data buffer
    // for the head, xxh3 for the trailer) are serial passes: they run
    // beside the first window's encoding, and the head is written after.
    // The BLAKE2b of every base tensor a DELTA may need (matched, and not
    // equal) runs in the same pass, in the SIMD lanes beside the long one.
    let mut base_digests: Option<(u64, u64)> = None;
    let candidates: Vec<(usize, &[u8])> = order
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let b = matched(t)?;
            (b != &data[t.begin as usize..t.end as usize]).then_some((i, b))
        })
        .collect();
    let mut ref_digests: HashMap<usize, [u8; 16]> = HashMap::new();
    let mut offset = 0u64;
    let mut i = 0;
    loop {
        let mut j = i;
        let mut bytes = 0u64;
        while j < order.len() && (j == i || bytes < 256 << 20) {
            bytes += order[j].len();
            j += 1;
        }
        let window = || -> Result<Vec<Encoded>, PackError> {
            order[i..j]
                .par_iter()
                .map(|t| {
                    let raw = &data[t.begin as usize..t.end as usize];
                    let e = encode(t, raw, matched(t), opts)?;
                    progress(raw.len() as u64);
                    Ok(e)
                })
                .collect()
        };
        let done = match base_digests {
            Some(_) => window()?,
            None => {
                let ((b8, refs, xxh), done) = rayon::join(
                    || {
                        let bases: Vec<&[u8]> = candidates.iter().map(|c| c.1).collect();
                        let (b8, refs) = base_and_reference_digests(bdata, &bases);
                        (b8, refs, xxh3_64(base.bytes))
                    },
                    window,
                );
                ref_digests = candidates.iter().map(|c| c.0).zip(refs).collect();
                let head = render_head(&header.raw, data.len() as u64, b8, order.len() as u32);
                out.write_all(&head)?;
                offset = head.len() as u64;
                base_digests = Some((xxh3_64(&head), xxh));
                done?
            }
        };
        for (k, (t, e)) in order[i..j].iter().zip(done).enumerate() {
            let reference = match e.reference {
                Some(len) => {
                    let d = ref_digests.get(&(i + k)).ok_or_else(|| {
                        PackError::Internal(format!("tensor {:?}: no base digest", t.name))
                    })?;
                    Some((len, *d))
                }
                None => None,
            };
            let rh = render_record_head(
                &t.name,
                t.begin,
                t.end,
                e.kind,
                e.frame.len() as u64,
                reference,
            );
            out.write_all(&rh)?;
            out.write_all(&e.frame)?;
            match e.kind {
                DeltaKind::Copy => stats.copy += 1,
                DeltaKind::Delta => stats.delta += 1,
                DeltaKind::Full => stats.full += 1,
            }
            heads.push(xxh3_64(&rh));
            let len = (rh.len() + e.frame.len()) as u64;
            units.push(UnitEntry {
                record_offset: offset,
                record_len: len,
                record_digest: 0,
                frame_digest: e.unit.frame,
                meta_digest: e.unit.meta,
                blocks: e.unit.blocks,
            });
            offset += len;
        }
        i = j;
        if i >= order.len() {
            break;
        }
    }
    let (head_digest, base_digest) = base_digests.expect("the first window ran");
    let trailer = Trailer {
        flags: 0,
        depth,
        z4dm_len: offset,
        head_digest,
        base_len: base.bytes.len() as u64,
        base_digest,
        base_fingerprint: base.fingerprint,
        base_path: base.rel_path.clone(),
        records_digest: Some(delta::records_digest(heads)),
        units,
    }
    .render();
    out.write_all(&trailer)?;
    stats.stored_bytes = offset + trailer.len() as u64;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` f32 weights in [-0.02, 0.02) from a fixed xorshift.
    fn weights(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 * 0.04 - 0.02).to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn full_is_skipped_only_for_a_small_delta_of_plain_weights() {
        let raw = weights(1 << 20, 7);
        let f32 = Some(Dtype::F32);
        assert!(full_cannot_win(f32, &raw, raw.len() / 10));
        assert!(!full_cannot_win(f32, &raw, raw.len() * 3 / 4));
        // Not a float, or too small to bother: always both ways.
        assert!(!full_cannot_win(Some(Dtype::I32), &raw, 1));
        assert!(!full_cannot_win(f32, &raw[..32 << 10], 1));
    }

    #[test]
    fn a_tiled_tensor_is_still_packed_alone() {
        // Random bytes per element (high order-0 entropy), repeated every
        // 4 KiB: zstd codes it in a few KiB, so a 10% delta must not stop
        // the full frame from being tried. (Repeats further apart than a
        // good part of a 64 KiB slice are not seen: see the doc.)
        let tile = weights(1 << 10, 3);
        let raw: Vec<u8> = tile.iter().copied().cycle().take(4 << 20).collect();
        assert!(!full_cannot_win(Some(Dtype::F32), &raw, raw.len() / 10));
        let plain = weights(1 << 20, 3);
        assert!(full_cannot_win(Some(Dtype::F32), &plain, raw.len() / 10));
    }
}
