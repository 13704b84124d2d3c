//! The filesystem's one error type and its errno mapping.
//!
//! Every errno the mount chooses has its own variant, so the exhaustive
//! match in [`FsError::errno`] lists each choice with its reason; `Io`
//! carries only errors passed through from the backing filesystem, with
//! their own errno.

use ckptfs_archive::ArchiveError;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum FsError {
    #[error("no such entry")]
    NotFound,
    /// The inode's path now names another file (replaced in STORE); the
    /// kernel retries the lookup on ESTALE.
    #[error("stale inode (the backing file was replaced)")]
    Stale,
    #[error("not a directory")]
    NotADirectory,
    #[error("is a directory")]
    IsADirectory,
    #[error("read-only file system")]
    ReadOnly,
    #[error("unknown file handle {0}")]
    BadHandle(u64),
    #[error("no such extended attribute")]
    NoXattr,
    #[error("extended attribute not supported here")]
    XattrUnsupported,
    #[error("{path}: cannot open archive: {reason}")]
    BadArchive { path: PathBuf, reason: Arc<String> },
    #[error("{0}")]
    Decode(Arc<ArchiveError>),
    #[error("decoder panicked")]
    DecodePanicked,
    #[error("name longer than 255 bytes")]
    NameTooLong,
    #[error("name reserved for the store's archives and spool")]
    ReservedName,
    #[error("hard links join plain files only, never under an X.safetensors name")]
    NotLinkable,
    #[error("file exists")]
    Exists,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid access mode (O_WRONLY and O_RDWR)")]
    BadAccessMode,
    #[error("unsupported rename flags {0:#x}")]
    UnsupportedRenameFlags(u32),
    #[error("not a symbolic link")]
    NotASymlink,
    #[error("path contains a NUL byte")]
    NulInPath,
    /// An error of the backing filesystem, answered with its own errno.
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl FsError {
    /// The errno answered to the kernel. Exhaustive on purpose: a new
    /// variant must choose its errno.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Stale => libc::ESTALE,
            FsError::NotADirectory => libc::ENOTDIR,
            FsError::IsADirectory => libc::EISDIR,
            FsError::ReadOnly => libc::EROFS,
            FsError::BadHandle(_) => libc::EBADF,
            FsError::NoXattr => libc::ENODATA,
            // Archives and `.blz` entries keep no attributes of their own,
            // and only `user.*` is passed through (doc/SEMANTICS.md).
            FsError::XattrUnsupported => libc::ENOTSUP,
            // Unreadable or corrupt data is an I/O error for the reader.
            FsError::BadArchive { .. } => libc::EIO,
            FsError::Decode(_) => libc::EIO,
            FsError::DecodePanicked => libc::EIO,
            // Checked before the backing call, which would answer the same.
            FsError::NameTooLong => libc::ENAMETOOLONG,
            // STORE uses these names for archives and the spool: creating
            // one would show up under another name (doc/SEMANTICS.md).
            FsError::ReservedName => libc::EPERM,
            // link(2)'s errno for directories; deliberate for archives and
            // staged files, which have no single backing file to link.
            FsError::NotLinkable => libc::EPERM,
            FsError::Exists => libc::EEXIST,
            // A `.blz` always has content; a directory may hold staged files
            // that STORE does not show.
            FsError::NotEmpty => libc::ENOTEMPTY,
            // open(2)'s errno for an access mode of both O_WRONLY and O_RDWR.
            FsError::BadAccessMode => libc::EINVAL,
            // rename(2)'s errno for RENAME_EXCHANGE / RENAME_WHITEOUT on a
            // filesystem without them.
            FsError::UnsupportedRenameFlags(_) => libc::EINVAL,
            // readlink(2)'s errno for an entry that is not a symlink.
            FsError::NotASymlink => libc::EINVAL,
            // The path cannot be passed to the C library (never from the
            // kernel, whose names have no NUL).
            FsError::NulInPath => libc::EINVAL,
            // Pass the backing filesystem's own errno through.
            FsError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

impl From<ArchiveError> for FsError {
    fn from(e: ArchiveError) -> Self {
        FsError::Decode(Arc::new(e))
    }
}

pub type Result<T> = std::result::Result<T, FsError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos() {
        assert_eq!(FsError::NotFound.errno(), libc::ENOENT);
        assert_eq!(
            FsError::Io(io::Error::from_raw_os_error(libc::EACCES)).errno(),
            libc::EACCES
        );
        assert_eq!(FsError::Io(io::Error::other("x")).errno(), libc::EIO);
        let bad = FsError::BadArchive {
            path: "/s/a.zstn".into(),
            reason: Arc::new("bad magic".into()),
        };
        assert_eq!(bad.errno(), libc::EIO);
        assert_eq!(bad.to_string(), "/s/a.zstn: cannot open archive: bad magic");
    }

    /// The errno of each deliberate choice (these used to travel as
    /// `Io(from_raw_os_error(..))`; the values must not change).
    #[test]
    fn deliberate_errnos() {
        let cases = [
            (FsError::NameTooLong, libc::ENAMETOOLONG),
            (FsError::ReservedName, libc::EPERM),
            (FsError::NotLinkable, libc::EPERM),
            (FsError::Exists, libc::EEXIST),
            (FsError::NotEmpty, libc::ENOTEMPTY),
            (FsError::BadAccessMode, libc::EINVAL),
            (
                FsError::UnsupportedRenameFlags(libc::RENAME_EXCHANGE),
                libc::EINVAL,
            ),
            (FsError::NotASymlink, libc::EINVAL),
            (FsError::NulInPath, libc::EINVAL),
        ];
        for (e, errno) in cases {
            assert_eq!(e.errno(), errno, "{e}");
        }
    }
}
