//! The parsed archive of each backing version ([`Slot`]).
//!
//! An archive inode keeps the `Slot` of the backing version it last saw
//! (`InodeState::archive`, or `InodeState::blz` for a `.blz`). A version is
//! the backing file's size and change times; when they differ from the
//! slot's, the file changed in place and is parsed again. Each parse gets a
//! process-wide generation, the first half of every block-cache key, so a
//! block decoded from one version is never served for another. Attributes
//! come from the parsed index alone; nothing is decoded here.
//!
//! An archive that cannot be parsed is kept as its reason (logged once per
//! version): it is still listed, with its stored size, and opening it fails
//! with EIO.

use super::inode::{Inode, InodeState};
use super::resolve::not_found_is;
use super::{CheckpointFs, FsError, Result};
use crate::Identity;
use ckptfs_archive::{self as archive, ArchiveView};
use ckptfs_store::source::Sources;
use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A backing file version: size and change times (with the inode's
/// identity, this tells whether the file was modified in place).
type Version = (u64, i64, i64, i64, i64);

pub(super) fn version_of(m: &Metadata) -> Version {
    (
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

/// The parsed archive of one backing version, or why it cannot be parsed.
#[derive(Clone)]
pub struct Slot {
    pub(super) version: Version,
    /// Unique per process: the cache key of this version's blocks.
    pub(super) generation: u64,
    pub(super) archive: std::result::Result<Arc<dyn ArchiveView>, Arc<String>>,
    /// For an archive that cannot be opened: the size it presents when
    /// that is known without it (a delta whose base is missing), else
    /// None (listed with its stored size).
    pub(super) presented_len: Option<u64>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("generation", &self.generation)
            .finish()
    }
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Where the mount opens a delta's base: the recorded path, relative to
/// the delta's directory, resolved lexically inside STORE (a `..` above
/// its root is refused) and opened beneath STORE's root like every other
/// access (no symlink followed).
pub(super) struct StoreBases<'a> {
    pub(super) store: &'a super::beneath::Beneath,
    /// What the store's files are read as (local maps, or an `s3://`
    /// store's remote copies).
    pub(super) sources: &'a dyn Sources,
}

impl archive::BaseFs for StoreBases<'_> {
    fn open_base(&self, from: &Path, rel: &str) -> std::io::Result<(File, PathBuf)> {
        use std::path::Component;
        let from = from.strip_prefix(self.store.path()).unwrap_or(from);
        let mut norm = PathBuf::new();
        for c in from
            .parent()
            .unwrap_or(Path::new(""))
            .join(rel)
            .components()
        {
            match c {
                Component::Normal(n) => norm.push(n),
                Component::CurDir => {}
                Component::ParentDir if norm.pop() => {}
                // EACCES: the path names a file outside the store.
                _ => return Err(std::io::Error::from_raw_os_error(libc::EACCES)),
            }
        }
        let file = self.store.open_file(&norm, libc::O_RDONLY, 0)?;
        Ok((file, self.store.path().join(norm)))
    }

    fn map(&self, file: &File) -> std::io::Result<Box<dyn ckptfs_store::source::ByteSource>> {
        self.sources.map(file)
    }
}

/// [`StoreBases`] that also keeps each base archive's decoded blocks in
/// the mount's block cache ([`archive::BaseBlocks`]), under a generation
/// of the base file's identity and version: every delta over the same
/// base version, opened now or later, finds the blocks another decoded.
/// A base replaced or modified in place has another identity or version,
/// so another generation: its old blocks are never served for it.
pub(super) struct MountBases<'a> {
    pub(super) bases: StoreBases<'a>,
    pub(super) fs: &'a CheckpointFs,
}

impl archive::BaseFs for MountBases<'_> {
    fn open_base(&self, from: &Path, rel: &str) -> std::io::Result<(File, PathBuf)> {
        self.bases.open_base(from, rel)
    }

    fn map(&self, file: &File) -> std::io::Result<Box<dyn ckptfs_store::source::ByteSource>> {
        self.bases.map(file)
    }

    fn base_blocks(&self, file: &File, path: &Path) -> Option<Arc<dyn archive::BaseBlocks>> {
        let m = file.metadata().ok()?;
        let id = (m.dev(), m.ino(), version_of(&m));
        let generation = *self
            .fs
            .base_generations
            .lock()
            .get_or_insert(id, next_generation);
        Some(Arc::new(CachedBaseBlocks {
            cache: self.fs.cache.clone(),
            stats: self.fs.stats.clone(),
            generation,
            path: path.to_path_buf(),
        }))
    }
}

/// Base versions whose generation is remembered (the least recently
/// opened is forgotten: a delta opened over it later decodes its base
/// again, under a new generation).
pub(super) const BASE_GENERATIONS: usize = 4096;

/// A base file's (device, inode, version).
pub(super) type BaseVersion = (u64, u64, Version);

/// One base version's blocks in the mount's block cache.
struct CachedBaseBlocks {
    cache: Arc<ckptfs_archive::cache::BlockCache<archive::ArchiveError>>,
    stats: Arc<super::stats::ReadStats>,
    generation: u64,
    /// The base file, in messages.
    path: PathBuf,
}

