//! An opened `.zstn` archive (z4ai's ZSTN container): one presented file,
//! the reconstructed `.safetensors`, made of the header (the prefix) and
//! the data buffer, whose records are the segments.
//!
//! Opening maps the file and parses the head, the index and the footer only.
//! Frames are parsed lazily, on first use, into a [`Grid`] of independently
//! decodable blocks: sub-tensor blocks when every plane is block-structured
//! (what ckptfs writes), otherwise the whole frame as one block (the fallback
//! for most z4ai frames). A unit is one unique frame; a REF record reads the
//! unit of the record it names.
//!
//! With a CKX1 checksum block (every file ckptfs writes), each block's
//! compressed bytes are checked before decoding and its decoded bytes after.
//!
//! Memory: what an open archive holds is bounded by its record count, not
//! by its header. The prefix (`u64 hlen ‖ header`) is served from the
//! mapped file, where it lies verbatim; record names stay there too. The
//! header JSON is not parsed at open: `verify` walks it once, entry by
//! entry, against the index sorted by name (linear in memory, n log n in
//! time); [`ZstnArchive::header`] parses it whole on demand (tools only).
//! Per record this is 56 bytes of index, 24 of segment and 4 of unit map;
//! per unique frame 32 bytes of unit (its grid cell) and 24 of checksum
//! head, plus 24 per block and the grids built so far.

use super::frame_block::{
    block_file_ranges, block_index, block_ranges, damaged_payload, decode_refetching_once,
    decode_unit_block, fetch_frame_structure, frame_grid, in_file, io_error, shared_grid,
    shared_grid_refetching_once, GridCell, GridError,
};
use super::{ArchiveError, ArchiveView, BlockKey, Grid, Kind, Result, Segment};
use ckptfs_codec::CodecError;
use ckptfs_format::ckx::{self, Extension};
use ckptfs_format::frame::Frame;
use ckptfs_format::safetensors::{for_each_entry, Header, HeaderError, TensorEntry};
use ckptfs_format::zstn::{IndexRecord, Layout, Record, RecordKind, Zstn};
use ckptfs_store::read_ahead::{in_order, ReadAhead};
use ckptfs_store::remote::Pin;
use ckptfs_store::source::ByteSource;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// A unique frame: the FRAME record that holds it (0 for an opaque
/// layout, whose one frame is the data buffer) and its grid, built on
/// first use.
struct Unit {
    record: u32,
    grid: GridCell,
}

/// What `verify`'s walk over the header found, for its summary.
#[derive(Debug)]
struct HeaderCheck {
    tensors: usize,
    /// Why the header is not strict safetensors, as verify's summary says
    /// it (the first reason found).
    note: Option<String>,
}

/// Fetches, from a source whose bytes are fetched, what opening a ZSTN
/// container reads: with an index, its head (up to the first frame), its
/// index and footer and its CKX1 block (frames are fetched when first
/// used); without one, the whole container.
pub(crate) fn fetch_metadata(b: &dyn ByteSource) -> std::io::Result<()> {
    let len = b.bytes().len() as u64;
    let u64_at = |at| crate::u64_at(b, at);
    let indexed = b.bytes().get(5) == Some(&1);
    let footer = ckptfs_format::zstn::FOOTER_LEN;
    if !indexed || len < 22 + footer {
        return b.ensure(0..len);
    }
    let head_end = u64_at(6).map_or(len, |h| h.saturating_add(22).min(len));
    b.ensure(0..head_end)?;
    b.ensure(len - footer..len)?;
    let index_offset = u64_at(len - footer).unwrap_or(0).min(len);
    b.ensure(index_offset..len)?;
    // The CKX1 block ends at the index with a 20-byte trailer naming its
    // length (absent in z4ai-written files).
    if index_offset >= 20 {
        b.ensure(index_offset - 20..index_offset)?;
        if b.bytes()
            .get(index_offset as usize - 4..index_offset as usize)
            == Some(b"CKX1")
        {
            let ext = u64_at(index_offset - 12).unwrap_or(0).min(index_offset);
            b.ensure(index_offset - ext..index_offset)?;
        }
    }
    Ok(())
}

fn strict_note(e: impl std::fmt::Display) -> String {
    format!("; note: not strict safetensors: {e}")
}

fn loose_note(e: &str) -> String {
    format!(
        "; note: the header is not strict safetensors ({e}), but every tensor decodes exactly \
         as stored"
    )
}

