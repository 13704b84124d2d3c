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
//!   is kept (DELTA or FULL);
//! - no match (new, renamed, resized, other dtype): FULL.
//!
//! Frames are encoded in parallel in windows of about 256 MiB of target
//! and written as they complete. No I/O beyond `out`; the caller owns the
//! files and resolves the base.

use super::tensor::{digests, encode_tensor, encode_xor};
use super::{PackError, PackOptions};
use crate::format::ckx::{BlockDigest, UnitDigests};
use crate::format::delta::{
    self, render_head, render_record_head, DeltaKind, Trailer, UnitEntry, COPY_BLOCK,
};
use crate::format::safetensors::{self, TensorEntry};
use blake2::digest::{Update, VariableOutput};
use rayon::prelude::*;
use std::collections::HashMap;
use std::io::Write;
use xxhash_rust::xxh3::xxh3_64;

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

/// BLAKE2b with output length `N` (z4ai's `hashlib.blake2b(digest_size=N)`).
pub fn blake2b<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut h = blake2::Blake2bVar::new(N).expect("BLAKE2b output length in 1..=64");
    h.update(data);
    let mut out = [0u8; N];
    h.finalize_variable(&mut out).expect("output length N");
    out
}

/// One encoded record, ready to write.
struct Encoded {
    kind: DeltaKind,
    frame: Vec<u8>,
    reference: Option<(u64, [u8; 16])>,
    unit: UnitDigests,
}

fn copy_unit(raw: &[u8]) -> UnitDigests {
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

fn encode(
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
    let xor: Vec<u8> = raw
        .par_iter()
        .zip(b.par_iter())
        .map(|(x, y)| x ^ y)
        .collect();
    let (d, f) = rayon::join(
        || encode_xor(dtype, &xor, opts),
        || encode_tensor(dtype, raw, opts),
    );
    if d.len() + delta::Z4DL_HEADER < f.len() {
        // Block digests cover the target bytes each block serves.
        let mut unit = digests(&d, &xor)?;
        let mut start = 0usize;
        for blk in &mut unit.blocks {
            blk.data = xxh3_64(&raw[start..blk.end as usize]);
            start = blk.end as usize;
        }
        Ok(Encoded {
            kind: DeltaKind::Delta,
            frame: d,
            reference: Some((b.len() as u64, blake2b::<16>(b))),
            unit,
        })
    } else {
        let unit = digests(&f, raw)?;
        Ok(Encoded {
            kind: DeltaKind::Full,
            frame: f,
            reference: None,
            unit,
        })
    }
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
    let head = render_head(
        &header.raw,
        data.len() as u64,
        blake2b::<8>(bdata),
        order.len() as u32,
    );
    out.write_all(&head)?;
    let mut offset = head.len() as u64;
    let mut stats = DeltaStats {
        tensors: order.len(),
        raw_bytes: target.len() as u64,
        ..Default::default()
    };
    let mut units = Vec::with_capacity(order.len());
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        let mut bytes = 0u64;
        while j < order.len() && (j == i || bytes < 256 << 20) {
            bytes += order[j].len();
            j += 1;
        }
        let done: Vec<Encoded> = order[i..j]
            .par_iter()
            .map(|t| {
                let raw = &data[t.begin as usize..t.end as usize];
                let e = encode(t, raw, matched(t), opts)?;
                progress(raw.len() as u64);
                Ok(e)
            })
            .collect::<Result<_, PackError>>()?;
        for (t, e) in order[i..j].iter().zip(done) {
            let rh = render_record_head(
                &t.name,
                t.begin,
                t.end,
                e.kind,
                e.frame.len() as u64,
                e.reference,
            );
            out.write_all(&rh)?;
            out.write_all(&e.frame)?;
            match e.kind {
                DeltaKind::Copy => stats.copy += 1,
                DeltaKind::Delta => stats.delta += 1,
                DeltaKind::Full => stats.full += 1,
            }
            let len = (rh.len() + e.frame.len()) as u64;
            units.push(UnitEntry {
                record_offset: offset,
                record_len: len,
                record_digest: xxh3_64(&rh),
                frame_digest: e.unit.frame,
                meta_digest: e.unit.meta,
                blocks: e.unit.blocks,
            });
            offset += len;
        }
        i = j;
    }
    let trailer = Trailer {
        flags: 0,
        depth,
        z4dm_len: offset,
        head_digest: xxh3_64(&head),
        base_len: base.bytes.len() as u64,
        base_digest: xxh3_64(base.bytes),
        base_fingerprint: base.fingerprint,
        base_path: base.rel_path.clone(),
        units,
    }
    .render();
    out.write_all(&trailer)?;
    stats.stored_bytes = offset + trailer.len() as u64;
    Ok(stats)
}
