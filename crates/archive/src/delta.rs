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
//! [`MAX_CHAIN`](ckptfs_format::delta::MAX_CHAIN) deep, checked while
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
//!
//! This file holds the opened archive and its `ArchiveView`; `open.rs`
//! opens one (and reads or fetches its head alone), `base.rs` has the base
//! and where it comes from, `blocks.rs` the block grids and block decoding.

use crate::frame_block::{decode_remote_frame_block, frame_unit_grid, io_error, GridCell};
use crate::{sparse_cache, ArchiveError, ArchiveView, BlockKey, Grid, Kind, Result, Segment};
use ckptfs_format::delta::{DeltaKind, Head, RecordHead, Trailer};
use ckptfs_format::digest::{xxh3_64, Xxh3};
use ckptfs_store::source::ByteSource;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

mod base;
mod blocks;
mod open;

pub use base::{open_base, Base, BaseBlocks, BaseFs, LocalFs, LocalSources};
pub(crate) use open::fetch_metadata;
pub use open::presented_len_of_head;

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
    map: Box<dyn ByteSource>,
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
        frame_unit_grid(self, &*self.map, unit, u.map(|u| &u.grid), frame, || {
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
            &*self.map,
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
        use ckptfs_format::z4digest::Z4Digest;
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
