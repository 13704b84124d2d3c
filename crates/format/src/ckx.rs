//! The ckptfs integrity extension (`CKX1`): checksums for every byte of a
//! ckptfs-written `.zstn`, stored where z4ai ignores it.
//!
//! ZSTN v3 has no checksum fields, but a reader follows only the footer and
//! the index, so bytes in the frames section that no record references are
//! skipped. ckptfs writes this block between the last frame and the index.
//! z4ai's own files have their frames back to back up to the index, so any
//! unreferenced bytes there must be a valid extension, or the file is corrupt.
//! `ckptfs seal` adds the same block to a z4ai-written file (frames left in
//! place) and marks it with the [`FLAG_SEALED`] flag.
//!
//! Layout (all integers little-endian, digests are xxh3-64 with seed 0; see
//! doc/FORMAT.md for the normative description):
//!
//! ```text
//! [4] "CKX1" ; u16 version = 1 ; u16 flags ; u32 n_units
//!                    flags: bit 0 = sealed (added to a z4ai-written file
//!                    by `ckptfs seal`), other bits 0; readers ignore them
//! u64 head_digest    file bytes [0, frames_start)       (magic .. data_len;
//!                    for contiguous = 0 also the frame_len field)
//! u64 index_digest   file bytes [index_offset, file_len) (index + footer;
//!                    empty for contiguous = 0, whose block follows the frame)
//! n_units × {        one per FRAME record, in index order
//!     u64 frame_digest   the whole frame
//!     u64 meta_digest    frame bytes outside every block payload, in order
//!     u32 n_blocks
//!     n_blocks × { u64 end ; u64 payload_digest ; u64 data_digest }
//! }                  end = cumulative decoded bytes of the unit after this
//!                    block; payload_digest covers the block's payload
//!                    ranges (concatenated, plane order); data_digest the
//!                    block's decoded bytes
//! u64 body_digest    everything above, from "CKX1"
//! u64 ext_len        the whole extension, trailer included
//! [4] "CKX1"
//! ```

use super::digest::xxh3_64;
use crate::digest::Xxh3;
use crate::frame::ElementAccess;
use crate::zstn::{Layout, RecordKind, Zstn};
use std::ops::Range;

pub const MAGIC: &[u8; 4] = b"CKX1";
pub const VERSION: u16 = 1;
/// `flags` bit: the block was added to a z4ai-written file by `ckptfs seal`
/// (ckptfs's writer leaves it clear). Informational: it changes nothing a
/// reader checks.
pub const FLAG_SEALED: u16 = 1;
const TRAILER: usize = 20;
const FIXED: usize = 4 + 2 + 2 + 4 + 8 + 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDigest {
    pub end: u64,
    pub payload: u64,
    pub data: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitDigests {
    pub frame: u64,
    pub meta: u64,
    pub blocks: Vec<BlockDigest>,
}

/// A parsed extension. The block digests of every unit are kept in one
/// array (`units[u].first_block` indexes it), so that an archive of 10^6
/// small tensors costs two allocations here, not 10^6.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extension {
    /// The `flags` field ([`FLAG_SEALED`]).
    pub flags: u16,
    pub head_digest: u64,
    pub index_digest: u64,
    pub units: Vec<UnitHead>,
    pub blocks: Vec<BlockDigest>,
    /// Where the extension lies in the file.
    pub range: Range<u64>,
}

/// The per-unit part of a parsed extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitHead {
    pub frame: u64,
    pub meta: u64,
    /// Index of the unit's first block digest in [`Extension::blocks`];
    /// its blocks run to the next unit's first.
    pub first_block: u64,
}

/// Hash of several ranges of `bytes`, concatenated.
pub fn hash_ranges(bytes: &[u8], ranges: &[Range<usize>]) -> u64 {
    let mut h = Xxh3::new();
    for r in ranges {
        h.update(&bytes[r.clone()]);
    }
    h.digest()
}

/// The complement of `covered` inside `0..len`, in order.
pub fn complement(len: usize, covered: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut v: Vec<Range<usize>> = covered.iter().filter(|r| !r.is_empty()).cloned().collect();
    v.sort_by_key(|r| r.start);
    let mut out = Vec::new();
    let mut pos = 0;
    for r in v {
        if r.start > pos {
            out.push(pos..r.start);
        }
        pos = pos.max(r.end);
    }
    if pos < len {
        out.push(pos..len);
    }
    out
}

