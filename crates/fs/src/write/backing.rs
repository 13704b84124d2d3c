//! Changes of STORE's files, made remotely first when the store has a
//! sink (see `crate::sink`): the local change follows a remote
//! success, so a failure leaves both as they were.

use crate::{CheckpointFs, FsError, Result};
use std::path::Path;

impl CheckpointFs {
    /// Removes STORE file `rel`.
    pub(super) fn unlink_backing(&self, rel: &Path) -> std::io::Result<()> {
        if let Some(s) = &self.sink {
            s.remove(rel)?;
        }
        self.store.unlink(rel)
    }

    /// Renames STORE file `from` to `to` (replacing it).
    pub(super) fn rename_backing(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        if let Some(s) = &self.sink {
            s.copy(from, to)?;
        }
        if let Err(e) = self.store.rename(from, to) {
            if let Some(s) = &self.sink {
                s.unpublish(to);
            }
            return Err(e);
        }
        if let Some(s) = &self.sink {
            s.moved(from, to, &self.store.path().join(to));
        }
        Ok(())
    }

    /// Moves STORE file `rel` out to `dest` (into the spool). `keeps`: the
    /// name stays presented (by the staged copy), so its remote copy stays
    /// until the staged one is committed over it; else it is removed.
    pub(super) fn take_backing(&self, rel: &Path, dest: &Path, keeps: bool) -> std::io::Result<()> {
        if let Some(s) = &self.sink {
            s.fill(rel, &self.store.path().join(rel))?;
        }
        self.store.rename_out(rel, dest)?;
        if !keeps {
            if let Some(s) = &self.sink {
                // The bytes are safe in the spool; a failure leaves a stale
                // object behind, logged.
                if let Err(e) = s.remove(rel) {
                    log::error!("{}: {e}", rel.display());
                }
            }
        }
        Ok(())
    }

    /// Renaming a directory of a store with a sink would be a copy of
    /// every object below it: refused with EXDEV (`mv` then copies).
    pub(super) fn check_dir_rename(&self) -> Result<()> {
        if self.sink.is_some() {
            return Err(FsError::Io(std::io::Error::from_raw_os_error(libc::EXDEV)));
        }
        Ok(())
    }

    /// Whether a regular file `name` written through the mount is staged:
    /// an `X.safetensors`, or any name when the store has a sink.
    pub(super) fn stages(&self, name: &std::ffi::OsStr) -> bool {
        self.sink.is_some() || crate::namespace::is_staging_name(name)
    }
}
