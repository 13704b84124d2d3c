//! An opened `.blz` model archive: the validated header over a memory map,
//! and for every file of the directory the same read path as a `.zstn`
//! [`Archive`](crate::archive::Archive): `logical_len`, `plan`,
//! `decode_block`, `read_with`, `read_at`, `block_len`, `grid`.
//!
//! Opening maps the file and parses the prelude and header JSON only
//! ([`format::blz::parse`] checks every offset, length, path and reference).
//! Every file is `prefix ‖ segments`:
//! - the *prefix* is held in memory: `u64 hlen ‖ header` for a shard, the
//!   whole content for an embedded file. It is built on first use and its
//!   digest checked then (`safetensors_header_xxh3`, the file's `xxh3`), so
//!   a damaged sidecar or shard header fails only reads of that file;
//! - each *segment* is one blob (a tensor, a shard's whole data buffer, a
//!   large plain file), read block by block.
//!
//! [`BlockKey::unit`] is the blob index: blobs are unique across the whole
//! archive, so tensors shared by several shards share cache entries. Block
//! reads check the block's digests (payload before decoding, data after)
//! and return [`ArchiveError`], so a mount serves `.blz` files through the
//! same `BlockCache<ArchiveError>` as `.zstn` files. The data-section
//! SHA-256 is checked by [`BlzArchive::verify`] only. The header digest is
//! checked at open; when it fails, every segment is checked against its
//! tensor's or file's own digest before it is served (see `trusted`).
//!
//! The map is private and read-only; ckptfs replaces archives by rename,
//! never in place.

use crate::archive::{
    decode_frame_block, frame_grid, ArchiveError, Backing, BlockError, BlockKey, Grid, GridError,
    Piece, PieceSource,
};
use crate::codec::frame::RansTables;
use crate::codec::CodecError;
use crate::format::blz::{
    self, BlobEntry, BlzError, Encoding, FileEntry, FileKind, Header as BlzHeader, Parsed,
};
use crate::format::safetensors::Header as StHeader;
use base64::Engine as _;
use rayon::prelude::*;
use sha2::{Digest as _, Sha256};
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

pub type Result<T> = std::result::Result<T, ArchiveError>;

/// One blob: its grid, built and checked on first use.
struct Unit {
    /// The first file (and tensor) that uses it, for messages.
    name: String,
    grid: OnceLock<std::result::Result<Arc<Grid>, GridError>>,
}

/// A blob as part of a file: file bytes `[start, start + len)` are the
/// blob's decoded bytes.
#[derive(Debug, Clone)]
struct Segment {
    start: u64,
    len: u64,
    unit: u32,
    /// What the segment's decoded bytes must hash to: (range within the
    /// segment, xxh3) pairs (one per tensor, or the whole file).
    expect: Vec<(Range<u64>, u64)>,
}

struct Slot {
    prefix_len: u64,
    /// Non-empty segments in file order, contiguous from `prefix_len`.
    segments: Vec<Segment>,
    prefix: OnceLock<std::result::Result<Arc<Vec<u8>>, String>>,
    /// Per segment, whether its bytes match the header's digests; only
    /// used when the header digest failed at open (`trusted` false).
    checked: Vec<OnceLock<std::result::Result<(), String>>>,
}

pub struct BlzArchive {
    path: PathBuf,
    map: Backing,
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
}

impl std::fmt::Debug for BlzArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlzArchive")
            .field("path", &self.path)
            .finish()
    }
}

/// What `verify` found.
#[derive(Debug, Clone, Default)]
pub struct VerifySummary {
    pub files: usize,
    pub shards: usize,
    pub tensors: usize,
    pub blobs: usize,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
}

impl BlzArchive {
    pub fn open(path: &Path) -> std::result::Result<BlzArchive, BlzError> {
        let io = |source| BlzError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        BlzArchive::from_file(&file, path)
    }

