//! **ckptfs-archive**: the readers. Depends on `ckptfs-format`,
//! `ckptfs-codec` and `ckptfs-store`; beside the archive kinds it holds
//! [`cache`] (the block cache every reader of a mount shares) and
//! [`z4delta`] (z4ai's own delta files, read for the CLI).
//!
//! Opened archives, whatever their kind, behind one trait.
//!
//! An archive presents one or more *files* (a `.zstn` presents one, the
//! `.safetensors` it reconstructs; a `.blz` presents a whole model
//! directory). Every presented file has the same shape:
//!
//! ```text
//! file = prefix ‖ segment ‖ segment ‖ ...
//! ```
//!
//! - the *prefix* is held in memory (a safetensors header, an embedded
//!   sidecar);
//! - each [`Segment`] is the decoded bytes of one *unit* (a frame, a blob),
//!   and a unit is cut into independently decodable *blocks* by its
//!   [`Grid`]. A block is named by a [`BlockKey`] (unit, block), unique
//!   within the archive, which is what caches store.
//!
//! A kind of archive implements [`ArchiveView`]: its files, their prefixes
//! and segments, its units' grids, and how to decode (and check) one block.
//! Everything else is written once, here, on top of the trait: [`plan`] (a
//! byte range to blocks), [`read_with`] (through any block fetcher, such as
//! the mount's cache), [`write_to`] (streaming unpack), [`verify`].
//! Adding a kind of archive means adding one module and one arm in
//! [`open`].
//!
//! Kinds: [`zstn`] (z4ai's ZSTN container, ckptfs-written or z4ai-written),
//! [`blz`] (ckptfs's model-directory archive), [`blazex`] (the `.blz`
//! the `blazex` tool writes, presented as `blazex export` would) and
//! [`delta`] (ckptfs's `.z4dm` delta against a base archive). Frame blocks shared by
//! both live in [`frame_block`].
//!
//! Every kind reads its bytes through a [`ByteSource`] (`ckptfs-store`): a
//! local map, memory, or a remote object's sparse copy, whose bytes are
//! fetched where a reader asks for them (`ensure_all`, `pin_all`). Each
//! kind says what opening it reads (its `fetch_metadata`), so that a remote
//! archive fetches that first, in few requests; what the caller opens a
//! file as is decided by the [`ckptfs_store::source::Sources`] it passes
//! ([`BaseFs::map`]).

pub mod blazex;
pub mod blz;
pub mod delta;
pub mod frame_block;
pub mod path_index;
mod pipeline;
pub mod sparse_cache;
#[cfg(test)]
#[path = "../../../tests/common/support.rs"]
#[allow(dead_code)] // each crate's tests use some of the helpers
mod test_support;
pub mod zstn;

pub mod cache;
pub mod z4delta;

pub use blazex::BlazexArchive;
pub use blz::BlzArchive;
pub use ckptfs_store::source::{self, ByteSource};
pub use delta::{BaseBlocks, BaseFs, DeltaArchive, LocalFs, LocalSources};
pub use frame_block::Grid;
pub use zstn::ZstnArchive;

use ckptfs_codec::CodecError;
use ckptfs_format::digest::Xxh3;
use ckptfs_format::zstn::ZstnError;
use rayon::prelude::*;
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
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
    #[error("{path}: {source}")]
    Blz {
        path: PathBuf,
        source: ckptfs_format::blz::BlzError,
    },
    #[error("{path}: {source}")]
    Blazex {
        path: PathBuf,
        source: ckptfs_format::blazex::BlazexError,
    },
    #[error("{path}: tensor {tensor:?}: {source}")]
    Frame {
        path: PathBuf,
        tensor: String,
        source: CodecError,
    },
    #[error("{path}: {what}")]
    Integrity { path: PathBuf, what: String },
    /// Not a kind of archive ckptfs reads.
    #[error("{path}: {what}")]
    Unrecognised { path: PathBuf, what: String },
}

/// An archive that could not be opened or read for want of memory: an
/// I/O error (`ENOMEM` kind), so the mount answers EIO and tries again at
/// the next access instead of keeping it as the archive's fault.
pub(crate) fn out_of_memory(path: &Path, what: String) -> ArchiveError {
    ArchiveError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::OutOfMemory, what),
    }
}

