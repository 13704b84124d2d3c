//! An opened ckptfs delta archive (`.z4dm`, `format::delta`): one
//! presented file, the target `.safetensors`, rebuilt from the delta's
//! records and the bytes of its base.
//!
//! Opening maps the file, checks the `CKD1` trailer, the `Z4DM` head and
//! every record head against it (record digests, records tiling the body
//! and the data buffer, the header JSON agreeing with the records), then
//! opens the base: the file at the recorded path relative to this
//! archive's directory, through a [`BaseFs`] (the mount's keeps it inside
//! its store). The base is an archive of any kind (a delta too, up to
//! [`MAX_CHAIN`](crate::format::delta::MAX_CHAIN) deep, checked while
//! opening so a cycle cannot recurse) or a plain `.safetensors`. Its
//! length and tensors (name, dtype, byte length of every COPY and DELTA record)
//! are checked at open; a missing or different base fails the open with
//! one line naming both files.
//!
//! Units are the records, in order. A block of a FULL unit is a frame
//! block (compressed bytes checked before decoding, as in CKX1); of a
//! DELTA unit, the XOR frame's block XOR the same range of the base tensor,
//! read through the base archive (a `ZSP1` sparse XOR, which decodes only
//! whole, in the blocks its trailer lists: each from the frame's index,
//! decoded once per unit and kept in `sparse_cache`); of a COPY unit, a
//! 1 MiB range of the base tensor. Every block's bytes are checked against
//! the trailer's digest of the *target* bytes before they are returned, so
//! a wrong or damaged base gives an error, never wrong bytes.
//!
//! A base archive's decoded blocks go through the [`BaseBlocks`] store the
//! [`BaseFs`] gives it, if any: the mount's shared block cache, so deltas
//! over one base version decode each base block once between them.
//!
//! Before the first byte that needs the base is served, the base's
//! identity is checked once ([`DeltaArchive::check_base`]): its archive
//! fingerprint (a checksummed archive's own checksum block) equals the one
//! recorded, or else the xxh3 of its whole presented content equals the
//! recorded digest (a plain `.safetensors` base, or a base re-encoded
//! since). `verify` always does the full check, and z4ai's BLAKE2b digests.
//! The check runs in `check_range`, which every path that serves bytes
//! calls first; a block decoder waits for it only if no other thread is
//! running it (each block is checked against its own digest anyway), so
//! the mount decodes blocks ahead while the first read checks the base.

use super::frame_block::{
    damaged_payload, decode_remote_frame_block, decode_unit_block, frame_grid, frame_unit_grid,
    io_error, GridCell, GridError,
};
use super::{
    sparse_cache, ArchiveError, ArchiveView, Backing, BlockKey, Grid, Kind, PieceSource, Result,
    Segment,
};
use crate::codec::xor_delta::xor_into;
use crate::format::ckx;
use crate::format::delta::{self, DeltaKind, Head, RecordHead, Trailer, MAX_CHAIN};
use crate::format::digest::{xxh3_64, Xxh3};
use crate::format::frame::Frame;
use crate::format::safetensors::{header_len, Header, TensorEntry};
use crate::format::z4dm;
use rayon::prelude::*;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The largest COPY block a reader accepts (ckptfs writes 1 MiB).
const MAX_COPY_BLOCK: u64 = 64 << 20;
/// The largest block of a sliced sparse unit a reader accepts (ckptfs
/// writes 1 MiB).
const MAX_SLICE: u64 = 64 << 20;
/// A DELTA block longer than this (a `ZSP1` frame listed as one block, as
/// ckptfs wrote them before listing their blocks: block grids are
/// otherwise about 1 MiB) is decoded beside the base's bytes, and a base
/// range longer than this is decoded in parallel.
const OVERLAP_MIN: u64 = 4 << 20;

/// Where a delta's base is opened from.
pub trait BaseFs: Send + Sync {
    /// Opens `rel` (a recorded base path) relative to the directory of the
    /// archive at `from`; returns the file and the path that names it (in
    /// messages, and as the `from` of its own base).
    fn open_base(&self, from: &Path, rel: &str) -> io::Result<(File, PathBuf)>;
    /// Where the decoded blocks of the base archive opened from `file`
    /// (named `path`) are kept and shared (the mount's block cache, keyed by the file's
    /// identity and version), or None: each delta decodes its base's
    /// blocks itself (the default; what the CLI does).
    fn base_blocks(&self, _file: &File, _path: &Path) -> Option<Arc<dyn BaseBlocks>> {
        None
    }
}

/// A store of a base archive's decoded blocks shared by every delta over
/// the same base version, so that a family of fine-tunes read together or
/// one after another decodes the base once (while its blocks stay in the
/// store). The base's own checks run in `decode`, as without a store.
pub trait BaseBlocks: Send + Sync {
    /// Block `key` of the base: the stored one, or `decode`'s result
    /// (kept for the next delta). Must not wait on another thread's
    /// decode of the same block: it may run on a rayon worker.
    fn get(
        &self,
        key: BlockKey,
        decode: &mut dyn FnMut() -> Result<Vec<u8>>,
    ) -> Result<Arc<Vec<u8>>>;
}

