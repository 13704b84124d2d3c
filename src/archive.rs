//! An opened `.zstn` archive: the container structure over a memory map, and
//! the read path from a byte range of the reconstructed `.safetensors` to the
//! frames and blocks that hold it.
//!
//! Opening maps the file and parses the head, the index and the footer only.
//! Frames are parsed lazily, on first use, into a [`Grid`] of independently
//! decodable blocks: sub-tensor blocks when every plane is block-structured
//! (what ckptfs writes), otherwise the whole frame as one block (the fallback
//! for most z4ai frames). A block is identified by a [`BlockKey`] (unique
//! frame, block number), which is what caches store.
//!
//! The map is private and read-only. The file must not be truncated in place
//! while it is open (ckptfs itself only ever replaces files by rename).

use crate::codec::frame::RansTables;
use crate::codec::CodecError;
use crate::format::ckx::{self, Extension};
use crate::format::frame::{block_grid, Frame};
use crate::format::safetensors::{Header, TensorEntry};
use crate::format::zstn::{Layout, Record, RecordKind, Zstn, ZstnError};
use memmap2::Mmap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ArchiveError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Container { path: PathBuf, source: ZstnError },
    #[error("{path}: tensor {tensor:?}: {source}")]
    Frame {
        path: PathBuf,
        tensor: String,
        source: CodecError,
    },
    #[error("{path}: {what}")]
    Integrity { path: PathBuf, what: String },
}

pub type Result<T> = std::result::Result<T, ArchiveError>;

/// Identifies one decodable block: a unique frame and a block within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub unit: u32,
    pub block: u32,
}

/// A unique frame: the bytes it stores and the data-buffer span of the
/// record that owns it.
#[derive(Debug)]
struct Unit {
    name: String,
    frame: Range<u64>,
    decoded_len: u64,
    grid: OnceLock<std::result::Result<Arc<Grid>, GridError>>,
}

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

