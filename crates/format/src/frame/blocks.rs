//! The block grid of a frame ([`block_grid`]) and random access by element
//! into a frame whose planes are all block-structured ([`ElementAccess`]):
//! which blocks there are and which payload bytes each one reads.

use super::{Frame, Transform, Z4aiFrame, BLOCK_BYTES, MAX_BLOCK_BYTES};
use crate::error::{CodecError, Result};
use crate::plane::{self, PlaneBlocks};
use std::ops::Range;

fn too_large(what: String, bytes: u64) -> CodecError {
    CodecError::TooLarge {
        what,
        bytes,
        limit: MAX_BLOCK_BYTES,
    }
}

/// The block grid of a frame that decodes to `decoded_len` bytes: boundaries
/// in decoded bytes (the last equals `decoded_len`; the tail belongs to the
/// last block), the element size (0 when the frame is one whole block), and
/// the element access used to decode sub-blocks. Reader and writer both use
/// this, so checksums computed per block agree.
///
/// Every block is at most [`MAX_BLOCK_BYTES`], and so is every piece of a
/// plane that decoding a block decodes at once (a method-2 zstd block, a
/// method-4 chunk); a frame that breaks this is refused here, so that
/// nothing is ever allocated from its lengths.
pub fn block_grid<'a>(
    frame: &Frame<'a>,
    decoded_len: u64,
) -> Result<(Vec<u64>, u64, Option<ElementAccess<'a>>)> {
    let whole = || -> Result<(Vec<u64>, u64, Option<ElementAccess<'a>>)> {
        if decoded_len > MAX_BLOCK_BYTES {
            return Err(too_large("the frame (one block)".into(), decoded_len));
        }
        Ok((vec![0, decoded_len], 0, None))
    };
    let Some(access) = frame.element_access()? else {
        return whole();
    };
    if decoded_len == 0 {
        return whole();
    }
    let eb = access.frame.elem_bytes();
    let mut bounds: Vec<u64> = access.grid().iter().map(|e| e * eb).collect();
    *bounds.last_mut().expect("grid has two bounds") = decoded_len;
    for (b, w) in bounds.windows(2).enumerate() {
        if w[1] - w[0] > MAX_BLOCK_BYTES {
            return Err(too_large(format!("block {b}"), w[1] - w[0]));
        }
    }
    if let Some((plane, piece)) = access.largest_piece() {
        if piece > MAX_BLOCK_BYTES {
            return Err(too_large(format!("a block of plane {plane}"), piece));
        }
    }
    Ok((bounds, eb, Some(access)))
}

/// Random access by element into a frame whose planes are all
/// block-structured.
pub struct ElementAccess<'a> {
    pub frame: Z4aiFrame<'a>,
    pub blocks: Vec<PlaneBlocks<'a>>,
}

impl<'a> ElementAccess<'a> {
    pub fn elements(&self) -> u64 {
        self.frame.body_len() / self.frame.elem_bytes()
    }

    /// The plane byte ranges that hold elements `[a, b)` of plane `i`: one
    /// range, except for a bit-field mantissa of several byte planes, which
    /// are concatenated in the plane (low byte first).
    pub fn plane_ranges(&self, i: usize, a: u64, b: u64) -> Vec<Range<u64>> {
        match (self.frame.transform, i) {
            (Transform::Bitfield(_), 0) => vec![a / 8..b.div_ceil(8)],
            (Transform::Bitfield(spec), 2) => {
                let n = self.elements();
                (0..spec.mant_planes() as u64)
                    .map(|k| k * n + a..k * n + b)
                    .collect()
            }
            (Transform::Split(w), 1) => {
                let r = w as u64 - 1;
                vec![a * r..b * r]
            }
            _ => vec![a..b],
        }
    }

