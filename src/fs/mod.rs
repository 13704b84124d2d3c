//! `CheckpointFs`: the filesystem logic of `ckptfs mount`, with no FUSE in
//! it. `crate::fuse` is a thin adapter that converts fuser types and calls
//! these methods; tests drive them directly, without a mount.
//!
//! What it owns:
//! - the namespace ([`namespace`]): `X.zstn` / `X.safetensors.zstn` shown
//!   as `X.safetensors`, everything else passed through;
//! - the inode table ([`inode`]): stable numbers per (path, backing file);
//! - attributes: archives report the logical size from the index (parsed
//!   once per backing version, nothing decoded) and the backing file's
//!   `st_blocks`, owner, mode and times;
//! - open handles: an archive handle holds the `Arc<Archive>` of the
//!   version it opened (its mmap keeps that version alive after a
//!   rename-replace in STORE); a plain handle holds the backing `File`;
//! - the read path: archive reads go through the shared [`BlockCache`],
//!   with per-handle sequential detection and parallel prefetch
//!   ([`prefetch`]); plain reads are `pread`s (or kernel passthrough,
//!   decided by the adapter).
//!
//! `.blz` model archives: `X.blz` is presented as a read-only directory
//! `X` holding the archive's files (exact sizes, subdirectories). Entries
//! inside are virtual inodes (`NodeKind::BlzDir` / `BlzFile`) that name
//! the `.blz` inode (`NodeKind::Blz`, whose state holds the parsed
//! [`BlzArchive`] of the version last seen, one generation per version) and
//! carry the `.blz` file's identity, so they follow the same numbering and
//! replacement rules as every other inode. A file inside is opened as an
//! archive handle over (archive, file index) and read through the same
//! block cache and prefetch as a `.zstn`; blocks are keyed by (generation,
//! blob, block), so a tensor shared by several shards is cached once. A
//! `.blz` that cannot be parsed is still listed as a directory; `opendir`
//! and `lookup` in it fail with EIO and log the file and reason.
//!
//! Freshness: every `lookup` and `getattr` re-stats the backing path, and
//! directory listings are read from STORE at `opendir`, so files that
//! appear, change or disappear in STORE show up on the next lookup or
//! listing. No negative entries are kept.
//!
//! Errors: one [`FsError`] with an exhaustive errno mapping. A backing
//! archive that cannot be parsed is still listed (with its stored size);
//! opening it fails with EIO and logs the file and reason. A block that
//! fails to decode answers EIO for the reads that need it, only.
//!
//! Lock order: `handles`, then the inode table, then an inode's state,
//! then the block cache. No lock is held while decoding.

pub mod error;
pub mod inode;
pub mod namespace;
pub mod prefetch;
pub mod spool;
mod write;

pub use error::{FsError, Result};
pub use inode::{NodeKind, ROOT_INO};
pub use write::{Caller, SetAttr, SetTime};

use crate::archive::{self, ArchiveError, ArchiveView, BlockKey, PieceSource};
use crate::cache::{BlockCache, CacheKey, CacheStats, FetchError};
use inode::{Identity, Inode, InodeTable};
use prefetch::{Policy, Sequential};
use spool::Spool;
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Extended attributes an archive answers.
pub const XATTR_STORED_SIZE: &str = "user.ckptfs.stored_size";
pub const XATTR_RATIO: &str = "user.ckptfs.ratio";
pub const XATTR_FORMAT: &str = "user.ckptfs.format";
pub const XATTR_CHECKSUMS: &str = "user.ckptfs.checksums";
pub const XATTR_ERROR: &str = "user.ckptfs.error";

#[derive(Debug, Clone)]
pub struct FsConfig {
    pub store: PathBuf,
    /// Byte budget of the decoded-block cache.
    pub cache_bytes: u64,
    /// How long the kernel may cache entries and attributes.
    pub ttl: Duration,
    /// Refuse every change (EROFS); nothing in STORE is touched.
    pub read_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    RegularFile,
    Symlink,
    NamedPipe,
    CharDevice,
    BlockDevice,
    Socket,
}

impl FileKind {
    fn from_mode(mode: u32) -> FileKind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::NamedPipe,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            libc::S_IFSOCK => FileKind::Socket,
            _ => FileKind::RegularFile,
        }
    }
}

/// File attributes as the mount presents them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// 512-byte blocks the backing file occupies (compressed, for archives).
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: FileKind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub attr: Attr,
    pub ttl: Duration,
}