/// The local file system: `rel` joined to `from`'s directory.
pub struct LocalFs;

impl BaseFs for LocalFs {
    fn open_base(&self, from: &Path, rel: &str) -> io::Result<(File, PathBuf)> {
        let p = from.parent().unwrap_or(Path::new("")).join(rel);
        Ok((File::open(&p)?, p))
    }
}

/// An opened base: an archive (its decoded blocks maybe shared with other
/// deltas over it: [`BaseBlocks`]), or a plain `.safetensors` file.
pub enum Base {
    Archive(Arc<dyn ArchiveView>, Option<Arc<dyn BaseBlocks>>),
    Plain { path: PathBuf, map: Backing },
}

impl Base {
    pub fn path(&self) -> &Path {
        match self {
            Base::Archive(a, _) => a.path(),
            Base::Plain { path, .. } => path,
        }
    }
    pub fn len(&self) -> u64 {
        match self {
            Base::Archive(a, _) => a.logical_len(0),
            Base::Plain { map, .. } => map.bytes().len() as u64,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Fills `buf` with presented bytes from `offset` (all inside).
    pub fn read_exact(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.apply(offset, buf, <[u8]>::copy_from_slice)
    }
    /// XORs the presented bytes from `offset` into `out` (all inside),
    /// without an intermediate copy: straight from the map of a plain
    /// base, block by block from a base archive (a ckptfs base of the same
    /// tensor has the delta's block grid, so this decodes one block).
    pub fn xor_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.apply(offset, out, xor_into)
    }
    /// Applies `op(dst, src)` to `out` and the presented bytes from
    /// `offset` (all inside).
    fn apply(&self, offset: u64, out: &mut [u8], op: fn(&mut [u8], &[u8])) -> Result<()> {
        let end = offset.checked_add(out.len() as u64);
        match self {
            Base::Plain { map, path } => {
                let b = end
                    .and_then(|e| map.bytes().get(offset as usize..e as usize))
                    .ok_or_else(|| ArchiveError::Integrity {
                        path: path.clone(),
                        what: format!("no bytes at {offset}"),
                    })?;
                op(out, b);
                Ok(())
            }
            Base::Archive(a, shared) => {
                let end = end
                    .filter(|&e| e <= a.logical_len(0))
                    .ok_or_else(|| a.integrity(format!("short read at {offset}")))?;
                a.check_range(0, offset..end)?;
                each_piece(&**a, shared.as_deref(), offset, out, op)
            }
        }
    }
    /// Asks for the stored bytes behind presented `range` to be read
    /// ahead (the prefetcher's hint, passed down to the base).
    fn will_need(&self, range: Range<u64>) {
        match self {
            Base::Plain { map, .. } => map.will_need(range),
            Base::Archive(a, _) => {
                let segs = a.segments(0);
                let k = segs.partition_point(|s| s.start + s.len <= range.start);
                for s in segs[k..].iter().take_while(|s| s.start < range.end) {
                    a.will_need(s.unit);
                }
            }
        }
    }
    /// The base archive's checksum identity (none for a plain file).
    pub fn fingerprint(&self) -> Option<u64> {
        match self {
            Base::Archive(a, _) => a.fingerprint(),
            Base::Plain { .. } => None,
        }
    }
    /// Its chain depth: 0 unless it is a delta.
    pub fn depth(&self) -> u32 {
        match self {
            Base::Archive(a, _) => (&**a as &dyn std::any::Any)
                .downcast_ref::<DeltaArchive>()
                .map_or(0, |d| d.depth()),
            Base::Plain { .. } => 0,
        }
    }
    /// Its real chain depth: 0 for a standalone base, else 1 + its own
    /// base's (the recorded depth is only an upper bound).
    pub fn chain_depth(&self) -> u32 {
        match self {
            Base::Archive(a, _) => (&**a as &dyn std::any::Any)
                .downcast_ref::<DeltaArchive>()
                .map_or(0, |d| d.chain_depth()),
            Base::Plain { .. } => 0,
        }
    }
    /// Calls `f` on the presented content, in order, in chunks.
    pub fn stream(&self, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        match self {
            Base::Plain { map, .. } => {
                f(map.bytes());
                Ok(())
            }
            Base::Archive(a, _) => {
                struct W<'a>(&'a mut dyn FnMut(&[u8]));
                impl io::Write for W<'_> {
                    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                        (self.0)(b);
                        Ok(b.len())
                    }
                    fn flush(&mut self) -> io::Result<()> {
                        Ok(())
                    }
                }
                super::write_to(&**a, 0, &mut W(f), &|_| {}).map_err(|e| match e {
                    super::WriteError::Archive(e) => e,
                    super::WriteError::Write(e) => ArchiveError::Io {
                        path: a.path().to_path_buf(),
                        source: e,
                    },
                })
            }
        }
    }
    /// Like [`Base::stream`], on this thread only: no rayon, so it may run
    /// inside a once-only initialiser called from a rayon worker (a nested
    /// parallel loop could steal a task that waits on that initialiser).
    fn stream_here(&self, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        match self {
            Base::Plain { map, .. } => {
                f(map.bytes());
                Ok(())
            }
            // Not through the shared blocks: this streams the whole base
            // once (the check of a base without a fingerprint), which
            // would flush the cache for blocks read once.
            Base::Archive(a, _) => {
                f(a.prefix(0)?);
                for key in super::blocks_of(&**a, 0)? {
                    f(&a.decode_block(key)?);
                }
                Ok(())
            }
        }
    }
    /// The parsed safetensors header of the presented content.
    fn header(&self) -> Result<(u64, Header)> {
        let len = self.len();
        let mut h8 = [0u8; 8];
        let short = |what: String| ArchiveError::Integrity {
            path: self.path().to_path_buf(),
            what,
        };
        if len < 8 {
            return Err(short(
                "not a safetensors file (shorter than 8 bytes)".into(),
            ));
        }
        self.read_exact(0, &mut h8)?;
        let hl = header_len(&h8, len).map_err(|e| short(format!("safetensors header: {e}")))?;
        let mut raw = vec![0u8; hl as usize];
        self.read_exact(8, &mut raw)?;
        let h = Header::parse(&raw, len - 8 - hl)
            .map_err(|e| short(format!("safetensors header: {e}")))?;
        Ok((8 + hl, h))
    }
}

