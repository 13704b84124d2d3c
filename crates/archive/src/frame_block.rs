//! Blocks of a ckptfs frame: the [`Grid`] that cuts a frame's decoded bytes
//! into independently decodable blocks, the decoding of one block, and
//! which side is damaged when a block fails its checksum. Shared by every kind of archive
//! whose units are frames (`.zstn` units, `.blz` blobs, a delta's FULL and
//! DELTA records).
//!
//! A frame whose planes are all block-structured (what ckptfs writes) has
//! sub-tensor blocks of whole elements; any other frame (most z4ai frames)
//! is one block.
//!
//! Over a remote object's local copy (a remote [`ByteSource`]), a frame is read
//! in two steps: its structure when its grid is first built
//! ([`fetch_frame_structure`]), then each block's payload when the block
//! is decoded ([`block_file_ranges`]), so a small read moves about one
//! compressed block. A copy that fails a check is fetched again once
//! before the failure stands ([`shared_grid_refetching_once`],
//! [`decode_remote_frame_block`]).

use super::{ArchiveError, ArchiveView, BlockKey, Result};
use ckptfs_codec::frame::DecodeElements;
use ckptfs_codec::frame::DecodeFrame;
use ckptfs_codec::frame::RansTables;
use ckptfs_codec::CodecError;
use ckptfs_format::ckx;
use ckptfs_format::frame::{block_grid, Frame};
use ckptfs_store::remote::Pin;
use ckptfs_store::source::ByteSource;
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
    let ranges = block_ranges(bytes, &grid, b)?;
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

/// The byte ranges of a frame (relative to it) that decoding block `b` of
/// `grid` reads besides the frame's structure: its payload in every
/// plane, or the whole frame when the unit is one block. None when the
/// frame no longer parses (its bytes changed since the grid was built).
pub(crate) fn block_ranges(bytes: &[u8], grid: &Grid, b: usize) -> Option<Vec<Range<usize>>> {
    if b >= grid.blocks() {
        return None;
    }
    let access = if grid.elem_bytes == 0 {
        None
    } else {
        Frame::parse(bytes).ok()?.element_access().ok()?
    };
    Some(ckx::block_payload(
        access.as_ref(),
        bytes.len(),
        &grid.bounds,
        grid.elem_bytes,
        b,
    ))
}

/// Ranges relative to `frame` as ranges of the file.
pub(crate) fn in_file(frame: &Range<u64>, rel: &[Range<usize>]) -> Vec<Range<u64>> {
    rel.iter()
        .map(|r| frame.start + r.start as u64..frame.start + r.end as u64)
        .collect()
}

/// For a frame at file bytes `frame` of a remote copy, before its grid is
/// built: fetches what building the grid reads, the frame's structure (not
/// its payloads), or the whole frame when it cannot be read block by block
/// (that is its one block, pinned in the disk cache until the grid is
/// built). Returns the file ranges fetched (to fetch again when a check
/// fails) and the pin. `decoded_len` is the frame's decoded length.
pub(crate) fn fetch_frame_structure<'m>(
    map: &'m dyn ByteSource,
    frame: &Range<u64>,
    decoded_len: u64,
) -> std::io::Result<(Vec<Range<u64>>, Option<Pin<'m>>)> {
    let bytes = &map.bytes()[frame.start as usize..frame.end as usize];
    let by_block = ckptfs_format::frame::fetch_structure(bytes, &mut |r| {
        map.ensure_all(&in_file(frame, &[r]))
    })?;
    match by_block
        .then(|| structure_ranges(bytes, decoded_len))
        .flatten()
    {
        Some(rs) => {
            let ranges = in_file(frame, &rs);
            map.ensure_all(&ranges)?;
            Ok((ranges, None))
        }
        None => {
            let whole = vec![frame.clone()];
            let pin = map.pin_all(&whole)?;
            Ok((whole, pin))
        }
    }
}

/// The file ranges block `b` of the frame at file bytes `frame` decodes
/// from: its payload in each plane, or the whole frame when the frame is
/// not block-structured.
pub(crate) fn block_file_ranges(
    frame: &Range<u64>,
    bytes: &[u8],
    grid: &Grid,
    b: usize,
) -> Vec<Range<u64>> {
    match block_ranges(bytes, grid, b) {
        Some(rs) => in_file(frame, &rs),
        None => vec![frame.clone()],
    }
}