/// Read-ahead over a remote archive's frames (the store's one policy,
/// `ckptfs_store::read_ahead`): a frame read in order is fetched whole,
/// and the frames after it in the background, up to 64 MiB within the
/// read-ahead room the disk cache allows.
const FRAMES_AHEAD: ReadAhead = ReadAhead {
    window: 1,
    beyond: 64 << 20,
};

/// Read-ahead over a frame's blocks: a block read in order is fetched
/// with the rest of its aligned window of 8 blocks (about 5.5 MB of
/// compressed bf16), and the blocks after the window in the background,
/// up to 64 MiB.
const BLOCKS_AHEAD: ReadAhead = ReadAhead {
    window: 8,
    beyond: 64 << 20,
};

pub struct ZstnArchive {
    path: PathBuf,
    map: Box<dyn ByteSource>,
    zstn: Zstn,
    /// The header entries, parsed whole on first use ([`Self::header`]).
    header: OnceLock<std::result::Result<Header, String>>,
    units: Vec<Unit>,
    /// For each record, the unit that holds its bytes.
    record_unit: Vec<u32>,
    ext: Option<Extension>,
    segments: Vec<Segment>,
    checked: OnceLock<HeaderCheck>,
}

impl std::fmt::Debug for ZstnArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZstnArchive")
            .field("path", &self.path)
            .finish()
    }
}

/// The data buffer as segments: the non-empty records in order (REFs
/// reading their target's unit), or one segment for an opaque layout.
fn segments_of(zstn: &Zstn, record_unit: &[u32]) -> Vec<Segment> {
    let start = zstn.data_start();
    let mut segments: Vec<Segment> = match &zstn.layout {
        Layout::Opaque { .. } => vec![Segment {
            start,
            len: zstn.data_len,
            unit: 0,
        }],
        Layout::Indexed { records, .. } => records
            .iter()
            .zip(record_unit)
            .filter(|(r, _)| !r.is_empty())
            .map(|(r, &unit)| Segment {
                start: start + r.begin,
                len: r.len(),
                unit,
            })
            .collect(),
    };
    // Records tile the data buffer in order, so this is already sorted;
    // kept as the invariant `plan` relies on.
    segments.sort_by_key(|s| s.start);
    segments
}

impl ZstnArchive {
    /// Opens a `.zstn` file (any kind of archive: [`super::open`]).
    pub fn open(path: &Path) -> Result<ZstnArchive> {
        let io = |source| ArchiveError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        ZstnArchive::from_source(ckptfs_store::source::map_file(&file).map_err(io)?, path)
    }

    /// A `.zstn` held in memory; `name` is used in messages.
    pub fn from_bytes(bytes: Vec<u8>, name: &Path) -> Result<ZstnArchive> {
        ZstnArchive::from_source(Box::new(bytes), name)
    }

