//! An opened BLAZE-X `.blz` (`"BLAZXPK\n"`, the archive the `blazex` tool
//! writes), presenting the directory `blazex export --to safetensors`
//! writes: `model.safetensors`, `config.json`, `tokenizer.json` (when the
//! archive has one) and every sidecar, in that order.
//!
//! Opening maps the file and parses the prelude and the header JSON
//! ([`format::blazex::parse`] checks every length, offset, name and dtype).
//! Nothing is copied or decoded:
//! - `model.safetensors` is a synthesised header (the prefix, built from
//!   the tensor list at open: sorted keys, data back to back in header
//!   order, as `blazex export` writes it) followed by one segment per
//!   tensor, served straight from the archive's bytes;
//! - `config.json` (`model_config` rendered as `blazex export` renders it),
//!   `tokenizer.json` (verbatim) and the sidecars (base64 decoded) are
//!   prefixes, built on first use, so an undecodable sidecar fails only
//!   reads of that file.
//!
//! A unit is a tensor, cut into plain 1 MiB blocks. BLAZE-X has one digest
//! per tensor (its xxh3), so a tensor's bytes are checked whole, once, the
//! first time any block of it is decoded (the file is mapped: hashing runs
//! at memory speed once the pages are in, and the pages are asked for
//! ahead with `madvise(WILLNEED)` so a cold read streams the tensor from
//! disk while it is hashed). The result is kept: a damaged tensor fails
//! every read of its own bytes and nothing else. The data-section SHA-256
//! is checked by `verify` only.
//!
//! BLAZE-X has no checksum over its header (config.json, tokenizer.json,
//! the sidecars, the tensor names, dtypes and shapes). An archive ckptfs
//! wrote (`pack --format blazex`) or sealed (`ckptfs seal`) ends its header
//! with a digest member that blazex skips; [`blazex::parse`] checks it at
//! open, so a damaged header fails the open. Without one
//! ([`HeaderCover::Uncovered`], what blazex writes), [`ArchiveView::checksums`]
//! is None (`--require-checksums` refuses it) and [`ArchiveView::uncovered`]
//! says what no checksum covers (verify, info and the mount's log say it).
//!
//! Over a remote object's local copy (a remote [`ByteSource`]), opening has
//! fetched the prelude and the header only (`super::fetch_metadata`), so
//! listing the directory and reading `config.json`, `tokenizer.json` or a
//! sidecar moves no tensor bytes. A tensor is fetched whole when any block
//! of it is first read (its xxh3 covers it whole), and pinned in the disk
//! cache while it is hashed and while a block of it is copied out; a
//! tensor that fails its xxh3 is fetched again once before the failure is
//! kept, and one whose bytes had to be fetched again (evicted since) is
//! hashed again. A failed fetch is an I/O error, not kept.

use super::frame_block::{block_index, io_error, shared_grid, GridCell};
use super::{ArchiveError, ArchiveView, BlockKey, Grid, Kind, Result, Segment};
use base64::Engine as _;
use ckptfs_format::blazex::{self, Header, HeaderCover, Parsed, TensorEntry};
use ckptfs_format::digest::xxh3_64;
use ckptfs_store::remote::Pin;
use ckptfs_store::source::ByteSource;
use parking_lot::Mutex;
use sha2::{Digest as _, Sha256};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// What no checksum covers in an archive without ckptfs's header digest.
pub const UNCOVERED: &str = "the header (config.json, tokenizer.json, the sidecars, tensor names, dtypes and shapes) has no checksum in BLAZE-X; `ckptfs seal` adds one";

/// Block size of a tensor's grid (plain bytes: a block is a copy).
const BLOCK: u64 = 1 << 20;

/// Where a presented file's bytes come from.
enum Source {
    /// `model.safetensors`: the synthesised header is ready at open.
    Model,
    Config,
    Tokenizer,
    /// Sidecar `k` of the header.
    Sidecar(usize),
}

struct Presented {
    path: String,
    len: u64,
    source: Source,
}

struct Unit {
    grid: GridCell,
    /// The tensor's xxh3 check, done on first use (and again after a
    /// remote copy's bytes were fetched anew); held while it runs, so one
    /// thread hashes and the others wait for its result.
    checked: Mutex<Option<std::result::Result<(), String>>>,
}

