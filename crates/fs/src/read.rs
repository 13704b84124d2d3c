//! Opening for reading and the read path.
//!
//! An archive (a `.zstn`, or a file inside a `.blz`) is opened as an archive
//! handle over the version current at `open`; `keep_cache` tells the kernel
//! to keep its page cache when the previous open served the same version.
//! Its reads go through the shared [`BlockCache`](ckptfs_archive::cache::BlockCache),
//! keyed by (generation, block), so concurrent readers decode each block
//! once; a block that fails to decode answers EIO for the reads that need
//! it, only. Each handle detects sequential reads ([`super::prefetch`]
//! decides the window) and the blocks ahead are decoded in parallel on the
//! rayon pool. No lock is held while decoding. An archive whose first data
//! read runs a long one-time check (`ArchiveView::check_pending`: a delta
//! reading its whole base) gets one window of `policy.max` prefetched
//! before that check, so the check overlaps with decoding.
//!
//! A plain or staged file is opened as a plain handle: the adapter may pass
//! it through to the kernel, else its reads are `pread`s here. Opening for
//! writing (or with `O_TRUNC`) goes to the write path.

use super::handles::{ArchiveHandle, Handle, PlainHandle, Served};
use super::inode::NodeKind;
use super::prefetch::Sequential;
use super::resolve::not_found_is;
use super::{CheckpointFs, FsError, Opened, Result};
use ckptfs_archive::cache::{CacheKey, FetchError};
use ckptfs_archive::{self as archive, BlockKey, PieceSource};
use parking_lot::Mutex;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;

/// The first tensor start (segment start) inside `range` of file `file`.
fn unit_start_in(a: &dyn archive::ArchiveView, file: usize, range: Range<u64>) -> Option<u64> {
    let segs = a.segments(file);
    let k = segs.partition_point(|s| s.start < range.start);
    segs.get(k).map(|s| s.start).filter(|&s| s < range.end)
}

/// The bytes of one read: owned, a range of a decoded block shared with
/// the cache (no copy), or the ranges of several blocks (and of the
/// prefix) in file order, which the adapter sends after the reply header
/// in one `writev`, also without a copy. A 1 MiB kernel request nearly
/// always spans two blocks (blocks follow tensor elements, requests follow
/// file offsets); assembling those into one buffer was 5% of the daemon's
/// CPU in a cold load.
pub enum ReadData {
    Owned(Vec<u8>),
    Shared(Arc<Vec<u8>>, Range<usize>),
    Pieces(Vec<Piece>),
}

/// One piece of a [`ReadData::Pieces`] reply.
pub enum Piece {
    /// A range of a decoded block (shared with the cache).
    Block(Arc<Vec<u8>>, Range<usize>),
    /// A range of an archive's prefix (the header), copied: it is small.
    Owned(Vec<u8>),
}

impl Piece {
    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Block(b, r) => &b[r.clone()],
            Piece::Owned(v) => v,
        }
    }
}