impl ArchiveError {
    /// The message without the archive's path (the mount logs and
    /// answers it beside the path it already names).
    /// The same error, rebuilt (an error shared by several readers of one
    /// cached block): an I/O error keeps its kind and message; any other
    /// becomes an integrity error with the same path and message.
    pub fn copied(&self) -> ArchiveError {
        match self {
            ArchiveError::Io { path, source } => ArchiveError::Io {
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            ArchiveError::Container { path, .. }
            | ArchiveError::Blz { path, .. }
            | ArchiveError::Blazex { path, .. }
            | ArchiveError::Frame { path, .. }
            | ArchiveError::Integrity { path, .. }
            | ArchiveError::Unrecognised { path, .. } => ArchiveError::Integrity {
                path: path.clone(),
                what: self.reason(),
            },
        }
    }

    pub fn reason(&self) -> String {
        match self {
            ArchiveError::Io { source, .. } => source.to_string(),
            ArchiveError::Container { source, .. } => source.to_string(),
            ArchiveError::Blz { source, .. } => source.to_string(),
            ArchiveError::Blazex { source, .. } => source.to_string(),
            ArchiveError::Frame { tensor, source, .. } => format!("tensor {tensor:?}: {source}"),
            ArchiveError::Integrity { what, .. } | ArchiveError::Unrecognised { what, .. } => {
                what.clone()
            }
        }
    }
}

pub type Result<T> = std::result::Result<T, ArchiveError>;

/// Identifies one decodable block: a unit and a block within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub unit: u32,
    pub block: u32,
}

/// One unit as part of a presented file: file bytes
/// `[start, start + len)` are the unit's decoded bytes `[0, len)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub start: u64,
    pub len: u64,
    pub unit: u32,
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

/// The kinds of archive ckptfs reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// z4ai's ZSTN container (one file).
    Zstn,
    /// ckptfs's `.blz` model-directory archive.
    Blz,
    /// BLAZE-X's `.blz` (`"BLAZXPK\n"`), written by the `blazex` tool.
    Blazex,
    /// ckptfs's delta: a z4ai `Z4DM` with ckptfs's `CKD1` trailer.
    Delta,
    /// Not a file: the mount's GGUF view of a model
    /// (`ckptfs_pack::export::gguf_view`), never detected from bytes.
    GgufView,
}

impl Kind {
    /// The kind of an archive from its first bytes.
    pub fn detect(head: &[u8]) -> Option<Kind> {
        if head.starts_with(ckptfs_format::blz::MAGIC) {
            Some(Kind::Blz)
        } else if head.starts_with(ckptfs_format::blazex::MAGIC) {
            Some(Kind::Blazex)
        } else if head.starts_with(b"ZSTN") {
            Some(Kind::Zstn)
        } else if head.starts_with(ckptfs_format::delta::Z4DM_MAGIC) {
            Some(Kind::Delta)
        } else {
            None
        }
    }

    /// The value of the mount's `user.ckptfs.format` attribute.
    pub fn format_name(self) -> &'static str {
        match self {
            Kind::Zstn => "zstn-v3",
            Kind::Blz => "ckptfs-blz-v1",
            Kind::Blazex => "blazex-blz-v1",
            Kind::Delta => "ckptfs-delta-v1",
            Kind::GgufView => "gguf-v3-view",
        }
    }
}