    pub fn from_source(map: Box<dyn ByteSource>, path: &Path) -> Result<ZstnArchive> {
        let bytes = map.bytes();
        let zstn = Zstn::parse(bytes).map_err(|source| ArchiveError::Container {
            path: path.to_path_buf(),
            source,
        })?;
        let mut units = Vec::new();
        let mut record_unit = Vec::new();
        match &zstn.layout {
            Layout::Opaque { .. } => units.push(Unit {
                record: 0,
                grid: OnceLock::new(),
            }),
            Layout::Indexed { records, .. } => {
                record_unit = vec![u32::MAX; records.len()];
                for (i, r) in records.iter().enumerate() {
                    record_unit[i] = match r.kind {
                        RecordKind::Frame { .. } => {
                            units.push(Unit {
                                record: i as u32,
                                grid: OnceLock::new(),
                            });
                            units.len() as u32 - 1
                        }
                        RecordKind::Ref(t) => record_unit[t as usize],
                    };
                }
            }
        }
        let ext = ckx::find(bytes, &zstn).map_err(|what| ArchiveError::Integrity {
            path: path.to_path_buf(),
            what,
        })?;
        let segments = segments_of(&zstn, &record_unit);
        let archive = ZstnArchive {
            path: path.to_path_buf(),
            map,
            zstn,
            header: OnceLock::new(),
            units,
            record_unit,
            ext,
            segments,
            checked: OnceLock::new(),
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

    fn index(&self) -> &[IndexRecord] {
        self.zstn.records()
    }

    /// Size of the reconstructed `.safetensors` file.
    pub fn len(&self) -> u64 {
        self.zstn.logical_len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn container(&self) -> &Zstn {
        &self.zstn
    }
    /// The index records with their names (built on each call: tools and
    /// tests; `container().records()` is the compact form).
    pub fn records(&self) -> Vec<Record> {
        self.index()
            .iter()
            .map(|r| r.to_record(self.bytes()))
            .collect()
    }
    /// The name of record `i` (empty when there is none).
    pub fn record_name(&self, i: usize) -> &str {
        self.index().get(i).map_or("", |r| r.name(self.bytes()))
    }
    /// The header entries, if the header JSON parses (z4ai does not
    /// require it). Parsed whole on the first call and kept: for tools;
    /// the mount and `verify` never call it.
    pub fn header(&self) -> Option<&Header> {
        self.parsed_header().as_ref().ok()
    }
    pub fn header_error(&self) -> Option<&str> {
        self.parsed_header().as_ref().err().map(String::as_str)
    }
    fn parsed_header(&self) -> &std::result::Result<Header, String> {
        self.header
            .get_or_init(|| Header::parse_entries(self.header_bytes()).map_err(|e| e.to_string()))
    }
    pub fn header_bytes(&self) -> &[u8] {
        let h = &self.zstn.header;
        &self.bytes()[h.start as usize..h.end as usize]
    }
    pub fn extension(&self) -> Option<&Extension> {
        self.ext.as_ref()
    }
    /// The archive's own bytes, as stored.
    pub fn stored_bytes(&self) -> &[u8] {
        self.bytes()
    }
    /// The header entry of a record, by name (a linear search of
    /// [`Self::header`]).
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.header()?.tensors.iter().find(|t| t.name == name)
    }
    /// Stored bytes of a unit's frame, in the file.
    fn unit_frame(&self, unit: u32) -> Range<u64> {
        match &self.zstn.layout {
            Layout::Opaque {
                frame_offset,
                frame_len,
            } => *frame_offset..frame_offset + frame_len,
            Layout::Indexed { records, .. } => {
                match records[self.units[unit as usize].record as usize].kind {
                    RecordKind::Frame { offset, len } => offset..offset + len,
                    RecordKind::Ref(_) => unreachable!("units are FRAME records"),
                }
            }
        }
    }
    /// Decoded length of a unit: its record's span.
    fn unit_decoded_len(&self, unit: u32) -> u64 {
        match &self.zstn.layout {
            Layout::Opaque { .. } => self.zstn.data_len,
            Layout::Indexed { records, .. } => {
                records[self.units[unit as usize].record as usize].len()
            }
        }
    }
    /// Compressed bytes of a unit's frame.
    pub fn frame_bytes(&self, unit: u32) -> &[u8] {
        let r = self.unit_frame(unit);
        &self.bytes()[r.start as usize..r.end as usize]
    }
    pub fn unit_of_record(&self, record: usize) -> u32 {
        self.record_unit.get(record).copied().unwrap_or(0)
    }
    /// The decoded bytes of record `i` (a tensor), following REFs.
    pub fn decode_record(&self, i: usize) -> Result<Vec<u8>> {
        self.decode_unit(self.unit_of_record(i))
    }

    /// Parses a unit's frame structure.
    pub fn frame(&self, unit: u32) -> Result<Frame<'_>> {
        let f = Frame::parse(self.frame_bytes(unit)).map_err(|e| self.frame_error(unit, e))?;
        let want = self.unit_decoded_len(unit);
        if f.decoded_len() != want {
            return Err(self.frame_error(
                unit,
                CodecError::LengthMismatch {
                    what: "frame",
                    got: f.decoded_len(),
                    expected: want,
                },
            ));
        }
        Ok(f)
    }

    /// Decodes one block from the bytes at hand (checked as `decode_block`
    /// says).
    fn decode_block_once(&self, key: BlockKey) -> Result<Vec<u8>> {
        let bytes = self.frame_bytes(key.unit);
        let Some(ext) = &self.ext else {
            // A z4ai-written file: no checksums to check.
            return decode_unit_block(self, key, bytes);
        };
        let b = block_index(self, key, &*self.grid(key.unit)?)?;
        let unit = key.unit as usize;
        decode_unit_block(self, key, bytes)
            .and_then(|out| {
                ext.verify_data(unit, b, &out)
                    .map_err(|what| self.unit_integrity(key.unit, what))?;
                Ok(out)
            })
            .map_err(|e| {
                let want = ext.unit_blocks(unit)[b].payload;
                damaged_payload(self, key, bytes, want).unwrap_or(e)
            })
    }

    /// For a remote archive, before the unit's grid is built: fetches the
    /// bytes building it reads, and returns the file ranges they lie in:
    /// the frame's structure (not its payloads), or the whole frame when
    /// it cannot be read block by block; that is one block's payload, so
    /// it is pinned in the disk cache until the grid is built.
    fn fetch_structure(&self, unit: u32) -> Result<(Vec<Range<u64>>, Option<Pin<'_>>)> {
        let frame = self.unit_frame(unit);
        // A reader going through the units in order (the previous one was
        // read, or its last byte is here or on its way): the frames after
        // this one are fetched in the background, and this one whole, in
        // one run (its structure and payloads: fewer, larger requests
        // than block by block, which it is about to read anyway).
        let len = frame.end - frame.start;
        let room = self.map.read_ahead_room();
        if self.follows_a_read_unit(unit) && len <= room.min(FRAMES_AHEAD.beyond) {
            FRAMES_AHEAD.start(&*self.map, self.units.len(), unit as usize, len, |u| {
                let f = self.unit_frame(u as u32);
                (f.start < f.end).then(|| vec![f])
            });
            let whole = vec![frame];
            let pin = self.map.pin_all(&whole).map_err(|e| io_error(self, e))?;
            return Ok((whole, pin));
        }
        fetch_frame_structure(&*self.map, &frame, self.unit_decoded_len(unit))
            .map_err(|e| io_error(self, e))
    }

    /// True when the unit before `unit` is read or was (its grid is
    /// built, or the first or last byte of its frame is fetched or being
    /// fetched): `unit` is read by a reader going through the archive in
    /// order (the mount decodes a few blocks ahead at once, so the two may
    /// be asked for together).
    fn follows_a_read_unit(&self, unit: u32) -> bool {
        let Some(prev) = unit.checked_sub(1) else {
            return false;
        };
        if self.units[prev as usize].grid.get().is_some() {
            return true;
        }
        let f = self.unit_frame(prev);
        f.start < f.end
            && (in_order(&*self.map, &[f.start..f.start + 1])
                || in_order(&*self.map, &[f.end - 1..f.end]))
    }

    fn build_grid(&self, unit: u32) -> std::result::Result<Arc<Grid>, GridError> {
        let (grid, meta) = frame_grid(self.frame_bytes(unit), self.unit_decoded_len(unit))?;
        if let Some(ext) = &self.ext {
            ext.verify_grid(unit as usize, &grid.bounds, meta)
                .map_err(GridError::Integrity)?;
        }
        Ok(Arc::new(grid))
    }

    /// Every header tensor must match a record of the same name and span,
    /// and every record a header tensor. One walk over the header JSON,
    /// entry by entry (never the whole JSON tree), against the record
    /// numbers sorted by name; as in a JSON object, the last of two entries
    /// of one name counts. Also notes the first entry that is not strict
    /// safetensors, for the summary.
    fn check_header_against_index(&self) -> Result<&HeaderCheck> {
        if let Some(c) = self.checked.get() {
            return Ok(c);
        }
        let Layout::Indexed { records, .. } = &self.zstn.layout else {
            // An opaque layout has no index to hold the header to (z4ai
            // does not require the header to parse).
            let note = match (self.header(), self.header_error()) {
                (Some(h), _) => h.validate(self.zstn.data_len).err().map(strict_note),
                (None, e) => Some(loose_note(e.unwrap_or("unparseable"))),
            };
            return Ok(self.checked.get_or_init(|| HeaderCheck {
                tensors: self.header().map_or(0, |h| h.tensors.len()),
                note,
            }));
        };
        let bytes = self.bytes();
        let name = |r: u32| records[r as usize].name(bytes);
        let mut by_name: Vec<u32> = (0..records.len() as u32).collect();
        by_name.sort_unstable_by(|&a, &b| name(a).cmp(name(b)));
        if let Some(w) = by_name.windows(2).find(|w| name(w[0]) == name(w[1])) {
            return Err(self.integrity(format!("index holds tensor {:?} twice", name(w[0]))));
        }
        // Per record: 0 not in the header, 1 its span matches, 2 it differs.
        let mut state = vec![0u8; records.len()];
        let mut differs: Vec<(u32, u64, u64)> = Vec::new();
        let mut unknown: Option<String> = None;
        let mut strict: Option<String> = None;
        let walked = for_each_entry(self.header_bytes(), |t| {
            let Ok(k) = by_name.binary_search_by(|&r| name(r).cmp(t.name.as_str())) else {
                unknown = Some(t.name.clone());
                return Err(HeaderError::NotAnObject); // stops the walk
            };
            let r = by_name[k];
            let rec = &records[r as usize];
            if rec.begin == t.begin && rec.end == t.end {
                state[r as usize] = 1;
            } else {
                state[r as usize] = 2;
                differs.push((r, t.begin, t.end));
            }
            if strict.is_none() {
                strict = t.validate(self.zstn.data_len).err().map(strict_note);
            }
            Ok(())
        });
        if let Some(n) = unknown {
            return Err(self.integrity(format!("tensor {n:?} has no index record")));
        }
        if let Err(e) = walked {
            // A header that is not safetensors JSON (z4ai writes some) has
            // no entries to check against the index; the file still decodes
            // exactly, and verify says so.
            return Ok(self.checked.get_or_init(|| HeaderCheck {
                tensors: records.len(),
                note: Some(loose_note(&e.to_string())),
            }));
        }
        let listed = state.iter().filter(|&&s| s != 0).count();
        if listed != records.len() {
            return Err(self.integrity(format!(
                "header lists {listed} tensors, index holds {} records",
                records.len()
            )));
        }
        if let Some(&(r, ..)) = differs.iter().find(|(r, ..)| state[*r as usize] == 2) {
            // The last entry of that name is the one that counts.
            let &(_, hb, he) = differs
                .iter()
                .rev()
                .find(|d| d.0 == r)
                .expect("found above");
            let rec = &records[r as usize];
            return Err(self.integrity(format!(
                "tensor {:?}: header span [{hb}, {he}) but index span [{}, {})",
                name(r),
                rec.begin,
                rec.end
            )));
        }
        Ok(self.checked.get_or_init(|| HeaderCheck {
            tensors: records.len(),
            note: strict,
        }))
    }
}

impl ArchiveView for ZstnArchive {
    fn kind(&self) -> Kind {
        Kind::Zstn
    }
    fn path(&self) -> &Path {
        &self.path
    }
    fn stored_len(&self) -> u64 {
        self.zstn.file_len
    }
    fn checksums(&self) -> Option<&'static str> {
        self.ext.as_ref().map(|_| "ckx1")
    }
    /// The xxh3 of the CKX1 block: it holds the digests of the head, the
    /// index and every block, so the same fingerprint means the same
    /// presented content (each block still checked when read).
    fn fingerprint(&self) -> Option<u64> {
        let e = self.ext.as_ref()?;
        let r = e.range.start as usize..e.range.end as usize;
        Some(ckptfs_format::digest::xxh3_64(&self.bytes()[r]))
    }
    fn files(&self) -> usize {
        1
    }
    fn file_path(&self, _file: usize) -> &str {
        ""
    }
    fn logical_len(&self, _file: usize) -> u64 {
        self.zstn.logical_len()
    }
    /// `u64le(hlen) ‖ header`: exactly the file's bytes from the `hlen`
    /// field (offset 6) to the end of the header JSON.
    fn prefix(&self, _file: usize) -> Result<&[u8]> {
        Ok(&self.bytes()[6..self.zstn.header.end as usize])
    }
    fn prefix_len(&self, _file: usize) -> u64 {
        self.zstn.data_start()
    }
    fn segments(&self, _file: usize) -> &[Segment] {
        &self.segments
    }
    fn units(&self) -> usize {
        self.units.len()
    }
    fn unit_name(&self, unit: u32) -> &str {
        match (&self.zstn.layout, self.units.get(unit as usize)) {
            (Layout::Indexed { records, .. }, Some(u)) => {
                records[u.record as usize].name(self.bytes())
            }
            _ => "<data buffer>",
        }
    }

