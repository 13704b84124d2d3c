//! The filesystem's one error type and its errno mapping.

use crate::archive::ArchiveError;
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
    #[error("{path}: cannot open archive: {reason}")]
    BadArchive { path: PathBuf, reason: Arc<String> },
    #[error("{0}")]
    Decode(Arc<ArchiveError>),
    #[error("decoder panicked")]
    DecodePanicked,
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
            // Unreadable or corrupt data is an I/O error for the reader.
            FsError::BadArchive { .. } => libc::EIO,
            FsError::Decode(_) => libc::EIO,
            FsError::DecodePanicked => libc::EIO,
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
}
