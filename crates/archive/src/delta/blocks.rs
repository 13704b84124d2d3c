//! Decoding a delta's blocks: the block grid of each unit (a COPY's 1 MiB
//! ranges, a frame's grid, or a sliced `ZSP1` XOR's), and one block
//! decoded, combined with the base's bytes and checked against the
//! trailer's digest of the target bytes.

use super::{Base, DeltaArchive, Unit, MAX_COPY_BLOCK, MAX_SLICE, OVERLAP_MIN};
use crate::frame_block::{damaged_payload, decode_unit_block, frame_grid, GridError};
use crate::{sparse_cache, ArchiveView, BlockKey, Grid, Result};
use ckptfs_codec::sparse::SparseFrameIndex;
use ckptfs_codec::xor_delta::xor_into;
use ckptfs_format::ckx;
use ckptfs_format::delta::DeltaKind;
use ckptfs_format::digest::xxh3_64;
use ckptfs_format::frame::Frame;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;

impl DeltaArchive {
    /// Decodes one block from the bytes at hand (fetched, for a remote
    /// copy), checking it against the trailer's digest.
    pub(super) fn decode_block_once(&self, key: BlockKey) -> Result<Vec<u8>> {
        let u = self.unit(key.unit)?;
        let grid = self.grid(key.unit)?;
        let b = crate::frame_block::block_index(self, key, &grid)?;
        let digests = &self.trailer.units[key.unit as usize].blocks[b];
        let span = grid.span(b);
        let frame = &self.bytes()[u.frame.clone()];
        let decoded = || -> Result<Vec<u8>> {
            Ok(match u.kind {
                DeltaKind::Full => decode_unit_block(self, key, frame)?,
                DeltaKind::Copy => {
                    self.check_base_for_block()?;
                    // The base range is copied whole: every byte written.
                    let mut out = ckptfs_codec::buffers::take(span.end - span.start, "a block")
                        .map_err(|e| self.frame_error(key.unit, e))?;
                    self.base.read_exact(u.base_offset + span.start, &mut out)?;
                    out
                }
                DeltaKind::Delta => {
                    let at = u.base_offset + span.start;
                    let len = span.end - span.start;
                    let overlap = matches!(self.base, Base::Archive(..)) && len > OVERLAP_MIN;
                    // A large block (a whole-frame XOR of a large tensor)
                    // over a base archive: its decode, which is serial,
                    // runs beside the base's, which is parallel (at the cost
                    // of one more buffer of the block's length meanwhile).
                    let (mut out, base) = if overlap {
                        let (out, base) = rayon::join(
                            || decode_unit_block(self, key, frame),
                            || -> Result<Vec<u8>> {
                                self.check_base_for_block()?;
                                let mut v = ckptfs_codec::buffers::take(len, "a base block")
                                    .map_err(|e| self.frame_error(key.unit, e))?;
                                self.base.read_exact(at, &mut v)?;
                                Ok(v)
                            },
                        );
                        (out?, Some(base?))
                    } else if grid.elem_bytes == 0 && grid.blocks() > 1 {
                        (self.sliced_sparse_block(key, frame, span.clone())?, None)
                    } else {
                        (decode_unit_block(self, key, frame)?, None)
                    };
                    if out.len() as u64 != len {
                        return Err(self.unit_integrity(
                            key.unit,
                            format!("block {b} decodes to {} bytes", out.len()),
                        ));
                    }
                    match base {
                        Some(base) => out
                            .par_chunks_mut(1 << 20)
                            .zip(base.par_chunks(1 << 20))
                            .for_each(|(o, b)| xor_into(o, b)),
                        None => {
                            self.check_base_for_block()?;
                            self.base.xor_into(at, &mut out)?;
                        }
                    }
                    out
                }
            })
        };
        let checked = |out: Vec<u8>| {
            if xxh3_64(&out) != digests.data {
                let why = if u.kind == DeltaKind::Full {
                    String::new()
                } else {
                    format!(
                        " (the delta or the base {} is damaged, or is not the base packed against)",
                        self.base.path().display()
                    )
                };
                return Err(self.unit_integrity(
                    key.unit,
                    format!("checksum mismatch in the decoded bytes of block {b}{why}"),
                ));
            }
            Ok(out)
        };
        decoded().and_then(checked).map_err(|e| match u.kind {
            DeltaKind::Copy => e,
            _ => damaged_payload(self, key, frame, digests.payload).unwrap_or(e),
        })
    }

    fn unit_frame(&self, u: &Unit) -> &[u8] {
        &self.bytes()[u.frame.clone()]
    }