    fn unit_label(&self, unit: u32) -> String {
        format!("tensor {:?}", self.unit_name(unit))
    }

    fn grid(&self, unit: u32) -> Result<Arc<Grid>> {
        let cell = self.units.get(unit as usize).map(|u| &u.grid);
        if cell.is_some_and(|c| c.get().is_none()) && self.map.is_remote() {
            let (fetched, _pin) = self.fetch_structure(unit)?;
            // A cached copy that fails its checks is fetched again once
            // before the failure is kept.
            return shared_grid_refetching_once(self, &*self.map, unit, cell, &fetched, || {
                self.build_grid(unit)
            });
        }
        shared_grid(self, unit, cell, || self.build_grid(unit))
    }

    /// A hint that the unit's blocks will be read: the kernel is asked to
    /// read its stored bytes ahead. A remote archive fetches each block's
    /// bytes when the block is decoded (the mount's read-ahead decodes
    /// blocks ahead), never a whole frame for a hint.
    fn will_need(&self, unit: u32) {
        if (unit as usize) < self.units.len() && !self.map.is_remote() {
            self.map.will_need(self.unit_frame(unit));
        }
    }

    /// Decodes one block: the unit bytes `grid.span(block)`. With a
    /// checksum block, the decoded bytes are checked against their digest.
    /// A remote archive first fetches what the block reads (its payload in
    /// each plane); a block that fails its checks is fetched again once,
    /// with the frame's structure, before the failure stands.
    fn decode_block(&self, key: BlockKey) -> Result<Vec<u8>> {
        if !self.map.is_remote() {
            return self.decode_block_once(key);
        }
        let grid = self.grid(key.unit)?;
        let b = block_index(self, key, &grid)?;
        let frame = self.unit_frame(key.unit);
        let bytes = self.frame_bytes(key.unit);
        let payload = block_file_ranges(&frame, bytes, &grid, b);
        // A missing block whose predecessor is here or on its way belongs
        // to a reader going through the frame in order (the mount decodes
        // several blocks ahead at once): the missing blocks of its window
        // are fetched with it, one coalesced GET per plane, and the blocks
        // after it in the background ([`BLOCKS_AHEAD`]). A random read
        // (its predecessor absent) fetches its block only.
        let sequential = b > 0
            && !self.map.has_all(&payload)
            && block_ranges(bytes, &grid, b - 1)
                .is_some_and(|prev| in_order(&*self.map, &in_file(&frame, &prev)));
        let ahead = if sequential {
            let own = payload.iter().map(|r| r.end - r.start).sum();
            BLOCKS_AHEAD.start(&*self.map, grid.blocks(), b, own, |nb| {
                block_ranges(bytes, &grid, nb).map(|rs| in_file(&frame, &rs))
            })
        } else {
            Vec::new()
        };
        // Fetched together (one coalesced run per plane) and kept while
        // this block's own pin is taken; the blocks ahead are then only
        // cached, evictable like any other. If they cannot be fetched, the
        // block's own bytes are still tried alone.
        let _ahead = if ahead.is_empty() {
            None
        } else {
            let mut all = payload.clone();
            all.extend(ahead);
            self.map.pin_all(&all).ok()
        };
        // The block's bytes stay in the disk cache until it is decoded.
        let _pin = self.map.pin_all(&payload).map_err(|e| io_error(self, e))?;
        drop(_ahead);
        let structure = Some((bytes, self.unit_decoded_len(key.unit)));
        decode_refetching_once(&*self.map, &frame, structure, payload, || {
            self.decode_block_once(key)
        })
    }

