//! An opened ckptfs `.blz` model archive: the validated header over a
//! memory map, presenting every file of the model directory.
//!
//! Opening maps the file and parses the prelude and header JSON only
//! ([`format::blz::parse`] checks every offset, length, path and reference).
//! Every file is `prefix ‖ segments` ([`super::ArchiveView`]):
//! - the *prefix* is held in memory: `u64 hlen ‖ header` for a shard, the
//!   whole content for an embedded file. It is built on first use and its
//!   digest checked then (`safetensors_header_xxh3`, the file's `xxh3`), so
//!   a damaged sidecar or shard header fails only reads of that file;
//! - each *segment* is one blob (a tensor, a shard's whole data buffer, a
//!   large plain file), read block by block.
//!
//! A unit is a blob: blobs are unique across the whole archive, so tensors
//! shared by several shards share cache entries. Block reads check the
//! block's digests (payload before decoding, data after). The data-section
//! SHA-256 is checked by `verify` only. The header digest is checked at
//! open; when it fails, every segment is checked against its tensor's or
//! file's own digest before it is served (see `trusted`).

use super::frame_block::{
    block_index, damaged_payload, decode_refetching_once, decode_remote_frame_block,
    decode_unit_block, frame_grid, frame_unit_grid, io_error, GridCell, GridError,
};
use super::path_index::PathIndex;
use super::{ArchiveError, ArchiveView, BlockKey, Grid, Kind, Result, Segment};
use base64::Engine as _;
use ckptfs_format::blz::{
    self, BlobEntry, BlzError, Content, Encoding, FileEntry, Header as BlzHeader, Parsed, Stored,
};
use ckptfs_format::digest::{xxh3_64, Xxh3};
use ckptfs_format::safetensors::Header as StHeader;
use ckptfs_store::source::ByteSource;
use sha2::{Digest as _, Sha256};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Fetches, from a source whose bytes are fetched, what opening a `.blz`
/// reads (ckptfs's, or BLAZE-X's, whose prelude is `prelude` bytes long
/// and likewise names its header's length at byte 12): the prelude and
/// the header; blobs and tensors are fetched when first used.
pub(crate) fn fetch_metadata(b: &dyn ByteSource, prelude: u64) -> std::io::Result<()> {
    let len = b.bytes().len() as u64;
    let header_end = crate::u64_at(b, 12).map_or(len, |h| h.saturating_add(prelude).min(len));
    b.ensure(0..header_end)
}

/// One blob: its grid, built and checked on first use.
struct Unit {
    /// The first file (and tensor) that uses it, for messages.
    name: String,
    grid: GridCell,
}

/// What a segment's decoded bytes must hash to: (range within the
/// segment, xxh3) pairs (one per tensor, or the whole file).
type Expect = Vec<(Range<u64>, u64)>;

struct Slot {
    prefix_len: u64,
    /// Non-empty segments in file order, contiguous from `prefix_len`.
    segments: Vec<Segment>,
    /// Per segment, its digests.
    expect: Vec<Expect>,
    prefix: OnceLock<std::result::Result<Vec<u8>, String>>,
    /// Per segment, whether its bytes match the header's digests; only
    /// used when the header digest failed at open (`trusted` false).
    checked: Vec<OnceLock<std::result::Result<(), String>>>,
}

pub struct BlzArchive {
    path: PathBuf,
    map: Box<dyn ByteSource>,
    parsed: Parsed,
    units: Vec<Unit>,
    slots: Vec<Slot>,
    /// The header digest matched at open. When it did not, the header's
    /// structure (which blob holds what) cannot be trusted either: a
    /// flipped blob index would serve another tensor of the same length,
    /// whose blocks check out. Every segment is then checked against its
    /// own tensor or file digest before its first byte is served, so a
    /// damaged header fails only the reads it actually affects.
    trusted: bool,
    /// The paths indexed, built on first use (a lookup or listing); not
    /// kept when it could not be allocated (scans answer meanwhile).
    paths: parking_lot::Mutex<Option<Arc<PathIndex>>>,
}

impl std::fmt::Debug for BlzArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlzArchive")
            .field("path", &self.path)
            .finish()
    }
}

impl BlzArchive {
    /// Opens a ckptfs `.blz` (any kind of archive: [`super::open`]).
    pub fn open(path: &Path) -> Result<BlzArchive> {
        let io = |source| ArchiveError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        BlzArchive::from_source(ckptfs_store::source::map_file(&file).map_err(io)?, path)
    }