    /// The largest piece of a plane decoded at once when decoding part of
    /// it (a zstd block or a rANS chunk; stored planes have none), as
    /// (plane, bytes).
    pub fn largest_piece(&self) -> Option<(usize, u64)> {
        self.blocks
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let piece = match b {
                    PlaneBlocks::Stored(_) => 0,
                    // Every block but the last is block_size long.
                    PlaneBlocks::Zstd(z) | PlaneBlocks::Rans32(z) if z.count() > 0 => {
                        z.bounds(0).end - z.bounds(0).start
                    }
                    PlaneBlocks::Zstd(_) | PlaneBlocks::Rans32(_) => 0,
                    // Chunks are [j*n/k, (j+1)*n/k): none is longer than ceil(n/k).
                    PlaneBlocks::Rans(r) => r.len().div_ceil(r.chunks().max(1) as u64),
                };
                (i, piece)
            })
            .max_by_key(|&(_, piece)| piece)
    }

    /// Natural block grid in elements: the boundaries of the first plane that
    /// has more than one block, or one block for the whole body.
    pub fn grid(&self) -> Vec<u64> {
        let n = self.elements();
        if self
            .blocks
            .iter()
            .all(|b| matches!(b, PlaneBlocks::Stored(_)))
        {
            // Stored planes are random-access at any offset: cut them into
            // blocks of about BLOCK_BYTES so caches hold small pieces.
            let step = (BLOCK_BYTES / self.frame.elem_bytes()).max(1);
            let mut g: Vec<u64> = (0..n.div_ceil(step)).map(|j| j * step).collect();
            g.push(n);
            if g.len() == 1 {
                g.insert(0, 0);
            }
            return g;
        }
        // The coarsest grid any plane offers: zstd blocks, or rANS chunks in
        // groups of CHUNK_GROUP (the SIMD decoder takes that many at once).
        let mut best: Option<Vec<u64>> = None;
        for (i, b) in self.blocks.iter().enumerate() {
            let (element_plane, limit) = match self.frame.transform {
                // Not the packed sign bits; a multi-byte mantissa plane
                // carries element boundaries in its first byte plane.
                Transform::Bitfield(_) => (i != 0, n),
                // The low bytes' blocks are those of the top bytes (the
                // writer cuts both at the same elements).
                Transform::Split(_) => (i == 0, n),
                _ => (true, n),
            };
            if !element_plane || b.count() <= 1 {
                continue;
            }
            let step = match b {
                PlaneBlocks::Stored(_) => continue,
                PlaneBlocks::Zstd(_) | PlaneBlocks::Rans32(_) => 1,
                PlaneBlocks::Rans(_) => plane::CHUNK_GROUP,
            };
            let starts: Vec<u64> = (0..b.count())
                .step_by(step)
                .map(|j| b.bounds(j).start)
                .filter(|&s| s < limit)
                .collect();
            if starts.len() > 1 && best.as_ref().is_none_or(|g| starts.len() < g.len()) {
                best = Some(starts);
            }
        }
        match best {
            Some(mut g) => {
                g.push(n);
                g
            }
            None => vec![0, n],
        }
    }

    /// The byte ranges (relative to the frame start) of the compressed
    /// payload that decoding elements `[a, b)` reads, over all planes.
    pub fn payload_ranges(&self, a: u64, b: u64) -> Vec<Range<usize>> {
        let base = self.frame.bytes.as_ptr() as usize;
        let rel = |s: &[u8]| {
            let start = s.as_ptr() as usize - base;
            start..start + s.len()
        };
        let mut out = Vec::new();
        for (i, blk) in self.blocks.iter().enumerate() {
            for r in self.plane_ranges(i, a, b) {
                if r.is_empty() {
                    continue;
                }
                match blk {
                    PlaneBlocks::Stored(p) => out.push(rel(&p[r.start as usize..r.end as usize])),
                    PlaneBlocks::Zstd(z) | PlaneBlocks::Rans32(z) => {
                        for j in blk.block_of(r.start)..=blk.block_of(r.end - 1) {
                            out.push(rel(z.payload(j)));
                        }
                    }
                    PlaneBlocks::Rans(p) => {
                        for j in blk.block_of(r.start)..=blk.block_of(r.end - 1) {
                            out.push(rel(p.chunk_payload(j)));
                        }
                    }
                }
            }
        }
        out
    }
}
