//! The rename journal (see `super`): a rename that changes a recorded
//! base path is written to the spool's `relations.journal` (from, to, and
//! each moved delta's new base path, NUL-separated) before it happens;
//! the trailers are rewritten after it and the journal removed. A daemon
//! that starts with a journal left finishes it if the rename happened,
//! and drops it otherwise.

use super::base_path_for;
use crate::{CheckpointFs, Result};
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The rename journal's name in the spool.
const JOURNAL: &str = "relations.journal";

impl CheckpointFs {
    /// The trailer rewrites a rename of STORE path `from` to `to` (a file
    /// or a directory) needs: (delta's path after the rename, new base
    /// path).
    pub(crate) fn plan_rename(&self, from: &Path, to: &Path) -> Vec<(PathBuf, String)> {
        let map = |p: &Path| match p.strip_prefix(from) {
            Ok(s) if s.as_os_str().is_empty() => to.to_path_buf(),
            Ok(s) => to.join(s),
            Err(_) => p.to_path_buf(),
        };
        let mut fixes = Vec::new();
        for r in self.relations() {
            let (d, b) = (map(&r.delta), map(&r.base));
            if d == r.delta && b == r.base {
                continue;
            }
            match base_path_for(&d, &b) {
                Ok(p) if p != r.recorded => fixes.push((d, p)),
                Ok(_) => {}
                Err(e) => log::warn!("{}: base path not kept: {e}", d.display()),
            }
        }
        fixes
    }

    /// Records `fixes` for a rename of `from` to `to` before it happens.
    pub(crate) fn begin_rename(
        &self,
        from: &Path,
        to: &Path,
        fixes: &[(PathBuf, String)],
    ) -> Result<()> {
        if fixes.is_empty() {
            return Ok(());
        }
        let mut v = Vec::new();
        for p in [from.as_os_str(), to.as_os_str()] {
            v.extend_from_slice(p.as_bytes());
            v.push(0);
        }
        for (d, b) in fixes {
            v.extend_from_slice(d.as_os_str().as_bytes());
            v.push(0);
            v.extend_from_slice(b.as_bytes());
            v.push(0);
        }
        let spool = self.spool()?;
        let tmp = spool.dir().join(format!("{JOURNAL}.tmp"));
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&v)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, spool.dir().join(JOURNAL))?;
        ckptfs_format::fsutil::sync_dir(spool.dir())?;
        Ok(())
    }

    /// After the rename: rewrites the trailers, then drops the journal.
    pub(crate) fn finish_rename(&self, fixes: &[(PathBuf, String)]) -> Result<()> {
        if fixes.is_empty() {
            return Ok(());
        }
        crate::hooks::pause("rename");
        for (d, b) in fixes {
            if self.store.lstat(d).is_ok() {
                if let Err(e) = self.retarget(d, b, None) {
                    // The journal stays: the next start tries again.
                    log::error!(
                        "{}: base path not rewritten to {b} after a rename ({e}); retried at the next start",
                        d.display()
                    );
                    return Ok(());
                }
            }
        }
        let spool = self.spool()?;
        std::fs::remove_file(spool.dir().join(JOURNAL))?;
        ckptfs_format::fsutil::sync_dir(spool.dir())?;
        Ok(())
    }

    /// At startup: finishes (or drops) a rename journal a crash left.
    pub(crate) fn recover_relations(&self) {
        let _g = self.ns.lock();
        self.settle_journal();
    }

    /// Finishes the rename journal if its rename happened, else drops it.
    /// Holds `ns`.
    pub(crate) fn settle_journal(&self) {
        let Ok(spool) = self.spool() else { return };
        let path = spool.dir().join(JOURNAL);
        let Ok(raw) = std::fs::read(&path) else {
            return;
        };
        let parts: Vec<PathBuf> = raw
            .split(|&b| b == 0)
            .map(|p| PathBuf::from(OsString::from_vec(p.to_vec())))
            .collect();
        // from, to, pairs, and the empty piece after the last NUL.
        if parts.len() < 3 || parts.len().is_multiple_of(2) {
            log::warn!("{}: damaged, ignored", path.display());
            let _ = std::fs::remove_file(&path);
            return;
        }
        let (from, to) = (&parts[0], &parts[1]);
        let fixes: Vec<(PathBuf, String)> = parts[2..parts.len() - 1]
            .chunks(2)
            .map(|c| (c[0].clone(), c[1].to_string_lossy().into_owned()))
            .collect();
        let done = self.store.lstat(from).is_err() && self.store.lstat(to).is_ok();
        if done {
            log::info!(
                "finishing the base paths of the rename of {} to {}",
                from.display(),
                to.display()
            );
            if let Err(e) = self.finish_rename(&fixes) {
                log::error!("{}: not finished: {e}", path.display());
            }
        } else {
            let _ = std::fs::remove_file(&path);
        }
    }
}
