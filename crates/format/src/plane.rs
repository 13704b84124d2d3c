//! Plane records of a `Z4AI` frame: the method ids (z4ai `backend.py`) and
//! the layout of the payloads that can be read piecewise: method 0 (stored),
//! 2 (independent zstd blocks) and 4 (adaptive rANS chunks, spec §4.4).
//!
//! [`PlaneBlocks::parse`] checks a payload's block table against the payload
//! and the plane length once, so that afterwards every block's bytes and
//! decoded range can be trusted. Parsing never allocates from a length
//! field beyond one offset per 4 payload bytes. Nothing here decodes: the
//! decoders (`codec::plane`, `codec::rans`) add `decode_*` methods to these
//! types, and the grid and checksums of `format` use only what is here.

use crate::cursor::Cursor;
use crate::error::{CodecError, Result};
use std::ops::Range;

pub const STORE: u8 = 0;
pub const ZSTD: u8 = 1;
pub const ZSTD_BLOCKS: u8 = 2;
pub const RANS: u8 = 3;
pub const RANS_ADAPT: u8 = 4;
pub const RANS_O1: u8 = 5;
/// ckptfs's own method (z4ai 0.2.0 does not read it): blocks of rANS with
/// 32 interleaved states and 12-bit probabilities (`codec::rans32`), with
/// the block table of method 2.
pub const RANS32: u8 = 6;

pub fn method_name(m: u8) -> &'static str {
    match m {
        STORE => "store",
        ZSTD => "zstd",
        ZSTD_BLOCKS => "zstd_blocks",
        RANS => "rans_o0",
        RANS_ADAPT => "rans_o0_adaptive",
        RANS_O1 => "rans_o1",
        RANS32 => "rans32",
        _ => "unknown",
    }
}

