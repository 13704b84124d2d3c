//! Extended attributes.
//!
//! Directories, plain files and staged files pass `user.*` attributes
//! through to their backing file (get, set, list, remove), so `cp -a` and
//! `cp --preserve=xattr` into the mount keep them. Other namespaces are
//! not passed through (ENOTSUP to set, left out of the list).
//!
//! An archive (a `.zstn` presented as `.safetensors`) answers the
//! `user.ckptfs.*` attributes below by name: its stored size, compression
//! ratio, format and checksums, or, for an archive that cannot be parsed,
//! its stored size and the reason; a delta (`X.z4dm`) also its base
//! (`user.ckptfs.base`, the recorded path relative to its directory). They describe the stored archive, not
//! the bytes read, so `listxattr` leaves them out: `cp -a` out of the mount
//! does not copy them onto the decoded copy, where they would be false.
//! `getfattr -n NAME` and `ckptfs info MNT/path` still show them. Nothing
//! is decoded to answer them. Archives and `.blz` entries keep no
//! attributes of their own: setting or removing one is ENOTSUP.
//!
//! The mount's root answers `user.ckptfs.stats` by name (also not listed):
//! the daemon's counters ([`super::stats`]), for `ckptfs stats`,
//! benchmarks and tests, to the mount's owner and root only (EACCES to
//! other users of an `--allow-other` mount); the STORE directory's own
//! attribute of that name, if any, is hidden.

use super::inode::{NodeKind, ROOT_INO};
use super::resolve::not_found_is;
use super::stats::XATTR_STATS;
use super::{CheckpointFs, FsError, Result};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

/// The namespace passed through to backing files.
const USER: &[u8] = b"user.";

/// Extended attributes an archive answers (by name only).
pub const XATTR_STORED_SIZE: &str = "user.ckptfs.stored_size";

pub const XATTR_RATIO: &str = "user.ckptfs.ratio";

pub const XATTR_FORMAT: &str = "user.ckptfs.format";

pub const XATTR_CHECKSUMS: &str = "user.ckptfs.checksums";

pub const XATTR_ERROR: &str = "user.ckptfs.error";

/// A delta's base: its stored path relative to the delta's directory.
pub const XATTR_BASE: &str = "user.ckptfs.base";

impl CheckpointFs {
    /// Where an inode's attributes come from.
    fn xattr_source(&self, ino: u64) -> Result<Source> {
        let inode = self.inode(ino)?;
        Ok(match inode.kind() {
            NodeKind::Directory | NodeKind::Plain | NodeKind::Staged { .. } => {
                Source::Backing(self.rel(&inode)?)
            }
            NodeKind::Archive => Source::Archive,
            NodeKind::Blz
            | NodeKind::BlzDir { .. }
            | NodeKind::BlzFile { .. }
            | NodeKind::GgufView => Source::None,
        })
    }

    /// The `user.ckptfs.*` attributes of archive `ino`, as (name, value).
    fn archive_xattrs(&self, ino: u64) -> Result<Vec<(&'static str, String)>> {
        let inode = self.inode(ino)?;
        let m = self.store.lstat(&self.rel(&inode)?).map_err(not_found_is)?;
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
                let mut v = vec![
                    (XATTR_STORED_SIZE, a.stored_len().to_string()),
                    (XATTR_RATIO, format!("{ratio:.3}")),
                    (XATTR_FORMAT, a.kind().format_name().to_string()),
                    (XATTR_CHECKSUMS, a.checksums().unwrap_or("none").to_string()),
                ];
                if let Some(b) = a.base_path() {
                    v.push((XATTR_BASE, b.to_string()));
                }
                v
            }
            Err(reason) => vec![
                (XATTR_STORED_SIZE, m.len().to_string()),
                (XATTR_ERROR, reason.to_string()),
            ],
        })
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>> {
        if ino == ROOT_INO && name.as_bytes() == XATTR_STATS.as_bytes() {
            // The mount's owner's (and root's): with --allow-other, other
            // users see the files, not what the daemon has served.
            if let Some(c) = super::beneath::current_caller() {
                // SAFETY: geteuid has no preconditions.
                let owner = unsafe { libc::geteuid() };
                if c.uid != 0 && c.uid != owner {
                    return Err(FsError::Io(std::io::Error::from_raw_os_error(libc::EACCES)));
                }
            }
            return Ok(self.read_stats().into_bytes());
        }
        match self.xattr_source(ino)? {
            Source::Backing(rel) if is_user(name) => {
                self.store.getxattr(&rel, name).map_err(no_xattr)
            }
            Source::Backing(_) | Source::None => Err(FsError::NoXattr),
            Source::Archive => self
                .archive_xattrs(ino)?
                .into_iter()
                .find(|(n, _)| n.as_bytes() == name.as_bytes())
                .map(|(_, v)| v.into_bytes())
                .ok_or(FsError::NoXattr),
        }
    }

    /// Attribute names, each NUL-terminated (the listxattr(2) format):
    /// the backing file's `user.*` ones; none for archives (see above).
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        match self.xattr_source(ino)? {
            Source::Backing(rel) => {
                let all = self.store.listxattr(&rel)?;
                let mut out = Vec::new();
                for n in all.split(|&b| b == 0).filter(|n| n.starts_with(USER)) {
                    out.extend_from_slice(n);
                    out.push(0);
                }
                Ok(out)
            }
            Source::Archive | Source::None => Ok(Vec::new()),
        }
    }

    /// `setxattr(2)`; `flags` are `XATTR_CREATE` / `XATTR_REPLACE`.
    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        let rel = self.xattr_target(ino, name)?;
        Ok(self.store.setxattr(&rel, name, value, flags)?)
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> Result<()> {
        let rel = self.xattr_target(ino, name)?;
        self.store.removexattr(&rel, name).map_err(no_xattr)
    }

    /// The backing file whose attribute `name` may be changed.
    fn xattr_target(&self, ino: u64, name: &OsStr) -> Result<std::path::PathBuf> {
        if self.read_only {
            return Err(FsError::ReadOnly);
        }
        match self.xattr_source(ino)? {
            Source::Backing(rel) if is_user(name) => Ok(rel),
            Source::Backing(_) | Source::Archive | Source::None => Err(FsError::XattrUnsupported),
        }
    }
}

enum Source {
    /// Passed through to this file (relative to STORE).
    Backing(std::path::PathBuf),
    /// `user.ckptfs.*`, by name only.
    Archive,
    /// No attributes.
    None,
}

fn is_user(name: &OsStr) -> bool {
    name.as_bytes().starts_with(USER)
}

/// ENODATA from the backing file is the mount's own "no such attribute".
fn no_xattr(e: std::io::Error) -> FsError {
    if e.raw_os_error() == Some(libc::ENODATA) {
        FsError::NoXattr
    } else {
        FsError::Io(e)
    }
}
