//! `unlink` and `rmdir`, and removing every backing a presented name has.
//!
//! Unlinking a file removes the staged copy, the archives that present it
//! (`X.zstn`, `N.zsame`) and a plain file of that name. A directory holding staged
//! files is not empty. A removed file that deltas depend on is released
//! instead (moved to the spool, its dependents rebased in the background;
//! `relations`).

use crate::inode::NodeKind;
use crate::namespace;
use crate::{CheckpointFs, FsError, Result};
use std::ffi::OsStr;
use std::io;
use std::path::Path;

impl CheckpointFs {
    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<()> {
        let (p, rel) = self.writable_dir(parent)?;
        let _g = self.ns.lock();
        let (backing, kind, _) = self.resolve(&p, name)?;
        match kind {
            NodeKind::Directory | NodeKind::Blz => return Err(FsError::IsADirectory),
            NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } | NodeKind::GgufView => {
                return Err(FsError::ReadOnly)
            }
            NodeKind::Plain => {
                self.release_if_base(&rel.join(&backing))?;
                // Gone already if it was released (moved to the spool).
                match self.unlink_backing(&rel.join(&backing)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(FsError::Io(e)),
                    _ => {}
                }
            }
            NodeKind::Archive | NodeKind::Staged { .. } => {
                self.clear_name(&rel, name, None, None)?;
            }
        }
        self.inodes.remove_name(parent, name);
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<()> {
        let (p, rel) = self.writable_dir(parent)?;
        let _g = self.ns.lock();
        let (backing, kind, _) = self.resolve(&p, name)?;
        match kind {
            NodeKind::Directory => {}
            // A `.blz` is a directory with content; it is removed by
            // unlinking the `.blz` in STORE.
            NodeKind::Blz => return Err(FsError::NotEmpty),
            NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } | NodeKind::GgufView => {
                return Err(FsError::ReadOnly)
            }
            NodeKind::Plain | NodeKind::Archive | NodeKind::Staged { .. } => {
                return Err(FsError::NotADirectory)
            }
        }
        let drel = rel.join(&backing);
        if !self.spool()?.ids_under(&drel).is_empty() {
            return Err(FsError::NotEmpty);
        }
        self.store.rmdir(&drel)?;
        self.inodes.remove_name(parent, name);
        Ok(())
    }

    /// Removes what presented `name` in `dir_rel` before, except `keep`
    /// (a backing name) and spool entry `keep_id`: a plain file of that
    /// name, its `.zstn` / `.zsame` archives, and a staged version.
    pub(super) fn clear_name(
        &self,
        dir_rel: &Path,
        name: &OsStr,
        keep: Option<&OsStr>,
        keep_id: Option<u64>,
    ) -> Result<()> {
        if let Some(s) = &self.spool {
            if let Some((id, _)) = s.find(&dir_rel.join(name)) {
                if Some(id) != keep_id {
                    s.remove(id)?;
                }
            }
        }
        let mut names = vec![name.to_os_string()];
        names.extend(
            namespace::archive_candidates(name)
                .into_iter()
                .filter(|c| !namespace::is_blz_name(c)),
        );
        for n in names {
            if Some(n.as_os_str()) == keep {
                continue;
            }
            let p = dir_rel.join(&n);
            match self.store.lstat(&p) {
                Ok(m) if !m.is_dir() => {
                    if m.is_file() {
                        self.release_base(&p)?;
                    }
                    match self.unlink_backing(&p) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => {
                            return Err(FsError::Io(e))
                        }
                        _ => {}
                    }
                }
                Ok(_) => {}
                // An object whose local file was staged (overwritten)
                // goes with the name.
                Err(_) => {
                    if let Some(s) = &self.sink {
                        s.remove(&p)?;
                    }
                }
            }
        }
        Ok(())
    }
}
