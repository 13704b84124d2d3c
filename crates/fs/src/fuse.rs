//! `CheckpointFuse`: the `fuser::Filesystem` adapter over
//! [`CheckpointFs`]. Each handler converts fuser types, calls the logic and
//! replies or maps the error to its errno; nothing else lives here except
//! the two things only the kernel connection can do:
//!
//! - **Kernel configuration** (`init`): the largest `max_readahead` the
//!   kernel allows and more background requests (deep async readahead);
//!   `FUSE_AUTO_INVAL_DATA` (a backing file modified in place drops its
//!   cached pages on the next attribute refresh); `FUSE_DIRECT_IO_ALLOW_MMAP`
//!   (a handle opened for direct I/O never stops another process from
//!   mapping the file); and `FUSE_PASSTHROUGH` when the kernel offers it.
//! - **Passthrough** for plain files: the backing fd is registered with the
//!   kernel (`BackingId`), which then serves reads and mmap itself at native
//!   speed. One `BackingId` per inode is shared by all its open handles (the
//!   kernel requires that) and closed with the last one. Registering needs
//!   CAP_SYS_ADMIN; if it fails once, passthrough is switched off for the
//!   mount and plain files are served by `pread` in `CheckpointFs`.
//!
//! The handlers that may wait for an `s3://` store's server (lookup,
//! getattr, open, read, readdir) open the request's deadline first
//! (`store::deadline`, `--read-timeout`).
//!
//! Archives are opened with `FOPEN_KEEP_CACHE` when the same archive version
//! was opened before, so warm re-reads come from the page cache; never with
//! `FOPEN_DIRECT_IO`, so `mmap` works. `O_DIRECT` opens need nothing: the
//! kernel sends their reads straight here.