    pub fn from_file(file: &File, path: &Path) -> std::result::Result<BlzArchive, BlzError> {
        let io = |source| BlzError::Io {
            path: path.display().to_string(),
            source,
        };
        let map = Backing::map(file).map_err(io)?;
        BlzArchive::from_backing(map, path)
    }

    /// An archive over bytes in memory; `name` is used in messages.
    pub fn from_bytes(bytes: Vec<u8>, name: &Path) -> std::result::Result<BlzArchive, BlzError> {
        BlzArchive::from_backing(Backing::Owned(bytes), name)
    }

    fn from_backing(map: Backing, path: &Path) -> std::result::Result<BlzArchive, BlzError> {
        let parsed = blz::parse(map.bytes())?;
        let h = &parsed.header;
        let mut names: Vec<Option<String>> = vec![None; h.blobs.len()];
        let mut name = |i: u32, n: &dyn Fn() -> String| {
            let slot = &mut names[i as usize];
            if slot.is_none() {
                *slot = Some(n());
            }
        };
        let mut slots = Vec::with_capacity(h.files.len());
        for f in &h.files {
            let mut segments = Vec::new();
            let prefix_len;
            match f.kind {
                FileKind::File => match f.blob {
                    Some(b) => {
                        prefix_len = 0;
                        name(b, &|| f.path.clone());
                        segments.push(Segment {
                            start: 0,
                            len: f.size,
                            unit: b,
                            expect: f.xxh3.map(|d| (0..f.size, d.0)).into_iter().collect(),
                        });
                    }
                    None => prefix_len = f.size,
                },
                FileKind::Safetensors => {
                    let sh = f.safetensors_header.as_deref().unwrap_or_default();
                    prefix_len = 8 + sh.len() as u64;
                    let dlen = f.data_length.unwrap_or_default();
                    match f.data_blob {
                        Some(b) => {
                            name(b, &|| format!("{}: data buffer", f.path));
                            segments.push(Segment {
                                start: prefix_len,
                                len: dlen,
                                unit: b,
                                expect: f
                                    .tensors
                                    .as_deref()
                                    .unwrap_or_default()
                                    .iter()
                                    .map(|t| (t.data_offsets[0]..t.data_offsets[1], t.xxh3.0))
                                    .collect(),
                            });
                        }
                        None => {
                            for t in f.tensors.as_deref().unwrap_or_default() {
                                let b = t.blob.expect("validated");
                                name(b, &|| format!("{}: tensor {:?}", f.path, t.name));
                                segments.push(Segment {
                                    start: prefix_len + t.data_offsets[0],
                                    len: t.len(),
                                    unit: b,
                                    expect: vec![(0..t.len(), t.xxh3.0)],
                                });
                            }
                        }
                    }
                    segments.retain(|s| s.len > 0);
                }
            }
            slots.push(Slot {
                prefix_len,
                checked: (0..segments.len()).map(|_| OnceLock::new()).collect(),
                segments,
                prefix: OnceLock::new(),
            });
        }
        let units = names
            .into_iter()
            .enumerate()
            .map(|(i, n)| Unit {
                name: n.unwrap_or_else(|| format!("blob {i} (unused)")),
                grid: OnceLock::new(),
            })
            .collect();
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
        })
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
    /// Size of the archive on disk.
    pub fn stored_len(&self) -> u64 {
        self.bytes().len() as u64
    }
    pub fn header(&self) -> &BlzHeader {
        &self.parsed.header
    }
    /// Files in header order (sorted by path when ckptfs wrote them).
    pub fn files(&self) -> &[FileEntry] {
        &self.parsed.header.files
    }
    /// The index of the file at relative path `path`.
    pub fn find(&self, path: &str) -> Option<usize> {
        self.files().iter().position(|f| f.path == path)
    }
    /// Every directory implied by the file paths (not the root), sorted.
    pub fn directories(&self) -> Vec<String> {
        let mut dirs: Vec<String> = self
            .files()
            .iter()
            .flat_map(|f| {
                f.path
                    .match_indices('/')
                    .map(|(i, _)| f.path[..i].to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs
    }
    /// A read view of file `i` with the `Archive` read API.
    pub fn file(&self, i: usize) -> BlzFile<'_> {
        assert!(i < self.slots.len(), "no file {i}");
        BlzFile {
            archive: self,
            index: i,
        }
    }
    /// Number of blobs (units).
    pub fn units(&self) -> usize {
        self.units.len()
    }
    pub fn blob(&self, unit: u32) -> &BlobEntry {
        &self.parsed.header.blobs[unit as usize]
    }
    pub fn unit_name(&self, unit: u32) -> &str {
        &self.units[unit as usize].name
    }
    /// Stored bytes of a blob.
    pub fn blob_bytes(&self, unit: u32) -> &[u8] {
        let b = self.blob(unit);
        let s = (self.parsed.data_start + b.offset) as usize;
        &self.bytes()[s..s + b.length as usize]
    }
    fn data(&self) -> &[u8] {
        &self.bytes()[self.parsed.data_start as usize..]
    }

    fn frame_err(&self, unit: u32, source: CodecError) -> ArchiveError {
        ArchiveError::Frame {
            path: self.path.clone(),
            tensor: self.units[unit as usize].name.clone(),
            source,
        }
    }

    fn unit_integrity(&self, unit: u32, what: String) -> ArchiveError {
        self.integrity(format!("{}: {what}", self.unit_name(unit)))
    }

    /// The block grid of a blob (built and checked once, then shared).
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

    fn build_grid(&self, unit: u32) -> std::result::Result<Arc<Grid>, GridError> {
        let b = self.blob(unit);
        let declared: Vec<u64> = std::iter::once(0)
            .chain(b.blocks.iter().map(|k| k.end))
            .collect();
        match b.encoding {
            Encoding::Raw => Ok(Arc::new(Grid {
                bounds: declared,
                elem_bytes: 0,
                tables: RansTables::default(),
            })),
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

    /// Decodes one block of a blob, checking its digests.
    pub fn decode_block(&self, key: BlockKey) -> Result<Vec<u8>> {
        if key.unit as usize >= self.units.len() {
            return Err(self.integrity(format!("no blob {}", key.unit)));
        }
        let grid = self.grid(key.unit)?;
        let b = key.block as usize;
        if b >= grid.blocks() {
            return Err(self.frame_err(
                key.unit,
                CodecError::invalid("block", format!("no block {b}")),
            ));
        }
        let span = grid.span(b);
        let blob = self.blob(key.unit);
        let bytes = self.blob_bytes(key.unit);
        let expect = &blob.blocks[b];
        let out = match blob.encoding {
            Encoding::Raw => bytes[span.start as usize..span.end as usize].to_vec(),
            Encoding::Z4aiFrame => {
                // Frames always carry a payload digest.
                let Some(want) = expect.payload.map(|d| d.0) else {
                    return Err(
                        self.unit_integrity(key.unit, format!("block {b} has no payload checksum"))
                    );
                };
                decode_frame_block(bytes, &grid, b, Some(want)).map_err(|e| match e {
                    BlockError::Codec(e) => self.frame_err(key.unit, e),
                    BlockError::Payload => self.unit_integrity(
                        key.unit,
                        format!("checksum mismatch in the compressed bytes of block {b}"),
                    ),
                })?
            }
        };
        if xxh3_64(&out) != expect.data.0 {
            return Err(self.unit_integrity(
                key.unit,
                format!("checksum mismatch in the decoded bytes of block {b}"),
            ));
        }
        Ok(out)
    }

    /// Decoded length of a block.
    pub fn block_len(&self, key: BlockKey) -> Result<u64> {
        let g = self.grid(key.unit)?;
        if key.block as usize >= g.blocks() {
            return Err(self.integrity(format!("no block {} in blob {}", key.block, key.unit)));
        }
        let s = g.span(key.block as usize);
        Ok(s.end - s.start)
    }

    /// The in-memory prefix of file `i`, built and checked on first use.
    pub fn prefix(&self, i: usize) -> Result<Arc<Vec<u8>>> {
        let f = &self.files()[i];
        self.slots[i]
            .prefix
            .get_or_init(|| build_prefix(f).map(Arc::new))
            .clone()
            .map_err(|what| self.integrity(format!("{}: {what}", f.path)))
    }

    /// Size of file `i`.
    pub fn logical_len(&self, i: usize) -> u64 {
        self.files()[i].size
    }

    /// Where the bytes of `range` of file `i` live.
    pub fn plan(&self, i: usize, range: Range<u64>) -> Result<Vec<Piece>> {
        let slot = &self.slots[i];
        let end = range.end.min(self.logical_len(i));
        let mut pieces = Vec::new();
        let mut pos = range.start;
        if pos < slot.prefix_len && pos < end {
            let hi = end.min(slot.prefix_len);
            pieces.push(Piece {
                source: PieceSource::Prefix,
                within: pos..hi,
                out_offset: 0,
            });
            pos = hi;
        }
        while pos < end {
            let k = slot.segments.partition_point(|s| s.start <= pos);
            let Some(seg) = k.checked_sub(1).map(|k| &slot.segments[k]) else {
                return Err(self.integrity(format!("{}: no data at {pos}", self.files()[i].path)));
            };
            let in_unit = pos - seg.start;
            if in_unit >= seg.len {
                return Err(self.integrity(format!("{}: no data at {pos}", self.files()[i].path)));
            }
            let grid = self.grid(seg.unit)?;
            let block = grid.block_of(in_unit);
            let span = grid.span(block);
            let hi = span.end.min(in_unit + (end - pos)).min(seg.len);
            pieces.push(Piece {
                source: PieceSource::Block(BlockKey {
                    unit: seg.unit,
                    block: block as u32,
                }),
                within: (in_unit - span.start)..(hi - span.start),
                out_offset: pos - range.start,
            });
            pos += hi - in_unit;
        }
        Ok(pieces)
    }

    /// Reads bytes `[offset, offset + buf.len())` of file `i` (clamped),
    /// fetching blocks through `fetch` (a cache, or plain decoding).
    pub fn read_with(
        &self,
        i: usize,
        offset: u64,
        buf: &mut [u8],
        fetch: &dyn Fn(BlockKey) -> Result<Arc<Vec<u8>>>,
    ) -> Result<usize> {
        let len = self.logical_len(i);
        if offset >= len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(len - offset) as usize;
        if !self.trusted {
            self.check_segments(i, offset..offset + n as u64)?;
        }
        for p in self.plan(i, offset..offset + n as u64)? {
            let dst = &mut buf[p.out_offset as usize
                ..p.out_offset as usize + (p.within.end - p.within.start) as usize];
            let src = match p.source {
                PieceSource::Prefix => self.prefix(i)?,
                PieceSource::Block(key) => fetch(key)?,
            };
            dst.copy_from_slice(&src[p.within.start as usize..p.within.end as usize]);
        }
        Ok(n)
    }

    /// Checks every segment of file `i` overlapping `range` against the
    /// header's digests (decoding it whole, once).
    fn check_segments(&self, i: usize, range: Range<u64>) -> Result<()> {
        let slot = &self.slots[i];
        for (k, seg) in slot.segments.iter().enumerate() {
            if seg.start >= range.end || seg.start + seg.len <= range.start {
                continue;
            }
            let r = slot.checked[k].get_or_init(|| {
                let grid = self.grid(seg.unit).map_err(|e| e.to_string())?;
                let mut bytes = Vec::with_capacity(seg.len as usize);
                for b in 0..grid.blocks() {
                    let d = self
                        .decode_block(BlockKey {
                            unit: seg.unit,
                            block: b as u32,
                        })
                        .map_err(|e| e.to_string())?;
                    bytes.extend_from_slice(&d);
                }
                for (r, want) in &seg.expect {
                    let part = bytes
                        .get(r.start as usize..r.end as usize)
                        .ok_or_else(|| "range outside its blob".to_string())?;
                    if xxh3_64(part) != *want {
                        return Err("checksum mismatch (the header is damaged)".to_string());
                    }
                }
                Ok(())
            });
            if let Err(what) = r {
                return Err(self.integrity(format!(
                    "{}: bytes {}..{}: {what}",
                    self.files()[i].path,
                    seg.start,
                    seg.start + seg.len
                )));
            }
        }
        Ok(())
    }

    /// Reads without a cache, decoding every covered block.
    pub fn read_at(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.read_with(i, offset, buf, &|k| self.decode_block(k).map(Arc::new))
    }

    /// The raw bytes of tensor `t` of shard `i`, decoding only the blocks
    /// that hold it, checked against the tensor's xxh3.
    pub fn tensor_bytes(&self, i: usize, t: usize) -> Result<Vec<u8>> {
        let f = &self.files()[i];
        let te = &f.tensors.as_deref().unwrap_or_default()[t];
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

    /// Streams file `i` into `w`: blocks decoded in parallel windows of
    /// bounded size, written in order.
    pub fn write_file(&self, i: usize, w: &mut dyn Write, progress: &dyn Fn(u64)) -> Result<()> {
        let io = |e: std::io::Error| {
            self.integrity(format!("{}: write failed: {e}", self.files()[i].path))
        };
        if !self.trusted {
            self.check_segments(i, 0..self.logical_len(i))?;
        }
        let prefix = self.prefix(i)?;
        w.write_all(&prefix).map_err(io)?;
        progress(prefix.len() as u64);
        let slot = &self.slots[i];
        let mut keys = Vec::new();
        for s in &slot.segments {
            let g = self.grid(s.unit)?;
            keys.extend((0..g.blocks() as u32).map(|block| BlockKey {
                unit: s.unit,
                block,
            }));
        }
        const WINDOW: u64 = 64 << 20;
        let mut k = 0;
        while k < keys.len() {
            let mut j = k;
            let mut bytes = 0;
            while j < keys.len() && (j == k || bytes < WINDOW) {
                bytes += self.block_len(keys[j])?;
                j += 1;
            }
            let decoded: Vec<Vec<u8>> = keys[k..j]
                .par_iter()
                .map(|key| self.decode_block(*key))
                .collect::<Result<_>>()?;
            for d in &decoded {
                w.write_all(d).map_err(io)?;
                progress(d.len() as u64);
            }
            k = j;
        }
        Ok(())
    }

    /// Checks the header digest.
    pub fn verify_header(&self) -> Result<()> {
        let r = &self.parsed.header_json;
        blz::check_header_digest(&self.bytes()[r.start as usize..r.end as usize])
            .map_err(|e| self.integrity(e.to_string()))
    }

    /// Checks the SHA-256 of the data section.
    pub fn verify_data_sha256(&self) -> Result<()> {
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

    /// xxh3 of a whole blob, decoding every block (in parallel windows).
    fn blob_digest(&self, unit: u32, progress: &(dyn Fn(u64) + Sync)) -> Result<u64> {
        let g = self.grid(unit)?;
        let mut h = Xxh3::new();
        let n = g.blocks() as u32;
        let mut k = 0;
        while k < n {
            let j = (k + 32).min(n);
            let decoded: Vec<Vec<u8>> = (k..j)
                .into_par_iter()
                .map(|block| self.decode_block(BlockKey { unit, block }))
                .collect::<Result<_>>()?;
            for d in &decoded {
                h.update(d);
                progress(d.len() as u64);
            }
            k = j;
        }
        Ok(h.digest())
    }

    /// Checks everything: every file's prefix (shard headers against the
    /// tensor lists, sidecar digests), every block of every blob, every
    /// blob's and tensor's xxh3, the header digest, the data SHA-256.
    /// The checks that name a file or tensor come first, so a failure says
    /// what is damaged.
    pub fn verify(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<VerifySummary> {
        let mut s = VerifySummary {
            files: self.files().len(),
            blobs: self.units(),
            stored_bytes: self.stored_len(),
            ..Default::default()
        };
        for i in 0..self.files().len() {
            self.prefix(i)?;
        }
        let digests: Vec<u64> = (0..self.units() as u32)
            .into_par_iter()
            .map(|u| {
                let d = self.blob_digest(u, progress)?;
                if d != self.blob(u).xxh3.0 {
                    return Err(self.unit_integrity(u, "checksum mismatch (blob xxh3)".into()));
                }
                Ok(d)
            })
            .collect::<Result<_>>()?;
        for (i, f) in self.files().iter().enumerate() {
            s.raw_bytes += f.size;
            match f.kind {
                FileKind::File => {
                    if let Some(b) = f.blob {
                        if Some(digests[b as usize]) != f.xxh3.map(|d| d.0) {
                            return Err(self.integrity(format!("{}: checksum mismatch", f.path)));
                        }
                    }
                }
                FileKind::Safetensors => {
                    s.shards += 1;
                    let tensors = f.tensors.as_deref().unwrap_or_default();
                    s.tensors += tensors.len();
                    for (t, te) in tensors.iter().enumerate() {
                        let ok = match te.blob {
                            Some(b) => digests[b as usize] == te.xxh3.0,
                            None => self.tensor_bytes(i, t).is_ok(),
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
        Ok(s)
    }
}

/// The in-memory prefix of a file, its digest and (for shards) the original
/// header's agreement with the tensor list checked.
fn build_prefix(f: &FileEntry) -> std::result::Result<Vec<u8>, String> {
    match f.kind {
        FileKind::Safetensors => {
            let sh = f.safetensors_header.as_deref().unwrap_or_default();
            if Some(xxh3_64(sh.as_bytes())) != f.safetensors_header_xxh3.map(|d| d.0) {
                return Err("checksum mismatch in the safetensors header".into());
            }
            let dlen = f.data_length.unwrap_or_default();
            let h = StHeader::parse(sh.as_bytes(), dlen)
                .map_err(|e| format!("stored safetensors header: {e}"))?;
            let tensors = f.tensors.as_deref().unwrap_or_default();
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
        FileKind::File => {
            let content = match (&f.text, &f.base64) {
                (Some(t), _) => t.as_bytes().to_vec(),
                (None, Some(b)) => base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| format!("invalid base64 content: {e}"))?,
                // Stored in a blob: no prefix, checked by its blocks.
                (None, None) => return Ok(Vec::new()),
            };
            if content.len() as u64 != f.size || Some(xxh3_64(&content)) != f.xxh3.map(|d| d.0) {
                return Err("checksum mismatch in the embedded content".into());
            }
            Ok(content)
        }
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One file of a `.blz` with the read API of a `.zstn`
/// [`Archive`](crate::archive::Archive).
#[derive(Clone, Copy)]
pub struct BlzFile<'a> {
    archive: &'a BlzArchive,
    index: usize,
}

impl<'a> BlzFile<'a> {
    pub fn index(&self) -> usize {
        self.index
    }
    pub fn entry(&self) -> &'a FileEntry {
        &self.archive.files()[self.index]
    }
    pub fn path(&self) -> &'a str {
        &self.entry().path
    }
    pub fn logical_len(&self) -> u64 {
        self.archive.logical_len(self.index)
    }
    pub fn plan(&self, range: Range<u64>) -> Result<Vec<Piece>> {
        self.archive.plan(self.index, range)
    }
    pub fn decode_block(&self, key: BlockKey) -> Result<Vec<u8>> {
        self.archive.decode_block(key)
    }
    pub fn read_with(
        &self,
        offset: u64,
        buf: &mut [u8],
        fetch: &dyn Fn(BlockKey) -> Result<Arc<Vec<u8>>>,
    ) -> Result<usize> {
        self.archive.read_with(self.index, offset, buf, fetch)
    }
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.archive.read_at(self.index, offset, buf)
    }
    pub fn block_len(&self, key: BlockKey) -> Result<u64> {
        self.archive.block_len(key)
    }
    pub fn grid(&self, unit: u32) -> Result<Arc<Grid>> {
        self.archive.grid(unit)
    }
}