/// Payload ranges (relative to the frame) that block `b` of a unit reads.
/// Without element access the unit is one block: the whole frame.
pub fn block_payload(
    access: Option<&ElementAccess<'_>>,
    frame_len: usize,
    bounds: &[u64],
    elem_bytes: u64,
    b: usize,
) -> Vec<Range<usize>> {
    match access {
        None => std::iter::once(0..frame_len).collect(),
        Some(acc) => {
            let body = acc.elements();
            let a = (bounds[b] / elem_bytes).min(body);
            let e = (bounds[b + 1] / elem_bytes).min(body);
            acc.payload_ranges(a, e)
        }
    }
}

/// Digests of one unit: `blocks` are the decoded bytes of each block.
pub fn unit_digests(
    frame: &[u8],
    access: Option<&ElementAccess<'_>>,
    bounds: &[u64],
    elem_bytes: u64,
    blocks: &[&[u8]],
) -> UnitDigests {
    let data: Vec<u64> = blocks.iter().map(|b| xxh3_64(b)).collect();
    unit_digests_from(frame, access, bounds, elem_bytes, &data)
}

/// Digests of one unit whose blocks' decoded bytes were already hashed:
/// `data[b]` is the xxh3 of block `b` (so a caller can decode and hash
/// one block at a time).
pub fn unit_digests_from(
    frame: &[u8],
    access: Option<&ElementAccess<'_>>,
    bounds: &[u64],
    elem_bytes: u64,
    data: &[u64],
) -> UnitDigests {
    let mut all = Vec::new();
    let mut out = Vec::with_capacity(data.len());
    for (b, &data) in data.iter().enumerate() {
        let ranges = block_payload(access, frame.len(), bounds, elem_bytes, b);
        out.push(BlockDigest {
            end: bounds[b + 1],
            payload: hash_ranges(frame, &ranges),
            data,
        });
        all.extend(ranges);
    }
    UnitDigests {
        frame: xxh3_64(frame),
        meta: hash_ranges(frame, &complement(frame.len(), &all)),
        blocks: out,
    }
}

/// The meta digest of a frame as a reader computes it from its grid.
pub fn meta_digest(
    frame: &[u8],
    access: Option<&ElementAccess<'_>>,
    bounds: &[u64],
    elem_bytes: u64,
) -> u64 {
    hash_ranges(frame, &meta_ranges(frame.len(), access, bounds, elem_bytes))
}

/// The frame bytes outside every block payload range (what `meta_digest`
/// covers), in order: relative to the frame.
pub fn meta_ranges(
    frame_len: usize,
    access: Option<&ElementAccess<'_>>,
    bounds: &[u64],
    elem_bytes: u64,
) -> Vec<Range<usize>> {
    let mut all = Vec::new();
    for b in 0..bounds.len() - 1 {
        all.extend(block_payload(access, frame_len, bounds, elem_bytes, b));
    }
    complement(frame_len, &all)
}

/// The regions the head and index digests cover: `[0, head_end)` and
/// `[index_start, file_len)`. An opaque layout has no index: its head runs
/// up to the frame and its "index" region is empty.
pub fn regions(zstn: &Zstn) -> (u64, u64) {
    match &zstn.layout {
        Layout::Indexed {
            frames_start,
            index_offset,
            ..
        } => (*frames_start, *index_offset),
        Layout::Opaque { frame_offset, .. } => (*frame_offset, zstn.file_len),
    }
}

/// Length of an extension for these block counts.
pub fn encoded_len(blocks_per_unit: &[usize]) -> usize {
    FIXED
        + blocks_per_unit
            .iter()
            .map(|n| 8 + 8 + 4 + n * 24)
            .sum::<usize>()
        + TRAILER
}

/// Serialises an extension as ckptfs's writer does (flags 0).
pub fn render(head_digest: u64, index_digest: u64, units: &[UnitDigests]) -> Vec<u8> {
    render_with_flags(0, head_digest, index_digest, units)
}