/// Applies `op(dst, src)` to every piece of `out` and the presented bytes of
/// `a` from `offset` (checked by the caller), decoding the blocks in
/// parallel when the range is long: a delta block that decodes whole (a
/// `ZSP1` sparse XOR frame listed as one block) spans many base blocks,
/// which a standalone read of the range would decode in parallel too.
fn each_piece(
    a: &dyn ArchiveView,
    shared: Option<&dyn BaseBlocks>,
    offset: u64,
    out: &mut [u8],
    op: fn(&mut [u8], &[u8]),
) -> Result<()> {
    let end = offset + out.len() as u64;
    let mut jobs = Vec::new();
    let mut rest = out;
    for p in super::plan(a, 0, offset..end)? {
        let within = p.within.start as usize..p.within.end as usize;
        let (dst, tail) = std::mem::take(&mut rest).split_at_mut(within.len());
        rest = tail;
        jobs.push((p.source, within, dst));
    }
    let one = |(source, within, dst): (PieceSource, Range<usize>, &mut [u8])| {
        match source {
            PieceSource::Prefix => op(dst, &a.prefix(0)?[within]),
            PieceSource::Block(k) => match shared {
                Some(shared) => op(dst, &shared.get(k, &mut || a.decode_block(k))?[within]),
                None => op(dst, &a.decode_block(k)?[within]),
            },
        }
        Ok(())
    };
    // A usual block's range spans a base block or two: decoded here, so a
    // reader's thread does not queue behind the pool's prefetch work.
    if end - offset <= OVERLAP_MIN {
        return jobs.into_iter().try_for_each(one);
    }
    jobs.into_par_iter().try_for_each(one)
}

/// Opens the base `rel` of the archive at `from`. `depth_left`: how many
/// more deltas may follow in the chain.
pub fn open_base(fs: &dyn BaseFs, from: &Path, rel: &str, depth_left: u32) -> Result<Base> {
    let (file, path) = fs.open_base(from, rel).map_err(|source| ArchiveError::Io {
        path: from.parent().unwrap_or(Path::new("")).join(rel),
        source,
    })?;
    // A base in a bucket is a remote copy like the delta: opened the same
    // way (its metadata fetched first; a plain file is fetched whole).
    let (backing, head) = super::map_with_head(&file, &path)?;
    if Kind::detect(&head).is_some() || super::unsupported_kind(&head).is_some() {
        let a = super::from_backing_in(backing, &head, &path, fs, depth_left)?;
        if a.files() != 1 || !a.file_path(0).is_empty() {
            return Err(a.integrity("a model-directory archive cannot be a delta's base".into()));
        }
        return Ok(Base::Archive(a, fs.base_blocks(&file, &path)));
    }
    Ok(Base::Plain { path, map: backing })
}