/// The bytes of an archive: a file mapping, or memory (tests, fuzzing).
/// Shared by the `.zstn` and `.blz` readers.
pub(crate) enum Backing {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    /// Maps a file read-only (an empty file cannot be mapped: it is held as
    /// an empty buffer).
    pub(crate) fn map(file: &File) -> std::io::Result<Backing> {
        if file.metadata()?.len() == 0 {
            return Ok(Backing::Owned(Vec::new()));
        }
        // SAFETY: the map is read-only and private to this process; ckptfs
        // never truncates archives in place (it replaces them by rename), so
        // the mapped pages stay valid for the map's lifetime.
        Ok(Backing::Map(unsafe { Mmap::map(file) }?))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

pub struct Archive {
    path: PathBuf,
    map: Backing,
    zstn: Zstn,
    header: Option<Header>,
    header_error: Option<String>,
    /// `u64le(hlen) ‖ header`: the first bytes of the reconstructed file.
    prefix: Vec<u8>,
    units: Vec<Unit>,
    /// For each record, the unit that holds its bytes.
    record_unit: Vec<u32>,
    ext: Option<Extension>,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive").field("path", &self.path).finish()
    }
}

impl Archive {
    pub fn open(path: &Path) -> Result<Archive> {
        let file = File::open(path).map_err(|source| ArchiveError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Archive::from_file(&file, path)
    }

    pub fn from_file(file: &File, path: &Path) -> Result<Archive> {
        let io = |source| ArchiveError::Io {
            path: path.to_path_buf(),
            source,
        };
        let map = Backing::map(file).map_err(io)?;
        Archive::from_backing(map, path)
    }

    /// An archive over bytes in memory; `name` is used in messages.
    pub fn from_bytes(bytes: Vec<u8>, name: &Path) -> Result<Archive> {
        Archive::from_backing(Backing::Owned(bytes), name)
    }

    fn from_backing(map: Backing, path: &Path) -> Result<Archive> {
        let bytes = map.bytes();
        let zstn = Zstn::parse(bytes).map_err(|source| ArchiveError::Container {
            path: path.to_path_buf(),
            source,
        })?;
        let raw = &bytes[zstn.header.start as usize..zstn.header.end as usize];
        let (header, header_error) = match Header::parse_entries(raw) {
            Ok(h) => (Some(h), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let mut prefix = Vec::with_capacity(raw.len() + 8);
        prefix.extend_from_slice(&(raw.len() as u64).to_le_bytes());
        prefix.extend_from_slice(raw);

        let mut units = Vec::new();
        let mut record_unit = Vec::new();
        match &zstn.layout {
            Layout::Opaque {
                frame_offset,
                frame_len,
            } => units.push(Unit {
                name: "<data buffer>".into(),
                frame: *frame_offset..frame_offset + frame_len,
                decoded_len: zstn.data_len,
                grid: OnceLock::new(),
            }),
            Layout::Indexed { records, .. } => {
                let mut unit_of_record = vec![u32::MAX; records.len()];
                for (i, r) in records.iter().enumerate() {
                    match r.kind {
                        RecordKind::Frame { offset, len } => {
                            unit_of_record[i] = units.len() as u32;
                            units.push(Unit {
                                name: r.name.clone(),
                                frame: offset..offset + len,
                                decoded_len: r.len(),
                                grid: OnceLock::new(),
                            });
                        }
                        RecordKind::Ref(t) => unit_of_record[i] = unit_of_record[t as usize],
                    }
                }
                record_unit = unit_of_record;
            }
        }
        let ext = ckx::find(bytes, &zstn).map_err(|what| ArchiveError::Integrity {
            path: path.to_path_buf(),
            what,
        })?;
        let archive = Archive {
            path: path.to_path_buf(),
            map,
            zstn,
            header,
            header_error,
            prefix,
            units,
            record_unit,
            ext,
        };
        if let Some(ext) = &archive.ext {
            ext.verify_structure(archive.bytes(), &archive.zstn, archive.units.len())
                .map_err(|what| archive.integrity(what))?;
        }
        Ok(archive)
    }

    fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    fn integrity(&self, what: String) -> ArchiveError {
        ArchiveError::Integrity {
            path: self.path.clone(),
            what,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Size of the reconstructed `.safetensors` file.
    pub fn logical_len(&self) -> u64 {
        self.zstn.logical_len()
    }
    /// Size of the archive on disk.
    pub fn stored_len(&self) -> u64 {
        self.zstn.file_len
    }
    pub fn container(&self) -> &Zstn {
        &self.zstn
    }
    pub fn records(&self) -> &[Record] {
        self.zstn.records()
    }
    /// The header entries, if the header JSON parses (z4ai does not require it).
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }
    pub fn header_error(&self) -> Option<&str> {
        self.header_error.as_deref()
    }
    pub fn header_bytes(&self) -> &[u8] {
        &self.prefix[8..]
    }
    pub fn extension(&self) -> Option<&Extension> {
        self.ext.as_ref()
    }
    pub fn units(&self) -> usize {
        self.units.len()
    }
    /// The header entry of a record, by name.
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.header
            .as_ref()?
            .tensors
            .iter()
            .find(|t| t.name == name)
    }
    pub fn unit_name(&self, unit: u32) -> &str {
        &self.units[unit as usize].name
    }
    /// Compressed bytes of a unit's frame.
    pub fn frame_bytes(&self, unit: u32) -> &[u8] {
        let r = &self.units[unit as usize].frame;
        &self.bytes()[r.start as usize..r.end as usize]
    }
    pub fn unit_of_record(&self, record: usize) -> u32 {
        self.record_unit.get(record).copied().unwrap_or(0)
    }

    fn frame_err(&self, unit: u32, source: CodecError) -> ArchiveError {
        ArchiveError::Frame {
            path: self.path.clone(),
            tensor: self.units[unit as usize].name.clone(),
            source,
        }
    }

    /// Parses a unit's frame structure.
    pub fn frame(&self, unit: u32) -> Result<Frame<'_>> {
        let u = &self.units[unit as usize];
        let f = Frame::parse(self.frame_bytes(unit)).map_err(|e| self.frame_err(unit, e))?;
        if f.decoded_len() != u.decoded_len {
            return Err(self.frame_err(
                unit,
                CodecError::LengthMismatch {
                    what: "frame",
                    got: f.decoded_len(),
                    expected: u.decoded_len,
                },
            ));
        }
        Ok(f)
    }

    /// The block grid of a unit (parsed once, then shared).
    pub fn grid(&self, unit: u32) -> Result<Arc<Grid>> {
        let u = &self.units[unit as usize];
        u.grid
            .get_or_init(|| self.build_grid(unit))
            .clone()
            .map_err(|e| match e {
                GridError::Codec(e) => self.frame_err(unit, e),
                GridError::Integrity(what) => self.unit_integrity(unit, what),
            })
    }

    fn unit_integrity(&self, unit: u32, what: String) -> ArchiveError {
        self.integrity(format!("tensor {:?}: {what}", self.unit_name(unit)))
    }

    fn build_grid(&self, unit: u32) -> std::result::Result<Arc<Grid>, GridError> {
        let u = &self.units[unit as usize];
        let (grid, meta) = frame_grid(self.frame_bytes(unit), u.decoded_len)?;
        if let Some(ext) = &self.ext {
            ext.verify_grid(unit as usize, &grid.bounds, meta)
                .map_err(GridError::Integrity)?;
        }
        Ok(Arc::new(grid))
    }

    /// Decodes one block: the unit bytes `grid.span(block)`. With a
    /// checksum block, the compressed bytes are checked before decoding and
    /// the decoded bytes after.
    pub fn decode_block(&self, key: BlockKey) -> Result<Vec<u8>> {
        let grid = self.grid(key.unit)?;
        let b = key.block as usize;
        if b >= grid.blocks() {
            return Err(self.frame_err(
                key.unit,
                CodecError::invalid("block", format!("no block {b}")),
            ));
        }
        let unit = key.unit as usize;
        let want = self.ext.as_ref().map(|e| e.units[unit].blocks[b].payload);
        let out =
            decode_frame_block(self.frame_bytes(key.unit), &grid, b, want).map_err(
                |e| match e {
                    BlockError::Codec(e) => self.frame_err(key.unit, e),
                    BlockError::Payload => self.unit_integrity(
                        key.unit,
                        format!("checksum mismatch in the compressed bytes of block {b}"),
                    ),
                },
            )?;
        if let Some(ext) = &self.ext {
            ext.verify_data(unit, b, &out)
                .map_err(|what| self.unit_integrity(key.unit, what))?;
        }
        Ok(out)
    }

    /// Checks a unit's whole-frame checksum (a no-op without a checksum block).
    pub fn verify_frame(&self, unit: u32) -> Result<()> {
        match &self.ext {
            Some(ext) => ext
                .verify_frame(unit as usize, self.frame_bytes(unit))
                .map_err(|what| self.unit_integrity(unit, what)),
            None => Ok(()),
        }
    }

    /// Where the data of logical file range `range` lives: a list of
    /// (block, range inside the block's decoded bytes, offset in the output).
    pub fn plan(&self, range: Range<u64>) -> Result<Vec<Piece>> {
        let mut pieces = Vec::new();
        let data_start = self.zstn.data_start();
        let end = range.end.min(self.logical_len());
        let mut pos = range.start;
        if pos < data_start && pos < end {
            let hi = end.min(data_start);
            pieces.push(Piece {
                source: PieceSource::Prefix,
                within: pos..hi,
                out_offset: 0,
            });
            pos = hi;
        }
        while pos < end {
            let d = pos - data_start;
            let (unit, unit_base, unit_len) = self.unit_at(d);
            let grid = self.grid(unit)?;
            let in_unit = d - unit_base;
            let block = grid.block_of(in_unit);
            let span = grid.span(block);
            let hi_in_unit = span.end.min(in_unit + (end - pos)).min(unit_len);
            pieces.push(Piece {
                source: PieceSource::Block(BlockKey {
                    unit,
                    block: block as u32,
                }),
                within: (in_unit - span.start)..(hi_in_unit - span.start),
                out_offset: pos - range.start,
            });
            pos += hi_in_unit - in_unit;
        }
        Ok(pieces)
    }

    /// The unit holding data-buffer byte `d`, the data offset where the
    /// owning record starts, and the record length.
    fn unit_at(&self, d: u64) -> (u32, u64, u64) {
        let records = self.zstn.records();
        if records.is_empty() {
            return (0, 0, self.zstn.data_len);
        }
        // Records tile the data buffer; find the last one starting at or
        // before d, skipping empty spans.
        let i = records.partition_point(|r| r.begin <= d) - 1;
        let mut i = i;
        while records[i].is_empty() && i + 1 < records.len() {
            i += 1;
        }
        let r = &records[i];
        (self.record_unit[i], r.begin, r.len())
    }

    /// Reads logical bytes `[offset, offset + buf.len())` (clamped to the
    /// file), fetching blocks through `fetch` (a cache, or plain decoding).
    pub fn read_with(
        &self,
        offset: u64,
        buf: &mut [u8],
        fetch: &dyn Fn(BlockKey) -> Result<Arc<Vec<u8>>>,
    ) -> Result<usize> {
        if offset >= self.logical_len() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(self.logical_len() - offset) as usize;
        for p in self.plan(offset..offset + n as u64)? {
            let dst = &mut buf[p.out_offset as usize
                ..p.out_offset as usize + (p.within.end - p.within.start) as usize];
            match p.source {
                PieceSource::Prefix => dst
                    .copy_from_slice(&self.prefix[p.within.start as usize..p.within.end as usize]),
                PieceSource::Block(key) => {
                    let block = fetch(key)?;
                    dst.copy_from_slice(&block[p.within.start as usize..p.within.end as usize]);
                }
            }
        }
        Ok(n)
    }

    /// Reads without a cache, decoding every covered block.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.read_with(offset, buf, &|k| self.decode_block(k).map(Arc::new))
    }

    /// Decodes a whole unit (all its blocks, in parallel when large).
    pub fn decode_unit(&self, unit: u32) -> Result<Vec<u8>> {
        use rayon::prelude::*;
        let grid = self.grid(unit)?;
        if grid.blocks() == 1 {
            return self.decode_block(BlockKey { unit, block: 0 });
        }
        let parts: Vec<Vec<u8>> = (0..grid.blocks() as u32)
            .into_par_iter()
            .map(|block| self.decode_block(BlockKey { unit, block }))
            .collect::<Result<_>>()?;
        Ok(parts.concat())
    }

    /// The decoded bytes of record `i` (a tensor), following REFs.
    pub fn decode_record(&self, i: usize) -> Result<Vec<u8>> {
        self.decode_unit(self.record_unit[i])
    }

    /// Every block of every unit, in data-buffer order (REF records add none).
    pub fn all_blocks(&self) -> Result<Vec<BlockKey>> {
        let mut keys = Vec::new();
        for unit in 0..self.units.len() as u32 {
            let g = self.grid(unit)?;
            keys.extend((0..g.blocks() as u32).map(|block| BlockKey { unit, block }));
        }
        Ok(keys)
    }

    /// Decoded length of a block.
    pub fn block_len(&self, key: BlockKey) -> Result<u64> {
        let g = self.grid(key.unit)?;
        let s = g.span(key.block as usize);
        Ok(s.end - s.start)
    }

    /// Data-buffer records in order with the unit each reads from; for
    /// an opaque layout, one pseudo-record covering the data buffer.
    pub fn segments(&self) -> Vec<(String, Range<u64>, u32)> {
        let records = self.zstn.records();
        if let Layout::Opaque { .. } = self.zstn.layout {
            return vec![("<data buffer>".into(), 0..self.zstn.data_len, 0)];
        }
        records
            .iter()
            .enumerate()
            .map(|(i, r)| (r.name.clone(), r.span(), self.record_unit[i]))
            .collect()
    }
}

/// Parses a frame into its block grid (checking that it decodes to
/// `decoded_len`) and the CKX1 meta digest of its non-payload bytes. Shared
/// by every reader of ckptfs frames (`.zstn` units, `.blz` blobs).
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

/// Why a frame block could not be decoded.
pub(crate) enum BlockError {
    Codec(CodecError),
    /// The compressed bytes do not match their checksum.
    Payload,
}

/// Decodes block `b` of a frame laid out as `grid` says. With
/// `payload_digest`, the block's compressed bytes are checked against it
/// before anything is decoded.
pub(crate) fn decode_frame_block(
    bytes: &[u8],
    grid: &Grid,
    b: usize,
    payload_digest: Option<u64>,
) -> std::result::Result<Vec<u8>, BlockError> {
    let frame = Frame::parse(bytes).map_err(BlockError::Codec)?;
    let access = if grid.elem_bytes == 0 {
        None
    } else {
        frame.element_access().map_err(BlockError::Codec)?
    };
    if let Some(want) = payload_digest {
        let ranges = ckx::block_payload(
            access.as_ref(),
            bytes.len(),
            &grid.bounds,
            grid.elem_bytes,
            b,
        );
        if ckx::hash_ranges(bytes, &ranges) != want {
            return Err(BlockError::Payload);
        }
    }
    let span = grid.span(b);
    let mut out = vec![0u8; (span.end - span.start) as usize];
    match &access {
        None => frame.decode(&mut out).map_err(BlockError::Codec)?,
        Some(access) => {
            let eb = grid.elem_bytes;
            let body = access.frame.body_len();
            let b_body = span.end.min(body);
            let (body_part, tail_part) = out.split_at_mut((b_body - span.start) as usize);
            access
                .decode_elements(span.start / eb, b_body / eb, &grid.tables, body_part)
                .map_err(BlockError::Codec)?;
            // The last block carries the tail.
            let tail = access.frame.tail;
            tail_part.copy_from_slice(&tail[tail.len() - tail_part.len()..]);
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PieceSource {
    Prefix,
    Block(BlockKey),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub source: PieceSource,
    /// Range inside the source (prefix bytes, or the block's decoded bytes).
    pub within: Range<u64>,
    /// Where it goes in the caller's buffer.
    pub out_offset: u64,
}