impl archive::BaseBlocks for CachedBaseBlocks {
    fn get(
        &self,
        block: archive::BlockKey,
        decode: &mut dyn FnMut() -> archive::Result<Vec<u8>>,
    ) -> archive::Result<Arc<Vec<u8>>> {
        let key = ckptfs_archive::cache::CacheKey {
            generation: self.generation,
            block,
        };
        // Never waits for another thread's decode of the block: this runs
        // inside a delta block's decode, maybe on a rayon worker.
        self.cache
            .get_or_load_nowait(key, || {
                let t = std::time::Instant::now();
                let b = decode();
                if let Ok(b) = &b {
                    self.stats.decoded(&key, b.len(), t.elapsed());
                }
                b
            })
            .map_err(|e| match e {
                ckptfs_archive::cache::FetchError::Load(e) => {
                    Arc::try_unwrap(e).unwrap_or_else(|e| e.copied())
                }
                ckptfs_archive::cache::FetchError::Panicked => archive::ArchiveError::Integrity {
                    path: self.path.clone(),
                    what: format!("the decoder of block {block:?} panicked"),
                },
            })
    }
}

/// A new process-wide cache generation.
pub(super) fn next_generation() -> u64 {
    GENERATION.fetch_add(1, Ordering::Relaxed)
}

impl CheckpointFs {
    /// The parsed archive for the backing version `meta` describes,
    /// parsing it if this version has not been seen yet.
    pub(super) fn archive_slot(&self, inode: &Inode, meta: &Metadata) -> Result<Slot> {
        let version = version_of(meta);
        let seen = |st: &InodeState| {
            st.archive
                .as_ref()
                .filter(|s| s.version == version)
                .cloned()
        };
        if let Some(s) = seen(&inode.state()) {
            return Ok(s);
        }
        // The path walk takes the inode table and `loc`s, which must not be
        // taken under `state` (see the lock order in `fs`).
        let rel = self.rel(inode)?;
        let path = self.store().join(&rel);
        let identity = inode.identity();
        crate::hooks::delay("archive-parse");
        let mut st = inode.state();
        // Parsed by another thread meanwhile: one parse per version.
        if let Some(s) = seen(&st) {
            return Ok(s);
        }
        let (slot, _) = self.parse_backing(&rel, &path, identity, false)?;
        st.archive = Some(slot.clone());
        Ok(slot)
    }

    /// Opens the backing file `rel` (which must still be `identity`) and
    /// parses the version it holds: the one open-and-parse path of every
    /// archive inode, presented as a file or (`directory`) a directory.
    pub(super) fn parse_backing(
        &self,
        rel: &Path,
        path: &Path,
        identity: Identity,
        directory: bool,
    ) -> Result<(Slot, Metadata)> {
        let file = self
            .store
            .open_file(rel, libc::O_RDONLY, 0)
            .map_err(not_found_is)?;
        let fm = file.metadata()?;
        if (fm.dev(), fm.ino()) != identity {
            return Err(FsError::Stale);
        }
        let bases = MountBases {
            bases: StoreBases {
                store: &self.store,
                sources: &*self.sources,
            },
            fs: self,
        };
        let slot = parse_version(&file, &fm, path, directory, self.require_checksums, &bases)?;
        Ok((slot, fm))
    }
}

/// Parses one backing version of an archive (whatever its kind, by its
/// magic). `directory`: presented as a directory of files (`X.blz`), else
/// as one file; an archive of the other shape is refused. An archive that
/// cannot be parsed is logged once per version and kept as the reason;
/// one that could not be read (an I/O error, such as a remote archive's
/// server out of reach) is logged and answered EIO, not kept: the next
/// access tries again.
pub(super) fn parse_version(
    file: &File,
    meta: &Metadata,
    path: &Path,
    directory: bool,
    require_checksums: bool,
    bases: &dyn archive::BaseFs,
) -> Result<Slot> {
    let shown = if directory {
        "listed as a directory"
    } else {
        "listed with its stored size"
    };
    let archive = archive::from_file_with(file, path, bases).and_then(|a| {
        let single = a.files() == 1 && a.file_path(0).is_empty();
        match (directory, single) {
            (true, true) => {
                Err(a.integrity("a single-file archive named as a model directory".into()))
            }
            (false, false) => {
                Err(a.integrity("a model-directory archive named as a single file".into()))
            }
            _ => Ok(a),
        }
    });
    let archive = archive.and_then(|a| {
        if require_checksums {
            archive::require_checksums(&*a)?;
        } else if let Some(what) = a.uncovered() {
            log::warn!("{}: served, but {what}", path.display());
        }
        Ok(a)
    });
    if let Err(e @ archive::ArchiveError::Io { .. }) = &archive {
        log::warn!("{e} (answered EIO; tried again at the next access)");
        return Err(FsError::Io(std::io::Error::from_raw_os_error(libc::EIO)));
    }
    let presented_len = match &archive {
        Err(_) if !directory => archive::delta::presented_len_of_head(file),
        _ => None,
    };
    Ok(Slot {
        version: version_of(meta),
        generation: next_generation(),
        presented_len,
        archive: archive.map_err(|e| {
            log::warn!("{e} ({shown}; opening it fails with EIO)");
            Arc::new(e.reason())
        }),
    })
}