/// The result of `open`.
#[derive(Debug)]
pub enum Opened {
    /// Served from the block cache; `keep_cache` when the kernel's page
    /// cache holds this same archive version from a previous open.
    Archive { fh: u64, keep_cache: bool },
    /// A plain file; when `passthrough`, the adapter may pass `file` to
    /// the kernel, else reads and writes come here. The kernel refuses to
    /// mix passthrough and cached opens of one inode, so a staged file is
    /// passed through only when its inode has no cached (archive) handle
    /// open, and it is compressed (becoming an archive) only when nothing
    /// has it open.
    Plain {
        fh: u64,
        file: Arc<File>,
        passthrough: bool,
    },
}

/// Receives directory entries; returns true when its buffer is full.
pub trait DirectoryReplier {
    fn add(&mut self, ino: u64, offset: u64, kind: FileKind, name: &OsStr) -> bool;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// A backing file version: size and change times (with the inode's
/// identity, this tells whether the file was modified in place).
type Version = (u64, i64, i64, i64, i64);

fn version_of(m: &Metadata) -> Version {
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
    version: Version,
    /// Unique per process: the cache key of this version's blocks.
    generation: u64,
    archive: std::result::Result<Arc<dyn ArchiveView>, Arc<String>>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("generation", &self.generation)
            .finish()
    }
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// What an archive handle serves: one file of an opened archive.
#[derive(Clone)]
struct Served {
    archive: Arc<dyn ArchiveView>,
    file: usize,
}

struct ArchiveHandle {
    ino: u64,
    archive: Served,
    generation: u64,
    seq: Mutex<Sequential>,
}

#[derive(Debug, Clone)]
struct DirItem {
    ino: u64,
    kind: FileKind,
    name: OsString,
}

/// An open plain or staged file.
struct PlainHandle {
    file: Arc<File>,
    ino: u64,
    /// The backing file's identity.
    identity: Identity,
    /// Served here (not passed through to the kernel).
    cached: bool,
    /// Opened for writing: counted in `CheckpointFs::writers` under this
    /// identity until released.
    writer: Option<Identity>,
}

enum Handle {
    Archive(ArchiveHandle),
    Plain(PlainHandle),
    Dir(Vec<DirItem>),
}

pub struct CheckpointFs {
    store: PathBuf,
    inodes: InodeTable,
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    cache: Arc<BlockCache<ArchiveError>>,
    policy: Policy,
    ttl: Duration,
    /// Backing paths already warned about (shadowed archives).
    warned: Mutex<HashSet<PathBuf>>,
    read_only: bool,
    /// Staged `.safetensors` files (None when read-only).
    spool: Option<Spool>,
    /// Serialises changes of the namespace (create, rename, unlink, commit
    /// of a compressed file). Reads and lookups do not take it.
    ns: Mutex<()>,
    /// Open handles with write access, per backing identity.
    writers: Mutex<HashMap<Identity, usize>>,
    /// Staged files waiting to be compressed.
    queue: Mutex<std::collections::VecDeque<u64>>,
    queue_cv: std::sync::Condvar,
}

impl std::fmt::Debug for CheckpointFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointFs")
            .field("store", &self.store)
            .finish()
    }
}

fn to_time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