    fn verify_structure(&self) -> Result<()> {
        self.check_header_against_index().map(|_| ())
    }

    /// The whole-frame checksum of the unit's compressed bytes (a no-op
    /// without a checksum block).
    fn verify_unit(&self, unit: u32, _digest: u64) -> Result<()> {
        let Some(ext) = &self.ext else {
            return Ok(());
        };
        let bytes = self.frame_bytes(unit);
        ext.verify_frame(unit as usize, bytes)
            .map_err(|what| self.unit_integrity(unit, what))?;
        // Reads hash a block's compressed bytes only after a failure;
        // `verify` checks every block's digest as written.
        for (b, d) in ext.unit_blocks(unit as usize).iter().enumerate() {
            let key = BlockKey {
                unit,
                block: b as u32,
            };
            if let Some(e) = damaged_payload(self, key, bytes, d.payload) {
                return Err(e);
            }
        }
        Ok(())
    }

    fn verify_finish(&self, _unit_digests: &[u64]) -> Result<String> {
        let check = self.check_header_against_index()?;
        let strict = check.note.clone().unwrap_or_default();
        Ok(format!(
            "{} tensors, {} -> {} bytes, ratio {:.4}, {}{}",
            check.tensors,
            self.len(),
            self.stored_len(),
            self.len() as f64 / self.stored_len().max(1) as f64,
            if self.ext.is_some() {
                "all checksums verified"
            } else {
                "no checksums (z4ai file): structure and lengths verified"
            },
            strict
        ))
    }
}

#[cfg(test)]
mod tests;
