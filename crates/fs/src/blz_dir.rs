//! `.blz` model archives presented as read-only directories.
//!
//! `X.blz` is shown as a directory `X` holding the archive's files (exact
//! sizes, subdirectories), whatever the archive's kind: ckptfs's own `.blz`
//! or BLAZE-X's, told apart by magic in `archive::open`. Nothing here knows
//! the kind: everything goes through [`ArchiveView`]. Entries inside are virtual inodes
//! (`NodeKind::BlzDir` / `BlzFile`) that name the `.blz` inode
//! (`NodeKind::Blz`, whose state holds the parsed archive of the version
//! last seen, one generation per version) and carry the `.blz` file's
//! identity, so they follow the same numbering and replacement rules as
//! every other inode. Their attributes are the `.blz`'s owner and times with
//! its read permissions only (directories add `x` where `r` is set).
//!
//! A file inside is opened as an archive handle over (archive, file index)
//! (see `read`) and read through the same block cache and prefetch as a
//! `.zstn`; blocks are keyed by (generation, blob, block), so a tensor shared
//! by several shards is cached once. A `.blz` that cannot be parsed is still
//! listed as a directory; `opendir` and `lookup` in it fail with EIO and log
//! the file and reason. Nothing inside can be changed (EROFS).
//!
//! Lookups, listings and sizes go through the archive's path index
//! ([`ckptfs_archive::path_index`]): a binary search and the entries under
//! one directory, never a scan of every file (a `.blz` may hold 10^6).

use super::archive_slot::{version_of, Slot};
use super::attr::attr_from_meta;
use super::dir::dot_entries;
use super::handles::{DirItem, Handle};
use super::inode::{Inode, NodeKind};
use super::resolve::not_found_is;
use super::{Attr, CheckpointFs, Entry, FileKind, FsError, Result};
use ckptfs_archive::ArchiveView;
use std::ffi::OsStr;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

impl CheckpointFs {
    /// The `.blz` inode behind a `Blz`/`BlzDir`/`BlzFile` inode, and the
    /// inode's path inside the archive ("" for the archive's root).
    pub(super) fn blz_root(&self, inode: &Arc<Inode>) -> Result<(Arc<Inode>, String)> {
        let root = match inode.kind() {
            NodeKind::Blz => return Ok((inode.clone(), String::new())),
            NodeKind::BlzDir { root } | NodeKind::BlzFile { root } => self.inode(root)?,
            NodeKind::Directory
            | NodeKind::Archive
            | NodeKind::Plain
            | NodeKind::Staged { .. }
            | NodeKind::GgufView => return Err(FsError::NotFound),
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
        let identity = root.identity();
        let rel = self.rel(root)?;
        let m = self.store.lstat(&rel).map_err(not_found_is)?;
        if (m.dev(), m.ino()) != identity {
            return Err(FsError::Stale);
        }
        // Nothing else is locked under `state` (see the lock order in `fs`).
        let mut st = root.state();
        if let Some(s) = &st.blz {
            if s.version == version_of(&m) {
                return Ok((s.clone(), m));
            }
        }
        let (slot, fm) = self.parse_backing(&rel, &path, identity, true)?;
        st.blz = Some(slot.clone());
        Ok((slot, fm))
    }

    /// Like [`Self::blz_slot`], but an unparseable archive is EIO (logged).
    pub(super) fn blz_archive(
        &self,
        root: &Inode,
    ) -> Result<(Arc<dyn ArchiveView>, u64, Metadata)> {
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
    /// metadata `m`: read-only, owner and times of the `.blz`. `blocks`:
    /// 512-byte blocks charged to it (see [`stored_share`]).
    fn blz_entry_attr(ino: u64, m: &Metadata, dir: bool, size: u64, blocks: u64) -> Attr {
        let mut a = attr_from_meta(ino, m, size);
        a.blocks = blocks;
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
    pub(super) fn blz_attr(&self, inode: &Arc<Inode>) -> Result<Attr> {
        let (root, inner) = self.blz_root(inode)?;
        let attr = match inode.kind() {
            NodeKind::BlzFile { .. } => {
                let (a, _, m) = self.blz_archive(&root)?;
                let i = a.find(&inner).ok_or(FsError::Stale)?;
                let size = a.logical_len(i);
                Self::blz_entry_attr(inode.ino, &m, false, size, stored_share(&*a, &m, size))
            }
            _ => {
                let (_, m) = self.blz_slot(&root)?;
                Self::blz_entry_attr(inode.ino, &m, true, 4096, 0)
            }
        };
        inode.state().attr = Some(attr);
        Ok(attr)
    }

    /// `lookup` in a `.blz` directory.
    pub(super) fn lookup_blz(&self, p: &Arc<Inode>, name: &OsStr) -> Result<Entry> {
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
        } else if a.is_dir(&path) {
            (NodeKind::BlzDir { root: root.ino }, None)
        } else {
            return Err(FsError::NotFound);
        };
        // Counted under the table's lock, as every lookup (see `assign_if`).
        let inode = self
            .inodes
            .assign_if(p.ino, name, name, kind, root.identity(), || true, true)
            .expect("unconditional");
        let attr = match attr_of {
            Some(size) => {
                Self::blz_entry_attr(inode.ino, &m, false, size, stored_share(&*a, &m, size))
            }
            None => Self::blz_entry_attr(inode.ino, &m, true, 4096, 0),
        };
        inode.state().attr = Some(attr);
        Ok(Entry {
            attr,
            ttl: self.ttl,
        })
    }

    /// `opendir` of a `.blz` directory: its files and subdirectories.
    pub(super) fn opendir_blz(&self, d: &Arc<Inode>) -> Result<u64> {
        let (root, inner) = self.blz_root(d)?;
        let (a, _, _) = self.blz_archive(&root)?;
        if !inner.is_empty() && !a.is_dir(&inner) {
            return Err(FsError::Stale);
        }
        // By the archive's path index: only the entries under `inner`.
        let kids = a.children(&inner);
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
}

/// The 512-byte blocks charged to a file of `size` bytes inside archive
/// `a` (whose backing file has metadata `m`): its share of the blocks the
/// archive occupies, in proportion to its size, so that `du` of the
/// directory adds up to the archive's own `du`.
fn stored_share(a: &dyn ArchiveView, m: &Metadata, size: u64) -> u64 {
    let total = a.total_logical_len();
    if total == 0 {
        return 0;
    }
    (m.blocks() as u128 * size as u128).div_ceil(total as u128) as u64
}
