//! Blocks of a ckptfs frame: the [`Grid`] that cuts a frame's decoded bytes
//! into independently decodable blocks, the decoding of one block, and
//! which side is damaged when a block fails its checksum. Shared by every kind of archive
//! whose units are frames (`.zstn` units, `.blz` blobs).
//!
//! A frame whose planes are all block-structured (what ckptfs writes) has
//! sub-tensor blocks of whole elements; any other frame (most z4ai frames)
//! is one block.

use super::{ArchiveView, BlockKey, Result};
use crate::codec::frame::RansTables;
use crate::codec::CodecError;
use crate::format::ckx;
use crate::format::frame::{block_grid, Frame};
use std::ops::Range;
use std::sync::{Arc, OnceLock};

/// Where a unit's grid (or why it could not be built) is kept once built:
/// 24 bytes per unit until then, which matters for archives of 10^6 units.
pub(crate) type GridCell = OnceLock<std::result::Result<Arc<Grid>, Arc<GridError>>>;

/// A unit's grid, built by `build` on first use and shared after; a
/// failure is kept and reported on every use.
pub(crate) fn shared_grid<A: ArchiveView + ?Sized>(
    a: &A,
    unit: u32,
    cell: Option<&GridCell>,
    build: impl FnOnce() -> std::result::Result<Arc<Grid>, GridError>,
) -> Result<Arc<Grid>> {
    let Some(cell) = cell else {
        return Err(a.integrity(format!("no unit {unit}")));
    };
    match cell.get_or_init(|| build().map_err(Arc::new)) {
        Ok(g) => Ok(g.clone()),
        Err(e) => Err(match &**e {
            GridError::Codec(e) => a.frame_error(unit, e.clone()),
            GridError::Integrity(what) => a.unit_integrity(unit, what.clone()),
        }),
    }
}

/// Decodes block `key` of a frame unit whose stored bytes are `bytes`.
/// The caller checks the decoded bytes against their checksum, and on any
/// failure asks [`damaged_payload`] which side is damaged.
///
/// The compressed bytes' own checksum is not hashed on the way: the
/// decoded bytes' checksum already covers every byte served, and the
/// decoders are safe on any input (a hostile file can carry matching
/// checksums anyway), so a second pass over every block would buy nothing
/// but a more precise message, which the failure path still gives.
pub(crate) fn decode_unit_block<A: ArchiveView + ?Sized>(
    a: &A,
    key: BlockKey,
    bytes: &[u8],
) -> Result<Vec<u8>> {
    let grid = a.grid(key.unit)?;
    let b = block_index(a, key, &grid)?;
    decode_frame_block(bytes, &grid, b).map_err(|e| a.frame_error(key.unit, e))
}

/// After block `key` failed (to decode, or its decoded checksum): the
/// error blaming its compressed bytes if they fail their own checksum
/// `want`, or `None` when they are intact (the caller's error stands).
pub(crate) fn damaged_payload<A: ArchiveView + ?Sized>(
    a: &A,
    key: BlockKey,
    bytes: &[u8],
    want: u64,
) -> Option<super::ArchiveError> {
    let grid = a.grid(key.unit).ok()?;
    let b = key.block as usize;
    if b >= grid.blocks() {
        return None;
    }
    let frame = Frame::parse(bytes).ok()?;
    let access = if grid.elem_bytes == 0 {
        None
    } else {
        frame.element_access().ok()?
    };
    let ranges = ckx::block_payload(
        access.as_ref(),
        bytes.len(),
        &grid.bounds,
        grid.elem_bytes,
        b,
    );
    (ckx::hash_ranges(bytes, &ranges) != want).then(|| {
        a.unit_integrity(
            key.unit,
            format!("checksum mismatch in the compressed bytes of block {b}"),
        )
    })
}

