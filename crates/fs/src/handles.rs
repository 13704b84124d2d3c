//! The open-handle table: what each `fh` given to the kernel stands for.
//!
//! - An archive handle holds the `Arc` of the archive version it opened
//!   (its mmap keeps that version alive after a rename-replace in STORE),
//!   the generation that keys its blocks in the cache, and its own
//!   sequential-read state for prefetch.
//! - A plain handle holds the backing `File` (a file in STORE or a staged
//!   file in the spool), whether the kernel serves it through its page
//!   cache (not passed through), and, when it was opened for writing, the
//!   backing identity it is counted under in `CheckpointFs::writers`.
//! - A directory handle holds the listing read at `opendir`.
//!
//! Handle numbers are never reused within a mount. The table answers two
//! questions for the write path: whether a backing file is open at all (a
//! staged file is compressed only when nothing has it open), and whether an
//! inode has handles served through the page cache (the kernel refuses to
//! mix those with passthrough opens of the same inode).

use super::inode::Identity;
use super::prefetch::Sequential;
use super::{CheckpointFs, FileKind, FsError, Opened, Result};
use ckptfs_archive::ArchiveView;
use parking_lot::{Mutex, MutexGuard};
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What an archive handle serves: one file of an opened archive.
#[derive(Clone)]
pub(super) struct Served {
    pub(super) archive: Arc<dyn ArchiveView>,
    pub(super) file: usize,
}

pub(super) struct ArchiveHandle {
    pub(super) ino: u64,
    pub(super) archive: Served,
    pub(super) generation: u64,
    pub(super) seq: Mutex<Sequential>,
}

#[derive(Debug, Clone)]
pub(super) struct DirItem {
    pub(super) ino: u64,
    pub(super) kind: FileKind,
    pub(super) name: OsString,
}

/// An open plain or staged file.
pub(super) struct PlainHandle {
    pub(super) file: Arc<File>,
    pub(super) ino: u64,
    /// The backing file's identity.
    pub(super) identity: Identity,
    /// Served here (not passed through to the kernel).
    pub(super) cached: bool,
    /// Opened for writing: counted in `CheckpointFs::writers` under this
    /// identity until released.
    pub(super) writer: Option<Identity>,
    /// Who opened it for writing (with `--allow-other`): the last close
    /// checks as them that a file with safetensors content may be moved
    /// into the spool (`write::adopt`).
    pub(super) opener: Option<super::beneath::Ids>,
    /// The S3 object this file is a copy of, kept in the disk cache while
    /// the handle lives (a large one: what the reads fetched, while they
    /// use it).
    pub(super) remote: Option<ckptfs_store::remote::InUse>,
}

pub(super) enum Handle {
    Archive(ArchiveHandle),
    Plain(PlainHandle),
    Dir(Vec<DirItem>),
}

/// Stripes of `CheckpointFs::open_mode`.
pub(super) const OPEN_MODE_STRIPES: usize = 64;