use crate::{
    Attr, Caller, CheckpointFs, DirectoryReplier, FileKind, FsError, Opened, SetAttr, SetTime,
};
use fuser::{
    AccessFlags, BackingId, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

#[derive(Default)]
struct BackingIds {
    by_ino: HashMap<u64, Weak<BackingId>>,
    by_fh: HashMap<u64, Arc<BackingId>>,
}

pub struct CheckpointFuse {
    fs: Arc<CheckpointFs>,
    passthrough: AtomicBool,
    backing: Mutex<BackingIds>,
}

impl CheckpointFuse {
    pub fn new(fs: Arc<CheckpointFs>) -> Self {
        CheckpointFuse {
            fs,
            passthrough: AtomicBool::new(false),
            backing: Mutex::new(BackingIds::default()),
        }
    }

    /// The handle, open flags and passthrough backing id (if any) for an
    /// opened file. `open_backing` registers a file with the kernel.
    fn open_reply(
        &self,
        ino: u64,
        o: Opened,
        open_backing: impl FnOnce(&std::fs::File) -> std::io::Result<BackingId>,
    ) -> (u64, FopenFlags, Option<Arc<BackingId>>) {
        match o {
            Opened::Archive { fh, keep_cache } => {
                let f = if keep_cache {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                (fh, f, None)
            }
            Opened::Plain {
                fh,
                file,
                passthrough,
                direct_io,
            } => {
                if passthrough && self.passthrough.load(Ordering::Relaxed) {
                    let mut b = self.backing.lock();
                    let id = match b.by_ino.get(&ino).and_then(Weak::upgrade) {
                        Some(id) => Ok(id),
                        None => open_backing(&file).map(Arc::new),
                    };
                    match id {
                        Ok(id) => {
                            b.by_ino.insert(ino, Arc::downgrade(&id));
                            b.by_fh.insert(fh, id.clone());
                            return (fh, FopenFlags::empty(), Some(id));
                        }
                        Err(e) => {
                            log::warn!(
                                "passthrough unavailable ({e}); serving plain files by pread"
                            );
                            self.passthrough.store(false, Ordering::Relaxed);
                        }
                    }
                }
                let f = if direct_io {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    FopenFlags::empty()
                };
                (fh, f, None)
            }
        }
    }

    fn reply_entry(&self, reply: ReplyEntry, r: crate::Result<crate::Entry>) {
        match r {
            Ok(e) => reply.entry(&e.ttl, &file_attr(&e.attr), Generation(0)),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn reply_empty(&self, reply: ReplyEmpty, r: crate::Result<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    /// The errno answered for `e`, counted (`ckptfs stats`).
    fn errno(&self, e: &FsError) -> Errno {
        // An I/O error without an errno (one the daemon made, not the store's
        // file system) becomes EIO: log it, no EIO goes without a log line.
        if matches!(e, FsError::Io(io) if io.raw_os_error().is_none()) {
            log::warn!("answering EIO: {e}");
        }
        self.fs.count_error(e.errno());
        Errno::from_i32(e.errno())
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

/// Slices of one read sent with one `writev` at most: the header takes
/// one more, and the kernel refuses more than `IOV_MAX` (1024). A read
/// across more pieces (an archive of many tiny tensors) is copied into one
/// buffer instead.
const MAX_REPLY_SLICES: usize = 256;

/// Answers a read: its pieces follow the header in one `writev`, without
/// being copied together first (fuser patched: vendor/fuser/PATCH.md).
fn reply_data(reply: ReplyData, d: crate::ReadData) {
    let slices = d.slices();
    if slices.len() <= MAX_REPLY_SLICES {
        let iov: Vec<std::io::IoSlice<'_>> =
            slices.iter().map(|s| std::io::IoSlice::new(s)).collect();
        reply.data_vectored(&iov);
    } else {
        drop(slices);
        reply.data(&d.into_vec());
    }
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::Directory => FileType::Directory,
        FileKind::RegularFile => FileType::RegularFile,
        FileKind::Symlink => FileType::Symlink,
        FileKind::NamedPipe => FileType::NamedPipe,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Socket => FileType::Socket,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// Answers an xattr query: the size when `size` is 0, else the value if
/// it fits.
fn reply_xattr(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

struct FuseDir(ReplyDirectory);

impl DirectoryReplier for FuseDir {
    fn add(&mut self, ino: u64, offset: u64, kind: FileKind, name: &OsStr) -> bool {
        self.0.add(INodeNo(ino), offset, file_type(kind), name)
    }
}

impl Filesystem for CheckpointFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        let caps = config.capabilities();
        for flag in [
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            // O_TRUNC arrives with the open, so truncating an archive
            // stages an empty file instead of decoding a copy first.
            InitFlags::FUSE_ATOMIC_O_TRUNC,
        ] {
            if caps.contains(flag) {
                let _ = config.add_capabilities(flag);
            }
        }
        // Passthrough: STORE may itself be on a stacked fs (overlayfs), so
        // allow the kernel's maximum depth.
        if caps.contains(InitFlags::FUSE_PASSTHROUGH)
            && config.set_max_stack_depth(2).is_ok()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        {
            self.passthrough.store(true, Ordering::Relaxed);
        }
        log::info!(
            "kernel ABI {:?}; passthrough for plain files: {}",
            config.kernel_abi(),
            self.passthrough.load(Ordering::Relaxed)
        );
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        let _deadline = ckptfs_store::deadline::Scope::begin();
        match self.fs.lookup(parent.0, name) {
            Ok(e) => reply.entry(&e.ttl, &file_attr(&e.attr), Generation(0)),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        let _deadline = ckptfs_store::deadline::Scope::begin();
        match self.fs.getattr_fh(ino.0, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&self.fs.attr_ttl(ino.0), &file_attr(&a)),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        let _deadline = ckptfs_store::deadline::Scope::begin();
        match self.fs.open(ino.0, flags.0) {
            Ok(o) => {
                let (fh, f, backing) = self.open_reply(ino.0, o, |file| reply.open_backing(file));
                match backing {
                    Some(id) => reply.opened_passthrough(FileHandle(fh), f, &id),
                    None => reply.opened(FileHandle(fh), f),
                }
            }
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        match self.fs.create(parent.0, name, mode, flags, caller(req)) {
            Ok((e, o)) => {
                let (fh, f, backing) =
                    self.open_reply(e.attr.ino, o, |file| reply.open_backing(file));
                let attr = file_attr(&e.attr);
                match backing {
                    Some(id) => reply.created_passthrough(
                        &e.ttl,
                        &attr,
                        Generation(0),
                        FileHandle(fh),
                        f,
                        &id,
                    ),
                    None => reply.created(&e.ttl, &attr, Generation(0), FileHandle(fh), f),
                }
            }
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.fs.fsync(fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        match self.fs.fsyncdir(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.fs.fallocate(fh.0, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        let t = |t: Option<TimeOrNow>| {
            t.map(|t| match t {
                TimeOrNow::Now => SetTime::Now,
                TimeOrNow::SpecificTime(t) => SetTime::At(t),
            })
        };
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: t(atime),
            mtime: t(mtime),
        };
        match self.fs.setattr(ino.0, a, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&self.fs.attr_ttl(ino.0), &file_attr(&a)),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        self.reply_entry(
            reply,
            self.fs.mknod(parent.0, name, mode, rdev, caller(req)),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        self.reply_entry(reply, self.fs.mkdir(parent.0, name, mode, caller(req)));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        self.reply_entry(
            reply,
            self.fs.symlink(parent.0, link_name, target, caller(req)),
        );
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        self.reply_entry(reply, self.fs.link(ino.0, newparent.0, newname));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        self.reply_empty(reply, self.fs.unlink(parent.0, name));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        self.reply_empty(reply, self.fs.rmdir(parent.0, name));
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        self.reply_empty(
            reply,
            self.fs
                .rename(parent.0, name, newparent.0, newname, flags.bits()),
        );
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _deadline = ckptfs_store::deadline::Scope::begin();
        match self.fs.read_data(fh.0, offset, size) {
            Ok(d) => {
                self.fs.count_served(d.len());
                reply_data(reply, d)
            }
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// No ioctls: ENOTTY, as a regular file on a local filesystem answers
    /// (Python's `isatty` probe on every open asks for TCGETS).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let after = self.fs.release_handle(fh.0);
        {
            let mut b = self.backing.lock();
            // Dropped before the count is looked at (the last handle's drop
            // closes the backing id): a dead entry would stay in `by_ino`.
            if let Some(id) = b.by_fh.remove(&fh.0) {
                drop(id);
                if b.by_ino.get(&ino.0).is_some_and(|w| w.strong_count() == 0) {
                    b.by_ino.remove(&ino.0);
                }
            }
        }
        reply.ok();
        if let Some(a) = after {
            self.fs.after_release(a);
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let mut out = FuseDir(reply);
        let _deadline = ckptfs_store::deadline::Scope::begin();
        match self.fs.readdir(fh.0, offset, &mut out) {
            Ok(()) => out.0.ok(),
            Err(e) => out.0.error(self.errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        match self.fs.getxattr(ino.0, name) {
            Ok(v) => reply_xattr(reply, &v, size),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        match self.fs.listxattr(ino.0) {
            Ok(v) => reply_xattr(reply, &v, size),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        match self.fs.setxattr(ino.0, name, value, flags) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _as = self.fs.on_behalf(req.uid(), req.gid(), req.pid());
        match self.fs.removexattr(ino.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.errno(&e)),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permission checks are the kernel's (`default_permissions`).
        reply.ok();
    }
}
