//! Staging: moving a `.safetensors` that is being written into the spool.
//!
//! A plain `X.safetensors` is moved in as it is. Opening an existing
//! archive for writing stages an empty file (`O_TRUNC`) or a decoded copy
//! (copy-up); the archive stays in STORE until the new version is
//! committed, so handles that opened it keep reading it. Staging changes
//! the inode's backing, not its number. A truncate of a staged file counts
//! as a writer while it runs.

use crate::inode::{Inode, NodeKind};
use crate::resolve::not_found_is;
use crate::spool::Spool;
use crate::sys::is_root;
use crate::{CheckpointFs, FsError, Result};
use ckptfs_archive::ArchiveView;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;

impl CheckpointFs {
    /// Moves plain `X.safetensors` into the spool (it is being written),
    /// or a plain file of another name with safetensors content (`adopt`).
    pub(super) fn stage_plain(&self, spool: &Spool, inode: &Inode) -> Result<u64> {
        let _g = self.ns.lock();
        match inode.kind() {
            NodeKind::Staged { id } => return Ok(id),
            NodeKind::Plain => {}
            // Changed since the caller looked without `ns` (renamed into
            // the spool and committed, say): its backing is now an archive,
            // whose bytes must never become a staged file's content.
            _ => return Err(FsError::Stale),
        }
        let l = inode.loc();
        let parent = self.inode(l.parent)?;
        let target = self.rel(&parent)?.join(&l.name);
        let rel = self.rel(inode)?;
        let m = self.store.lstat(&rel).map_err(not_found_is)?;
        if !m.is_file() || (m.dev(), m.ino()) != inode.identity() {
            return Err(FsError::Stale);
        }
        self.store.may_write_dir(rel.parent().unwrap_or(&rel))?;
        let id = spool.adopt(&target, |d| self.take_backing(&rel, d, target == rel))?;
        spool.set_ino(id, inode.ino);
        let identity = spool.entry(id).ok_or(FsError::Stale)?.identity;
        inode.rebase(l.name.clone(), NodeKind::Staged { id }, identity);
        Ok(id)
    }

    /// Stages a new version of archive `inode`: empty when `truncate`,
    /// else a decoded copy (copy-up). The `.zstn` stays until the new
    /// version is committed.
    pub(super) fn stage_archive(
        &self,
        spool: &Spool,
        inode: &Inode,
        truncate: bool,
    ) -> Result<u64> {
        let _g = self.ns.lock();
        if let NodeKind::Staged { id } = inode.kind() {
            return Ok(id);
        }
        let path = self.full(inode)?;
        let m = self.store.lstat(&self.rel(inode)?).map_err(not_found_is)?;
        if (m.dev(), m.ino()) != inode.identity() {
            return Err(FsError::Stale);
        }
        let l = inode.loc();
        let parent = self.inode(l.parent)?;
        let target = self.rel(&parent)?.join(&l.name);
        let archive = if truncate {
            None
        } else {
            let slot = self.archive_slot(inode, &m)?;
            Some(slot.archive.map_err(|reason| {
                let e = FsError::BadArchive {
                    path: path.clone(),
                    reason,
                };
                log::error!("{e}");
                e
            })?)
        };
        let (id, file) = spool.create(&target, m.mode() & 0o7777, 0)?;
        let fill = || -> Result<()> {
            if is_root() {
                std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()))?;
            }
            if let Some(a) = &archive {
                copy_up(&**a, &file)?;
            }
            Ok(())
        };
        if let Err(e) = fill() {
            let _ = spool.remove(id);
            return Err(e);
        }
        let fm = file.metadata()?;
        spool.set_ino(id, inode.ino);
        inode.rebase(l.name, NodeKind::Staged { id }, (fm.dev(), fm.ino()));
        Ok(id)
    }

    /// Truncates staged file `id` (through `file` when the caller has it
    /// open) and queues it when nothing has it open for writing.
    pub(super) fn truncate_staged(
        &self,
        spool: &Spool,
        id: u64,
        size: u64,
        file: Option<&File>,
    ) -> Result<()> {
        let entry = spool.entry(id).ok_or(FsError::Stale)?;
        self.add_writer(entry.identity);
        spool.bump(id);
        let r = match file {
            Some(f) => f.set_len(size),
            None => OpenOptions::new()
                .write(true)
                .open(spool.data_path(id))
                .and_then(|f| f.set_len(size)),
        };
        self.writer_closed(entry.identity);
        r.map_err(not_found_is)
    }
}

/// Decodes all of `a` into `out` (copy-up of an archive opened for
/// writing).
fn copy_up(a: &dyn ArchiveView, out: &File) -> Result<()> {
    let len = a.logical_len(0);
    let mut buf = vec![0u8; 16 << 20];
    let mut off = 0u64;
    while off < len {
        let n = ((len - off) as usize).min(buf.len());
        let got = a
            .read_at(0, off, &mut buf[..n])
            .map_err(|e| FsError::Decode(Arc::new(e)))?;
        if got == 0 {
            return Err(a
                .integrity(format!("ended at byte {off} of {len} while copying it up"))
                .into());
        }
        out.write_all_at(&buf[..got], off)?;
        off += got as u64;
    }
    Ok(())
}