pub struct BlazexArchive {
    path: PathBuf,
    map: Box<dyn ByteSource>,
    parsed: Parsed,
    files: Vec<Presented>,
    /// `model.safetensors`'s header (8-byte length, JSON, padding).
    model_prefix: Vec<u8>,
    model_segments: Vec<Segment>,
    /// Prefixes of the other files, built on first use.
    prefixes: Vec<OnceLock<std::result::Result<Vec<u8>, String>>>,
    units: Vec<Unit>,
}

impl std::fmt::Debug for BlazexArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlazexArchive")
            .field("path", &self.path)
            .finish()
    }
}

impl BlazexArchive {
    /// Opens a BLAZE-X `.blz` (any kind of archive: [`super::open`]).
    pub fn open(path: &Path) -> Result<BlazexArchive> {
        let io = |source| ArchiveError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        BlazexArchive::from_source(ckptfs_store::source::map_file(&file).map_err(io)?, path)
    }

    /// An archive over bytes in memory; `name` is used in messages.
    pub fn from_bytes(bytes: Vec<u8>, name: &Path) -> Result<BlazexArchive> {
        BlazexArchive::from_source(Box::new(bytes), name)
    }

    pub fn from_source(map: Box<dyn ByteSource>, path: &Path) -> Result<BlazexArchive> {
        let parsed = blazex::parse(map.bytes()).map_err(|source| match source {
            // Not the archive's fault: an I/O-like error, tried again later.
            blazex::BlazexError::OutOfMemory { .. } => {
                super::out_of_memory(path, source.to_string())
            }
            source => ArchiveError::Blazex {
                path: path.to_path_buf(),
                source,
            },
        })?;
        let h = &parsed.header;
        let (model_prefix, offsets) = blazex::render_safetensors_header(&h.tensors);
        let prefix_len = model_prefix.len() as u64;
        let model_segments: Vec<Segment> = h
            .tensors
            .iter()
            .zip(&offsets)
            .enumerate()
            .filter(|(_, (t, _))| t.data_len > 0)
            .map(|(i, (t, &o))| Segment {
                start: prefix_len + o,
                len: t.data_len,
                unit: i as u32,
            })
            .collect();
        let data_total: u64 = h.tensors.iter().map(|t| t.data_len).sum();
        let mut files = vec![
            Presented {
                path: blazex::MODEL_FILE.into(),
                len: prefix_len + data_total,
                source: Source::Model,
            },
            Presented {
                path: blazex::CONFIG_FILE.into(),
                len: blazex::render_config(&h.model_config).len() as u64,
                source: Source::Config,
            },
        ];
        if let Some(t) = &h.tokenizer {
            files.push(Presented {
                path: blazex::TOKENIZER_FILE.into(),
                len: t.len() as u64,
                source: Source::Tokenizer,
            });
        }
        for (k, s) in h.sidecar_files.iter().enumerate() {
            files.push(Presented {
                path: s.filename.clone(),
                len: ckptfs_format::blz::base64_decoded_len(&s.content_b64).expect("validated"),
                source: Source::Sidecar(k),
            });
        }
        let units = h
            .tensors
            .iter()
            .map(|_| Unit {
                grid: OnceLock::new(),
                checked: Mutex::new(None),
            })
            .collect();
        Ok(BlazexArchive {
            path: path.to_path_buf(),
            prefixes: files.iter().map(|_| OnceLock::new()).collect(),
            files,
            map,
            parsed,
            model_prefix,
            model_segments,
            units,
        })
    }

    pub fn header(&self) -> &Header {
        &self.parsed.header
    }

    pub fn tensors(&self) -> &[TensorEntry] {
        &self.parsed.header.tensors
    }

    /// The whole archive's bytes (present only for a local file).
    pub fn stored_bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    /// Whether ckptfs's header digest covers the header.
    pub fn cover(&self) -> HeaderCover {
        self.parsed.cover
    }

    /// Offset of DATA in the file.
    pub fn data_start(&self) -> u64 {
        self.parsed.data_start
    }

    /// Where tensor `t`'s stored bytes are in the file.
    fn tensor_range(&self, t: usize) -> Range<u64> {
        let te = &self.tensors()[t];
        let s = self.parsed.data_start + te.data_offset;
        s..s + te.data_len
    }

    /// The stored bytes of tensor `t`, not checked (see
    /// [`Self::tensor_bytes`]).
    pub fn raw_tensor(&self, t: usize) -> &[u8] {
        let r = self.tensor_range(t);
        &self.map.bytes()[r.start as usize..r.end as usize]
    }