    /// An archive over bytes in memory; `name` is used in messages.
    pub fn from_bytes(bytes: Vec<u8>, name: &Path) -> Result<BlzArchive> {
        BlzArchive::from_source(Box::new(bytes), name)
    }

    pub(crate) fn from_source(map: Box<dyn ByteSource>, path: &Path) -> Result<BlzArchive> {
        let parsed = blz::parse(map.bytes()).map_err(|source| match source {
            // Not the archive's fault: an I/O-like error, tried again later.
            BlzError::OutOfMemory(_) => super::out_of_memory(path, source.to_string()),
            source => ArchiveError::Blz {
                path: path.to_path_buf(),
                source,
            },
        })?;
        let h = &parsed.header;
        let oom = |e: ckptfs_format::memory::OutOfMemory| super::out_of_memory(path, e.to_string());
        let mut names: Vec<Option<String>> =
            ckptfs_format::memory::try_vec(h.blobs.len()).map_err(oom)?;
        names.resize(h.blobs.len(), None);
        let mut name = |i: u32, n: &dyn Fn() -> String| {
            let slot = &mut names[i as usize];
            if slot.is_none() {
                *slot = Some(n());
            }
        };
        let mut slots = ckptfs_format::memory::try_vec(h.files.len()).map_err(oom)?;
        for f in &h.files {
            let mut segments = Vec::new();
            let prefix_len;
            match &f.content {
                Content::Plain {
                    xxh3,
                    stored: Stored::Blob(b),
                } => {
                    prefix_len = 0;
                    name(*b, &|| f.path.clone());
                    segments.push((
                        Segment {
                            start: 0,
                            len: f.size,
                            unit: *b,
                        },
                        vec![(0..f.size, xxh3.0)],
                    ));
                }
                Content::Plain { .. } => prefix_len = f.size,
                Content::Shard(sh) => {
                    prefix_len = 8 + sh.header.len() as u64;
                    let dlen = sh.data_length;
                    match sh.data_blob {
                        Some(b) => {
                            name(b, &|| format!("{}: data buffer", f.path));
                            segments.push((
                                Segment {
                                    start: prefix_len,
                                    len: dlen,
                                    unit: b,
                                },
                                sh.tensors
                                    .iter()
                                    .map(|t| (t.data_offsets[0]..t.data_offsets[1], t.xxh3.0))
                                    .collect(),
                            ));
                        }
                        None => {
                            for t in &sh.tensors {
                                let b = t.blob.expect("validated");
                                name(b, &|| format!("{}: tensor {:?}", f.path, t.name));
                                segments.push((
                                    Segment {
                                        start: prefix_len + t.data_offsets[0],
                                        len: t.len(),
                                        unit: b,
                                    },
                                    vec![(0..t.len(), t.xxh3.0)],
                                ));
                            }
                        }
                    }
                    segments.retain(|(s, _)| s.len > 0);
                }
            }
            let (segments, expect): (Vec<Segment>, Vec<Expect>) = segments.into_iter().unzip();
            slots.push(Slot {
                prefix_len,
                checked: (0..segments.len()).map(|_| OnceLock::new()).collect(),
                segments,
                expect,
                prefix: OnceLock::new(),
            });
        }
        let mut units = ckptfs_format::memory::try_vec(names.len()).map_err(oom)?;
        units.extend(names.into_iter().enumerate().map(|(i, n)| Unit {
            name: n.unwrap_or_else(|| format!("blob {i} (unused)")),
            grid: OnceLock::new(),
        }));
        let r = &parsed.header_json;
        let trusted =
            blz::check_header_digest(&map.bytes()[r.start as usize..r.end as usize]).is_ok();
        if !trusted {
            log::warn!(
                "{}: header digest mismatch; every tensor and file is checked against its own \
                 digest before it is served",
                path.display()
            );
        }
        Ok(BlzArchive {
            path: path.to_path_buf(),
            map,
            parsed,
            units,
            slots,
            trusted,
            paths: parking_lot::Mutex::new(None),
        })
    }

    /// The path index, built on first use; None when it cannot be
    /// allocated now.
    fn paths(&self) -> Option<Arc<PathIndex>> {
        let mut p = self.paths.lock();
        if p.is_none() {
            let entries = self.entries();
            match PathIndex::build(entries.len(), |i| &entries[i].path, |i| entries[i].size) {
                Ok(ix) => *p = Some(Arc::new(ix)),
                Err(e) => log::warn!(
                    "{}: path index: {e} (scanning instead)",
                    self.path.display()
                ),
            }
        }
        p.clone()
    }

    fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    pub fn header(&self) -> &BlzHeader {
        &self.parsed.header
    }
    /// Files in header order (sorted by path when ckptfs wrote them).
    pub fn entries(&self) -> &[FileEntry] {
        &self.parsed.header.files
    }
    pub fn blob(&self, unit: u32) -> &BlobEntry {
        &self.parsed.header.blobs[unit as usize]
    }
    /// Stored bytes of a blob.
    pub fn blob_bytes(&self, unit: u32) -> &[u8] {
        let r = self.blob_range(unit);
        &self.bytes()[r.start as usize..r.end as usize]
    }
    /// Where a blob's stored bytes are in the file.
    fn blob_range(&self, unit: u32) -> Range<u64> {
        let b = self.blob(unit);
        let s = self.parsed.data_start + b.offset;
        s..s + b.length
    }
    fn data(&self) -> &[u8] {
        &self.bytes()[self.parsed.data_start as usize..]
    }

    fn build_grid(&self, unit: u32) -> std::result::Result<Arc<Grid>, GridError> {
        let b = self.blob(unit);
        let declared: Vec<u64> = std::iter::once(0)
            .chain(b.blocks.iter().map(|k| k.end))
            .collect();
        match b.encoding {
            Encoding::Raw => Ok(Arc::new(Grid::plain(declared))),
            Encoding::Z4aiFrame => {
                let (grid, meta) = frame_grid(self.blob_bytes(unit), b.decoded_length)
                    .map_err(GridError::Codec)?;
                if grid.bounds != declared {
                    return Err(GridError::Integrity(
                        "block layout of the frame differs from the header".into(),
                    ));
                }
                if Some(meta) != b.meta.map(|d| d.0) {
                    return Err(GridError::Integrity(
                        "checksum mismatch in frame headers or tables".into(),
                    ));
                }
                Ok(Arc::new(grid))
            }
        }
    }

    /// Checks every segment of file `i` overlapping `range` against the
    /// header's digests (decoding it once, block by block: only one block
    /// is held at a time).
    fn check_segments(&self, i: usize, range: Range<u64>) -> Result<()> {
        let slot = &self.slots[i];
        for (k, seg) in slot.segments.iter().enumerate() {
            if seg.start >= range.end || seg.start + seg.len <= range.start {
                continue;
            }
            let r = slot.checked[k].get_or_init(|| self.check_segment(seg, &slot.expect[k]));
            if let Err(what) = r {
                return Err(self.integrity(format!(
                    "{}: bytes {}..{}: {what}",
                    self.entries()[i].path,
                    seg.start,
                    seg.start + seg.len
                )));
            }
        }
        Ok(())
    }

    /// Hashes the ranges of `expect` (within the segment's unit) as its
    /// blocks decode, one block at a time, and compares each digest.
    fn check_segment(&self, seg: &Segment, expect: &Expect) -> std::result::Result<(), String> {
        let grid = self.grid(seg.unit).map_err(|e| e.to_string())?;
        let mut ranges: Vec<&(Range<u64>, u64)> = expect.iter().collect();
        ranges.sort_by_key(|(r, _)| (r.start, r.end));
        let total = grid.bounds.last().copied().unwrap_or(0);
        for w in ranges.windows(2) {
            if w[1].0.start < w[0].0.end {
                return Err("tensors overlap (the header is damaged)".into());
            }
        }
        if ranges.iter().any(|(r, _)| r.start > r.end || r.end > total) {
            return Err("range outside its blob".into());
        }
        let mismatch = || "checksum mismatch (the header is damaged)".to_string();
        let mut next = 0;
        let mut h = Xxh3::new();
        for b in 0..grid.blocks() {
            let span = grid.span(b);
            if next == ranges.len() {
                break;
            }
            if ranges[next].0.start >= span.end {
                continue;
            }
            let d = self
                .decode_block(BlockKey {
                    unit: seg.unit,
                    block: b as u32,
                })
                .map_err(|e| e.to_string())?;
            while let Some((r, want)) = ranges.get(next) {
                if r.start >= span.end {
                    break;
                }
                let (lo, hi) = (r.start.max(span.start), r.end.min(span.end));
                if lo < hi {
                    h.update(&d[(lo - span.start) as usize..(hi - span.start) as usize]);
                }
                if r.end > span.end {
                    break; // continues in the next block
                }
                if h.digest() != *want {
                    return Err(mismatch());
                }
                h = Xxh3::new();
                next += 1;
            }
        }
        // What is left is empty and at the very end.
        if ranges[next..].iter().any(|(_, want)| *want != xxh3_64(b"")) {
            return Err(mismatch());
        }
        Ok(())
    }