/// The block number of `key`, checked against the unit's grid.
pub(crate) fn block_index<A: ArchiveView + ?Sized>(
    a: &A,
    key: BlockKey,
    grid: &Grid,
) -> Result<usize> {
    let b = key.block as usize;
    if b >= grid.blocks() {
        return Err(a.frame_error(
            key.unit,
            CodecError::invalid("block", format!("no block {b}")),
        ));
    }
    Ok(b)
}

/// Block boundaries of one unit, in decoded bytes of that unit. The last
/// boundary equals the unit's decoded length.
#[derive(Debug)]
pub struct Grid {
    pub bounds: Vec<u64>,
    /// Element size for sub-tensor blocks; 0 when the unit is one block.
    pub(crate) elem_bytes: u64,
    pub(crate) tables: RansTables,
}

impl Grid {
    /// A grid of plain byte ranges (stored, not encoded).
    pub(crate) fn plain(bounds: Vec<u64>) -> Grid {
        Grid {
            bounds,
            elem_bytes: 0,
            tables: RansTables::default(),
        }
    }
    pub fn blocks(&self) -> usize {
        self.bounds.len() - 1
    }
    pub fn span(&self, b: usize) -> Range<u64> {
        self.bounds[b]..self.bounds[b + 1]
    }
    /// The block holding unit byte `pos`.
    pub fn block_of(&self, pos: u64) -> usize {
        match self.bounds.binary_search(&pos) {
            Ok(i) => i.min(self.blocks() - 1),
            Err(i) => i - 1,
        }
    }
}

/// Why a unit's grid could not be built; kept (cloned) for every later use.
#[derive(Debug, Clone)]
pub(crate) enum GridError {
    Codec(CodecError),
    Integrity(String),
}

impl From<CodecError> for GridError {
    fn from(e: CodecError) -> Self {
        GridError::Codec(e)
    }
}

/// Parses a frame into its block grid (checking that it decodes to
/// `decoded_len`) and the CKX1 meta digest of its non-payload bytes.
pub(crate) fn frame_grid(
    bytes: &[u8],
    decoded_len: u64,
) -> std::result::Result<(Grid, u64), CodecError> {
    let frame = Frame::parse(bytes)?;
    if frame.decoded_len() != decoded_len {
        return Err(CodecError::LengthMismatch {
            what: "frame",
            got: frame.decoded_len(),
            expected: decoded_len,
        });
    }
    let (bounds, elem_bytes, access) = block_grid(&frame, decoded_len)?;
    let meta = ckx::meta_digest(bytes, access.as_ref(), &bounds, elem_bytes);
    let tables = match &access {
        Some(a) => a.load_tables()?,
        None => RansTables::default(),
    };
    Ok((
        Grid {
            bounds,
            elem_bytes,
            tables,
        },
        meta,
    ))
}

/// Decodes block `b` of a frame laid out as `grid` says.
pub(crate) fn decode_frame_block(
    bytes: &[u8],
    grid: &Grid,
    b: usize,
) -> std::result::Result<Vec<u8>, CodecError> {
    let frame = Frame::parse(bytes)?;
    let access = if grid.elem_bytes == 0 {
        None
    } else {
        frame.element_access()?
    };
    let span = grid.span(b);
    // The grid bounds every span by MAX_BLOCK_BYTES; memory may still be
    // short, which fails this block only.
    let mut out = crate::codec::zeroed(span.end - span.start, "a block")?;
    match &access {
        None => frame.decode(&mut out)?,
        Some(access) => {
            let eb = grid.elem_bytes;
            let body = access.frame.body_len();
            let b_body = span.end.min(body);
            let (body_part, tail_part) = out.split_at_mut((b_body - span.start) as usize);
            access.decode_elements(span.start / eb, b_body / eb, &grid.tables, body_part)?;
            // The last block carries the tail.
            let tail = access.frame.tail;
            tail_part.copy_from_slice(&tail[tail.len() - tail_part.len()..]);
        }
    }
    Ok(out)
}
