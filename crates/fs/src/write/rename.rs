//! `rename(2)`.
//!
//! A rename moves the inode (the kernel keeps its number for the new name)
//! and whatever the backing needs: a directory moves with its staged files;
//! a file renamed to an `X.safetensors` name becomes a compression
//! candidate (staged); a staged file stays staged under any name (its
//! content decides at commit); an archive keeps its archive under the new
//! name (`Y.zstn` for `Y.safetensors`, `N.zsame` for any other `N`); a
//! `.blz` directory `X` renamed to `Y` is STORE's `X.blz` renamed to
//! `Y.blz` (over an empty directory `Y` too). What
//! cannot be presented under the new name is refused (see each arm).
//! Delta relations survive (`relations`): a replaced base has its
//! dependents made standalone first, and recorded base paths the move
//! changes are journalled, then rewritten.

use crate::inode::{Inode, NodeKind};
use crate::namespace;
use crate::spool::Spool;
use crate::{CheckpointFs, FsError, Result};
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

impl CheckpointFs {
    /// `rename(2)`. `flags`: `RENAME_NOREPLACE` is honoured;
    /// `RENAME_EXCHANGE` and `RENAME_WHITEOUT` are refused with EINVAL.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return Err(FsError::UnsupportedRenameFlags(flags));
        }
        let (p, rel) = self.writable_dir(parent)?;
        let (np, nrel) = self.writable_dir(newparent)?;
        let spool = self.spool()?;
        let _g = self.ns.lock();
        let (backing, kind, meta) = self.resolve(&p, name)?;
        let dst = match self.resolve(&np, newname) {
            Ok(d) => Some(d),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        self.check_new_name(&nrel, newname, kind.is_dir())?;
        if parent == newparent && name == newname {
            return Ok(());
        }
        if let Some((_, dkind, dmeta)) = &dst {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(FsError::Exists);
            }
            if (dmeta.dev(), dmeta.ino()) == (meta.dev(), meta.ino()) {
                // Two names of one file: rename(2) does nothing.
                return Ok(());
            }
            match (kind.is_dir(), dkind.is_dir()) {
                (true, false) => return Err(FsError::NotADirectory),
                (false, true) => return Err(FsError::IsADirectory),
                _ => {}
            }
            if *dkind == NodeKind::Blz {
                return Err(FsError::NotEmpty);
            }
            if *dkind == NodeKind::Directory && !spool.ids_under(&nrel.join(newname)).is_empty() {
                return Err(FsError::NotEmpty);
            }
        }
        // What the rename replaces or removes in STORE keeps its
        // dependents (made standalone first; see `relations`). A source
        // based on the destination is one of them: look it up again.
        let staging = namespace::is_staging_name(newname);
        let moving_plain_in = kind == NodeKind::Plain && staging && meta.is_file();
        let released = match kind {
            NodeKind::Directory | NodeKind::Blz => None,
            NodeKind::Archive => Some(nrel.join(self.renamed_archive(&nrel, newname, &backing))),
            _ => Some(nrel.join(newname)),
        };
        if let Some(d) = &released {
            if *d != rel.join(&backing) {
                self.release_if_base(d)?;
            }
        }
        if moving_plain_in {
            self.release_if_base(&rel.join(&backing))?;
        }
        let (backing, kind, meta) = self.resolve(&p, name)?;
        let identity = (meta.dev(), meta.ino());
        // Recorded base paths that the move changes: journalled first,
        // rewritten after.
        let moved = match kind {
            NodeKind::Directory => Some(nrel.join(newname)),
            NodeKind::Archive => Some(nrel.join(self.renamed_archive(&nrel, newname, &backing))),
            NodeKind::Plain if !moving_plain_in => Some(nrel.join(newname)),
            _ => None,
        };
        let fixes = match &moved {
            Some(to) => {
                let f = self.plan_rename(&rel.join(&backing), to);
                self.begin_rename(&rel.join(&backing), to, &f)?;
                f
            }
            None => Vec::new(),
        };
        // A staged version the new name showed before: removed once the
        // new file presents the name (the spool's index then points at
        // the new one, so `clear_name` no longer finds it).
        let replaced_staged = spool
            .find(&nrel.join(newname))
            .map(|(id, _)| id)
            .filter(|_| dst.is_some());
        let replaced = dst
            .as_ref()
            .and_then(|(_, dkind, dmeta)| self.keep_replaced(newparent, newname, *dkind, dmeta));
        let moved_out = (|| -> Result<(OsString, NodeKind, _)> {
            Ok(match kind {
                NodeKind::Directory => {
                    self.check_dir_rename()?;
                    self.store
                        .rename(&rel.join(&backing), &nrel.join(newname))?;
                    spool.move_dir(&rel.join(name), &nrel.join(newname))?;
                    (newname.to_os_string(), kind, identity)
                }
                NodeKind::Blz => {
                    let mut b = newname.to_os_string();
                    b.push(".blz");
                    if self.store.lstat(&nrel.join(&b)).is_ok() {
                        return Err(FsError::Exists);
                    }
                    // `X` -> `Y` renames `X.blz` to `Y.blz`. A target that is
                    // an empty directory is replaced, as rename(2) replaces
                    // one directory by another; rmdir answers ENOTEMPTY for a
                    // full one (staged files were checked above). The archive
                    // itself moves in one renameat; if that fails the target
                    // directory is put back.
                    let emptied = match &dst {
                        Some((_, NodeKind::Directory, dmeta)) => {
                            let d = nrel.join(newname);
                            self.store.rmdir(&d)?;
                            Some((d, dmeta.mode() & 0o7777))
                        }
                        _ => None,
                    };
                    if let Err(e) = self.rename_backing(&rel.join(&backing), &nrel.join(&b)) {
                        if let Some((d, mode)) = emptied {
                            let _ = self.store.mkdir(&d, mode);
                        }
                        return Err(e.into());
                    }
                    (b, kind, identity)
                }
                NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } | NodeKind::GgufView => {
                    return Err(FsError::ReadOnly)
                }
                NodeKind::Plain if staging && meta.is_file() => {
                    // `a.safetensors.incomplete` -> `a.safetensors`: a new
                    // compression candidate.
                    self.store.may_write_dir(&rel)?;
                    self.store.may_write_dir(&nrel)?;
                    let id = spool.adopt(&nrel.join(newname), |d| {
                        self.take_backing(&rel.join(&backing), d, false)
                    })?;
                    self.clear_name(&nrel, newname, None, Some(id))?;
                    remove_replaced(spool, replaced_staged, id)?;
                    if self.writer_count(identity) == 0 {
                        self.schedule(id);
                    }
                    (newname.to_os_string(), NodeKind::Staged { id }, identity)
                }
                NodeKind::Plain => {
                    self.rename_backing(&rel.join(&backing), &nrel.join(newname))?;
                    self.clear_name(&nrel, newname, Some(newname), None)?;
                    (newname.to_os_string(), kind, identity)
                }
                NodeKind::Staged { id } => {
                    // Staged under any name: compressed after its last close
                    // if its content is safetensors, else put back plain.
                    spool.retarget(id, &nrel.join(newname))?;
                    // The version it replaced at the old name goes with it.
                    self.clear_name(&rel, name, None, Some(id))?;
                    self.clear_name(&nrel, newname, None, Some(id))?;
                    remove_replaced(spool, replaced_staged, id)?;
                    (newname.to_os_string(), kind, identity)
                }
                // `X.zstn` under an `Y.safetensors` name is `Y.zstn`, under
                // any other name `N` it is `N.zsame` (and back).
                NodeKind::Archive => {
                    let z = self.renamed_archive(&nrel, newname, &backing);
                    self.rename_backing(&rel.join(&backing), &nrel.join(&z))?;
                    self.clear_name(&nrel, newname, Some(&z), None)?;
                    (z, kind, identity)
                }
            })
        })();
        let (new_backing, new_kind, new_identity) = match moved_out {
            Ok(v) => v,
            Err(e) => {
                // Nothing moved, or part of it: settle the journal now.
                self.settle_journal();
                return Err(e);
            }
        };
        if let Some((inode, file)) = replaced {
            inode.state().replaced = Some(Arc::new(file));
        }
        let synced = self.store.sync_dir(&nrel).and_then(|()| {
            if rel != nrel {
                self.store.sync_dir(&rel)
            } else {
                Ok(())
            }
        });
        self.finish_rename(&fixes)?;
        synced?;
        match self.inodes.find(parent, name) {
            Some(i) => {
                self.inodes.rename(
                    i.ino,
                    newparent,
                    newname,
                    new_backing,
                    new_kind,
                    new_identity,
                );
                if let NodeKind::Staged { id } = new_kind {
                    spool.set_ino(id, i.ino);
                }
            }
            None => self.inodes.remove_name(newparent, newname),
        }
        Ok(())
    }
}