/// An opened archive of any kind: the files it presents and how to decode
/// the blocks they are made of. Implementations check every structure at
/// open and every block's integrity in [`ArchiveView::decode_block`].
/// (`Any`: code that needs one kind's own details, as `info` does, gets
/// them by downcasting the opened archive instead of opening it again.)
pub trait ArchiveView: Send + Sync + std::any::Any {
    fn kind(&self) -> Kind;
    /// The archive's path (for messages).
    fn path(&self) -> &Path;
    /// Size of the archive on disk.
    fn stored_len(&self) -> u64;
    /// The checksums that cover every byte served, if any (the value of the
    /// mount's `user.ckptfs.checksums` attribute).
    fn checksums(&self) -> Option<&'static str>;
    /// What the archive's checksums leave uncovered, when that is not
    /// everything served but some of it (a BLAZE-X header without ckptfs's
    /// digest): said by `verify`, `info` and the mount's log.
    fn uncovered(&self) -> Option<&'static str> {
        None
    }
    /// A digest that changes whenever the presented content could: the
    /// archive's own checksum block, for an archive with checksums over
    /// every byte served (a delta records its base's, to recognise it
    /// without decoding it). `None` by default.
    fn fingerprint(&self) -> Option<u64> {
        None
    }
    /// For a delta, its base's recorded path (relative to the archive's
    /// directory).
    fn base_path(&self) -> Option<&str> {
        None
    }
    /// Number of presented files.
    fn files(&self) -> usize;
    /// Relative `/`-separated path of file `file` inside the archive
    /// (empty for a single-file archive, presented under its own name).
    fn file_path(&self, file: usize) -> &str;
    /// Size of presented file `file`.
    fn logical_len(&self, file: usize) -> u64;
    /// The in-memory first bytes of file `file` (checked before it is
    /// returned; a damaged prefix fails only this file).
    fn prefix(&self, file: usize) -> Result<&[u8]>;
    /// Length of the prefix, known without building it.
    fn prefix_len(&self, file: usize) -> u64;
    /// The non-empty segments of file `file`, in file order, contiguous
    /// from the prefix's end to the file's end.
    fn segments(&self, file: usize) -> &[Segment];
    /// Number of units.
    fn units(&self) -> usize;
    /// What a unit holds (a tensor, a file), for messages.
    fn unit_name(&self, unit: u32) -> &str;
    /// The block grid of a unit (built and checked once, then shared).
    fn grid(&self, unit: u32) -> Result<Arc<Grid>>;
    /// Decodes one block, checking its integrity.
    fn decode_block(&self, key: BlockKey) -> Result<Vec<u8>>;
    /// Hints that the blocks of `unit` will be decoded soon (the mount's
    /// prefetch): an archive on a file starts reading the unit's stored
    /// bytes from disk in the background. No effect by default.
    fn will_need(&self, _unit: u32) {}
    /// Checks that must pass before bytes `range` of file `file` are
    /// served (an archive whose index cannot be trusted checks whole
    /// segments against their own digests). Cheap once passed.
    fn check_range(&self, _file: usize, _range: Range<u64>) -> Result<()> {
        Ok(())
    }
    /// True while [`ArchiveView::check_range`] may still have a long
    /// one-time check to run or finish (a delta's check of its base, which
    /// reads the whole base). Blocks decode meanwhile (each is checked
    /// against its own digest; nothing is served before the check passes),
    /// so the mount prefetches a wider window for the check to overlap.
    fn check_pending(&self) -> bool {
        false
    }
    /// Kind-specific checks of `verify` that come before any block is
    /// decoded (structure that names a file or tensor).
    fn verify_structure(&self) -> Result<()>;
    /// Checks unit `unit` once all its blocks decoded; `digest` is the
    /// xxh3-64 of its decoded bytes.
    fn verify_unit(&self, unit: u32, digest: u64) -> Result<()>;
    /// The last checks of `verify` (whole-archive digests, per-file and
    /// per-tensor digests from the unit digests); returns the one-line
    /// summary `verify` prints.
    fn verify_finish(&self, unit_digests: &[u64]) -> Result<String>;

    /// An integrity error naming this archive.
    fn integrity(&self, what: String) -> ArchiveError {
        ArchiveError::Integrity {
            path: self.path().to_path_buf(),
            what,
        }
    }

    /// How messages name unit `unit` (default: its name).
    fn unit_label(&self, unit: u32) -> String {
        self.unit_name(unit).to_string()
    }

    /// An integrity error about unit `unit`.
    fn unit_integrity(&self, unit: u32, what: String) -> ArchiveError {
        self.integrity(format!("{}: {what}", self.unit_label(unit)))
    }

    /// A decoding error in unit `unit`'s frame.
    fn frame_error(&self, unit: u32, source: CodecError) -> ArchiveError {
        ArchiveError::Frame {
            path: self.path().to_path_buf(),
            tensor: self.unit_name(unit).to_string(),
            source,
        }
    }

    /// The index of the file at relative path `path`.
    fn find(&self, path: &str) -> Option<usize> {
        (0..self.files()).find(|&i| self.file_path(i) == path)
    }

    /// Decoded length of a block.
    fn block_len(&self, key: BlockKey) -> Result<u64> {
        let g = self.grid(key.unit)?;
        if key.block as usize >= g.blocks() {
            return Err(self.integrity(format!("no block {} in unit {}", key.block, key.unit)));
        }
        let s = g.span(key.block as usize);
        Ok(s.end - s.start)
    }

    /// Reads without a cache, decoding every covered block.
    fn read_at(&self, file: usize, offset: u64, buf: &mut [u8]) -> Result<usize> {
        read_with(self, file, offset, buf, &mut |k| {
            self.decode_block(k).map(Arc::new)
        })
    }

    /// Decodes a whole unit (all its blocks, in parallel when large).
    fn decode_unit(&self, unit: u32) -> Result<Vec<u8>> {
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

    /// Every directory implied by the file paths (not the root), sorted.
    fn directories(&self) -> Vec<String> {
        let mut dirs: Vec<String> = (0..self.files())
            .flat_map(|i| {
                let p = self.file_path(i);
                p.match_indices('/')
                    .map(|(k, _)| p[..k].to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// True when `path` is a directory of the archive (holds a file).
    fn is_dir(&self, path: &str) -> bool {
        self.directories()
            .binary_search_by(|d| d.as_str().cmp(path))
            .is_ok()
    }

    /// The entries directly in directory `dir` ("" for the root): (name,
    /// is a directory), sorted by name. By default a scan of every path
    /// (an archive of many files keeps an index: `path_index`).
    fn children(&self, dir: &str) -> Vec<(String, bool)> {
        path_index::scan_children((0..self.files()).map(|i| self.file_path(i)), dir)
    }

    /// The sum of the presented files' sizes.
    fn total_logical_len(&self) -> u64 {
        (0..self.files()).map(|i| self.logical_len(i)).sum()
    }
}

/// What a file starting with `head` is, when it is a z4ai container or
/// frame that ckptfs does not read (for a message that names it).
pub fn unsupported_kind(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"Z4AIMF01") {
        Some("a chunked z4ai frame (Z4AIMF01, from z4ai.chunked.compress)")
    } else if head.starts_with(b"ZARA") {
        Some("a z4ai effort=max frame (ZARA, possibly brotli-coded)")
    } else if head.starts_with(b"Z4DL") {
        Some("a z4ai XOR delta frame (Z4DL; only `ckptfs unpack/verify/info --base REF` read it)")
    } else if head.starts_with(b"Z4DM") {
        Some("a z4ai model delta (Z4DM; only `ckptfs unpack/verify/info --base BASE` read it)")
    } else {
        None
    }
}

/// Opens the archive at `path`, of whatever kind its first bytes say.
pub fn open(path: &Path) -> Result<Arc<dyn ArchiveView>> {
    open_with(path, &LocalFs)
}

/// [`open`] through `fs` (which maps the file, and opens a delta's base).
pub fn open_with(path: &Path, fs: &dyn BaseFs) -> Result<Arc<dyn ArchiveView>> {
    let file = std::fs::File::open(path).map_err(|source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    from_file_with(&file, path, fs)
}

/// Opens an archive from an open file (`path` names it in messages).
pub fn from_file(file: &std::fs::File, path: &Path) -> Result<Arc<dyn ArchiveView>> {
    from_file_with(file, path, &LocalFs)
}

/// Opens an archive from an open file; a delta's base is opened through
/// `fs` (the mount keeps it inside its store).
pub fn from_file_with(
    file: &std::fs::File,
    path: &Path,
    fs: &dyn BaseFs,
) -> Result<Arc<dyn ArchiveView>> {
    let (source, head) = map_with_head(file, path, fs)?;
    from_source_in(source, &head, path, fs, ckptfs_format::delta::MAX_CHAIN)
}

/// Maps an open file through `fs` and reads its first bytes (up to 8:
/// what [`Kind::detect`] looks at). Over a source whose bytes are fetched,
/// what opening the archive reads is fetched first ([`fetch_metadata`]).
fn map_with_head(
    file: &std::fs::File,
    path: &Path,
    fs: &dyn BaseFs,
) -> Result<(Box<dyn ByteSource>, Vec<u8>)> {
    let io = |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    };
    let source = fs.map(file).map_err(io)?;
    if source.is_remote() {
        fetch_metadata(&*source).map_err(io)?;
        let bytes = source.bytes();
        let head = bytes[..bytes.len().min(8)].to_vec();
        return Ok((source, head));
    }
    let mut head = [0u8; 8];
    let n = (&*file).read(&mut head).map_err(io)?;
    Ok((source, head[..n].to_vec()))
}

/// Bytes of the head and of the tail of a remote archive fetched first
/// when it is opened ([`fetch_metadata`]).
const OPEN_GUESS: u64 = 64 << 10;

/// Fetches what opening an archive reads, when its bytes must be fetched:
/// a guess first, the head and the tail at once, wide enough to hold a
/// usual archive's header, index, footer and checksum block. Each exact
/// range would otherwise be a request of its own, one after the other, and
/// a request costs a round trip (about 45 ms against s3s-fs, whose
/// responses wait for delayed ACKs), whatever its size. Then each kind
/// fetches the exact ranges it reads ([`zstn::fetch_metadata`],
/// [`blz::fetch_metadata`], [`delta::fetch_metadata`]); an object of no
/// kind ckptfs reads is fetched whole (to say what it is).
fn fetch_metadata(b: &dyn ByteSource) -> std::io::Result<()> {
    let len = b.bytes().len() as u64;
    let guess = OPEN_GUESS.min(len);
    b.ensure_all(&[0..guess, len - guess..len])?;
    b.ensure(0..22)?;
    match Kind::detect(b.bytes()) {
        Some(Kind::Blz) => blz::fetch_metadata(b, ckptfs_format::blz::PRELUDE_LEN),
        Some(Kind::Blazex) => blz::fetch_metadata(b, ckptfs_format::blazex::PRELUDE_LEN),
        Some(Kind::Delta) => delta::fetch_metadata(b),
        Some(Kind::Zstn) => zstn::fetch_metadata(b),
        Some(Kind::GgufView) | None => b.ensure(0..len),
    }
}

/// The little-endian u64 at `at` of `b` (None past its end): offsets read
/// to choose what to fetch, clamped by the caller to the object (the
/// parser checks them as usual once fetched).
pub(crate) fn u64_at(b: &dyn ByteSource, at: u64) -> Option<u64> {
    let s = b.bytes().get(at as usize..at.checked_add(8)? as usize)?;
    Some(u64::from_le_bytes(s.try_into().ok()?))
}

/// Opens an archive held in memory (`name` is used in messages).
pub fn from_bytes(bytes: Vec<u8>, name: &Path) -> Result<Arc<dyn ArchiveView>> {
    let head = bytes[..bytes.len().min(8)].to_vec();
    from_source_in(
        Box::new(bytes),
        &head,
        name,
        &LocalFs,
        ckptfs_format::delta::MAX_CHAIN,
    )
}

/// `depth_left`: how deep a chain of deltas may still go (a delta's base
/// is opened with one less).
fn from_source_in(
    source: Box<dyn ByteSource>,
    head: &[u8],
    path: &Path,
    fs: &dyn BaseFs,
    depth_left: u32,
) -> Result<Arc<dyn ArchiveView>> {
    match Kind::detect(head) {
        Some(Kind::Delta) => Ok(Arc::new(DeltaArchive::from_source(
            source, path, fs, depth_left,
        )?)),
        Some(Kind::Zstn) => Ok(Arc::new(ZstnArchive::from_source(source, path)?)),
        Some(Kind::Blz) => Ok(Arc::new(BlzArchive::from_source(source, path)?)),
        Some(Kind::Blazex) => Ok(Arc::new(BlazexArchive::from_source(source, path)?)),
        None if unsupported_kind(head).is_some() => Err(ArchiveError::Unrecognised {
            path: path.to_path_buf(),
            what: format!(
                "{}: ckptfs does not read this kind of z4ai file (decode it with z4ai)",
                unsupported_kind(head).unwrap_or_default()
            ),
        }),
        Some(Kind::GgufView) | None => Err(ArchiveError::Unrecognised {
            path: path.to_path_buf(),
            what: format!(
                "not a .blz archive (ckptfs's or BLAZE-X's) or ZSTN archive (magic {:?})",
                String::from_utf8_lossy(head)
            ),
        }),
    }
}

/// The mount's `--require-checksums` rule: an archive is served only if
/// checksums cover every byte it serves ([`ArchiveView::checksums`]), so
/// damage is an error, never wrong bytes. A z4ai-written `.zstn` has none
/// until `ckptfs seal` adds them.
pub fn require_checksums<A: ArchiveView + ?Sized>(a: &A) -> Result<()> {
    match (a.checksums(), a.uncovered()) {
        (Some(_), None) => Ok(()),
        (_, Some(what)) => Err(a.integrity(format!(
            "not every byte is covered by a checksum ({what}; or mount without --require-checksums)"
        ))),
        (None, None) => Err(a.integrity(
            "no checksums (z4ai-written): run `ckptfs seal` or mount without --require-checksums"
                .into(),
        )),
    }
}

/// Where the bytes of `range` of file `file` live: a list of (source,
/// range inside the source, offset in the output).
pub fn plan<A: ArchiveView + ?Sized>(a: &A, file: usize, range: Range<u64>) -> Result<Vec<Piece>> {
    let prefix_len = a.prefix_len(file);
    let segments = a.segments(file);
    let end = range.end.min(a.logical_len(file));
    let mut pieces = Vec::new();
    let mut pos = range.start;
    if pos < prefix_len && pos < end {
        let hi = end.min(prefix_len);
        pieces.push(Piece {
            source: PieceSource::Prefix,
            within: pos..hi,
            out_offset: 0,
        });
        pos = hi;
    }
    while pos < end {
        let k = segments.partition_point(|s| s.start <= pos);
        let seg = k
            .checked_sub(1)
            .map(|k| &segments[k])
            .filter(|s| pos - s.start < s.len)
            .ok_or_else(|| a.integrity(format!("{}: no data at {pos}", display_name(a, file))))?;
        let in_unit = pos - seg.start;
        let grid = a.grid(seg.unit)?;
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

fn display_name<A: ArchiveView + ?Sized>(a: &A, file: usize) -> String {
    match a.file_path(file) {
        "" => "data".to_string(),
        p => p.to_string(),
    }
}

/// Reads bytes `[offset, offset + buf.len())` of file `file` (clamped to
/// the file), fetching blocks through `fetch` (a cache, or plain
/// decoding). Errors of the fetcher come back as they are.
pub fn read_with<A, E>(
    a: &A,
    file: usize,
    offset: u64,
    buf: &mut [u8],
    fetch: &mut dyn FnMut(BlockKey) -> std::result::Result<Arc<Vec<u8>>, E>,
) -> std::result::Result<usize, E>
where
    A: ArchiveView + ?Sized,
    E: From<ArchiveError>,
{
    let len = a.logical_len(file);
    if offset >= len {
        return Ok(0);
    }
    let n = (buf.len() as u64).min(len - offset) as usize;
    a.check_range(file, offset..offset + n as u64)?;
    for p in plan(a, file, offset..offset + n as u64)? {
        let dst = &mut buf[p.out_offset as usize
            ..p.out_offset as usize + (p.within.end - p.within.start) as usize];
        let within = p.within.start as usize..p.within.end as usize;
        match p.source {
            PieceSource::Prefix => dst.copy_from_slice(&a.prefix(file)?[within]),
            PieceSource::Block(key) => dst.copy_from_slice(&fetch(key)?[within]),
        }
    }
    Ok(n)
}

/// Every block of file `file`, in file order (a unit used twice appears
/// twice).
pub fn blocks_of<A: ArchiveView + ?Sized>(a: &A, file: usize) -> Result<Vec<BlockKey>> {
    let mut keys = Vec::new();
    for s in a.segments(file) {
        let g = a.grid(s.unit)?;
        keys.extend((0..g.blocks() as u32).map(|block| BlockKey {
            unit: s.unit,
            block,
        }));
    }
    Ok(keys)
}

/// Decoded bytes a streaming operation keeps in flight ahead of its sink:
/// enough to keep every core decoding, few enough that the block buffers
/// are reused rather than faulted in fresh.
const AHEAD: u64 = 8 << 20;

/// Why streaming a file out failed: reading the archive, or writing.
#[derive(Debug, Error)]
pub enum WriteError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error(transparent)]
    Write(#[from] std::io::Error),
}

/// Streams file `file` into `w`: blocks decoded in parallel windows of
/// bounded size, written in order; `progress` gets each written length.
pub fn write_to<A: ArchiveView + ?Sized>(
    a: &A,
    file: usize,
    w: &mut dyn Write,
    progress: &dyn Fn(u64),
) -> std::result::Result<(), WriteError> {
    a.check_range(file, 0..a.logical_len(file))?;
    let prefix = a.prefix(file)?;
    w.write_all(prefix)?;
    progress(prefix.len() as u64);
    pipeline::each_decoded(a, &blocks_of(a, file)?, AHEAD, &mut |d| {
        w.write_all(d)?;
        progress(d.len() as u64);
        Ok(())
    })
}

/// Decodes a bare frame (a `.z4ai` file as the z4ai CLI writes it) into
/// `w`, one block of its grid at a time, so that memory stays bounded as
/// for archives (a frame that is one block is bounded by
/// `format::frame::MAX_BLOCK_BYTES`). `path` names it in errors. Returns
/// the decoded length.
pub fn write_frame(
    bytes: &[u8],
    path: &Path,
    w: &mut dyn Write,
) -> std::result::Result<u64, WriteError> {
    let codec = |e: CodecError| ArchiveError::Integrity {
        path: path.to_path_buf(),
        what: e.to_string(),
    };
    let len = ckptfs_format::frame::Frame::parse(bytes)
        .map_err(codec)?
        .decoded_len();
    let (grid, _meta) = frame_block::frame_grid(bytes, len).map_err(codec)?;
    for b in 0..grid.blocks() {
        let block = frame_block::decode_frame_block(bytes, &grid, b).map_err(codec)?;
        w.write_all(&block)?;
    }
    Ok(len)
}

/// xxh3-64 of a whole unit, decoding its blocks in parallel windows.
fn unit_digest<A: ArchiveView + ?Sized>(
    a: &A,
    unit: u32,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64> {
    let g = a.grid(unit)?;
    let keys: Vec<BlockKey> = (0..g.blocks() as u32)
        .map(|block| BlockKey { unit, block })
        .collect();
    let mut h = Xxh3::new();
    pipeline::each_decoded(a, &keys, AHEAD, &mut |d| {
        h.update(d);
        progress(d.len() as u64);
        Ok::<(), ArchiveError>(())
    })?;
    Ok(h.digest())
}

/// Checks everything: the kind's structure, every file's prefix, every
/// block of every unit (with its checksums), each unit, then the kind's
/// whole-archive checks. The checks that name a file or tensor come
/// first, so a failure says what is damaged. Returns the one-line summary.
pub fn verify<A: ArchiveView + ?Sized>(a: &A, progress: &(dyn Fn(u64) + Sync)) -> Result<String> {
    a.verify_structure()?;
    for i in 0..a.files() {
        a.prefix(i)?;
    }
    let digests: Vec<u64> = (0..a.units() as u32)
        .into_par_iter()
        .map(|u| {
            let d = unit_digest(a, u, progress)?;
            a.verify_unit(u, d)?;
            Ok(d)
        })
        .collect::<Result<_>>()?;
    a.verify_finish(&digests)
}

#[cfg(test)]
mod tests;
