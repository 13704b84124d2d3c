//! The `user.ckptfs.*` extended attributes of an archive: its stored size,
//! compression ratio, format and checksums, or, for an archive that cannot
//! be parsed, its stored size and the reason. Every other inode has none.
//! Read-only; nothing is decoded to answer them.

use super::inode::NodeKind;
use super::resolve::not_found_is;
use super::{CheckpointFs, FsError, Result};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

/// Extended attributes an archive answers.
pub const XATTR_STORED_SIZE: &str = "user.ckptfs.stored_size";

pub const XATTR_RATIO: &str = "user.ckptfs.ratio";

pub const XATTR_FORMAT: &str = "user.ckptfs.format";

pub const XATTR_CHECKSUMS: &str = "user.ckptfs.checksums";

pub const XATTR_ERROR: &str = "user.ckptfs.error";

impl CheckpointFs {
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
}
