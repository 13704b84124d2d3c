//! Decoding of plane methods 0-5 of the Z4AI frame (z4ai `backend.py`) and
//! ckptfs's method 6 (`rans32`), and random access inside the
//! block-structured ones.
//!
//! Methods 0 (stored), 2 (zstd blocks), 4 (adaptive rANS chunks) and 6 can be
//! decoded piecewise: [`PlaneBlocks`] (parsed in `format::plane`, with the
//! method ids, re-exported here) describes a plane's independent blocks, and
//! [`PlaneBlocks::decode_range`] decodes only the blocks that cover a byte
//! range. Methods 1, 3 and 5 decode as a whole ([`decode_plane`]).

use super::{rans, zstd, CodecError, Result};
use crate::rans::adaptive::AdaptiveDecode;
use crate::rans::adaptive::AdaptiveDecodeMore;
pub use ckptfs_format::plane::{
    method_name, PlaneBlocks, ZstdBlocks, RANS, RANS32, RANS_ADAPT, RANS_O1, STORE, ZSTD,
    ZSTD_BLOCKS,
};
use std::ops::Range;

/// Decodes a whole plane into `out` (its `orig_len` bytes).
pub fn decode_plane(method: u8, payload: &[u8], out: &mut [u8]) -> Result<()> {
    match method {
        STORE => {
            if payload.len() != out.len() {
                return Err(CodecError::LengthMismatch {
                    what: "stored plane",
                    got: payload.len() as u64,
                    expected: out.len() as u64,
                });
            }
            out.copy_from_slice(payload);
            return Ok(());
        }
        ZSTD => zstd::decompress_exact(payload, out, "zstd plane")?,
        ZSTD_BLOCKS => {
            let blocks = ZstdBlocks::parse(payload, out.len() as u64)?;
            use rayon::prelude::*;
            let bs = blocks.block_size as usize;
            let work = |(i, chunk): (usize, &mut [u8])| blocks.decode_block(i, chunk);
            if out.len() >= 1 << 20 {
                out.par_chunks_mut(bs).enumerate().try_for_each(work)?;
            } else {
                out.chunks_mut(bs).enumerate().try_for_each(work)?;
            }
            return Ok(());
        }
        RANS => rans::decode_method3(payload, out)?,
        RANS_ADAPT => rans::decode_method4(payload, out)?,
        RANS_O1 => rans::decode_method5(payload, out)?,
        RANS32 => {
            let blocks = ZstdBlocks::parse_as(payload, out.len() as u64, "rans32 blocks")?;
            use rayon::prelude::*;
            let bs = blocks.block_size as usize;
            let work = |(i, chunk): (usize, &mut [u8])| {
                super::rans32::decode_block_here(blocks.payload(i), chunk)
            };
            if out.len() >= 1 << 20 {
                out.par_chunks_mut(bs).enumerate().try_for_each(work)?;
            } else {
                out.chunks_mut(bs).enumerate().try_for_each(work)?;
            }
            return Ok(());
        }
        m => {
            return Err(CodecError::invalid(
                "plane",
                format!("unknown plane method {m}"),
            ));
        }
    }
    Ok(())
}

/// Decoding of one block of a block-structured zstd plane.
pub trait DecodeZstdBlock {
    fn decode_block(&self, i: usize, out: &mut [u8]) -> Result<()>;
}

impl DecodeZstdBlock for ZstdBlocks<'_> {
    fn decode_block(&self, i: usize, out: &mut [u8]) -> Result<()> {
        zstd::decompress_exact(self.payload(i), out, "zstd block")?;
        Ok(())
    }
}

/// Decoding of a byte range of a block-structured plane.
pub trait DecodePlaneRange {
    fn decode_range(
        &self,
        range: Range<u64>,
        tables: Option<&[rans::FreqTable]>,
        out: &mut [u8],
    ) -> Result<()>;
}