/// Serialises an extension with `flags` ([`FLAG_SEALED`] for `ckptfs seal`).
pub fn render_with_flags(
    flags: u16,
    head_digest: u64,
    index_digest: u64,
    units: &[UnitDigests],
) -> Vec<u8> {
    let counts: Vec<usize> = units.iter().map(|u| u.blocks.len()).collect();
    let len = encoded_len(&counts);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(&(units.len() as u32).to_le_bytes());
    v.extend_from_slice(&head_digest.to_le_bytes());
    v.extend_from_slice(&index_digest.to_le_bytes());
    for u in units {
        v.extend_from_slice(&u.frame.to_le_bytes());
        v.extend_from_slice(&u.meta.to_le_bytes());
        v.extend_from_slice(&(u.blocks.len() as u32).to_le_bytes());
        for b in &u.blocks {
            v.extend_from_slice(&b.end.to_le_bytes());
            v.extend_from_slice(&b.payload.to_le_bytes());
            v.extend_from_slice(&b.data.to_le_bytes());
        }
    }
    let body = xxh3_64(&v);
    v.extend_from_slice(&body.to_le_bytes());
    v.extend_from_slice(&(len as u64).to_le_bytes());
    v.extend_from_slice(MAGIC);
    debug_assert_eq!(v.len(), len);
    v
}

/// Finds and parses the extension of a parsed container. `Ok(None)` for a
/// file with no unreferenced bytes before its index (a z4ai file).
pub fn find(bytes: &[u8], zstn: &Zstn) -> Result<Option<Extension>, String> {
    let (frames_end, ext_end) = match &zstn.layout {
        Layout::Indexed {
            records,
            frames_start,
            index_offset,
            ..
        } => {
            let end = records
                .iter()
                .filter_map(|r| match r.kind {
                    RecordKind::Frame { offset, len } => Some(offset + len),
                    RecordKind::Ref(_) => None,
                })
                .max()
                .unwrap_or(*frames_start);
            (end, *index_offset)
        }
        Layout::Opaque {
            frame_offset,
            frame_len,
        } => (frame_offset + frame_len, zstn.file_len),
    };
    if frames_end > ext_end {
        return Err("frames overlap the index".into());
    }
    let index_offset = &ext_end;
    let gap = (*index_offset - frames_end) as usize;
    if gap == 0 {
        return Ok(None);
    }
    let corrupt = |what: &str| {
        Err(format!(
            "{gap} unreferenced bytes at offset {frames_end} before the index are not a valid CKX1 checksum block ({what})"
        ))
    };
    let ext = &bytes[frames_end as usize..*index_offset as usize];
    if ext.len() < FIXED + TRAILER || &ext[..4] != MAGIC || &ext[ext.len() - 4..] != MAGIC {
        return corrupt("bad magic");
    }
    let t = &ext[ext.len() - TRAILER..];
    let body_digest = u64::from_le_bytes(t[..8].try_into().unwrap());
    let ext_len = u64::from_le_bytes(t[8..16].try_into().unwrap());
    if ext_len != ext.len() as u64 {
        return corrupt("length");
    }
    let body = &ext[..ext.len() - TRAILER];
    if xxh3_64(body) != body_digest {
        return corrupt("checksum mismatch");
    }
    let version = u16::from_le_bytes(body[4..6].try_into().unwrap());
    if version != VERSION {
        return Err(format!(
            "checksum block version {version} is not supported (this build reads version {VERSION})"
        ));
    }
    let flags = u16::from_le_bytes(body[6..8].try_into().unwrap());
    let n_units = u32::from_le_bytes(body[8..12].try_into().unwrap()) as usize;
    let head_digest = u64::from_le_bytes(body[12..20].try_into().unwrap());
    let index_digest = u64::from_le_bytes(body[20..28].try_into().unwrap());
    let mut pos = FIXED;
    let rd = |pos: &mut usize, n: usize| -> Option<&[u8]> {
        let s = body.get(*pos..*pos + n)?;
        *pos += n;
        Some(s)
    };
    if n_units > body.len() / 20 {
        return corrupt("unit count");
    }
    let mut units = Vec::with_capacity(n_units);
    // Every block takes 24 bytes of the body.
    let mut blocks = Vec::with_capacity(body.len() / 24);
    for _ in 0..n_units {
        let Some(h) = rd(&mut pos, 20) else {
            return corrupt("truncated");
        };
        let frame = u64::from_le_bytes(h[..8].try_into().unwrap());
        let meta = u64::from_le_bytes(h[8..16].try_into().unwrap());
        let nb = u32::from_le_bytes(h[16..20].try_into().unwrap()) as usize;
        if nb > (body.len() - pos) / 24 {
            return corrupt("block count");
        }
        units.push(UnitHead {
            frame,
            meta,
            first_block: blocks.len() as u64,
        });
        for _ in 0..nb {
            let b = rd(&mut pos, 24).expect("bounded above");
            blocks.push(BlockDigest {
                end: u64::from_le_bytes(b[..8].try_into().unwrap()),
                payload: u64::from_le_bytes(b[8..16].try_into().unwrap()),
                data: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            });
        }
    }
    if pos != body.len() {
        return corrupt("trailing bytes");
    }
    blocks.shrink_to_fit();
    Ok(Some(Extension {
        flags,
        head_digest,
        index_digest,
        units,
        blocks,
        range: frames_end..*index_offset,
    }))
}