/// Decodes a block of a remote copy whose stored bytes `payload` were
/// fetched: when the decode fails its checks (the cached bytes may be
/// damaged), fetches them again once, with the frame's structure when
/// `frame` is a z4ai frame (`Some((bytes, decoded_len))`, else the block's
/// bytes only), and decodes once more.
pub(crate) fn decode_refetching_once(
    map: &dyn ByteSource,
    file_range: &Range<u64>,
    frame: Option<(&[u8], u64)>,
    payload: Vec<Range<u64>>,
    decode: impl Fn() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    match decode() {
        Err(e @ (ArchiveError::Integrity { .. } | ArchiveError::Frame { .. })) => {
            let mut again = payload;
            if let Some((bytes, decoded_len)) = frame {
                match structure_ranges(bytes, decoded_len) {
                    Some(rs) => again.extend(in_file(file_range, &rs)),
                    None => again = vec![file_range.clone()],
                }
            }
            if map.refetch(&again) {
                decode()
            } else {
                Err(e)
            }
        }
        r => r,
    }
}

/// The grid of a unit of a remote copy whose structure was fetched (the
/// file ranges `fetched`, see [`fetch_frame_structure`]), built by `build`
/// on first use and shared after: a cached copy that fails its checks is
/// fetched again once before the failure is kept.
pub(crate) fn shared_grid_refetching_once<A: ArchiveView + ?Sized>(
    a: &A,
    map: &dyn ByteSource,
    unit: u32,
    cell: Option<&GridCell>,
    fetched: &[Range<u64>],
    build: impl Fn() -> std::result::Result<Arc<Grid>, GridError>,
) -> Result<Arc<Grid>> {
    shared_grid(a, unit, cell, || match build() {
        Err(_) if map.refetch(fetched) => build(),
        r => r,
    })
}

/// The grid of unit `unit`, built by `build` on first use and shared
/// after. `frame`: where the unit's frame is in the file and its decoded
/// length, when the unit is a frame; over a remote copy its structure is
/// fetched first ([`fetch_frame_structure`], [`shared_grid_refetching_once`]).
pub(crate) fn frame_unit_grid<A: ArchiveView + ?Sized>(
    a: &A,
    map: &dyn ByteSource,
    unit: u32,
    cell: Option<&GridCell>,
    frame: Option<(Range<u64>, u64)>,
    build: impl Fn() -> std::result::Result<Arc<Grid>, GridError>,
) -> Result<Arc<Grid>> {
    match frame {
        Some((frame, decoded_len))
            if map.is_remote() && cell.is_some_and(|c| c.get().is_none()) =>
        {
            let (fetched, _pin) =
                fetch_frame_structure(map, &frame, decoded_len).map_err(|e| io_error(a, e))?;
            shared_grid_refetching_once(a, map, unit, cell, &fetched, build)
        }
        _ => shared_grid(a, unit, cell, build),
    }
}

/// Decodes block `b` (of `grid`) of the frame at file bytes `frame` of a
/// remote copy, with `decode` (which reads the mapped bytes and checks
/// them): the block's payload is fetched first and pinned in the disk
/// cache until it is decoded; a block that fails its checks is fetched
/// again once, with the frame's structure ([`decode_refetching_once`]).
/// `decoded_len` is the frame's decoded length.
pub(crate) fn decode_remote_frame_block<A: ArchiveView + ?Sized>(
    a: &A,
    map: &dyn ByteSource,
    frame: &Range<u64>,
    decoded_len: u64,
    grid: &Grid,
    b: usize,
    decode: impl Fn() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    let bytes = &map.bytes()[frame.start as usize..frame.end as usize];
    let payload = block_file_ranges(frame, bytes, grid, b);
    let _pin = map.pin_all(&payload).map_err(|e| io_error(a, e))?;
    decode_refetching_once(map, frame, Some((bytes, decoded_len)), payload, decode)
}

/// An I/O error reading archive `a` (a fetch that failed).
pub(crate) fn io_error<A: ArchiveView + ?Sized>(a: &A, source: std::io::Error) -> ArchiveError {
    ArchiveError::Io {
        path: a.path().to_path_buf(),
        source,
    }
}

