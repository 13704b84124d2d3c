//! Opening for writing, and the calls on a handle opened for writing:
//! `write`, `fsync`, `fallocate`.
//!
//! A plain file is opened in STORE. A regular `X.safetensors` (plain,
//! staged or compressed) is staged first (see `stage`) and its spool file
//! opened; a writer registers in `writers` before waiting out a running
//! compression of its file.

use crate::beneath::Beneath;
use crate::handles::{Handle, PlainHandle};
use crate::inode::{Inode, NodeKind};
use crate::resolve::not_found_is;
use crate::spool::Spool;
use crate::sys::check;
use crate::{CheckpointFs, FsError, Opened, Result};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

/// Open flags passed on to a backing file opened for writing.
pub(super) fn backing_flags(flags: i32) -> i32 {
    flags & (libc::O_APPEND | libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME)
}

fn open_backing(store: &Beneath, rel: &Path, flags: i32) -> io::Result<File> {
    let acc = flags & libc::O_ACCMODE;
    let trunc = if flags & libc::O_TRUNC != 0 && acc != libc::O_RDONLY {
        libc::O_TRUNC
    } else {
        0
    };
    store.open_file(rel, acc | trunc | backing_flags(flags), 0)
}

fn writes(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

impl CheckpointFs {
    /// Opens `ino` for writing (or with `O_TRUNC`).
    pub(crate) fn open_write(&self, ino: u64, flags: i32) -> Result<Opened> {
        if flags & libc::O_ACCMODE == libc::O_ACCMODE {
            return Err(FsError::BadAccessMode);
        }
        let spool = self.spool()?;
        let inode = self.inode(ino)?;
        match inode.kind() {
            NodeKind::Directory | NodeKind::Blz | NodeKind::BlzDir { .. } => {
                Err(FsError::IsADirectory)
            }
            NodeKind::BlzFile { .. } | NodeKind::GgufView => Err(FsError::ReadOnly),
            NodeKind::Plain => {
                let rel = self.rel(&inode)?;
                let m = self.store.lstat(&rel).map_err(not_found_is)?;
                if (m.dev(), m.ino()) != inode.identity() {
                    return Err(FsError::Stale);
                }
                if m.is_file() && self.stages(&inode.loc().name) && writes(flags) {
                    let id = self.stage_plain(spool, &inode)?;
                    return self.open_staged(spool, &inode, id, flags);
                }
                let file = open_backing(&self.store, &rel, flags).map_err(not_found_is)?;
                let writer = writes(flags).then_some(inode.identity());
                if let Some(w) = writer {
                    self.add_writer(w);
                }
                Ok(self.plain_handle(ino, file, writer, true, flags))
            }
            NodeKind::Staged { id } => self.open_staged(spool, &inode, id, flags),
            NodeKind::Archive => {
                let id = self.stage_archive(spool, &inode, flags & libc::O_TRUNC != 0)?;
                self.open_staged(spool, &inode, id, flags & !libc::O_TRUNC)
            }
        }
    }

    fn open_staged(&self, spool: &Spool, inode: &Inode, id: u64, flags: i32) -> Result<Opened> {
        let entry = spool.entry(id).ok_or(FsError::Stale)?;
        let writer = writes(flags) || flags & libc::O_TRUNC != 0;
        if writer {
            // Register first, then wait out a running compression (see
            // the module doc).
            self.add_writer(entry.identity);
            spool.bump(id);
            // A commit that looked at `writers` before this one registered
            // may have moved the file out of the spool since; under `ns` it
            // has finished or will see this writer and stand down. Writing
            // to a file the commit moved would lose the writes (compressed)
            // or leave the inode's size to a file it no longer presents.
            let _g = self.ns.lock();
            if spool.entry(id).is_none() || inode.kind() != (NodeKind::Staged { id }) {
                drop(_g);
                self.writer_closed(entry.identity);
                return Err(FsError::Stale);
            }
        }
        let file = match open_backing(&self.store, &Spool::data_rel(id), flags) {
            Ok(f) => f,
            Err(e) => {
                if writer {
                    self.writer_closed(entry.identity);
                }
                return Err(not_found_is(e));
            }
        };
        Ok(self.plain_handle(
            inode.ino,
            file,
            writer.then_some(entry.identity),
            true,
            flags,
        ))
    }

    /// Writes `data` at `offset` through a handle opened for writing.
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.handle(fh)?;
        match &*h {
            Handle::Plain(PlainHandle {
                file,
                writer: Some(_),
                ..
            }) => {
                file.write_all_at(data, offset)?;
                Ok(data.len() as u32)
            }
            Handle::Plain(_) | Handle::Archive(_) => Err(FsError::BadHandle(fh)),
            Handle::Dir(_) => Err(FsError::IsADirectory),
        }
    }

    /// `fsync`: the file, and for a staged file its spool record, so that
    /// it survives a power loss too.
    pub fn fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        let h = self.handle(fh)?;
        let Handle::Plain(PlainHandle { file, writer, .. }) = &*h else {
            return Ok(());
        };
        if datasync {
            file.sync_data()?;
        } else {
            file.sync_all()?;
        }
        if let (Some(id), Some(s)) = (writer, &self.spool) {
            if let Some(sid) = s.find_identity(*id) {
                s.sync(sid)?;
            }
        }
        Ok(())
    }

    /// `fallocate(2)` on a handle opened for writing.
    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        let h = self.handle(fh)?;
        let Handle::Plain(PlainHandle {
            file,
            writer: Some(_),
            ..
        }) = &*h
        else {
            return Err(FsError::BadHandle(fh));
        };
        use std::os::fd::AsRawFd;
        // SAFETY: the fd is open for as long as `file` lives.
        check(unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        })
    }
}