    /// The bytes of tensor `t`, checked against its xxh3.
    pub fn tensor_bytes(&self, t: usize) -> Result<&[u8]> {
        self.check_tensor(t as u32)?;
        Ok(self.raw_tensor(t))
    }

    /// Checks tensor `unit` against its xxh3 (once, unless a remote copy
    /// had to fetch its bytes again since). Over a remote copy the whole
    /// tensor is fetched first, and stays pinned in the disk cache while
    /// the returned pin lives; a tensor that fails its check is fetched
    /// again once before the failure is kept.
    fn check_tensor(&self, unit: u32) -> Result<Option<Pin<'_>>> {
        let Some(u) = self.units.get(unit as usize) else {
            return Err(self.integrity(format!("no tensor {unit}")));
        };
        let range = [self.tensor_range(unit as usize)];
        let mut checked = u.checked.lock();
        let present = self.map.has_all(&range);
        let pin = self.map.pin_all(&range).map_err(|e| io_error(self, e))?;
        match &*checked {
            Some(r) if present || r.is_err() => {
                return r
                    .clone()
                    .map(|()| pin)
                    .map_err(|what| self.unit_integrity(unit, what))
            }
            _ => {}
        }
        // Only a hint: the hash below reads the pages either way.
        self.will_need(unit);
        let mut ok = self.hash_matches(unit);
        if !ok && self.map.is_remote() {
            // The cached copy may be damaged: once more from the server.
            if !self.map.refetch(&range) {
                return Err(io_error(
                    self,
                    std::io::Error::other(format!(
                        "tensor {:?} failed its xxh3 and could not be fetched again",
                        self.unit_name(unit)
                    )),
                ));
            }
            ok = self.hash_matches(unit);
        }
        let r = if ok {
            Ok(())
        } else {
            log::error!(
                "{}: tensor {:?}: checksum mismatch (xxh3)",
                self.path.display(),
                self.unit_name(unit)
            );
            Err("checksum mismatch (xxh3)".to_string())
        };
        *checked = Some(r.clone());
        r.map(|()| pin)
            .map_err(|what| self.unit_integrity(unit, what))
    }

    /// True when tensor `unit`'s stored bytes match its xxh3.
    fn hash_matches(&self, unit: u32) -> bool {
        xxh3_64(self.raw_tensor(unit as usize)) == self.tensors()[unit as usize].xxh3
    }

    fn build_prefix(&self, file: usize) -> std::result::Result<Vec<u8>, String> {
        let h = self.header();
        match self.files[file].source {
            Source::Model => Ok(self.model_prefix.clone()),
            Source::Config => Ok(blazex::render_config(&h.model_config)),
            Source::Tokenizer => Ok(h.tokenizer.clone().unwrap_or_default().into_bytes()),
            Source::Sidecar(k) => base64::engine::general_purpose::STANDARD
                .decode(&h.sidecar_files[k].content_b64)
                .map_err(|e| format!("content_b64 does not decode: {e}")),
        }
    }

    /// Checks the SHA-256 of DATA up to the end of the last listed tensor.
    pub fn verify_data_sha256(&self) -> Result<()> {
        let end = self.header().digest_end();
        let start = self.parsed.data_start;
        self.map
            .ensure(start..start + end)
            .map_err(|e| io_error(self, e))?;
        let s = start as usize;
        let mut h = Sha256::new();
        for c in self.map.bytes()[s..s + end as usize].chunks(16 << 20) {
            h.update(c);
        }
        let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        if got != self.header().data_sha256 {
            return Err(self.integrity(format!(
                "data section SHA-256 mismatch (header {:?}, data {got})",
                self.header().data_sha256
            )));
        }
        Ok(())
    }
}