    /// The grid of a DELTA unit whose XOR is a `ZSP1` frame that the
    /// trailer lists in several blocks (FORMAT.md, deltas): the trailer's
    /// block ends, checked to cut the frame's output on whole bytes of its
    /// bitmap (8 elements) up to its body, each block at most
    /// [`MAX_SLICE`]; the frame's index, the whole tensor's bitmap and
    /// values, at most `MAX_BLOCK_BYTES`.
    fn sliced_sparse_grid(&self, unit: u32) -> std::result::Result<Arc<Grid>, GridError> {
        let u = &self.units[unit as usize];
        let frame = self.unit_frame(u);
        let bad = |what: &str| GridError::Integrity(format!("sliced sparse frame: {what}"));
        let Frame::Sparse(f) = Frame::parse(frame).map_err(GridError::Codec)? else {
            return Err(bad("not a ZSP1 frame"));
        };
        let w = u64::from(f.width);
        let body = f
            .count
            .checked_mul(w)
            .ok_or_else(|| bad("length overflows"))?;
        if Frame::Sparse(f.clone()).decoded_len() != u.len {
            return Err(bad("decodes to a length other than its tensor's"));
        }
        let index = f.count.div_ceil(8).saturating_add(f.nnz.saturating_mul(w));
        if index > ckptfs_format::frame::MAX_BLOCK_BYTES {
            return Err(bad("its bitmap and values are too large to index"));
        }
        let mut bounds = vec![0u64];
        for b in &self.trailer.units[unit as usize].blocks {
            let last = *bounds.last().expect("non-empty");
            let inner = b.end < u.len;
            if b.end <= last
                || b.end - last > MAX_SLICE
                || (inner && (b.end > body || b.end % (8 * w) != 0))
            {
                return Err(GridError::Integrity("CKD1 block layout is invalid".into()));
            }
            bounds.push(b.end);
        }
        if *bounds.last().expect("non-empty") != u.len {
            return Err(GridError::Integrity("CKD1 block layout is invalid".into()));
        }
        if self.trailer.units[unit as usize].meta_digest
            != ckx::meta_digest(frame, None, &bounds, 0)
        {
            return Err(GridError::Integrity(
                "checksum mismatch in frame headers or tables".into(),
            ));
        }
        Ok(Arc::new(Grid::plain(bounds)))
    }

    /// Block `b` (`span`) of a sliced sparse unit's XOR, from the frame's
    /// index (built once per unit, kept in `sparse_cache`).
    fn sliced_sparse_block(
        &self,
        key: BlockKey,
        frame: &[u8],
        span: Range<u64>,
    ) -> Result<Vec<u8>> {
        let err = |e| self.frame_error(key.unit, e);
        let ix = sparse_cache::get_or_build(self.owner, key.unit, || match Frame::parse(frame)? {
            Frame::Sparse(f) => f.index(),
            _ => Err(ckptfs_codec::CodecError::invalid(
                "sliced sparse unit",
                "not a ZSP1 frame",
            )),
        })
        .map_err(err)?;
        let mut out = ckptfs_codec::buffers::take(span.end - span.start, "a block").map_err(err)?;
        ix.decode_range(span.start, &mut out).map_err(err)?;
        Ok(out)
    }

    pub(super) fn build_grid(&self, unit: u32) -> std::result::Result<Arc<Grid>, GridError> {
        let u = &self.units[unit as usize];
        let want = &self.trailer.units[unit as usize].blocks;
        match u.kind {
            DeltaKind::Copy => {
                let mut bounds = vec![0u64];
                for b in want {
                    let last = *bounds.last().expect("non-empty");
                    if (b.end <= last && !(b.end == 0 && u.len == 0))
                        || b.end - last > MAX_COPY_BLOCK
                    {
                        return Err(GridError::Integrity("CKD1 block layout is invalid".into()));
                    }
                    bounds.push(b.end);
                }
                if bounds.len() < 2 || *bounds.last().expect("non-empty") != u.len {
                    return Err(GridError::Integrity("CKD1 block layout is invalid".into()));
                }
                Ok(Arc::new(Grid::plain(bounds)))
            }
            DeltaKind::Delta if want.len() > 1 && frame_is_sparse(self.unit_frame(u)) => {
                self.sliced_sparse_grid(unit)
            }
            DeltaKind::Full | DeltaKind::Delta => {
                let frame = &self.bytes()[u.frame.clone()];
                let (grid, meta) = frame_grid(frame, u.len)?;
                if want.len() != grid.blocks()
                    || want.iter().zip(&grid.bounds[1..]).any(|(b, &e)| b.end != e)
                {
                    return Err(GridError::Integrity(
                        "block layout differs from the checksum block".into(),
                    ));
                }
                if self.trailer.units[unit as usize].meta_digest != meta {
                    return Err(GridError::Integrity(
                        "checksum mismatch in frame headers or tables".into(),
                    ));
                }
                Ok(Arc::new(grid))
            }
        }
    }
}

/// True when `frame` is a `ZSP1` sparse frame.
fn frame_is_sparse(frame: &[u8]) -> bool {
    frame.starts_with(b"ZSP1")
}