impl CheckpointFs {
    /// Keeps what an open racing a rename over `newname` needs to read
    /// the file the rename replaces (the kernel resolved the name before
    /// the rename and opens the inode it found), as rename(2) allows,
    /// instead of failing with ESTALE: the kernel looks the name up again
    /// once only, and a second rename-over meanwhile made the error reach
    /// the caller. An archive is served its parsed version (parsed here if
    /// it was not yet). A plain or staged regular file is returned opened,
    /// with its inode, to be kept there (`InodeState::replaced`) until the
    /// kernel forgets the inode: its space is freed once the last racing
    /// open closes, as for an unlinked open file. Nothing when the kernel
    /// has no inode for the name or the file cannot be opened (such an
    /// open answers ESTALE, as before).
    fn keep_replaced(
        &self,
        newparent: u64,
        newname: &OsStr,
        kind: NodeKind,
        meta: &std::fs::Metadata,
    ) -> Option<(Arc<Inode>, std::fs::File)> {
        let identity = (meta.dev(), meta.ino());
        let inode = self
            .inodes
            .find(newparent, newname)
            .filter(|i| i.identity() == identity && meta.is_file() && i.state().lookups > 0)?;
        match kind {
            NodeKind::Archive => {
                // A failed parse is kept as its reason: nothing to serve.
                let _ = self.archive_slot(&inode, meta);
                return None;
            }
            NodeKind::Plain | NodeKind::Staged { .. } => {}
            _ => return None,
        }
        // Non-blocking: a FIFO put at the path meanwhile must not block
        // the rename (it is refused below by its identity).
        let file = self
            .store
            .open_file(
                &self.rel(&inode).ok()?,
                libc::O_RDONLY | libc::O_NONBLOCK,
                0,
            )
            .ok()?;
        let m = file.metadata().ok()?;
        ((m.dev(), m.ino()) == identity && m.is_file()).then_some((inode, file))
    }

    /// The backing name archive `backing` takes when renamed to `newname`
    /// in `dir`: a delta (`X.z4dm`) stays a `.z4dm` under an
    /// `Y.safetensors` name; other archives as [`Self::archive_name_in`].
    fn renamed_archive(&self, dir: &std::path::Path, newname: &OsStr, backing: &OsStr) -> OsString {
        use std::os::unix::ffi::OsStrExt;
        if backing.as_bytes().ends_with(namespace::DELTA_SUFFIX)
            && namespace::is_staging_name(newname)
        {
            return namespace::delta_name_for(newname);
        }
        self.archive_name_in(dir, newname)
    }
}

/// Removes staged version `old` that a rename replaced by staged `new`.
fn remove_replaced(spool: &Spool, old: Option<u64>, new: u64) -> Result<()> {
    match old {
        Some(o) if o != new => Ok(spool.remove(o)?),
        _ => Ok(()),
    }
}
