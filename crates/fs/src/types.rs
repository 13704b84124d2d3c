//! The small types `CheckpointFs` speaks in: what its methods take and
//! answer. They carry no logic beyond conversions, so the FUSE adapter and
//! the tests can build and read them without touching anything else.

use std::ffi::OsStr;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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
    pub(super) fn from_mode(mode: u32) -> FileKind {
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
        /// Served here without the page cache (`FOPEN_DIRECT_IO`): an
        /// `O_DIRECT` open that is not passed through.
        direct_io: bool,
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

/// A time to set: now, or a given time.
#[derive(Debug, Clone, Copy)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The attribute changes of a `setattr`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

/// Who asks: the owner new files get (when the daemon runs as root).
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}