impl Extension {
    /// Added to a z4ai-written file by `ckptfs seal` (else written by
    /// ckptfs's own writer).
    pub fn sealed(&self) -> bool {
        self.flags & FLAG_SEALED != 0
    }

    /// The block digests of unit `unit`.
    pub fn unit_blocks(&self, unit: usize) -> &[BlockDigest] {
        let first = self.units[unit].first_block as usize;
        let end = self
            .units
            .get(unit + 1)
            .map_or(self.blocks.len(), |u| u.first_block as usize);
        &self.blocks[first..end]
    }

    /// Checks the head and index digests and the unit count (at open).
    pub fn verify_structure(
        &self,
        bytes: &[u8],
        zstn: &Zstn,
        n_units: usize,
    ) -> Result<(), String> {
        let (head_end, index_start) = regions(zstn);
        if xxh3_64(&bytes[..head_end as usize]) != self.head_digest {
            return Err("checksum mismatch in the container head (header JSON or lengths)".into());
        }
        if xxh3_64(&bytes[index_start as usize..]) != self.index_digest {
            return Err("checksum mismatch in the index or footer".into());
        }
        if self.units.len() != n_units {
            return Err(format!(
                "checksum block lists {} frames, the index has {n_units}",
                self.units.len()
            ));
        }
        Ok(())
    }

    /// Checks a unit's block grid and frame metadata (once per unit).
    pub fn verify_grid(&self, unit: usize, bounds: &[u64], meta: u64) -> Result<(), String> {
        let blocks = self.unit_blocks(unit);
        if blocks.len() != bounds.len() - 1
            || blocks.iter().zip(&bounds[1..]).any(|(b, &e)| b.end != e)
        {
            return Err("block layout differs from the checksum block".into());
        }
        if self.units[unit].meta != meta {
            return Err("checksum mismatch in frame headers or tables".into());
        }
        Ok(())
    }

    pub fn verify_payload(
        &self,
        unit: usize,
        block: usize,
        frame: &[u8],
        ranges: &[Range<usize>],
    ) -> Result<(), String> {
        if hash_ranges(frame, ranges) != self.unit_blocks(unit)[block].payload {
            return Err(format!(
                "checksum mismatch in the compressed bytes of block {block}"
            ));
        }
        Ok(())
    }

    pub fn verify_data(&self, unit: usize, block: usize, data: &[u8]) -> Result<(), String> {
        if xxh3_64(data) != self.unit_blocks(unit)[block].data {
            return Err(format!(
                "checksum mismatch in the decoded bytes of block {block}"
            ));
        }
        Ok(())
    }

    pub fn verify_frame(&self, unit: usize, frame: &[u8]) -> Result<(), String> {
        if xxh3_64(frame) != self.units[unit].frame {
            return Err("checksum mismatch in the frame".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zstn::{render_footer, render_head, render_index};

    /// A zero-tensor ZSTN file with `ext` between the head and the index.
    fn file_with(ext: &[u8]) -> Vec<u8> {
        let mut f = render_head(b"{}      ", 0, true);
        f.extend_from_slice(ext);
        let idx = render_index(&[]);
        let off = f.len() as u64;
        f.extend_from_slice(&idx);
        f.extend_from_slice(&render_footer(off, idx.len() as u64));
        f
    }

    #[test]
    fn the_sealed_flag_round_trips_and_the_writer_leaves_it_clear() {
        assert_eq!(render(1, 2, &[]), render_with_flags(0, 1, 2, &[]));
        for (flags, sealed) in [(0, false), (FLAG_SEALED, true)] {
            let f = file_with(&render_with_flags(flags, 1, 2, &[]));
            let z = Zstn::parse(&f).unwrap();
            let e = find(&f, &z).unwrap().expect("a CKX1 block");
            assert_eq!((e.flags, e.sealed()), (flags, sealed));
        }
    }
}