impl DecodePlaneRange for PlaneBlocks<'_> {
    /// Decodes plane bytes `range` into `out` (`out.len() == range.len()`),
    /// touching only the blocks that cover it.
    fn decode_range(
        &self,
        range: Range<u64>,
        tables: Option<&[rans::FreqTable]>,
        out: &mut [u8],
    ) -> Result<()> {
        debug_assert_eq!(out.len() as u64, range.end - range.start);
        if range.is_empty() {
            return Ok(());
        }
        if let PlaneBlocks::Stored(p) = self {
            out.copy_from_slice(&p[range.start as usize..range.end as usize]);
            return Ok(());
        }
        let first = self.block_of(range.start);
        let last = self.block_of(range.end - 1);
        if let PlaneBlocks::Rans(r) = self {
            return decode_rans_range(r, first..last + 1, range, tables, out);
        }
        let mut scratch = Vec::new();
        for i in first..=last {
            let b = self.bounds(i);
            let lo = range.start.max(b.start);
            let hi = range.end.min(b.end);
            let dst = &mut out[(lo - range.start) as usize..(hi - range.start) as usize];
            let whole = lo == b.start && hi == b.end;
            let target: &mut [u8] = if whole {
                dst
            } else {
                super::grow_zeroed(&mut scratch, b.end - b.start, "zstd block")?;
                &mut scratch[..(b.end - b.start) as usize]
            };
            match self {
                PlaneBlocks::Zstd(z) => z.decode_block(i, target)?,
                PlaneBlocks::Rans32(z) => super::rans32::decode_block_here(z.payload(i), target)?,
                PlaneBlocks::Rans(_) | PlaneBlocks::Stored(_) => unreachable!(),
            }
            if !whole {
                let dst = &mut out[(lo - range.start) as usize..(hi - range.start) as usize];
                dst.copy_from_slice(&scratch[(lo - b.start) as usize..(hi - b.start) as usize]);
            }
        }
        Ok(())
    }
}

/// Decodes plane bytes `range` of a rANS plane from the chunks `js` that
/// cover it, all at once (the SIMD decoder wants many chunks per call).
fn decode_rans_range(
    r: &rans::AdaptivePayload<'_>,
    js: Range<usize>,
    range: Range<u64>,
    freqs: Option<&[rans::FreqTable]>,
    out: &mut [u8],
) -> Result<()> {
    thread_local! {
        static TABLES: std::cell::RefCell<rans::DecodeTables> = std::cell::RefCell::new(rans::DecodeTables::default());
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let owned;
    let freqs = match freqs {
        Some(f) => f,
        None => {
            owned = r.freq_tables()?;
            &owned
        }
    };
    let span = r.chunk_bounds(js.start).start..r.chunk_bounds(js.end - 1).end;
    TABLES.with(|t| {
        let mut tables = t.borrow_mut();
        tables.rebuild(freqs, js.clone())?;
        if span == range {
            r.decode_chunks(js, &tables, out)?;
        } else {
            SCRATCH.with(|s| -> Result<()> {
                let mut scratch = s.borrow_mut();
                let len = (span.end - span.start) as usize;
                super::grow_zeroed(&mut scratch, len as u64, "rANS chunks")?;
                let r = r.decode_chunks(js, &tables, &mut scratch[..len]);
                if r.is_ok() {
                    let from = (range.start - span.start) as usize;
                    out.copy_from_slice(&scratch[from..from + out.len()]);
                }
                if scratch.len() > super::SCRATCH_KEEP {
                    *scratch = Vec::new();
                }
                r
            })?;
        }
        Ok(())
    })
}

/// Encodes a method-2 payload: independent zstd frames of `block_size`
/// bytes (the last shorter), each with its content size.
pub fn encode_zstd_blocks(data: &[u8], block_size: usize, level: i32) -> Vec<u8> {
    use rayon::prelude::*;
    let frames: Vec<Vec<u8>> = data
        .par_chunks(block_size.max(1))
        .map(|c| zstd::compress(c, level))
        .collect();
    let mut v =
        Vec::with_capacity(8 + frames.len() * 4 + frames.iter().map(Vec::len).sum::<usize>());
    v.extend_from_slice(&(block_size as u32).to_le_bytes());
    v.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    for f in &frames {
        v.extend_from_slice(&(f.len() as u32).to_le_bytes());
    }
    for f in &frames {
        v.extend_from_slice(f);
    }
    v
}