/// The size of the file a `Z4DM` delta presents, from its head alone (no
/// base needed): `8 + hlen + data_len`. None when `file` is no `Z4DM` or
/// its head cannot be read; for listing a delta whose base is missing with
/// the size it would have.
pub fn presented_len_of_head(file: &File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut fixed = [0u8; z4dm::FIXED_LEN];
    file.read_exact_at(&mut fixed, 0).ok()?;
    let hlen = z4dm::json_len(&fixed)?;
    if hlen > crate::format::safetensors::MAX_HEADER_LEN {
        return None;
    }
    let mut data_len = [0u8; 8];
    file.read_exact_at(&mut data_len, z4dm::FIXED_LEN as u64 + hlen)
        .ok()?;
    (8 + hlen).checked_add(u64::from_le_bytes(data_len))
}

/// The most a record's bytes before its frame take besides its name:
/// name length, begin, end, kind, frame length and a DELTA's Z4DL header.
const RECORD_HEAD_FIXED: u64 = 2 + 8 + 8 + 1 + 8 + delta::Z4DL_HEADER as u64;

/// Bytes of each record read ahead when a local delta is opened: its
/// fixed part and a name of up to a few KiB.
const RECORD_HEAD_AHEAD: u64 = 8 << 10;

/// Over a remote copy: fetches what [`DeltaArchive::from_backing`] reads
/// (`super::remote_metadata`): the CKD1 trailer, the Z4DM head (header
/// JSON, lengths, digest) and each record's bytes before its frame, where
/// the trailer says the records are (all together: about one request per
/// run of records whose frames are small, and a second round only for
/// names longer than a page). Frames are fetched when used. Offsets here
/// only choose what to fetch (clamped to the object); a trailer that does
/// not parse fetches nothing more (the open reports it).
pub(super) fn fetch_metadata(b: &Backing) -> io::Result<()> {
    let len = b.bytes().len() as u64;
    let u64_at = |at: u64| -> Option<u64> {
        let s = b.bytes().get(at as usize..at.checked_add(8)? as usize)?;
        Some(u64::from_le_bytes(s.try_into().ok()?))
    };
    // The trailer ends with its own length and "CKD1"; the head starts
    // with "Z4DM", a version byte and the header JSON's length.
    let fixed = z4dm::FIXED_LEN as u64;
    b.ensure_all(&[0..fixed.min(len), len.saturating_sub(12)..len])?;
    let trailer_len = u64_at(len.saturating_sub(12)).unwrap_or(0).min(len);
    let head_end = u64_at(z4dm::JSON_LEN_AT as u64).map_or(len, |h| z4dm::head_len(h).min(len));
    b.ensure_all(&[0..head_end, len - trailer_len..len])?;
    let Ok(Some(trailer)) = Trailer::find(b.bytes()) else {
        return Ok(());
    };
    let head = |u: &delta::UnitEntry, most: u64| {
        let at = u.record_offset.min(len);
        at..at.saturating_add(u.record_len.min(most)).min(len)
    };
    let page = crate::store::remote::ALIGN;
    let first: Vec<Range<u64>> = trailer.units.iter().map(|u| head(u, page)).collect();
    b.ensure_all(&first)?;
    let name_len = |at: u64| {
        let at = at.min(len) as usize;
        let s = b.bytes().get(at..at.checked_add(2)?)?;
        Some(u16::from_le_bytes(s.try_into().ok()?) as u64)
    };
    let rest: Vec<Range<u64>> = trailer
        .units
        .iter()
        .filter_map(|u| {
            let need = RECORD_HEAD_FIXED + name_len(u.record_offset)?;
            (need > page).then(|| head(u, need))
        })
        .collect();
    b.ensure_all(&rest)
}

/// File bytes `r` as a range of file offsets.
fn file_range(r: &Range<usize>) -> Range<u64> {
    r.start as u64..r.end as u64
}

struct Unit {
    kind: DeltaKind,
    /// The Z4AI frame's bytes in the file (empty for COPY).
    frame: Range<usize>,
    /// Where the matching base tensor starts in the base's presented file.
    base_offset: u64,
    len: u64,
    grid: GridCell,
}

pub struct DeltaArchive {
    path: PathBuf,
    map: Backing,
    head: Head,
    trailer: Trailer,
    records: Vec<RecordHead>,
    units: Vec<Unit>,
    segments: Vec<Segment>,
    base: Base,
    /// Passed once: the base is the one packed against.
    base_ok: OnceLock<std::result::Result<(), String>>,
    /// Set when a thread starts the check (it may still be running).
    base_check_started: AtomicBool,
    fingerprint: u64,
    /// This archive's key in `sparse_cache`.
    owner: u64,
}

impl Drop for DeltaArchive {
    fn drop(&mut self) {
        sparse_cache::forget(self.owner);
    }
}

