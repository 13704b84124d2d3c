//! A delta's base: where it is opened from ([`BaseFs`]), the store of its
//! decoded blocks that deltas over one base share ([`BaseBlocks`]), and
//! the opened base itself ([`Base`]: an archive or a plain `.safetensors`),
//! read in pieces for the blocks built on it.

use super::{DeltaArchive, OVERLAP_MIN};
use crate::{ArchiveError, ArchiveView, BlockKey, Kind, PieceSource, Result};
use ckptfs_codec::xor_delta::xor_into;
use ckptfs_format::safetensors::{header_len, Header};
use ckptfs_store::source::{ByteSource, Sources};
use rayon::prelude::*;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a delta's base is opened from.
pub trait BaseFs: Send + Sync {
    /// Opens `rel` (a recorded base path) relative to the directory of the
    /// archive at `from`; returns the file and the path that names it (in
    /// messages, and as the `from` of its own base).
    fn open_base(&self, from: &Path, rel: &str) -> io::Result<(File, PathBuf)>;
    /// The bytes of an archive file this opened (a base, or the archive
    /// opened with it): a plain map by default, a remote copy's source
    /// when the store is remote (`ckptfs_store::source::Sources`).
    fn map(&self, file: &File) -> io::Result<Box<dyn ByteSource>> {
        ckptfs_store::source::map_file(file)
    }
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

/// The local file system as [`LocalFs`], its files read through a store's
/// [`Sources`] (an `s3://` store's mirror: remote copies).
pub struct LocalSources<'a>(pub &'a dyn Sources);

impl BaseFs for LocalSources<'_> {
    fn open_base(&self, from: &Path, rel: &str) -> io::Result<(File, PathBuf)> {
        LocalFs.open_base(from, rel)
    }
    fn map(&self, file: &File) -> io::Result<Box<dyn ByteSource>> {
        self.0.map(file)
    }
}

/// An opened base: an archive (its decoded blocks maybe shared with other
/// deltas over it: [`BaseBlocks`]), or a plain `.safetensors` file.
pub enum Base {
    Archive(Arc<dyn ArchiveView>, Option<Arc<dyn BaseBlocks>>),
    Plain {
        path: PathBuf,
        map: Box<dyn ByteSource>,
    },
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
    pub(super) fn will_need(&self, range: Range<u64>) {
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
                crate::write_to(&**a, 0, &mut W(f), &|_| {}).map_err(|e| match e {
                    crate::WriteError::Archive(e) => e,
                    crate::WriteError::Write(e) => ArchiveError::Io {
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
    pub(super) fn stream_here(&self, f: &mut dyn FnMut(&[u8])) -> Result<()> {
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
                for key in crate::blocks_of(&**a, 0)? {
                    f(&a.decode_block(key)?);
                }
                Ok(())
            }
        }
    }
    /// The parsed safetensors header of the presented content.
    pub(super) fn header(&self) -> Result<(u64, Header)> {
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
    for p in crate::plan(a, 0, offset..end)? {
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
    let (source, head) = crate::map_with_head(&file, &path, fs)?;
    if Kind::detect(&head).is_some() || crate::unsupported_kind(&head).is_some() {
        let a = crate::from_source_in(source, &head, &path, fs, depth_left)?;
        if a.files() != 1 || !a.file_path(0).is_empty() {
            return Err(a.integrity("a model-directory archive cannot be a delta's base".into()));
        }
        return Ok(Base::Archive(a, fs.base_blocks(&file, &path)));
    }
    Ok(Base::Plain { path, map: source })
}