/// The byte ranges of a frame (relative to it) outside every block's
/// payload: its structure, which building the grid reads (what the CKX1
/// meta digest covers). None when the frame does not parse.
pub(crate) fn structure_ranges(bytes: &[u8], decoded_len: u64) -> Option<Vec<Range<usize>>> {
    let frame = Frame::parse(bytes).ok()?;
    let (bounds, elem_bytes, access) = block_grid(&frame, decoded_len).ok()?;
    Some(ckx::meta_ranges(
        bytes.len(),
        access.as_ref(),
        &bounds,
        elem_bytes,
    ))
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
    pub fn plain(bounds: Vec<u64>) -> Grid {
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
    // short, which fails this block only. Element decoding writes every
    // byte of its output (planes joined element by element, the tail
    // copied), so it may take a recycled buffer; whole-frame decoders
    // (sparse frames scatter into zeros) get a zeroed one.
    let len = span.end - span.start;
    let mut out = match &access {
        None => ckptfs_codec::zeroed(len, "a block")?,
        Some(_) => ckptfs_codec::buffers::take(len, "a block")?,
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use ckptfs_format::frame::fetch_structure;
    use ckptfs_format::safetensors::Dtype;
    use ckptfs_pack::{tensor::encode_tensor, PackOptions};

    /// Gaussian-ish values of `dtype` (`n` elements), deterministic.
    fn values(dtype: Dtype, n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            // Sum of four uniforms: roughly normal, as weights are.
            let mut s = 0.0f32;
            for _ in 0..4 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                s += (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            }
            s * 0.02
        };
        let mut out = Vec::new();
        for _ in 0..n {
            let v = next();
            match dtype {
                Dtype::BF16 => out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes()),
                Dtype::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
                _ => out.extend_from_slice(&v.to_le_bytes()),
            }
        }
        out
    }

    /// The walk of a frame's structure asks for a small part of it, and
    /// that part alone (every other byte zeroed) builds the same grid with
    /// the same meta digest; each block then needs only its payload.
    #[test]
    fn a_frame_structure_is_read_without_its_payloads() {
        for (dtype, n) in [
            (Dtype::BF16, 6 << 20),
            (Dtype::F32, 3 << 20),
            (Dtype::F16, 5 << 20),
        ] {
            let raw = values(dtype, n);
            let frame = encode_tensor(Some(dtype), &raw, PackOptions::default());
            let mut asked = ckptfs_store::ranges::RangeSet::new();
            let by_block = fetch_structure(&frame, &mut |r| {
                assert!(r.end <= frame.len());
                asked.insert(r.start as u64..r.end as u64);
                Ok(())
            })
            .unwrap();
            assert!(by_block, "{dtype:?}: a ckptfs frame reads block by block");
            assert!(
                asked.covered() * 20 < frame.len() as u64,
                "{dtype:?}: the walk asked for {} of {} bytes",
                asked.covered(),
                frame.len()
            );
            let mut sparse = vec![0u8; frame.len()];
            for r in asked.ranges() {
                let r = r.start as usize..r.end as usize;
                sparse[r.clone()].copy_from_slice(&frame[r]);
            }
            let want = structure_ranges(&frame, raw.len() as u64).unwrap();
            assert_eq!(structure_ranges(&sparse, raw.len() as u64).unwrap(), want);
            for r in &want {
                assert!(
                    asked.contains(r.start as u64..r.end as u64),
                    "{dtype:?}: {r:?}"
                );
            }
            let (g, meta) = frame_grid(&frame, raw.len() as u64).unwrap();
            let (g2, meta2) = frame_grid(&sparse, raw.len() as u64).unwrap();
            assert_eq!((g.bounds.clone(), meta), (g2.bounds.clone(), meta2));
            assert!(g.blocks() > 2, "{dtype:?}: {} blocks", g.blocks());
            // Block 1 from the structure and its payload alone.
            for r in block_ranges(&frame, &g, 1).unwrap() {
                sparse[r.clone()].copy_from_slice(&frame[r]);
            }
            let got = decode_frame_block(&sparse, &g2, 1).unwrap();
            let span = g.span(1);
            assert!(
                got[..] == raw[span.start as usize..span.end as usize],
                "{dtype:?}"
            );
        }
    }
}