    /// xxh3 of bytes `range` of file `i`, read in pieces of at most 8 MiB.
    fn range_digest(&self, i: usize, range: Range<u64>) -> Result<u64> {
        let mut h = Xxh3::new();
        let mut buf = vec![0u8; (range.end - range.start).min(8 << 20) as usize];
        let mut at = range.start;
        while at < range.end {
            let n = ((range.end - at) as usize).min(buf.len());
            let got = self.read_at(i, at, &mut buf[..n])?;
            if got != n {
                return Err(self.integrity(format!("{}: short read", self.entries()[i].path)));
            }
            h.update(&buf[..n]);
            at += n as u64;
        }
        Ok(h.digest())
    }

    /// The raw bytes of tensor `t` of shard `i`, decoding only the blocks
    /// that hold it, checked against the tensor's xxh3.
    pub fn tensor_bytes(&self, i: usize, t: usize) -> Result<Vec<u8>> {
        let f = &self.entries()[i];
        let te = &f.tensors()[t];
        let mut out = vec![0u8; te.len() as usize];
        let start = self.slots[i].prefix_len + te.data_offsets[0];
        self.read_at(i, start, &mut out)?;
        if xxh3_64(&out) != te.xxh3.0 {
            return Err(self.integrity(format!(
                "{}: tensor {:?}: checksum mismatch",
                f.path, te.name
            )));
        }
        Ok(out)
    }

    /// Decodes one block of a blob from bytes at hand, checking its
    /// digests.
    fn decode_block_once(&self, key: BlockKey) -> Result<Vec<u8>> {
        let grid = self.grid(key.unit)?;
        let b = block_index(self, key, &grid)?;
        let span = grid.span(b);
        let blob = self.blob(key.unit);
        let bytes = self.blob_bytes(key.unit);
        let expect = &blob.blocks[b];
        let checked = |out: Vec<u8>| {
            if xxh3_64(&out) != expect.data.0 {
                return Err(self.unit_integrity(
                    key.unit,
                    format!("checksum mismatch in the decoded bytes of block {b}"),
                ));
            }
            Ok(out)
        };
        match blob.encoding {
            Encoding::Raw => checked(bytes[span.start as usize..span.end as usize].to_vec()),
            Encoding::Z4aiFrame => {
                // Frames always carry a payload digest.
                let Some(want) = expect.payload.map(|d| d.0) else {
                    return Err(
                        self.unit_integrity(key.unit, format!("block {b} has no payload checksum"))
                    );
                };
                decode_unit_block(self, key, bytes)
                    .and_then(checked)
                    .map_err(|e| damaged_payload(self, key, bytes, want).unwrap_or(e))
            }
        }
    }

    /// Checks the header digest.
    pub fn verify_header(&self) -> Result<()> {
        let r = &self.parsed.header_json;
        blz::check_header_digest(&self.bytes()[r.start as usize..r.end as usize])
            .map_err(|e| self.integrity(e.to_string()))
    }

    /// Checks the SHA-256 of the data section.
    pub fn verify_data_sha256(&self) -> Result<()> {
        let start = self.parsed.data_start;
        self.map
            .ensure(start..self.bytes().len() as u64)
            .map_err(|e| io_error(self, e))?;
        let data = self.data();
        let mut h = Sha256::new();
        for c in data.chunks(16 << 20) {
            h.update(c);
        }
        let got = hex(&h.finalize());
        if got != self.header().data_sha256 {
            return Err(self.integrity(BlzError::DataDigest.to_string()));
        }
        Ok(())
    }
}