impl CheckpointFs {
    /// The io-mode lock of inode `ino` (see `CheckpointFs::open_mode`).
    pub(super) fn open_mode(&self, ino: u64) -> MutexGuard<'_, ()> {
        self.open_mode[ino as usize % OPEN_MODE_STRIPES].lock()
    }

    pub(super) fn insert_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.write().insert(fh, Arc::new(h));
        fh
    }

    pub(super) fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .read()
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle(fh))
    }

    /// Registers an open plain (or staged) file, passed through to the
    /// kernel when `passthrough` and no open of `ino` is served through
    /// the page cache. A `writer` must already be counted in `writers`;
    /// `release` uncounts it.
    pub(super) fn plain_handle(
        &self,
        ino: u64,
        file: File,
        writer: Option<Identity>,
        passthrough: bool,
        flags: i32,
    ) -> Opened {
        let mode = self.open_mode(ino);
        self.plain_handle_of(&mode, ino, file, writer, passthrough, flags, None)
    }

    /// [`Self::plain_handle`] with `open_mode` held by the caller (`mode`),
    /// from its own choice of `passthrough` to the insertion here; `remote`
    /// is the S3 object a plain file is a copy of, kept in the disk cache
    /// while the handle lives.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plain_handle_of(
        &self,
        _mode: &MutexGuard<'_, ()>,
        ino: u64,
        file: File,
        writer: Option<Identity>,
        passthrough: bool,
        flags: i32,
        remote: Option<ckptfs_store::remote::InUse>,
    ) -> Opened {
        // An O_DIRECT open is served here, not passed through: the kernel
        // opens the backing file with the opener's flags, and an O_DIRECT
        // later cleared with fcntl(F_SETFL) would still apply to it
        // (unaligned I/O then fails with EINVAL). Served here (pread and
        // pwrite on a backing file opened without O_DIRECT), any alignment
        // works either way. Only when other opens of the inode are already
        // passed through (the kernel refuses to mix) does it stay passed
        // through.
        let direct = flags & libc::O_DIRECT != 0;
        let passthrough = passthrough
            && !self.has_cached_opens(ino)
            && (!direct || self.has_passthrough_opens(ino));
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
            opener: writer.and_then(|_| super::beneath::current_caller()),
            remote,
        }));
        Opened::Plain {
            fh,
            file,
            passthrough,
            direct_io: direct && !passthrough,
        }
    }

    /// Whether `ino` has plain handles passed through to the kernel.
    ///
    /// The kernel drops an open's io mode before it sends the release, so
    /// the handles here are a superset of the opens the kernel still
    /// counts: when an inode has no handle of one mode here, the kernel has
    /// no open of that mode, and an open in the other mode is safe. A
    /// staged file is read through the page cache (it becomes an archive
    /// when it commits), but while a writer's passthrough handle is still
    /// here (its close is in flight: a reader that opens right after
    /// `close` returns) the reader is passed through too; the kernel
    /// answered EIO to the page-cache open otherwise.
    pub(super) fn has_passthrough_opens(&self, ino: u64) -> bool {
        self.handles
            .read()
            .values()
            .any(|h| matches!(&**h, Handle::Plain(p) if p.ino == ino && !p.cached))
    }

    /// Whether `ino` has handles the kernel serves through its page cache
    /// (archives, plain handles not passed through). The kernel refuses a
    /// passthrough open of an inode with such handles, and vice versa.
    pub(super) fn has_cached_opens(&self, ino: u64) -> bool {
        self.handles.read().values().any(|h| match &**h {
            Handle::Archive(a) => a.ino == ino,
            Handle::Plain(p) => p.ino == ino && p.cached,
            Handle::Dir(_) => false,
        })
    }

    /// Whether any handle has the backing file `id` open.
    pub(super) fn is_open(&self, id: Identity) -> bool {
        self.handles
            .read()
            .values()
            .any(|h| matches!(&**h, Handle::Plain(p) if p.identity == id))
    }

    /// Closes every handle still open: at the end of the session the
    /// kernel sends no more releases, and a handle left open would keep its
    /// staged file from being compressed before the daemon exits.
    pub fn release_all(&self) {
        let open: Vec<u64> = self.handles.read().keys().copied().collect();
        for fh in open {
            self.release(fh);
        }
    }

    /// Closes a handle. The last writer of a staged file queues it for
    /// compression (the close does not wait for it); the last writer of a
    /// plain file with safetensors content stages it first (`adopt`).
    pub fn release(&self, fh: u64) {
        if let Some(after) = self.release_handle(fh) {
            self.after_release(after);
        }
    }

    /// The part of [`Self::release`] the kernel waits for: the handle is
    /// gone. What it returns is for [`Self::after_release`], which the
    /// adapter calls after replying (it reads the file's header: a slow
    /// reply to a release the kernel has stopped waiting for at unmount
    /// fails with ENOENT).
    pub fn release_handle(&self, fh: u64) -> Option<AfterRelease> {
        let h = self.handles.write().remove(&fh)?;
        let Handle::Plain(p) = &*h else { return None };
        match p.writer {
            Some(id) => {
                self.writer_closed(id);
                Some(AfterRelease {
                    ino: p.ino,
                    identity: id,
                    opener: p.opener.clone(),
                })
            }
            None => {
                self.handle_closed(p.identity);
                None
            }
        }
    }

    /// Stages a plain file with safetensors content whose last writer
    /// closed (see `write::adopt`), as the process that opened it.
    pub fn after_release(&self, a: AfterRelease) {
        let _as = a.opener.map(super::beneath::on_behalf);
        self.adopt_if_safetensors(a.ino, a.identity);
    }
}

/// What remains to do after a writer's handle is released.
#[derive(Debug)]
pub struct AfterRelease {
    ino: u64,
    identity: Identity,
    opener: Option<super::beneath::Ids>,
}