fn attr_from_meta(ino: u64, m: &Metadata, size: u64) -> Attr {
    Attr {
        ino,
        size,
        blocks: m.blocks(),
        atime: to_time(m.atime(), m.atime_nsec()),
        mtime: to_time(m.mtime(), m.mtime_nsec()),
        ctime: to_time(m.ctime(), m.ctime_nsec()),
        kind: FileKind::from_mode(m.mode()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
    }
}

fn not_found_is(e: io::Error) -> FsError {
    if e.kind() == io::ErrorKind::NotFound {
        FsError::NotFound
    } else {
        FsError::Io(e)
    }
}

impl CheckpointFs {
    pub fn new(cfg: FsConfig) -> io::Result<CheckpointFs> {
        let store = cfg.store.canonicalize()?;
        let m = std::fs::metadata(&store)?;
        if !m.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{}: not a directory", store.display()),
            ));
        }
        let (spool, recovered) = if cfg.read_only {
            (None, Vec::new())
        } else {
            let (s, r) = Spool::open(&store)?;
            (Some(s), r)
        };
        let fs = CheckpointFs {
            inodes: InodeTable::new((m.dev(), m.ino())),
            store,
            handles: RwLock::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            cache: Arc::new(BlockCache::new(cfg.cache_bytes)),
            policy: Policy::for_cache(cfg.cache_bytes),
            ttl: cfg.ttl,
            warned: Mutex::new(HashSet::new()),
            read_only: cfg.read_only,
            spool,
            ns: Mutex::new(()),
            writers: Mutex::new(HashMap::new()),
            queue: Mutex::new(Default::default()),
            queue_cv: Default::default(),
        };
        for r in recovered {
            log::info!(
                "recovering staged {} (spool entry {:016x}); it will be compressed",
                r.target.display(),
                r.id
            );
            fs.schedule(r.id);
        }
        Ok(fs)
    }

    pub fn store(&self) -> &Path {
        &self.store
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The backing path of `inode` relative to STORE, found by walking its
    /// parents (inodes store only their own name). For an entry inside a
    /// `.blz`, the path of the `.blz` joined with the path inside it.
    fn rel(&self, inode: &Inode) -> Result<PathBuf> {
        let l = inode.loc();
        if let NodeKind::Staged { id } = l.kind {
            return Ok(Spool::data_rel(id));
        }
        if inode.ino == ROOT_INO {
            return Ok(PathBuf::new());
        }
        let mut names = vec![l.backing];
        let mut p = l.parent;
        while p != ROOT_INO {
            let i = self.inode(p)?;
            let pl = i.loc();
            names.push(pl.backing);
            p = pl.parent;
            if names.len() > 4096 {
                return Err(FsError::Stale);
            }
        }
        Ok(names.iter().rev().collect())
    }

    fn full(&self, inode: &Inode) -> Result<PathBuf> {
        Ok(self.store.join(self.rel(inode)?))
    }

    fn inode(&self, ino: u64) -> Result<Arc<Inode>> {
        // The kernel only names inodes we gave it; an unknown one was
        // forgotten and superseded, which is what ESTALE means.
        self.inodes.get(ino).ok_or(FsError::Stale)
    }

    fn dir_inode(&self, ino: u64) -> Result<Arc<Inode>> {
        let i = self.inode(ino)?;
        if i.kind().is_dir() {
            Ok(i)
        } else {
            Err(FsError::NotADirectory)
        }
    }

    /// The `.blz` inode behind a `Blz`/`BlzDir`/`BlzFile` inode, and the
    /// inode's path inside the archive ("" for the archive's root).
    fn blz_root(&self, inode: &Arc<Inode>) -> Result<(Arc<Inode>, String)> {
        let root = match inode.kind() {
            NodeKind::Blz => return Ok((inode.clone(), String::new())),
            NodeKind::BlzDir { root } | NodeKind::BlzFile { root } => self.inode(root)?,
            NodeKind::Directory | NodeKind::Archive | NodeKind::Plain | NodeKind::Staged { .. } => {
                return Err(FsError::NotFound)
            }
        };
        let mut names = Vec::new();
        let mut cur = inode.clone();
        while cur.ino != root.ino {
            let l = cur.loc();
            names.push(l.backing.to_str().ok_or(FsError::NotFound)?.to_string());
            cur = self.inode(l.parent)?;
            if names.len() > 4096 {
                return Err(FsError::Stale);
            }
        }
        names.reverse();
        Ok((root, names.join("/")))
    }

    /// The parsed `.blz` of `root`'s current backing version (parsed on
    /// first sight of that version) and the backing file's metadata.
    fn blz_slot(&self, root: &Inode) -> Result<(Slot, Metadata)> {
        let path = self.full(root)?;
        let m = std::fs::symlink_metadata(&path).map_err(not_found_is)?;
        if (m.dev(), m.ino()) != root.identity() {
            return Err(FsError::Stale);
        }
        let mut st = root.state();
        if let Some(s) = &st.blz {
            if s.version == version_of(&m) {
                return Ok((s.clone(), m));
            }
        }
        let file = File::open(&path).map_err(not_found_is)?;
        let fm = file.metadata()?;
        if (fm.dev(), fm.ino()) != root.identity() {
            return Err(FsError::Stale);
        }
        let slot = parse_version(&file, &fm, &path, true);
        st.blz = Some(slot.clone());
        Ok((slot, fm))
    }

    /// Like [`Self::blz_slot`], but an unparseable archive is EIO (logged).
    fn blz_archive(&self, root: &Inode) -> Result<(Arc<dyn ArchiveView>, u64, Metadata)> {
        let (slot, m) = self.blz_slot(root)?;
        match slot.archive {
            Ok(a) => Ok((a, slot.generation, m)),
            Err(reason) => {
                let e = FsError::BadArchive {
                    path: self.full(root)?,
                    reason,
                };
                log::error!("{e}");
                Err(e)
            }
        }
    }

    /// Attributes of an entry inside a `.blz` whose backing file has
    /// metadata `m`: read-only, owner and times of the `.blz`.
    fn blz_entry_attr(ino: u64, m: &Metadata, dir: bool, size: u64) -> Attr {
        let mut a = attr_from_meta(ino, m, size);
        a.blocks = size.div_ceil(512);
        a.rdev = 0;
        let r = a.perm & 0o444;
        if dir {
            a.kind = FileKind::Directory;
            a.perm = r | (r >> 2);
            a.nlink = 2;
        } else {
            a.kind = FileKind::RegularFile;
            a.perm = r;
            a.nlink = 1;
        }
        a
    }

    /// Attributes of a `BlzDir`/`BlzFile` inode, the `.blz` having
    /// metadata `m`.
    fn blz_attr(&self, inode: &Arc<Inode>) -> Result<Attr> {
        let (root, inner) = self.blz_root(inode)?;
        let attr = match inode.kind() {
            NodeKind::BlzFile { .. } => {
                let (a, _, m) = self.blz_archive(&root)?;
                let i = a.find(&inner).ok_or(FsError::Stale)?;
                Self::blz_entry_attr(inode.ino, &m, false, a.logical_len(i))
            }
            _ => {
                let (_, m) = self.blz_slot(&root)?;
                Self::blz_entry_attr(inode.ino, &m, true, 4096)
            }
        };
        inode.state().attr = Some(attr);
        Ok(attr)
    }

    /// `lookup` in a `.blz` directory.
    fn lookup_blz(&self, p: &Arc<Inode>, name: &OsStr) -> Result<Entry> {
        let (root, inner) = self.blz_root(p)?;
        let n = name.to_str().ok_or(FsError::NotFound)?;
        if n.is_empty() || n == "." || n == ".." || n.contains('/') {
            return Err(FsError::NotFound);
        }
        let path = if inner.is_empty() {
            n.to_string()
        } else {
            format!("{inner}/{n}")
        };
        let (a, _, m) = self.blz_archive(&root)?;
        let (kind, attr_of) = if let Some(i) = a.find(&path) {
            (NodeKind::BlzFile { root: root.ino }, Some(a.logical_len(i)))
        } else if a.directories().binary_search(&path).is_ok() {
            (NodeKind::BlzDir { root: root.ino }, None)
        } else {
            return Err(FsError::NotFound);
        };
        let inode = self.inodes.assign(p.ino, name, name, kind, root.identity());
        let attr = match attr_of {
            Some(size) => Self::blz_entry_attr(inode.ino, &m, false, size),
            None => Self::blz_entry_attr(inode.ino, &m, true, 4096),
        };
        let mut st = inode.state();
        st.attr = Some(attr);
        st.lookups += 1;
        Ok(Entry {
            attr,
            ttl: self.ttl,
        })
    }

    /// `opendir` of a `.blz` directory: its files and subdirectories.
    fn opendir_blz(&self, d: &Arc<Inode>) -> Result<u64> {
        let (root, inner) = self.blz_root(d)?;
        let (a, _, _) = self.blz_archive(&root)?;
        let dirs = a.directories();
        if !inner.is_empty() && dirs.binary_search(&inner).is_err() {
            return Err(FsError::Stale);
        }
        let prefix = if inner.is_empty() {
            String::new()
        } else {
            format!("{inner}/")
        };
        let child = |p: &str| -> Option<String> {
            let rest = p.strip_prefix(&prefix)?;
            (!rest.is_empty() && !rest.contains('/')).then(|| rest.to_string())
        };
        let mut kids: Vec<(String, bool)> = (0..a.files())
            .filter_map(|f| child(a.file_path(f)).map(|n| (n, false)))
            .chain(dirs.iter().filter_map(|p| child(p).map(|n| (n, true))))
            .collect();
        kids.sort();
        let mut items = dot_entries(d.ino, d.parent());
        for (name, dir) in kids {
            let (kind, fk) = if dir {
                (NodeKind::BlzDir { root: root.ino }, FileKind::Directory)
            } else {
                (NodeKind::BlzFile { root: root.ino }, FileKind::RegularFile)
            };
            let inode = self.inodes.assign(
                d.ino,
                OsStr::new(&name),
                OsStr::new(&name),
                kind,
                root.identity(),
            );
            items.push(DirItem {
                ino: inode.ino,
                kind: fk,
                name: name.into(),
            });
        }
        Ok(self.insert_handle(Handle::Dir(items)))
    }

    fn warn_once(&self, path: &Path, msg: impl FnOnce() -> String) {
        let mut w = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if w.insert(path.to_path_buf()) {
            log::warn!("{}", msg());
        }
    }

    fn warn_shadowed(&self, dir: &Path, hidden: &OsStr, shown: &OsStr) {
        let hidden = dir.join(hidden);
        self.warn_once(&hidden, || {
            format!(
                "{}: hidden by {} (both present the same name; the plain file is shown)",
                hidden.display(),
                dir.join(shown).display()
            )
        });
    }

    /// Which backing entry presents `name` in directory inode `p`: a
    /// staged file first, then STORE (see [`Self::resolve_name`]).
    fn resolve(&self, p: &Inode, name: &OsStr) -> Result<(OsString, NodeKind, Metadata)> {
        let rel = self.rel(p)?;
        if rel.as_os_str().is_empty() && name == spool::SPOOL_DIR {
            return Err(FsError::NotFound);
        }
        if let Some(s) = &self.spool {
            if let Some((id, _)) = s.find(&rel.join(name)) {
                match std::fs::symlink_metadata(s.data_path(id)) {
                    Ok(m) => return Ok((name.to_os_string(), NodeKind::Staged { id }, m)),
                    // Committed or removed just now: STORE has it.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(FsError::Io(e)),
                }
            }
        }
        self.resolve_name(&self.store.join(rel), name)
    }

    /// Which backing entry presents `name` in directory `dir`.
    fn resolve_name(&self, dir: &Path, name: &OsStr) -> Result<(OsString, NodeKind, Metadata)> {
        let cands = namespace::archive_candidates(name);
        match std::fs::symlink_metadata(dir.join(name)) {
            Ok(m) => {
                if m.is_file() && namespace::is_archive_name(name) {
                    // Shown under its `.safetensors` name instead.
                    return Err(FsError::NotFound);
                }
                for c in &cands {
                    if std::fs::symlink_metadata(dir.join(c)).is_ok_and(|m| m.is_file()) {
                        self.warn_shadowed(dir, c, name);
                    }
                }
                let kind = if m.is_dir() {
                    NodeKind::Directory
                } else {
                    NodeKind::Plain
                };
                Ok((name.to_os_string(), kind, m))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut found: Option<(OsString, Metadata)> = None;
                for c in cands {
                    match std::fs::symlink_metadata(dir.join(&c)) {
                        Ok(m) if m.is_file() => match &found {
                            None => found = Some((c, m)),
                            Some((winner, _)) => self.warn_shadowed(dir, &c, winner),
                        },
                        _ => {}
                    }
                }
                let (c, m) = found.ok_or(FsError::NotFound)?;
                let kind = if namespace::is_blz_name(&c) {
                    NodeKind::Blz
                } else {
                    NodeKind::Archive
                };
                Ok((c, kind, m))
            }
            Err(e) => Err(FsError::Io(e)),
        }
    }

    /// The parsed archive for the backing version `meta` describes,
    /// parsing it if this version has not been seen yet.
    fn archive_slot(&self, inode: &Inode, meta: &Metadata) -> Result<Slot> {
        let mut st = inode.state();
        if let Some(s) = &st.archive {
            if s.version == version_of(meta) {
                return Ok(s.clone());
            }
        }
        let path = self.full(inode)?;
        let file = File::open(&path).map_err(not_found_is)?;
        let fm = file.metadata()?;
        if (fm.dev(), fm.ino()) != inode.identity() {
            return Err(FsError::Stale);
        }
        let slot = parse_version(&file, &fm, &path, false);
        st.archive = Some(slot.clone());
        Ok(slot)
    }

    fn attr_of(&self, inode: &Inode, meta: &Metadata) -> Result<Attr> {
        let kind = inode.kind();
        let size = match kind {
            NodeKind::Archive => match &self.archive_slot(inode, meta)?.archive {
                Ok(a) => a.logical_len(0),
                Err(_) => meta.len(),
            },
            NodeKind::Directory | NodeKind::Plain | NodeKind::Blz | NodeKind::Staged { .. } => {
                meta.len()
            }
            NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } => {
                return Err(FsError::Stale);
            }
        };
        let mut attr = attr_from_meta(inode.ino, meta, size);
        if kind == NodeKind::Blz {
            // Listed even when it cannot be parsed; nothing is parsed here.
            attr.kind = FileKind::Directory;
            let r = attr.perm & 0o444;
            attr.perm = r | (r >> 2);
            attr.nlink = 2;
        }
        inode.state().attr = Some(attr);
        Ok(attr)
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Entry> {
        let p = self.dir_inode(parent)?;
        if matches!(p.kind(), NodeKind::Blz | NodeKind::BlzDir { .. }) {
            return self.lookup_blz(&p, name);
        }
        let (backing, kind, meta) = self.resolve(&p, name)?;
        let inode = self
            .inodes
            .assign(parent, name, &backing, kind, (meta.dev(), meta.ino()));
        if let (NodeKind::Staged { id }, Some(s)) = (kind, &self.spool) {
            s.set_ino(id, inode.ino);
        }
        let attr = self.attr_of(&inode, &meta)?;
        inode.state().lookups += 1;
        Ok(Entry {
            attr,
            ttl: self.ttl,
        })
    }

    pub fn forget(&self, ino: u64, nlookup: u64) {
        self.inodes.forget(ino, nlookup);
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.getattr_fh(ino, None)
    }

    /// `getattr`, through the open handle `fh` when one is given (so an
    /// unlinked but open file still reports its size).
    pub fn getattr_fh(&self, ino: u64, fh: Option<u64>) -> Result<Attr> {
        let inode = self.inode(ino)?;
        if let Some(Ok(h)) = fh.map(|f| self.handle(f)) {
            if let Handle::Plain(p) = &*h {
                if p.ino == ino {
                    let m = p.file.metadata()?;
                    let attr = attr_from_meta(ino, &m, m.len());
                    inode.state().attr = Some(attr);
                    return Ok(attr);
                }
            }
        }
        if inode.kind().in_blz() {
            return match self.blz_attr(&inode) {
                // The `.blz` was replaced or removed, or no longer has
                // this entry: answer what it last was.
                Err(FsError::Stale | FsError::NotFound) => inode.state().attr.ok_or(FsError::Stale),
                r => r,
            };
        }
        match std::fs::symlink_metadata(self.full(&inode)?) {
            Ok(m) if (m.dev(), m.ino()) == inode.identity() => self.attr_of(&inode, &m),
            // The path was replaced or removed: this inode is the old file;
            // answer what it last was (as a local fs does for an unlinked
            // but referenced inode).
            Ok(_) => inode.state().attr.ok_or(FsError::Stale),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Unlinked but still referenced (open): no names left.
                let mut a = inode.state().attr.ok_or(FsError::NotFound)?;
                a.nlink = 0;
                Ok(a)
            }
            Err(e) => Err(FsError::Io(e)),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if matches!(
            inode.kind(),
            NodeKind::Blz | NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. }
        ) {
            return Err(FsError::Io(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        Ok(std::fs::read_link(self.full(&inode)?)
            .map_err(not_found_is)?
            .into_os_string()
            .into_encoded_bytes())
    }

    fn insert_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(h));
        fh
    }

    fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle(fh))
    }

    /// Registers an open plain (or staged) file. A `writer` must already
    /// be counted in `writers`; `release` uncounts it.
    fn plain_handle(
        &self,
        ino: u64,
        file: File,
        writer: Option<Identity>,
        passthrough: bool,
    ) -> Opened {
        let identity = file
            .metadata()
            .map(|m| (m.dev(), m.ino()))
            .unwrap_or((0, 0));
        let file = Arc::new(file);
        let fh = self.insert_handle(Handle::Plain(PlainHandle {
            file: file.clone(),
            ino,
            identity,
            cached: !passthrough,
            writer,
        }));
        Opened::Plain {
            fh,
            file,
            passthrough,
        }
    }

    /// Whether `ino` has handles the kernel serves through its page cache
    /// (archives, plain handles not passed through). The kernel refuses a
    /// passthrough open of an inode with such handles, and vice versa.
    fn has_cached_opens(&self, ino: u64) -> bool {
        self.handles
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|h| match &**h {
                Handle::Archive(a) => a.ino == ino,
                Handle::Plain(p) => p.ino == ino && p.cached,
                Handle::Dir(_) => false,
            })
    }

    /// Whether any handle has the backing file `id` open.
    fn is_open(&self, id: Identity) -> bool {
        self.handles
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|h| matches!(&**h, Handle::Plain(p) if p.identity == id))
    }

    /// Opens a file. `flags` are the open(2) flags; opening for writing
    /// (or with `O_TRUNC`) goes to [`Self::open_write`].
    pub fn open(&self, ino: u64, flags: i32) -> Result<Opened> {
        let staged = matches!(self.inode(ino)?.kind(), NodeKind::Staged { .. });
        match self.open_once(ino, flags) {
            // Committed (compressed or put back) between resolving the
            // inode and opening its spool file: wait for the commit to
            // finish (it holds `ns`) and open what it left.
            Err(FsError::NotFound | FsError::Stale) if staged => {
                drop(self.ns.lock().unwrap_or_else(|p| p.into_inner()));
                self.open_once(ino, flags)
            }
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
            NodeKind::Plain | NodeKind::Staged { .. } => {
                let file = File::open(&path).map_err(not_found_is)?;
                let m = file.metadata()?;
                if (m.dev(), m.ino()) != inode.identity() {
                    return Err(FsError::Stale);
                }
                let passthrough = inode.kind() == NodeKind::Plain || !self.has_cached_opens(ino);
                Ok(self.plain_handle(ino, file, None, passthrough))
            }
            NodeKind::Archive => {
                let m = std::fs::symlink_metadata(&path).map_err(not_found_is)?;
                if (m.dev(), m.ino()) != inode.identity() {
                    return Err(FsError::Stale);
                }
                let slot = self.archive_slot(&inode, &m)?;
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
        let h = self.handle(fh)?;
        match &*h {
            Handle::Plain(PlainHandle { file, .. }) => {
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
                Ok(buf)
            }
            Handle::Archive(a) => self.read_archive(a, offset, size),
            Handle::Dir(_) => Err(FsError::IsADirectory),
        }
    }

    fn read_archive(&self, h: &ArchiveHandle, offset: u64, size: u32) -> Result<Vec<u8>> {
        let Served { archive, file } = &h.archive;
        let len = archive.logical_len(*file);
        if offset >= len {
            return Ok(Vec::new());
        }
        let n = (size as u64).min(len - offset);
        let ahead =
            h.seq
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .on_read(offset, n, len, &self.policy);
        if let Some(range) = ahead {
            self.prefetch(h, range);
        }
        let mut buf = vec![0u8; n as usize];
        let mut fetch = |k: BlockKey| -> Result<Arc<Vec<u8>>> {
            let key = CacheKey {
                generation: h.generation,
                block: k,
            };
            self.cache
                .get_or_load(key, || archive.decode_block(k))
                .map_err(|e| match e {
                    FetchError::Load(e) => FsError::Decode(e),
                    FetchError::Panicked => FsError::DecodePanicked,
                })
        };
        match archive::read_with(&**archive, *file, offset, &mut buf, &mut fetch) {
            Ok(k) => {
                buf.truncate(k);
                Ok(buf)
            }
            Err(err) => {
                log::error!("read at {offset}+{n}: {err}");
                Err(err)
            }
        }
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
        let mut last = None;
        for p in pieces {
            let PieceSource::Block(k) = p.source else {
                continue;
            };
            if last == Some(k) {
                continue;
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
            let archive = h.archive.archive.clone();
            rayon::spawn(move || {
                if let Some(Err(FetchError::Load(e))) =
                    cache.load_if_absent(key, || archive.decode_block(k))
                {
                    log::debug!("prefetch: {e}");
                }
            });
        }
    }

    /// Closes a handle. The last writer of a staged file queues it for
    /// compression (the close does not wait for it).
    pub fn release(&self, fh: u64) {
        let h = self
            .handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh);
        if let Some(h) = h {
            if let Handle::Plain(p) = &*h {
                match p.writer {
                    Some(id) => self.writer_closed(id),
                    None => self.handle_closed(p.identity),
                }
            }
        }
    }

    /// Reads the directory from STORE now; `readdir` serves this snapshot.
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let d = self.dir_inode(ino)?;
        if matches!(d.kind(), NodeKind::Blz | NodeKind::BlzDir { .. }) {
            return self.opendir_blz(&d);
        }
        let rel = self.rel(&d)?;
        let dir = self.store.join(&rel);
        let mut raw = Vec::new();
        let mut kinds = HashMap::new();
        let staged: HashMap<OsString, u64> = match &self.spool {
            Some(s) => s.names_in(&rel).into_iter().map(|(i, n)| (n, i)).collect(),
            None => HashMap::new(),
        };
        for e in std::fs::read_dir(&dir).map_err(not_found_is)? {
            let e = e?;
            if rel.as_os_str().is_empty() && e.file_name() == spool::SPOOL_DIR {
                continue;
            }
            let ft = e.file_type()?;
            kinds.insert(e.file_name(), (ft, e.ino()));
            raw.push((e.file_name(), ft.is_file()));
        }
        let (resolved, shadowed) = namespace::resolve_dir(&raw);
        for s in shadowed {
            self.warn_shadowed(&dir, &s.hidden, &s.shown);
        }
        let mut items = dot_entries(d.ino, d.parent());
        let dev = d.identity().0;
        for (name, id) in &staged {
            let Some(s) = &self.spool else { break };
            let Ok(m) = std::fs::symlink_metadata(s.data_path(*id)) else {
                continue;
            };
            let inode = self.inodes.assign(
                d.ino,
                name,
                name,
                NodeKind::Staged { id: *id },
                (m.dev(), m.ino()),
            );
            s.set_ino(*id, inode.ino);
            items.push(DirItem {
                ino: inode.ino,
                kind: FileKind::RegularFile,
                name: name.clone(),
            });
        }
        for r in resolved {
            if staged.contains_key(&r.presented) {
                continue;
            }
            let (ft, bino) = kinds[&r.backing];
            let (kind, fk) = if r.archive && namespace::is_blz_name(&r.backing) {
                (NodeKind::Blz, FileKind::Directory)
            } else if r.archive {
                (NodeKind::Archive, FileKind::RegularFile)
            } else if ft.is_dir() {
                (NodeKind::Directory, FileKind::Directory)
            } else {
                use std::os::unix::fs::FileTypeExt;
                let fk = if ft.is_symlink() {
                    FileKind::Symlink
                } else if ft.is_fifo() {
                    FileKind::NamedPipe
                } else if ft.is_socket() {
                    FileKind::Socket
                } else if ft.is_char_device() {
                    FileKind::CharDevice
                } else if ft.is_block_device() {
                    FileKind::BlockDevice
                } else {
                    FileKind::RegularFile
                };
                (NodeKind::Plain, fk)
            };
            let inode = self
                .inodes
                .assign(d.ino, &r.presented, &r.backing, kind, (dev, bino));
            items.push(DirItem {
                ino: inode.ino,
                kind: fk,
                name: r.presented,
            });
        }
        Ok(self.insert_handle(Handle::Dir(items)))
    }

    pub fn readdir(&self, fh: u64, offset: u64, out: &mut dyn DirectoryReplier) -> Result<()> {
        let h = self.handle(fh)?;
        let Handle::Dir(items) = &*h else {
            return Err(FsError::NotADirectory);
        };
        for (i, it) in items.iter().enumerate().skip(offset as usize) {
            if out.add(it.ino, i as u64 + 1, it.kind, &it.name) {
                break;
            }
        }
        Ok(())
    }

    pub fn releasedir(&self, fh: u64) {
        self.release(fh);
    }

    /// The `user.ckptfs.*` attributes of an inode, as (name, value).
    fn xattrs(&self, ino: u64) -> Result<Vec<(&'static str, String)>> {
        let inode = self.inode(ino)?;
        match inode.kind() {
            NodeKind::Directory
            | NodeKind::Plain
            | NodeKind::Staged { .. }
            | NodeKind::Blz
            | NodeKind::BlzDir { .. }
            | NodeKind::BlzFile { .. } => return Ok(Vec::new()),
            NodeKind::Archive => {}
        }
        let m = std::fs::symlink_metadata(self.full(&inode)?).map_err(not_found_is)?;
        if (m.dev(), m.ino()) != inode.identity() {
            return Err(FsError::Stale);
        }
        let slot = self.archive_slot(&inode, &m)?;
        Ok(match &slot.archive {
            Ok(a) => {
                let ratio = if a.stored_len() == 0 {
                    1.0
                } else {
                    a.logical_len(0) as f64 / a.stored_len() as f64
                };
                vec![
                    (XATTR_STORED_SIZE, a.stored_len().to_string()),
                    (XATTR_RATIO, format!("{ratio:.3}")),
                    (XATTR_FORMAT, a.kind().format_name().to_string()),
                    (XATTR_CHECKSUMS, a.checksums().unwrap_or("none").to_string()),
                ]
            }
            Err(reason) => vec![
                (XATTR_STORED_SIZE, m.len().to_string()),
                (XATTR_ERROR, reason.to_string()),
            ],
        })
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
        self.xattrs(ino)?
            .into_iter()
            .find(|(n, _)| n.as_bytes() == name.as_bytes())
            .map(|(_, v)| v.into_bytes())
            .ok_or(FsError::NoXattr)
    }

    /// Attribute names, each NUL-terminated (the listxattr(2) format).
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for (n, _) in self.xattrs(ino)? {
            out.extend_from_slice(n.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    /// `fsync` of a directory: its backing directory.
    pub fn fsyncdir(&self, ino: u64) -> Result<()> {
        let d = self.dir_inode(ino)?;
        if matches!(d.kind(), NodeKind::Blz | NodeKind::BlzDir { .. }) {
            return Ok(());
        }
        crate::fsutil::sync_dir(&self.full(&d)?)?;
        Ok(())
    }

    /// Statistics of the filesystem holding STORE.
    pub fn statfs(&self) -> Result<StatFs> {
        let c = std::ffi::CString::new(self.store.as_os_str().as_bytes())
            .map_err(|e| FsError::Io(io::Error::other(e)))?;
        // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid NUL-terminated path and `s` a writable
        // statvfs that outlives the call.
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return Err(FsError::Io(io::Error::last_os_error()));
        }
        Ok(StatFs {
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            bsize: s.f_bsize as u32,
            namelen: s.f_namemax as u32,
            frsize: s.f_frsize as u32,
        })
    }
}

/// Parses one backing version of an archive (whatever its kind, by its
/// magic). `directory`: presented as a directory of files (`X.blz`), else
/// as one file; an archive of the other shape is refused. An archive that
/// cannot be parsed is logged once per version and kept as the reason.
fn parse_version(file: &File, meta: &Metadata, path: &Path, directory: bool) -> Slot {
    let shown = if directory {
        "listed as a directory"
    } else {
        "listed with its stored size"
    };
    let archive = archive::from_file(file, path).and_then(|a| {
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
    Slot {
        version: version_of(meta),
        generation: GENERATION.fetch_add(1, Ordering::Relaxed),
        archive: archive.map_err(|e| {
            log::warn!("{e} ({shown}; opening it fails with EIO)");
            Arc::new(e.reason())
        }),
    }
}

/// The `.` and `..` entries every listing starts with.
fn dot_entries(ino: u64, parent: u64) -> Vec<DirItem> {
    vec![
        DirItem {
            ino,
            kind: FileKind::Directory,
            name: ".".into(),
        },
        DirItem {
            ino: parent,
            kind: FileKind::Directory,
            name: "..".into(),
        },
    ]
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_tests;