/// The in-memory prefix of a file, its digest and (for shards) the original
/// header's agreement with the tensor list checked.
fn build_prefix(f: &FileEntry) -> std::result::Result<Vec<u8>, String> {
    match &f.content {
        Content::Shard(shard) => {
            let sh = &shard.header;
            if xxh3_64(sh.as_bytes()) != shard.header_xxh3.0 {
                return Err("checksum mismatch in the safetensors header".into());
            }
            let h = StHeader::parse(sh.as_bytes(), shard.data_length)
                .map_err(|e| format!("stored safetensors header: {e}"))?;
            let tensors = &shard.tensors;
            let mut mine: Vec<(u64, u64, &str, &str, &[u64])> = tensors
                .iter()
                .map(|t| {
                    (
                        t.data_offsets[0],
                        t.data_offsets[1],
                        t.name.as_str(),
                        t.dtype.as_str(),
                        t.shape.as_slice(),
                    )
                })
                .collect();
            let mut theirs: Vec<(u64, u64, &str, &str, &[u64])> = h
                .tensors
                .iter()
                .map(|t| {
                    (
                        t.begin,
                        t.end,
                        t.name.as_str(),
                        t.dtype.as_str(),
                        t.shape.as_slice(),
                    )
                })
                .collect();
            mine.sort();
            theirs.sort();
            if mine != theirs {
                return Err("the tensor list differs from the stored safetensors header".into());
            }
            let mut v = Vec::with_capacity(8 + sh.len());
            v.extend_from_slice(&(sh.len() as u64).to_le_bytes());
            v.extend_from_slice(sh.as_bytes());
            Ok(v)
        }
        Content::Plain { xxh3, stored } => {
            let content = match stored {
                Stored::Text(t) => t.as_bytes().to_vec(),
                Stored::Base64(b) => base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| format!("invalid base64 content: {e}"))?,
                // Stored in a blob: no prefix, checked by its blocks.
                Stored::Blob(_) => return Ok(Vec::new()),
            };
            if content.len() as u64 != f.size || xxh3_64(&content) != xxh3.0 {
                return Err("checksum mismatch in the embedded content".into());
            }
            Ok(content)
        }
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ArchiveView for BlzArchive {
    fn kind(&self) -> Kind {
        Kind::Blz
    }
    fn path(&self) -> &Path {
        &self.path
    }
    fn stored_len(&self) -> u64 {
        self.bytes().len() as u64
    }
    fn checksums(&self) -> Option<&'static str> {
        Some("xxh3")
    }
    fn find(&self, path: &str) -> Option<usize> {
        let e = self.entries();
        match self.paths() {
            Some(ix) => ix.find(|i| &e[i].path, path),
            None => e.iter().position(|f| f.path == path),
        }
    }
    fn directories(&self) -> Vec<String> {
        match self.paths() {
            Some(ix) => ix.directories().to_vec(),
            None => {
                super::path_index::scan_directories(self.entries().iter().map(|f| f.path.as_str()))
            }
        }
    }
    fn is_dir(&self, path: &str) -> bool {
        match self.paths() {
            Some(ix) => ix.is_dir(path),
            None => self.entries().iter().any(|f| {
                f.path
                    .strip_prefix(path)
                    .is_some_and(|rest| rest.starts_with('/'))
            }),
        }
    }
    fn children(&self, dir: &str) -> Vec<(String, bool)> {
        let e = self.entries();
        match self.paths() {
            Some(ix) => ix.children(|i| &e[i].path, dir),
            None => super::path_index::scan_children(e.iter().map(|f| f.path.as_str()), dir),
        }
    }
    fn total_logical_len(&self) -> u64 {
        match self.paths() {
            Some(ix) => ix.total_len(),
            None => self.entries().iter().map(|f| f.size).sum(),
        }
    }
    fn files(&self) -> usize {
        self.slots.len()
    }
    fn file_path(&self, file: usize) -> &str {
        &self.entries()[file].path
    }
    fn logical_len(&self, file: usize) -> u64 {
        self.entries()[file].size
    }
    /// Built and checked on first use.
    fn prefix(&self, file: usize) -> Result<&[u8]> {
        let f = &self.entries()[file];
        match self.slots[file].prefix.get_or_init(|| build_prefix(f)) {
            Ok(p) => Ok(p),
            Err(what) => Err(self.integrity(format!("{}: {what}", f.path))),
        }
    }
    fn prefix_len(&self, file: usize) -> u64 {
        self.slots[file].prefix_len
    }
    fn segments(&self, file: usize) -> &[Segment] {
        &self.slots[file].segments
    }
    fn units(&self) -> usize {
        self.units.len()
    }
    fn unit_name(&self, unit: u32) -> &str {
        &self.units[unit as usize].name
    }

    /// The block grid of a blob (built and checked once, then shared;
    /// over a remote copy, a frame's structure is fetched first).
    fn grid(&self, unit: u32) -> Result<Arc<Grid>> {
        let cell = self.units.get(unit as usize).map(|u| &u.grid);
        let frame = cell
            .is_some()
            .then(|| self.blob(unit))
            .filter(|b| b.encoding == Encoding::Z4aiFrame)
            .map(|b| (self.blob_range(unit), b.decoded_length));
        frame_unit_grid(self, &*self.map, unit, cell, frame, || {
            self.build_grid(unit)
        })
    }

    fn will_need(&self, unit: u32) {
        if (unit as usize) < self.units.len() && !self.map.is_remote() {
            self.map.will_need(self.blob_range(unit));
        }
    }

    /// Decodes one block of a blob, checking its digests. Over a remote
    /// copy, the block's stored bytes are fetched first (and kept in the
    /// disk cache until it is decoded); a block that fails its checks is
    /// fetched again once, with its frame's structure.
    fn decode_block(&self, key: BlockKey) -> Result<Vec<u8>> {
        if key.unit as usize >= self.units.len() {
            return Err(self.integrity(format!("no blob {}", key.unit)));
        }
        if !self.map.is_remote() {
            return self.decode_block_once(key);
        }
        let grid = self.grid(key.unit)?;
        let b = block_index(self, key, &grid)?;
        let frame = self.blob_range(key.unit);
        let blob = self.blob(key.unit);
        let decode = || self.decode_block_once(key);
        match blob.encoding {
            Encoding::Z4aiFrame => decode_remote_frame_block(
                self,
                &*self.map,
                &frame,
                blob.decoded_length,
                &grid,
                b,
                decode,
            ),
            Encoding::Raw => {
                let span = grid.span(b);
                let payload = vec![frame.start + span.start..frame.start + span.end];
                let _pin = self.map.pin_all(&payload).map_err(|e| io_error(self, e))?;
                decode_refetching_once(&*self.map, &frame, None, payload, decode)
            }
        }
    }

    fn check_range(&self, file: usize, range: Range<u64>) -> Result<()> {
        if self.trusted {
            return Ok(());
        }
        self.check_segments(file, range)
    }

    fn verify_structure(&self) -> Result<()> {
        Ok(())
    }

    fn verify_unit(&self, unit: u32, digest: u64) -> Result<()> {
        if digest != self.blob(unit).xxh3.0 {
            return Err(self.unit_integrity(unit, "checksum mismatch (blob xxh3)".into()));
        }
        Ok(())
    }

    /// Every file's and tensor's xxh3 (from the blob digests), the header
    /// digest, the data SHA-256.
    fn verify_finish(&self, digests: &[u64]) -> Result<String> {
        let (mut raw_bytes, mut shards, mut tensors_n) = (0u64, 0usize, 0usize);
        for (i, f) in self.entries().iter().enumerate() {
            raw_bytes += f.size;
            match &f.content {
                Content::Plain {
                    xxh3,
                    stored: Stored::Blob(b),
                } => {
                    if digests[*b as usize] != xxh3.0 {
                        return Err(self.integrity(format!("{}: checksum mismatch", f.path)));
                    }
                }
                Content::Plain { .. } => {}
                Content::Shard(sh) => {
                    shards += 1;
                    let tensors = &sh.tensors;
                    tensors_n += tensors.len();
                    for te in tensors {
                        let ok = match te.blob {
                            Some(b) => digests[b as usize] == te.xxh3.0,
                            None => {
                                let start = self.slots[i].prefix_len + te.data_offsets[0];
                                self.range_digest(i, start..start + te.len())
                                    .is_ok_and(|d| d == te.xxh3.0)
                            }
                        };
                        if !ok {
                            return Err(self.integrity(format!(
                                "{}: tensor {:?}: checksum mismatch",
                                f.path, te.name
                            )));
                        }
                    }
                }
            }
        }
        self.verify_header()?;
        self.verify_data_sha256()?;
        let stored = self.stored_len();
        let n =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        Ok(format!(
            "{} ({}, {} in {}), {} -> {} bytes, ratio {:.4}, all checksums and the data SHA-256 verified",
            n(self.files(), "file", "files"),
            n(shards, "shard", "shards"),
            n(tensors_n, "tensor", "tensors"),
            n(self.units(), "blob", "blobs"),
            raw_bytes,
            stored,
            raw_bytes as f64 / stored.max(1) as f64
        ))
    }
}
