//! `setattr`: mode, owner, size and times.
//!
//! A size change of an `X.safetensors` stages it first (a truncated archive
//! is a new version); everything else is applied to the backing file.

use crate::handles::{Handle, PlainHandle};
use crate::inode::NodeKind;
use crate::resolve::not_found_is;
use crate::sys::timespec;
use crate::{Attr, CheckpointFs, FsError, Result, SetAttr};

impl CheckpointFs {
    /// `setattr`: mode, owner, size and times, through `fh` when given.
    pub fn setattr(&self, ino: u64, a: SetAttr, fh: Option<u64>) -> Result<Attr> {
        let spool = self.spool()?;
        let inode = self.inode(ino)?;
        let handle_file = fh
            .and_then(|f| self.handle(f).ok())
            .and_then(|h| match &*h {
                Handle::Plain(PlainHandle { file, ino: hi, .. }) if *hi == ino => {
                    Some(file.clone())
                }
                _ => None,
            });
        match inode.kind() {
            NodeKind::Blz
            | NodeKind::BlzDir { .. }
            | NodeKind::BlzFile { .. }
            | NodeKind::GgufView => return Err(FsError::ReadOnly),
            _ => {}
        }
        if let Some(size) = a.size {
            let kind = inode.kind();
            match kind {
                NodeKind::Directory => return Err(FsError::IsADirectory),
                NodeKind::Plain if self.stages(&inode.loc().name) && handle_file.is_none() => {
                    let rel = self.rel(&inode)?;
                    if self.store.lstat(&rel).is_ok_and(|m| m.is_file()) {
                        let id = self.stage_plain(spool, &inode)?;
                        self.truncate_staged(spool, id, size, None)?;
                    }
                }
                NodeKind::Plain => match &handle_file {
                    Some(f) => f.set_len(size)?,
                    None => self
                        .store
                        .open_file(&self.rel(&inode)?, libc::O_WRONLY, 0)
                        .map_err(not_found_is)?
                        .set_len(size)?,
                },
                NodeKind::Staged { id } => {
                    self.truncate_staged(spool, id, size, handle_file.as_deref())?
                }
                NodeKind::Archive => {
                    let id = self.stage_archive(spool, &inode, size == 0)?;
                    self.truncate_staged(spool, id, size, None)?;
                }
                NodeKind::Blz
                | NodeKind::BlzDir { .. }
                | NodeKind::BlzFile { .. }
                | NodeKind::GgufView => {
                    unreachable!("refused above")
                }
            }
        }
        if a.uid.is_some()
            || a.gid.is_some()
            || a.mode.is_some()
            || a.atime.is_some()
            || a.mtime.is_some()
        {
            // Under `ns`: a commit moving the staged file to its archive
            // either ran before (the change goes to the archive) or runs
            // after (it copies the staged file's new attributes), never in
            // between.
            let _g = self.ns.lock();
            let rel = self.rel(&inode)?;
            if a.uid.is_some() || a.gid.is_some() {
                let uid = a.uid.unwrap_or(u32::MAX);
                let gid = a.gid.unwrap_or(u32::MAX);
                self.store.lchown(&rel, uid, gid)?;
            }
            if let Some(mode) = a.mode {
                self.store.chmod(&rel, mode & 0o7777)?;
            }
            if a.atime.is_some() || a.mtime.is_some() {
                self.store
                    .utimens(&rel, &[timespec(a.atime), timespec(a.mtime)])?;
            }
        }
        self.getattr_fh(ino, fh)
    }
}