impl DeltaArchive {
    /// Opens a delta held in `map`; its base through `fs`. `depth_left`
    /// bounds the chain still allowed below this archive.
    pub fn from_backing(
        map: Backing,
        path: &Path,
        fs: &dyn BaseFs,
        depth_left: u32,
    ) -> Result<DeltaArchive> {
        let bad = |what: String| ArchiveError::Integrity {
            path: path.to_path_buf(),
            what,
        };
        let bytes = map.bytes();
        let trailer = match Trailer::find(bytes).map_err(bad)? {
            Some(t) => t,
            None => {
                return Err(ArchiveError::Unrecognised {
                    path: path.to_path_buf(),
                    what: "a z4ai model delta (Z4DM) without ckptfs's CKD1 trailer, so no base \
                           path or checksums: decode it with `ckptfs unpack FILE --base BASE` or \
                           z4ai"
                        .into(),
                })
            }
        };
        if trailer.depth == 0 || trailer.depth > MAX_CHAIN {
            return Err(bad(format!(
                "chain depth {} outside 1..={MAX_CHAIN}",
                trailer.depth
            )));
        }
        if trailer.depth > depth_left {
            return Err(bad(format!(
                "a chain of deltas deeper than {MAX_CHAIN} (or a cycle) below it"
            )));
        }
        delta::check_base_path(&trailer.base_path).map_err(bad)?;
        let body = &bytes[..trailer.z4dm_len as usize];
        let head = delta::parse_head(body).map_err(bad)?;
        if xxh3_64(&body[..head.records_start]) != trailer.head_digest {
            return Err(bad(
                "checksum mismatch in the Z4DM head (header JSON or lengths)".into(),
            ));
        }
        if head.n_records as usize != trailer.units.len() {
            return Err(bad(format!(
                "{} records, the CKD1 trailer lists {}",
                head.n_records,
                trailer.units.len()
            )));
        }
        // The records are read one after another below, each where its
        // frame begins: ask for all their heads at once, so that a cold
        // open waits for one round of reads, not one per record.
        // Heads closer than RECORD_HEAD_AHEAD go in one request, so that
        // an archive of many small tensors takes few calls.
        let mut ahead: Option<Range<u64>> = None;
        for u in &trailer.units {
            let at = u.record_offset;
            let head = at..at.saturating_add(u.record_len.min(RECORD_HEAD_AHEAD));
            ahead = match ahead {
                Some(r) if head.start <= r.end.saturating_add(RECORD_HEAD_AHEAD) => {
                    Some(r.start..r.end.max(head.end))
                }
                r => {
                    if let Some(r) = r {
                        map.will_need(r);
                    }
                    Some(head)
                }
            };
        }
        if let Some(r) = ahead {
            map.will_need(r);
        }
        let mut records = Vec::with_capacity(trailer.units.len());
        let mut heads = Vec::with_capacity(trailer.units.len());
        let mut at = head.records_start as u64;
        let mut data_pos = 0u64;
        for (i, u) in trailer.units.iter().enumerate() {
            if u.record_offset != at {
                return Err(bad(format!("record {i} is not where the trailer says")));
            }
            let r = delta::parse_record(body, at as usize).map_err(bad)?;
            if r.end_offset as u64 != at + u.record_len {
                return Err(bad(format!(
                    "record {:?}: length differs from the trailer",
                    r.name
                )));
            }
            let meta_end = if r.kind == DeltaKind::Copy {
                r.end_offset
            } else {
                r.frame.start
            };
            let digest = xxh3_64(&body[at as usize..meta_end]);
            if trailer.records_digest.is_none() && digest != u.record_digest {
                return Err(bad(format!("record {:?}: checksum mismatch", r.name)));
            }
            heads.push(digest);
            if r.begin != data_pos || r.end < r.begin || r.end > head.data_len {
                return Err(bad(format!(
                    "record {:?}: bytes [{}, {}) do not continue the data buffer at {data_pos}",
                    r.name, r.begin, r.end
                )));
            }
            data_pos = r.end;
            at = r.end_offset as u64;
            records.push(r);
        }
        if trailer
            .records_digest
            .is_some_and(|d| d != delta::records_digest(heads))
        {
            return Err(bad(
                "checksum mismatch in the Z4DM records (names, spans, kinds or lengths)".into(),
            ));
        }
        if at != trailer.z4dm_len || data_pos != head.data_len {
            return Err(bad(
                "records do not fill the Z4DM body and data buffer".into()
            ));
        }
        let prefix = &bytes[head.prefix.clone()];
        let header = Header::parse(&prefix[8..], head.data_len)
            .map_err(|e| bad(format!("safetensors header: {e}")))?;
        let order = header.data_order();
        if order.len() != records.len()
            || order
                .iter()
                .zip(&records)
                .any(|(t, r)| t.name != r.name || t.begin != r.begin || t.end != r.end)
        {
            return Err(bad("the header's tensors differ from the records".into()));
        }
        let base = open_base(fs, path, &trailer.base_path, trailer.depth - 1).map_err(|e| {
            // An I/O error names the base already; others name its file.
            let why = match &e {
                ArchiveError::Io { .. } => e.reason(),
                _ => e.to_string(),
            };
            bad(format!(
                "base {}: {why}",
                path.parent()
                    .unwrap_or(Path::new(""))
                    .join(&trailer.base_path)
                    .display(),
            ))
        })?;
        let wrong_base = |what: String| bad(format!("base {}: {what}", base.path().display()));
        // The recorded depth bounds the chain: a base made shallower since
        // (a delta below it rewritten standalone) keeps it valid.
        if base.depth() + 1 > trailer.depth {
            return Err(wrong_base(format!(
                "chain depth {} where this delta allows at most {}",
                base.depth(),
                trailer.depth - 1
            )));
        }
        if base.len() != trailer.base_len {
            return Err(wrong_base(format!(
                "{} bytes, this delta was packed against {} bytes (a different base)",
                base.len(),
                trailer.base_len
            )));
        }
        let needs_base = records.iter().any(|r| r.kind != DeltaKind::Full);
        let (base_start, base_header) = if needs_base {
            let (s, h) = base.header()?;
            (s, Some(h))
        } else {
            (0, None)
        };
        let by_name: HashMap<&str, &TensorEntry> = base_header
            .iter()
            .flat_map(|h| &h.tensors)
            .map(|t| (t.name.as_str(), t))
            .collect();
        let mut units = Vec::with_capacity(records.len());
        let mut segments = Vec::new();
        let prefix_len = prefix.len() as u64;
        for (i, (r, t)) in records.iter().zip(&order).enumerate() {
            let len = r.end - r.begin;
            let base_offset = match r.kind {
                DeltaKind::Full => 0,
                DeltaKind::Copy | DeltaKind::Delta => {
                    let b = by_name
                        .get(r.name.as_str())
                        .filter(|b| b.dtype == t.dtype && b.len() == len)
                        .ok_or_else(|| {
                            wrong_base(format!(
                                "no tensor {:?} of dtype {} and {len} bytes (a different base)",
                                r.name, t.dtype
                            ))
                        })?;
                    if r.kind == DeltaKind::Delta && r.reference.map(|x| x.0) != Some(len) {
                        return Err(bad(format!("record {:?}: Z4DL reference length", r.name)));
                    }
                    base_start + b.begin
                }
            };
            units.push(Unit {
                kind: r.kind,
                frame: r.frame.clone(),
                base_offset,
                len,
                grid: GridCell::new(),
            });
            if len > 0 {
                segments.push(Segment {
                    start: prefix_len + r.begin,
                    len,
                    unit: i as u32,
                });
            }
        }
        let fingerprint = xxh3_64(&bytes[trailer.z4dm_len as usize..]);
        Ok(DeltaArchive {
            path: path.to_path_buf(),
            map,
            head,
            trailer,
            records,
            units,
            segments,
            base,
            base_ok: OnceLock::new(),
            base_check_started: AtomicBool::new(false),
            fingerprint,
            owner: sparse_cache::new_owner(),
        })
    }

    fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    /// The chain depth: 1 when the base is standalone.
    pub fn depth(&self) -> u32 {
        self.trailer.depth
    }

    /// The real chain depth, from the bases opened (at most `depth()`).
    pub fn chain_depth(&self) -> u32 {
        1 + self.base.chain_depth()
    }

    /// The base path as recorded (relative to this archive's directory).
    pub fn base_rel(&self) -> &str {
        &self.trailer.base_path
    }

    /// The opened base.
    pub fn base(&self) -> &Base {
        &self.base
    }

    /// Records by kind: (COPY, DELTA, FULL).
    pub fn counts(&self) -> (usize, usize, usize) {
        let n = |k| self.records.iter().filter(|r| r.kind == k).count();
        (n(DeltaKind::Copy), n(DeltaKind::Delta), n(DeltaKind::Full))
    }

    fn base_error(&self, what: String) -> ArchiveError {
        self.integrity(format!("base {}: {what}", self.base.path().display()))
    }

    /// Checks, once, that the base is the one packed against (see the
    /// module doc): its fingerprint, or else the digest of its content.
    pub fn check_base(&self) -> Result<()> {
        let r = self.base_ok.get_or_init(|| {
            self.base_check_started.store(true, Ordering::Release);
            if self.fingerprint_matches() {
                return Ok(());
            }
            self.full_base_check().map_err(|e| e.reason())
        });
        r.clone().map_err(|what| self.integrity(what))
    }

    /// True when the base's archive fingerprint is the one recorded: the
    /// base is the one packed against, known without reading it.
    fn fingerprint_matches(&self) -> bool {
        self.trailer.base_fingerprint != 0
            && self.base.fingerprint() == Some(self.trailer.base_fingerprint)
    }