/// The independent blocks of a random-access plane.
pub enum PlaneBlocks<'a> {
    Stored(&'a [u8]),
    Zstd(ZstdBlocks<'a>),
    Rans(AdaptivePayload<'a>),
    /// Method 6: the block table of method 2, rANS-32 blocks.
    Rans32(ZstdBlocks<'a>),
}

impl<'a> PlaneBlocks<'a> {
    /// `None` when the method needs a whole-plane decode (1, 3, 5).
    pub fn parse(method: u8, payload: &'a [u8], orig_len: u64) -> Result<Option<Self>> {
        Ok(match method {
            STORE => Some(PlaneBlocks::Stored(payload)),
            ZSTD_BLOCKS => Some(PlaneBlocks::Zstd(ZstdBlocks::parse(payload, orig_len)?)),
            RANS32 => Some(PlaneBlocks::Rans32(ZstdBlocks::parse_as(
                payload,
                orig_len,
                "rans32 blocks",
            )?)),
            RANS_ADAPT => {
                let p = AdaptivePayload::parse(payload)?;
                if p.len() != orig_len {
                    return Err(CodecError::LengthMismatch {
                        what: "rANS plane",
                        got: p.len(),
                        expected: orig_len,
                    });
                }
                Some(PlaneBlocks::Rans(p))
            }
            _ => None,
        })
    }

    /// Number of blocks (a stored plane is one block).
    pub fn count(&self) -> usize {
        match self {
            PlaneBlocks::Stored(_) => 1,
            PlaneBlocks::Zstd(z) | PlaneBlocks::Rans32(z) => z.count(),
            PlaneBlocks::Rans(r) => r.chunks(),
        }
    }

    pub fn bounds(&self, i: usize) -> Range<u64> {
        match self {
            PlaneBlocks::Stored(p) => 0..p.len() as u64,
            PlaneBlocks::Zstd(z) | PlaneBlocks::Rans32(z) => z.bounds(i),
            PlaneBlocks::Rans(r) => r.chunk_bounds(i),
        }
    }

    /// Index of the block that holds plane byte `pos` (pos < plane length).
    pub fn block_of(&self, pos: u64) -> usize {
        match self {
            PlaneBlocks::Stored(_) => 0,
            PlaneBlocks::Zstd(z) | PlaneBlocks::Rans32(z) => (pos / z.block_size as u64) as usize,
            PlaneBlocks::Rans(r) => {
                // Chunk j starts at floor(j*n/k); search is exact and cheap.
                let (mut lo, mut hi) = (0usize, r.chunks());
                while hi - lo > 1 {
                    let mid = (lo + hi) / 2;
                    if r.chunk_bounds(mid).start <= pos {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                lo
            }
        }
    }
}

/// A parsed method-2 payload (and the block table of method 6).
#[derive(Debug, Clone)]
pub struct ZstdBlocks<'a> {
    pub block_size: u32,
    orig_len: u64,
    /// Start offsets of each block inside `data`, plus the end.
    offsets: Vec<usize>,
    data: &'a [u8],
}

impl<'a> ZstdBlocks<'a> {
    pub fn parse(payload: &'a [u8], orig_len: u64) -> Result<Self> {
        Self::parse_as(payload, orig_len, "zstd blocks")
    }

    /// [`ZstdBlocks::parse`], errors naming the plane `what`.
    pub fn parse_as(payload: &'a [u8], orig_len: u64, what: &'static str) -> Result<Self> {
        let mut c = Cursor::new(payload);
        let block_size = c.u32(what)?;
        let n = c.u32(what)? as u64;
        if block_size == 0 && orig_len > 0 {
            return Err(CodecError::invalid(what, "block size 0"));
        }
        let expect = if orig_len == 0 {
            0
        } else {
            orig_len.div_ceil(block_size as u64)
        };
        if n != expect {
            return Err(CodecError::invalid(
                what,
                format!("{n} blocks of {block_size} bytes cannot hold {orig_len} bytes"),
            ));
        }
        let table = c.take(n * 4, what)?;
        let mut offsets = Vec::with_capacity(n as usize + 1);
        let mut pos = 0usize;
        offsets.push(0);
        for l in table.chunks_exact(4) {
            pos = pos
                .checked_add(u32::from_le_bytes(l.try_into().unwrap()) as usize)
                .ok_or_else(|| CodecError::invalid(what, "length overflow"))?;
            offsets.push(pos);
        }
        let data = c.rest();
        if pos != data.len() {
            return Err(CodecError::invalid(
                what,
                format!("block lengths sum to {pos}, payload holds {}", data.len()),
            ));
        }
        Ok(ZstdBlocks {
            block_size,
            orig_len,
            offsets,
            data,
        })
    }
    pub fn count(&self) -> usize {
        self.offsets.len() - 1
    }
    pub fn bounds(&self, i: usize) -> Range<u64> {
        let b = i as u64 * self.block_size as u64;
        b..(b + self.block_size as u64).min(self.orig_len)
    }
    pub fn payload(&self, i: usize) -> &'a [u8] {
        &self.data[self.offsets[i]..self.offsets[i + 1]]
    }
}

/// Bit 62 of the method-4 count (`_ADAPT_FLAG`).
pub const ADAPT_FLAG: u64 = 1 << 62;

/// Bit 63 of the method-3 count (`_CHUNK_FLAG`).
pub const CHUNK_FLAG: u64 = 1 << 63;

/// Chunks decoded together by [`AdaptivePayload::decode_chunks`] (one SIMD
/// lane each).
pub const CHUNK_GROUP: usize = 16;

/// Parsed view of a method-4 (adaptive order-0) payload, for random access to
/// its chunks.
///
/// The fields are `pub(crate)` for the decoders in `codec::rans`; build one
/// only with [`AdaptivePayload::parse`], which guarantees `k + 1`
/// non-decreasing `starts`, the last at most `body.len()`.
#[derive(Debug, Clone)]
pub struct AdaptivePayload<'a> {
    pub n: u64,
    pub k: usize,
    pub freq_blob: &'a [u8],
    /// The concatenated chunk streams.
    pub body: &'a [u8],
    /// k + 1 offsets into `body`.
    pub starts: Vec<usize>,
}

impl<'a> AdaptivePayload<'a> {
    /// Parse and validate the header, the chunk-length table and the layout.
    /// The only allocation is the offset table, at most `payload.len() / 4`
    /// entries. Trailing bytes after the last chunk are ignored, as z4ai does.
    pub fn parse(payload: &'a [u8]) -> Result<Self> {
        let mut c = Cursor::new(payload);
        let raw = c.u64("method-4 count")?;
        if raw == 0 {
            // z4ai writes an empty plane as the 8 bytes `u64 0`.
            return Ok(AdaptivePayload {
                n: 0,
                k: 0,
                freq_blob: &[],
                body: &[],
                starts: vec![0],
            });
        }
        if raw & ADAPT_FLAG == 0 {
            return Err(CodecError::invalid(
                "method-4 payload",
                "count without the bit-62 adaptive flag",
            ));
        }
        if raw & CHUNK_FLAG != 0 {
            return Err(CodecError::invalid(
                "method-4 payload",
                "count has bit 63 set (n >= 2^62)",
            ));
        }
        let n = raw & !ADAPT_FLAG;
        let k = c.u32("method-4 chunk count")? as usize;
        let fbl = c.u32("method-4 freq blob length")?;
        if k == 0 && n != 0 {
            return Err(CodecError::invalid(
                "method-4 payload",
                format!("0 chunks for {n} symbols"),
            ));
        }
        let clens = c.take(4 * k as u64, "method-4 chunk lengths")?;
        let freq_blob = c.take(u64::from(fbl), "method-4 freq blob")?;
        let body = c.rest();
        let starts = chunk_offsets(clens, body.len(), "method-4 chunk streams")?;
        Ok(AdaptivePayload {
            n,
            k,
            freq_blob,
            body,
            starts,
        })
    }

    /// Number of symbols n.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True if the plane is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Number of chunks k.
    pub fn chunks(&self) -> usize {
        self.k
    }

    /// Symbol range `[j*n/k, (j+1)*n/k)` of chunk j. Panics if `j >= k`.
    pub fn chunk_bounds(&self, j: usize) -> Range<u64> {
        assert!(j < self.k, "chunk {j} out of range ({} chunks)", self.k);
        chunk_range(self.n, self.k, j)
    }

    /// Compressed bytes of chunk j. Panics if `j >= k`.
    pub fn chunk_payload(&self, j: usize) -> &'a [u8] {
        assert!(j < self.k, "chunk {j} out of range ({} chunks)", self.k);
        &self.body[self.starts[j]..self.starts[j + 1]]
    }

    /// The zstd frame holding the k frequency tables.
    pub fn freq_blob(&self) -> &'a [u8] {
        self.freq_blob
    }
}

/// `[j*n/k, (j+1)*n/k)` without overflow.
pub fn chunk_range(n: u64, k: usize, j: usize) -> Range<u64> {
    let lo = (u128::from(n) * j as u128 / k as u128) as u64;
    let hi = (u128::from(n) * (j as u128 + 1) / k as u128) as u64;
    lo..hi
}

/// Read `k` u32 chunk lengths from `clens` and check that the chunks fit in
/// `avail` bytes; returns the k+1 chunk start offsets relative to the first.
pub fn chunk_offsets(clens: &[u8], avail: usize, what: &'static str) -> Result<Vec<usize>> {
    let mut starts = Vec::with_capacity(clens.len() / 4 + 1);
    let mut acc = 0u64;
    starts.push(0);
    for c in clens.chunks_exact(4) {
        acc += u64::from(u32::from_le_bytes(c.try_into().unwrap()));
        if acc > avail as u64 {
            return Err(CodecError::Truncated {
                what,
                need: acc,
                have: avail as u64,
            });
        }
        starts.push(acc as usize);
    }
    Ok(starts)
}
