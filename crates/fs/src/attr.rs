//! What `stat(2)`, `readlink(2)` and `statfs(2)` answer.
//!
//! Archives report the logical size from the index (parsed once per backing
//! version, nothing decoded) and the backing file's `st_blocks` (so `du`
//! shows disk use), owner, mode and times; a `.blz` is a directory. Every
//! `getattr` re-stats the backing path. When the path was replaced or
//! removed, the inode is the old file and answers what it last was (as a
//! local filesystem does for an unlinked but referenced inode); an open
//! handle answers from its own file.

use super::handles::Handle;
use super::inode::{Inode, NodeKind};
use super::resolve::not_found_is;
use super::{Attr, CheckpointFs, FileKind, FsError, Result, StatFs};
use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(super) fn to_time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

pub(super) fn attr_from_meta(ino: u64, m: &Metadata, size: u64) -> Attr {
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

impl CheckpointFs {
    /// `a` as the mount shows it: without write bits under `--read-only`,
    /// where nothing can be written (`ls -l` and `access(W_OK)`-free
    /// tools such as file managers tell so, as on a read-only medium).
    fn shown(&self, mut a: Attr) -> Attr {
        if self.read_only {
            a.perm &= !0o222;
        }
        a
    }

    pub(super) fn attr_of(&self, inode: &Inode, meta: &Metadata) -> Result<Attr> {
        let kind = inode.kind();
        let size = match kind {
            NodeKind::Archive => {
                let slot = self.archive_slot(inode, meta)?;
                match &slot.archive {
                    Ok(a) => a.logical_len(0),
                    // A delta whose base is missing: the size it presents.
                    Err(_) => slot.presented_len.unwrap_or(meta.len()),
                }
            }
            NodeKind::Directory | NodeKind::Plain | NodeKind::Blz | NodeKind::Staged { .. } => {
                meta.len()
            }
            NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } => {
                return Err(FsError::Stale);
            }
            NodeKind::GgufView => self.gguf_view_of(inode)?.0.logical_len(0),
        };
        let mut attr = self.shown(attr_from_meta(inode.ino, meta, size));
        if kind == NodeKind::Blz {
            // Listed even when it cannot be parsed; nothing is parsed here.
            attr.kind = FileKind::Directory;
            let r = attr.perm & 0o444;
            attr.perm = r | (r >> 2);
            attr.nlink = 2;
            // A directory's own size: the archive's stored bytes are
            // counted by the files inside (`du` adds them up once).
            attr.size = 4096;
            attr.blocks = 0;
        }
        if kind == NodeKind::GgufView {
            // Computed on demand: read-only, takes no space.
            attr.kind = FileKind::RegularFile;
            attr.perm &= 0o444;
            attr.nlink = 1;
            attr.blocks = 0;
            attr.rdev = 0;
        }
        inode.state().attr = Some(attr);
        Ok(attr)
    }

    /// How long the kernel may keep the attributes of `ino`: not at all
    /// while it is staged or open for writing (the daemon changes its size
    /// and times behind the kernel's cache: staging, truncates, commits),
    /// so `fstat` and `lseek(SEEK_END)` answer fresh; else the mount's TTL.
    pub fn attr_ttl(&self, ino: u64) -> Duration {
        match self.inodes.get(ino) {
            Some(i)
                if matches!(i.kind(), NodeKind::Staged { .. })
                    || self.writer_count(i.identity()) > 0 =>
            {
                Duration::ZERO
            }
            _ => self.ttl,
        }
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
                    let attr = self.shown(attr_from_meta(ino, &m, m.len()));
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
        let removed = match self.store.lstat(&self.rel(&inode)?) {
            Ok(m) if (m.dev(), m.ino()) == inode.identity() => match self.attr_of(&inode, &m) {
                // Replaced or removed between the `lstat` and the parse of
                // a version not seen yet (an archive just committed is
                // renamed over at once): the old file, as below. ENOENT
                // here would fail the `open` or `read` that asked.
                Err(FsError::Stale) => false,
                Err(FsError::NotFound) => true,
                r => return r,
            },
            Ok(_) => false,
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => return Err(FsError::Io(e)),
        };
        // The path was replaced or removed: this inode is the old file;
        // answer what it last was (as a local fs does for an unlinked but
        // referenced inode), with no names left if it was removed.
        let mut a = inode.state().attr.ok_or(FsError::Stale)?;
        if removed {
            a.nlink = 0;
        }
        Ok(a)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if matches!(
            inode.kind(),
            NodeKind::Blz | NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } | NodeKind::GgufView
        ) {
            return Err(FsError::NotASymlink);
        }
        self.store
            .readlink(&self.rel(&inode)?)
            .map_err(not_found_is)
    }

    /// Statistics of the filesystem holding STORE.
    pub fn statfs(&self) -> Result<StatFs> {
        let s = self.store.statvfs()?;
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