    /// [`Self::check_base`] for a block decoder: its result once known;
    /// while another thread runs it, no wait. Every block is checked
    /// against the digest of the target bytes it serves, so a wrong base
    /// still gives an error, never wrong bytes, and nothing is served
    /// before the check passes: every path that serves bytes calls
    /// `check_range` first (the mount's reads, `read_with`, `write_to`).
    /// So the first read's check (one read of the whole base) overlaps
    /// with decoding the blocks the mount prefetches meanwhile.
    fn check_base_for_block(&self) -> Result<()> {
        if self.base_ok.get().is_none() && self.base_check_started.load(Ordering::Acquire) {
            return Ok(());
        }
        self.check_base()
    }

    /// The xxh3 of the base's whole presented content against the
    /// recorded digest.
    fn full_base_check(&self) -> Result<()> {
        let mut h = Xxh3::new();
        self.base.stream_here(&mut |b| h.update(b))?;
        if h.digest() != self.trailer.base_digest {
            return Err(self.base_error(
                "content differs from the base this delta was packed against (digest mismatch)"
                    .into(),
            ));
        }
        Ok(())
    }

    fn unit(&self, unit: u32) -> Result<&Unit> {
        self.units
            .get(unit as usize)
            .ok_or_else(|| self.integrity(format!("no unit {unit}")))
    }