impl ArchiveView for BlazexArchive {
    fn kind(&self) -> Kind {
        Kind::Blazex
    }
    fn path(&self) -> &Path {
        &self.path
    }
    fn stored_len(&self) -> u64 {
        self.map.bytes().len() as u64
    }
    fn checksums(&self) -> Option<&'static str> {
        match self.cover() {
            HeaderCover::Sealed => Some("xxh3"),
            HeaderCover::Uncovered => None,
        }
    }
    fn uncovered(&self) -> Option<&'static str> {
        match self.cover() {
            HeaderCover::Sealed => None,
            HeaderCover::Uncovered => Some(UNCOVERED),
        }
    }
    fn files(&self) -> usize {
        self.files.len()
    }
    fn file_path(&self, file: usize) -> &str {
        &self.files[file].path
    }
    fn logical_len(&self, file: usize) -> u64 {
        self.files[file].len
    }
    fn prefix(&self, file: usize) -> Result<&[u8]> {
        if let Source::Model = self.files[file].source {
            return Ok(&self.model_prefix);
        }
        match self.prefixes[file].get_or_init(|| self.build_prefix(file)) {
            Ok(p) if p.len() as u64 == self.files[file].len => Ok(p),
            Ok(_) => Err(self.integrity(format!(
                "{}: decoded length differs from the header's",
                self.files[file].path
            ))),
            Err(what) => Err(self.integrity(format!("{}: {what}", self.files[file].path))),
        }
    }
    fn prefix_len(&self, file: usize) -> u64 {
        match self.files[file].source {
            Source::Model => self.model_prefix.len() as u64,
            _ => self.files[file].len,
        }
    }
    fn segments(&self, file: usize) -> &[Segment] {
        match self.files[file].source {
            Source::Model => &self.model_segments,
            _ => &[],
        }
    }
    fn units(&self) -> usize {
        self.units.len()
    }
    fn unit_name(&self, unit: u32) -> &str {
        &self.tensors()[unit as usize].name
    }
    fn unit_label(&self, unit: u32) -> String {
        format!("tensor {:?}", self.unit_name(unit))
    }

    fn grid(&self, unit: u32) -> Result<Arc<Grid>> {
        let cell = self.units.get(unit as usize).map(|u| &u.grid);
        shared_grid(self, unit, cell, || {
            let len = self.tensors()[unit as usize].data_len;
            let mut bounds: Vec<u64> = (0..len.div_ceil(BLOCK)).map(|b| b * BLOCK).collect();
            bounds.push(len);
            Ok(Arc::new(Grid::plain(bounds)))
        })
    }

    fn will_need(&self, unit: u32) {
        if (unit as usize) < self.units.len() {
            self.map.will_need(self.tensor_range(unit as usize));
        }
    }

    /// A copy of one block of a tensor, after the whole tensor checked
    /// against its xxh3 (once; over a remote copy, the tensor stays pinned
    /// in the disk cache until the block is copied).
    fn decode_block(&self, key: BlockKey) -> Result<Vec<u8>> {
        let _pin = self.check_tensor(key.unit)?;
        let grid = self.grid(key.unit)?;
        let b = block_index(self, key, &grid)?;
        let span = grid.span(b);
        Ok(self.raw_tensor(key.unit as usize)[span.start as usize..span.end as usize].to_vec())
    }

    /// Checks the tensors `range` of `model.safetensors` overlaps (in
    /// parallel: a whole-file read checks every tensor once).
    fn check_range(&self, file: usize, range: Range<u64>) -> Result<()> {
        use rayon::prelude::*;
        let segs = self.segments(file);
        let lo = segs.partition_point(|s| s.start + s.len <= range.start);
        let hi = segs.partition_point(|s| s.start < range.end);
        if lo >= hi {
            return Ok(());
        }
        segs[lo..hi]
            .par_iter()
            .try_for_each(|s| self.check_tensor(s.unit).map(drop))
    }

    fn verify_structure(&self) -> Result<()> {
        Ok(())
    }

    fn verify_unit(&self, unit: u32, digest: u64) -> Result<()> {
        if digest != self.tensors()[unit as usize].xxh3 {
            return Err(self.unit_integrity(unit, "checksum mismatch (xxh3)".into()));
        }
        Ok(())
    }

    fn verify_finish(&self, _digests: &[u64]) -> Result<String> {
        self.verify_data_sha256()?;
        let raw: u64 = self.tensors().iter().map(|t| t.data_len).sum();
        let covered = match self.cover() {
            HeaderCover::Sealed => format!(
                "every tensor's xxh3, the data SHA-256 and the header digest ({}) verified",
                blazex::DIGEST_KEY
            ),
            HeaderCover::Uncovered => format!(
                "every tensor's xxh3 and the data SHA-256 verified; NOT verified: {UNCOVERED}"
            ),
        };
        Ok(format!(
            "BLAZE-X v1: {} files, {} tensors, {} data bytes in {} stored, {covered}",
            self.files(),
            self.tensors().len(),
            raw,
            self.stored_len()
        ))
    }
}