impl ReadData {
    /// The bytes in one vector (a copy unless owned already).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            ReadData::Owned(v) => v,
            ReadData::Shared(b, r) => b[r].to_vec(),
            ReadData::Pieces(p) => p.iter().flat_map(Piece::bytes).copied().collect(),
        }
    }

    /// The bytes as slices, in order, for one vectored write.
    pub fn slices(&self) -> Vec<&[u8]> {
        match self {
            ReadData::Owned(v) => vec![v],
            ReadData::Shared(b, r) => vec![&b[r.clone()]],
            ReadData::Pieces(p) => p.iter().map(Piece::bytes).collect(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            ReadData::Owned(v) => v.len(),
            ReadData::Shared(_, r) => r.len(),
            ReadData::Pieces(p) => p.iter().map(|p| p.bytes().len()).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl CheckpointFs {
    /// Opens a file. `flags` are the open(2) flags; opening for writing
    /// (or with `O_TRUNC`) goes to the write path (`open_write`).
    pub fn open(&self, ino: u64, flags: i32) -> Result<Opened> {
        let r = match self.open_once(ino, flags) {
            // Committed (compressed or put back) between resolving the
            // inode and opening its spool file, staged meanwhile, or
            // renamed over by a rename that has not yet kept the replaced
            // file: wait for the change to finish (it holds `ns`) and open
            // what it left.
            Err(FsError::NotFound | FsError::Stale) => {
                drop(self.ns.lock());
                self.open_once(ino, flags)
            }
            r => r,
        };
        match r {
            // The inode's backing is gone: the name was renamed over or
            // removed after the kernel looked it up. ESTALE makes the
            // kernel look the name up again and open what it shows now
            // (ENOENT if nothing), so an open racing a rename-over finds
            // the old or the new file, never nothing.
            Err(FsError::NotFound) => Err(FsError::Stale),
            r => r,
        }
    }

    fn open_once(&self, ino: u64, flags: i32) -> Result<Opened> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return self.open_write(ino, flags);
        }
        let inode = self.inode(ino)?;
        let path = self.full(&inode)?;
        match inode.kind() {
            NodeKind::Directory | NodeKind::Blz | NodeKind::BlzDir { .. } => {
                Err(FsError::IsADirectory)
            }
            NodeKind::BlzFile { .. } => {
                let (root, inner) = self.blz_root(&inode)?;
                let (archive, generation, _) = self.blz_archive(&root)?;
                let index = archive.find(&inner).ok_or(FsError::Stale)?;
                let keep_cache = {
                    let mut st = inode.state();
                    let keep = st.last_open_generation == Some(generation);
                    st.last_open_generation = Some(generation);
                    keep
                };
                let fh = self.insert_handle(Handle::Archive(ArchiveHandle {
                    ino,
                    archive: Served {
                        archive,
                        file: index,
                    },
                    generation,
                    seq: Mutex::new(Sequential::default()),
                }));
                Ok(Opened::Archive { fh, keep_cache })
            }
            NodeKind::GgufView => {
                let (archive, generation) = self.gguf_view_of(&inode)?;
                let keep_cache = {
                    let mut st = inode.state();
                    let keep = st.last_open_generation == Some(generation);
                    st.last_open_generation = Some(generation);
                    keep
                };
                let fh = self.insert_handle(Handle::Archive(ArchiveHandle {
                    ino,
                    archive: Served { archive, file: 0 },
                    generation,
                    seq: Mutex::new(Sequential::default()),
                }));
                Ok(Opened::Archive { fh, keep_cache })
            }
            kind @ (NodeKind::Plain | NodeKind::Staged { .. }) => {
                let current = self
                    .store
                    .open_file(&self.rel(&inode)?, libc::O_RDONLY, 0)
                    .map_err(not_found_is)
                    .and_then(|f| {
                        let m = f.metadata()?;
                        match (m.dev(), m.ino()) == inode.identity() {
                            true => Ok(f),
                            false => Err(FsError::Stale),
                        }
                    });
                let file = match current {
                    Ok(f) => f,
                    // Renamed over since the kernel looked the name up:
                    // the file the rename replaced, if it was kept.
                    Err(e @ (FsError::NotFound | FsError::Stale)) => {
                        let kept = inode.state().replaced.clone();
                        match kept.map(|f| f.try_clone()) {
                            Some(Ok(f)) => f,
                            _ => return Err(e),
                        }
                    }
                    Err(e) => return Err(e),
                };
                // A plain object of an S3 store: a small one is fetched
                // whole before it is served, and kept in the disk cache
                // while the handle lives; a large one is fetched by the
                // reads (the failure is logged with the object's name).
                let remote = self
                    .sources
                    .open_plain(&file, false)
                    .map_err(|_| FsError::Io(std::io::Error::from_raw_os_error(libc::EIO)))?;
                let whole = remote.as_ref().is_none_or(|(_, complete)| *complete);
                let remote = remote.map(|(u, _)| u);
                // A staged file becomes an archive (served through the page
                // cache) when it is compressed, under the same inode; the
                // kernel refuses (EIO) an open whose io mode differs from
                // opens still in flight on that inode, so a staged file is
                // read through the page cache, unless a writer's
                // passthrough handle may still be open in the kernel (see
                // `has_passthrough_opens`). Such a reader is put in the
                // handle table under `ns`: a commit looks for open handles
                // under `ns` before the file becomes an archive, so it sees
                // this one, or it is done and the open starts again. The
                // choice and the insertion are made under `open_mode`, so
                // that two opens of the inode never choose differently.
                let staged = matches!(kind, NodeKind::Staged { .. });
                if staged {
                    crate::hooks::delay("open-staged");
                }
                let mut ns = None;
                loop {
                    let mode = self.open_mode(ino);
                    // Staged or committed since `file` was opened: open
                    // again, as what the inode is now.
                    if inode.kind() != kind {
                        return Err(FsError::Stale);
                    }
                    let writer_in_flight = self.has_passthrough_opens(ino);
                    if staged && whole && writer_in_flight && ns.is_none() {
                        // `ns` comes before `open_mode`: choose again under both.
                        drop(mode);
                        ns = Some(self.ns.lock());
                        continue;
                    }
                    let passthrough = whole && (!staged || writer_in_flight);
                    return Ok(self.plain_handle_of(
                        &mode,
                        ino,
                        file,
                        None,
                        passthrough,
                        flags,
                        remote,
                    ));
                }
            }
            NodeKind::Archive => {
                let current = match self.store.lstat(&self.rel(&inode)?).map_err(not_found_is) {
                    Ok(m) if (m.dev(), m.ino()) == inode.identity() => {
                        self.archive_slot(&inode, &m)
                    }
                    Ok(_) => Err(FsError::Stale),
                    Err(e) => Err(e),
                };
                let slot = match current {
                    Ok(s) => s,
                    // Renamed over or removed since the kernel looked the
                    // name up: the version this inode showed is still
                    // mapped (ckptfs replaces archives by rename, never in
                    // place), so serve it. The open raced the rename, and
                    // the old file is one of the two rename(2) allows;
                    // answering ESTALE instead sends the kernel to look
                    // again, and a second rename during that retry used to
                    // surface as an error. So too when it was replaced
                    // between the `lstat` and the parse of a version not
                    // seen yet.
                    Err(FsError::Stale | FsError::NotFound) => {
                        match inode.state().archive.clone() {
                            Some(s) if s.archive.is_ok() => s,
                            _ => return Err(FsError::Stale),
                        }
                    }
                    Err(e) => return Err(e),
                };
                let archive = match slot.archive {
                    Ok(a) => a,
                    Err(reason) => {
                        let e = FsError::BadArchive { path, reason };
                        log::error!("{e}");
                        return Err(e);
                    }
                };
                let keep_cache = {
                    let mut st = inode.state();
                    let keep = st.last_open_generation == Some(slot.generation);
                    st.last_open_generation = Some(slot.generation);
                    keep
                };
                // Under `open_mode`, and only if it is still an archive: a
                // writer staging this inode chooses its io mode from the
                // handles here once it is staged.
                let _mode = self.open_mode(ino);
                if inode.kind() != NodeKind::Archive {
                    return Err(FsError::Stale);
                }
                let fh = self.insert_handle(Handle::Archive(ArchiveHandle {
                    ino,
                    archive: Served { archive, file: 0 },
                    generation: slot.generation,
                    seq: Mutex::new(Sequential::default()),
                }));
                Ok(Opened::Archive { fh, keep_cache })
            }
        }
    }

    /// Reads up to `size` bytes at `offset` (short only at end of file).
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.read_data(fh, offset, size).map(ReadData::into_vec)
    }

    /// [`Self::read`] without copying when the range lies in one decoded
    /// block: the reply is then a slice of the cached block itself.
    pub fn read_data(&self, fh: u64, offset: u64, size: u32) -> Result<ReadData> {
        self.stats.read(size);
        log::trace!("read fh {fh} at {offset}+{size}");
        let h = self.handle(fh)?;
        match &*h {
            Handle::Plain(PlainHandle { file, remote, .. }) => {
                // A large object of an S3 store is fetched as it is read.
                let _pin = match remote {
                    Some(r) if !r.is_complete() => Some(
                        r.pin_for_read(offset..offset.saturating_add(size as u64))
                            .map_err(|_| FsError::Io(io::Error::from_raw_os_error(libc::EIO)))?,
                    ),
                    _ => None,
                };
                let mut buf = vec![0u8; size as usize];
                let mut n = 0;
                while n < buf.len() {
                    match file.read_at(&mut buf[n..], offset + n as u64) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(FsError::Io(e)),
                    }
                }
                buf.truncate(n);
                Ok(ReadData::Owned(buf))
            }
            Handle::Archive(a) => self.read_archive(a, offset, size),
            Handle::Dir(_) => Err(FsError::IsADirectory),
        }
    }

    fn read_archive(&self, h: &ArchiveHandle, offset: u64, size: u32) -> Result<ReadData> {
        let Served { archive, file } = &h.archive;
        let len = archive.logical_len(*file);
        if offset >= len {
            return Ok(ReadData::Owned(Vec::new()));
        }
        let n = (size as u64).min(len - offset);
        let ahead = {
            let mut seq = h.seq.lock();
            let unit_start = |seq: &mut Sequential| {
                unit_start_in(&**archive, *file, offset..offset + n)
                    .and_then(|start| seq.start_unit(offset + n, start, len, &self.policy))
            };
            if seq.fills_hole(offset, n, &self.policy) {
                unit_start(&mut seq)
            } else {
                match seq.on_read(offset, n, len, &self.policy) {
                    None if seq.window() == 0 => unit_start(&mut seq),
                    r => r,
                }
            }
        };
        if let Some(range) = ahead {
            self.prefetch(h, range);
        }
        if offset + n > archive.prefix_len(*file) && archive.check_pending() {
            // The check below may take a while (a delta reads its whole
            // base once, at its first read past the header): decode the
            // next window meanwhile, once per archive, random reads too.
            self.prefetch(h, offset..len.min(offset + self.policy.max));
        }
        // A block's bytes handed to a read are counted, so that a block read
        // whole (now in the kernel's page cache) is evicted first.
        let fetch = |k: BlockKey, within: &Range<u64>| -> Result<Arc<Vec<u8>>> {
            let key = CacheKey {
                generation: h.generation,
                block: k,
            };
            let b = self
                .cache
                .get_or_load(key, || {
                    let t = std::time::Instant::now();
                    let b = archive.decode_block(k);
                    if let Ok(b) = &b {
                        self.stats.decoded(&key, b.len(), t.elapsed());
                    }
                    b
                })
                .map_err(|e| match e {
                    FetchError::Load(e) => FsError::Decode(e),
                    FetchError::Panicked => FsError::DecodePanicked,
                })?;
            self.cache.served(&key, within.end - within.start);
            Ok(b)
        };
        let range = offset..offset + n;
        let result = archive
            .check_range(*file, range.clone())
            .and_then(|()| archive::plan(&**archive, *file, range))
            .map_err(FsError::from)
            .and_then(|pieces| match pieces.as_slice() {
                // The common case: the read lies inside one block.
                [p] => match p.source {
                    PieceSource::Block(k) => Ok(ReadData::Shared(
                        fetch(k, &p.within)?,
                        p.within.start as usize..p.within.end as usize,
                    )),
                    PieceSource::Prefix => Ok(ReadData::Owned(
                        archive.prefix(*file)?[p.within.start as usize..p.within.end as usize]
                            .to_vec(),
                    )),
                },
                pieces => pieces
                    .iter()
                    .map(|p| {
                        let within = p.within.start as usize..p.within.end as usize;
                        Ok(match p.source {
                            PieceSource::Prefix => {
                                Piece::Owned(archive.prefix(*file)?[within].to_vec())
                            }
                            PieceSource::Block(k) => Piece::Block(fetch(k, &p.within)?, within),
                        })
                    })
                    .collect::<Result<Vec<_>>>()
                    .map(ReadData::Pieces),
            });
        if let Err(err) = &result {
            log::error!("read at {offset}+{n}: {err}");
        }
        result
    }

    /// Decodes the blocks of `range` into the cache on the rayon pool.
    fn prefetch(&self, h: &ArchiveHandle, range: std::ops::Range<u64>) {
        let pieces = match archive::plan(&*h.archive.archive, h.archive.file, range) {
            Ok(p) => p,
            Err(e) => {
                log::debug!("prefetch plan: {e}");
                return;
            }
        };
        let mut last: Option<BlockKey> = None;
        for p in pieces {
            let PieceSource::Block(k) = p.source else {
                continue;
            };
            if last == Some(k) {
                continue;
            }
            if last.is_none_or(|l| l.unit != k.unit) {
                // Start reading the unit's stored bytes now, so that the
                // decodes below do not wait for the disk page by page.
                h.archive.archive.will_need(k.unit);
            }
            last = Some(k);
            let key = CacheKey {
                generation: h.generation,
                block: k,
            };
            if self.cache.contains_or_loading(&key) {
                continue;
            }
            let cache = self.cache.clone();
            let stats = self.stats.clone();
            let archive = h.archive.archive.clone();
            rayon::spawn(move || {
                // A reader may wait for this decode: it ends by the read
                // timeout of an `s3://` store too.
                let _deadline = ckptfs_store::deadline::Scope::begin();
                if let Some(Err(FetchError::Load(e))) = cache.load_if_absent(key, || {
                    let t = std::time::Instant::now();
                    let b = archive.decode_block(k);
                    if let Ok(b) = &b {
                        stats.decoded(&key, b.len(), t.elapsed());
                    }
                    b
                }) {
                    log::debug!("prefetch: {e}");
                }
            });
        }
    }
}