    /// Decodes one block from the bytes at hand (fetched, for a remote
    /// copy), checking it against the trailer's digest.
    fn decode_block_once(&self, key: BlockKey) -> Result<Vec<u8>> {
        let u = self.unit(key.unit)?;
        let grid = self.grid(key.unit)?;
        let b = super::frame_block::block_index(self, key, &grid)?;
        let digests = &self.trailer.units[key.unit as usize].blocks[b];
        let span = grid.span(b);
        let frame = &self.bytes()[u.frame.clone()];
        let decoded = || -> Result<Vec<u8>> {
            Ok(match u.kind {
                DeltaKind::Full => decode_unit_block(self, key, frame)?,
                DeltaKind::Copy => {
                    self.check_base_for_block()?;
                    // The base range is copied whole: every byte written.
                    let mut out = crate::codec::buffers::take(span.end - span.start, "a block")
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
                                let mut v = crate::codec::buffers::take(len, "a base block")
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
        if index > crate::format::frame::MAX_BLOCK_BYTES {
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
            _ => Err(crate::codec::CodecError::invalid(
                "sliced sparse unit",
                "not a ZSP1 frame",
            )),
        })
        .map_err(err)?;
        let mut out = crate::codec::buffers::take(span.end - span.start, "a block").map_err(err)?;
        ix.decode_range(span.start, &mut out).map_err(err)?;
        Ok(out)
    }

    fn build_grid(&self, unit: u32) -> std::result::Result<Arc<Grid>, GridError> {
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

impl ArchiveView for DeltaArchive {
    fn kind(&self) -> Kind {
        Kind::Delta
    }
    fn path(&self) -> &Path {
        &self.path
    }
    fn stored_len(&self) -> u64 {
        self.bytes().len() as u64
    }
    fn checksums(&self) -> Option<&'static str> {
        Some("ckd1")
    }
    fn fingerprint(&self) -> Option<u64> {
        Some(self.fingerprint)
    }
    fn base_path(&self) -> Option<&str> {
        Some(&self.trailer.base_path)
    }
    fn files(&self) -> usize {
        1
    }
    fn file_path(&self, _file: usize) -> &str {
        ""
    }
    fn logical_len(&self, _file: usize) -> u64 {
        self.head.prefix.len() as u64 + self.head.data_len
    }
    fn prefix(&self, _file: usize) -> Result<&[u8]> {
        Ok(&self.bytes()[self.head.prefix.clone()])
    }
    fn prefix_len(&self, _file: usize) -> u64 {
        self.head.prefix.len() as u64
    }
    fn segments(&self, _file: usize) -> &[Segment] {
        &self.segments
    }
    fn units(&self) -> usize {
        self.units.len()
    }
    fn unit_name(&self, unit: u32) -> &str {
        self.records
            .get(unit as usize)
            .map_or("<none>", |r| r.name.as_str())
    }
    fn unit_label(&self, unit: u32) -> String {
        format!("tensor {:?}", self.unit_name(unit))
    }
    /// The grid of a record (over a remote copy, a FULL or DELTA frame's
    /// structure is fetched first).
    fn grid(&self, unit: u32) -> Result<Arc<Grid>> {
        let u = self.units.get(unit as usize);
        let frame = u
            .filter(|u| u.kind != DeltaKind::Copy)
            .map(|u| (file_range(&u.frame), u.len));
        frame_unit_grid(self, &self.map, unit, u.map(|u| &u.grid), frame, || {
            self.build_grid(unit)
        })
    }
    /// Decodes one block, checking it against the trailer's digest. Over a
    /// remote copy, a FULL or DELTA block's stored bytes are fetched first
    /// (pinned in the disk cache until it is decoded) and fetched again
    /// once, with the frame's structure, when the block fails its checks;
    /// the base's bytes come through the base archive, which fetches its
    /// own.
    fn decode_block(&self, key: BlockKey) -> Result<Vec<u8>> {
        let u = self.unit(key.unit)?;
        if !self.map.is_remote() || u.kind == DeltaKind::Copy {
            return self.decode_block_once(key);
        }
        let grid = self.grid(key.unit)?;
        let b = super::frame_block::block_index(self, key, &grid)?;
        decode_remote_frame_block(
            self,
            &self.map,
            &file_range(&u.frame),
            u.len,
            &grid,
            b,
            || self.decode_block_once(key),
        )
    }
    fn will_need(&self, unit: u32) {
        if let Some(u) = self.units.get(unit as usize) {
            self.map.will_need(u.frame.start as u64..u.frame.end as u64);
            if u.kind != DeltaKind::Full {
                self.base.will_need(u.base_offset..u.base_offset + u.len);
            }
        }
    }
    fn check_range(&self, _file: usize, range: Range<u64>) -> Result<()> {
        // The prefix needs no base; anything else may.
        if range.end > self.prefix_len(0) && self.units.iter().any(|u| u.kind != DeltaKind::Full) {
            self.check_base()?;
        }
        Ok(())
    }
    /// Only a check that reads the whole base is long: one that the
    /// fingerprint settles is not (a wider prefetch would then only move
    /// bytes the read does not need, over the network for a remote copy).
    fn check_pending(&self) -> bool {
        self.base_ok.get().is_none()
            && self.units.iter().any(|u| u.kind != DeltaKind::Full)
            && !self.fingerprint_matches()
    }
    fn verify_structure(&self) -> Result<()> {
        // The full content digest, whatever the fingerprint says, and what
        // z4ai checks: BLAKE2b-8 of the base's data buffer, BLAKE2b-16 of
        // each DELTA record's base tensor.
        use crate::format::z4digest::Z4Digest;
        let mut x = Xxh3::new();
        let mut b8 = Z4Digest::base_data();
        let start = if self.base.len() >= 8 {
            let mut h8 = [0u8; 8];
            self.base.read_exact(0, &mut h8)?;
            8 + u64::from_le_bytes(h8)
        } else {
            0
        };
        let mut pos = 0u64;
        self.base.stream(&mut |b| {
            x.update(b);
            let lo = start.saturating_sub(pos).min(b.len() as u64) as usize;
            b8.update(&b[lo..]);
            pos += b.len() as u64;
        })?;
        if x.digest() != self.trailer.base_digest {
            return Err(self.base_error(
                "content differs from the base this delta was packed against (digest mismatch)"
                    .into(),
            ));
        }
        if b8.finish() != self.head.base_data_digest {
            return Err(self.base_error("the Z4DM's BLAKE2b digest of the base differs".into()));
        }
        for (r, u) in self.records.iter().zip(&self.units) {
            if let (DeltaKind::Delta, Some((_, want))) = (r.kind, r.reference) {
                let mut h = Z4Digest::reference();
                let mut pos = 0;
                let mut buf = vec![0u8; (u.len.min(16 << 20)) as usize];
                while pos < u.len {
                    let n = (u.len - pos).min(buf.len() as u64) as usize;
                    self.base.read_exact(u.base_offset + pos, &mut buf[..n])?;
                    h.update(&buf[..n]);
                    pos += n as u64;
                }
                if h.finish() != want {
                    return Err(self.base_error(format!(
                        "tensor {:?}: the Z4DL's BLAKE2b digest of the base tensor differs",
                        r.name
                    )));
                }
            }
        }
        Ok(())
    }
    fn verify_unit(&self, unit: u32, _digest: u64) -> Result<()> {
        let u = self.unit(unit)?;
        self.map
            .ensure(file_range(&u.frame))
            .map_err(|e| io_error(self, e))?;
        if u.kind != DeltaKind::Copy
            && xxh3_64(&self.bytes()[u.frame.clone()])
                != self.trailer.units[unit as usize].frame_digest
        {
            return Err(self.unit_integrity(unit, "checksum mismatch in the frame".into()));
        }
        Ok(())
    }
    fn verify_finish(&self, _unit_digests: &[u64]) -> Result<String> {
        let (c, d, f) = self.counts();
        let len = self.logical_len(0);
        Ok(format!(
            "delta (chain depth {}) against {}: {} tensors ({c} COPY, {d} DELTA, {f} FULL), {} -> {} bytes, ratio {:.4}, all checksums verified",
            self.depth(),
            self.trailer.base_path,
            self.records.len(),
            len,
            self.stored_len(),
            len as f64 / self.stored_len().max(1) as f64,
        ))
    }
}

/// True when `frame` is a `ZSP1` sparse frame.
fn frame_is_sparse(frame: &[u8]) -> bool {
    frame.starts_with(b"ZSP1")
}
