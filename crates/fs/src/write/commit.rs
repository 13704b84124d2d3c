//! Compressing a staged file and committing the result.
//!
//! After the last writer closes, the staged file is validated, packed to
//! `ID.zstn.tmp` in the spool with no lock held, fsynced and renamed to
//! `X.zstn` next to where it belongs; that directory is fsynced, whatever
//! the name presented before is removed, and only then the staged copy.
//! Invalid safetensors are moved back as a plain `X.safetensors` instead.
//! A version that changed during compression (a new writer, a truncate)
//! discards the result; the next close queues it again. On failure (out of
//! space, a failed upload) the staged file stays, served as it is, and the
//! error is logged; it is retried with back-off (`queue`). A panic in the
//! sink's upload is caught and is a failed upload: it never ends the
//! write-back thread.
//! The inode keeps its number and page cache: only its backing changes.

use super::delta_commit::PackedDelta;
use crate::inode::NodeKind;
use crate::namespace;
use crate::spool::{Entry as SpoolEntry, Spool};
use crate::sys::is_root;
use crate::{CheckpointFs, FsError, Result};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// A staged file packed into the spool's temporary file.
struct Packed {
    raw: u64,
    stored: u64,
    /// Stored as a delta (else a standalone archive).
    delta: Option<PackedDelta>,
}

impl CheckpointFs {
    /// Compresses staged file `id` and commits it, if nothing writes it.
    pub(super) fn commit(&self, id: u64) {
        let Some(spool) = &self.spool else { return };
        let Some(entry) = spool.begin_compress(id) else {
            return;
        };
        if self.writer_count(entry.identity) > 0 || self.is_open(entry.identity) {
            // Compressed after the last close (a passthrough handle must
            // not be open when the inode becomes an archive).
            spool.end_compress(id);
            return;
        }
        let t0 = std::time::Instant::now();
        let packed = self.compress_staged(spool, id, &entry);
        // Uploaded while the staged file is still marked as being read
        // (writers wait), with no lock held.
        let published = match &packed {
            Ok(p) => self.publish_staged(spool, id, &entry, p.is_some()),
            Err(_) => Ok(None),
        };
        spool.end_compress(id);
        let step = if packed.is_ok() {
            "upload"
        } else {
            "compression"
        };
        let packed = match packed.and_then(|p| published.map(|u| (p, u))) {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_file(spool.tmp_path(id));
                // Out of space, an upload refused: tried again with
                // back-off until it succeeds, while the file stays staged.
                let retry = self.writeback.retry_later(id, e.to_string());
                if spool.entry(id).is_none_or(|c| c.version != entry.version) {
                    // Renamed over or removed while it was being read: a
                    // later version (or nothing) is what the name shows now.
                    log::debug!(
                        "{}: superseded while compressing ({e})",
                        entry.target.display()
                    );
                    return;
                }
                self.stats.commit(false);
                let again = format!("; tried again in {} s", retry.as_secs());
                // An upload's message names the object (its URL).
                let name = match &self.sink {
                    Some(s) => s.describe(&entry.target),
                    None => entry.target.display().to_string(),
                };
                log::error!(
                    "{name}: {step} failed, the file stays staged at {} and readable{again}: {e}",
                    spool.data_path(id).display()
                );
                return;
            }
        };
        // Before `ns`: a `ckptfs hold` pauses this thread only.
        let _held = self.hold_commits(&entry.target);
        let _g = self.ns.lock();
        let current = spool.entry(id);
        // From the check for open handles to the inode's new kind: an open
        // either put its handle in the table before (and this commit stands
        // down) or finds the new kind and opens again.
        let _mode = current
            .as_ref()
            .and_then(|c| c.ino)
            .map(|i| self.open_mode(i));
        let (packed, published) = packed;
        if current.as_ref().map(|c| c.version) != Some(entry.version)
            || self.writer_count(entry.identity) > 0
            || self.is_open(entry.identity)
        {
            // Changed while compressing: the next close queues it again.
            let _ = std::fs::remove_file(spool.tmp_path(id));
            if let (Some(sink), Some((rel, _))) = (&self.sink, &published) {
                if current.is_none_or(|c| c.target != entry.target) {
                    // Removed or renamed meanwhile: nothing presents the
                    // object just uploaded.
                    sink.unpublish(rel);
                }
            }
            return;
        }
        let current = current.expect("checked");
        let how = packed.as_ref().map(|p| p.delta.as_ref());
        match self.commit_locked(spool, id, &current, how, published.as_ref()) {
            Ok(false) => {
                // The delta's base changed meanwhile: packed again.
                let _ = std::fs::remove_file(spool.tmp_path(id));
                self.schedule(id);
            }
            Ok(true) => {
                self.writeback.succeeded(id);
                self.stats.commit(true);
                // Not with a sink: a rewrite would have to be uploaded too.
                if self.delta_auto
                    && self.sink.is_none()
                    && matches!(packed, Some(Packed { delta: None, .. }))
                    && namespace::is_staging_name(current.target.file_name().unwrap_or_default())
                {
                    // Stored standalone: its predecessor may become a
                    // delta against it, in the background.
                    self.queue_family(&current.target);
                }
                if let Some(Packed { raw, stored, .. }) = packed {
                    log::info!(
                        "{}: compressed {} -> {} bytes (ratio {:.4}) in {:.2} s",
                        current.target.display(),
                        raw,
                        stored,
                        raw as f64 / stored.max(1) as f64,
                        t0.elapsed().as_secs_f64()
                    );
                }
            }
            Err(e) => {
                let _ = std::fs::remove_file(spool.tmp_path(id));
                if spool.entry(id).is_none_or(|c| c.version != entry.version) {
                    // Renamed over or removed while it was being read: a
                    // later version (or nothing) is what the name shows now.
                    log::debug!(
                        "{}: superseded while compressing ({e})",
                        entry.target.display()
                    );
                    return;
                }
                self.stats.commit(false);
                log::error!(
                    "{}: commit failed, the file stays staged and readable: {e}",
                    current.target.display()
                );
                self.writeback.retry_later(id, e.to_string());
            }
        }
    }

    /// Waits while `ckptfs hold` holds STORE, then keeps commits' shared
    /// lock until dropped (see `crate::hold`). A lock that cannot be
    /// taken at all is logged and does not stop the commit.
    pub(super) fn hold_commits(&self, target: &Path) -> Option<crate::hold::DirLock<'_>> {
        let dir = self.hold.as_ref()?;
        let waiting = || {
            log::info!(
                "{}: commit paused while `ckptfs hold` holds the store",
                target.display()
            )
        };
        match crate::hold::lock(dir, crate::hold::Mode::Shared, true, waiting) {
            Ok(g) => g,
            Err(e) => {
                log::warn!("cannot take the commit lock of the store ({e}); committing anyway");
                None
            }
        }
    }

    /// Packs the staged bytes into the spool's temporary file (with
    /// `--delta auto`, a delta when it pays, see `delta_commit`). None
    /// when the bytes are not valid safetensors (they will be kept as a
    /// plain file).
    fn compress_staged(
        &self,
        spool: &Spool,
        id: u64,
        entry: &SpoolEntry,
    ) -> io::Result<Option<Packed>> {
        let file = File::open(spool.data_path(id))?;
        let m = file.metadata()?;
        // SAFETY: nothing truncates the staged file while it is being
        // compressed: writers wait for `end_compress` (see the module doc).
        let map = if m.len() > 0 {
            Some(unsafe { memmap2::Mmap::map(&file) }?)
        } else {
            None
        };
        let bytes: &[u8] = map.as_deref().unwrap_or(&[]);
        if let Err(e) = ckptfs_format::safetensors::split_file(bytes) {
            if !namespace::is_staging_name(entry.target.file_name().unwrap_or_default()) {
                // Any file is staged when the store has a sink.
                return Ok(None);
            }
            log::warn!(
                "{}: not a valid safetensors file ({e}); kept in the store as a plain file",
                entry.target.display()
            );
            return Ok(None);
        }
        let tmp = spool.tmp_path(id);
        let out = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        let stats = {
            let mut w = io::BufWriter::with_capacity(4 << 20, &out);
            let s = ckptfs_pack::pack(bytes, &mut w, Default::default(), &|_| {})
                .map_err(io::Error::other)?;
            w.flush()?;
            s
        };
        let dtmp = spool.dir().join(format!("{id:016x}.z4dm.tmp"));
        let delta = self.pack_commit_delta(id, &entry.target, bytes, stats.stored_bytes, &dtmp);
        let (out, stored) = match &delta {
            Some(d) => {
                std::fs::rename(&dtmp, &tmp)?;
                (OpenOptions::new().write(true).open(&tmp)?, d.stored)
            }
            None => (out, stats.stored_bytes),
        };
        // The archive keeps the file's mode, owner and times (copied again
        // under `ns` at commit: a chmod made while packing is not lost).
        copy_attrs(&m, &out)?;
        out.sync_all()?;
        Ok(Some(Packed {
            raw: stats.raw_bytes,
            stored,
            delta,
        }))
    }

    /// Moves the compressed file (`how`: Some(None) standalone,
    /// Some(Some(_)) a delta) or, when `how` is None, the staged bytes to
    /// its final name and removes the staged copy. Holds `ns`. False when
    /// nothing was done because the delta's base changed since it was
    /// packed.
    fn commit_locked(
        &self,
        spool: &Spool,
        id: u64,
        entry: &SpoolEntry,
        how: Option<Option<&PackedDelta>>,
        published: Option<&(std::path::PathBuf, String)>,
    ) -> Result<bool> {
        let name = entry.target.file_name().ok_or(FsError::NotFound)?;
        let dir_rel = entry.target.parent().unwrap_or(Path::new(""));
        if !self.store.is_dir(dir_rel) {
            // Removed in STORE behind the mount's back: never drop data.
            self.store.create_dir_all(dir_rel)?;
        }
        let final_rel = dir_rel.join(match how {
            Some(Some(_)) => namespace::delta_name_for(name),
            Some(None) => self.archive_name_in(dir_rel, name),
            None => name.to_os_string(),
        });
        if self.sink.is_some() && published.is_none_or(|(rel, _)| *rel != final_rel) {
            // Uploaded under another name (an archive of the long name
            // appeared meanwhile): published again by the retry.
            if let (Some(sink), Some((rel, _))) = (&self.sink, published) {
                sink.unpublish(rel);
            }
            return Err(FsError::Io(io::Error::other("the archive name changed")));
        }
        // Every backing the new version replaces keeps its dependents
        // (rewritten standalone first, see `relations`).
        let mut replaced = vec![name.to_os_string()];
        replaced.extend(
            namespace::archive_candidates(name)
                .into_iter()
                .filter(|c| !namespace::is_blz_name(c)),
        );
        for n in &replaced {
            self.release_if_base(&dir_rel.join(n))?;
        }
        if let Some(Some(d)) = how {
            let now = self.store.lstat(&d.base).ok().map(|m| (m.dev(), m.ino()));
            if now != Some(d.base_identity) {
                log::info!(
                    "{}: base {} changed while packing the delta; packing again",
                    entry.target.display(),
                    d.base.display()
                );
                return Ok(false);
            }
        }
        let (backing, kind) = if let Some(delta) = how {
            // A chmod, chown or utime of the staged file after it was
            // packed (setattr takes `ns` too) is carried to the archive.
            let staged = std::fs::metadata(spool.data_path(id))?;
            let out = OpenOptions::new().write(true).open(spool.tmp_path(id))?;
            copy_attrs(&staged, &out)?;
            out.sync_all()?;
            let zname = match delta {
                Some(_) => namespace::delta_name_for(name),
                None => self.archive_name_in(dir_rel, name),
            };
            self.store
                .rename_in(&spool.tmp_path(id), &dir_rel.join(&zname))?;
            (zname, NodeKind::Archive)
        } else {
            self.store
                .rename_in(&spool.data_path(id), &dir_rel.join(name))?;
            (name.to_os_string(), NodeKind::Plain)
        };
        self.store.sync_dir(dir_rel)?;
        if let (Some(sink), Some((rel, tag))) = (&self.sink, published) {
            sink.published(rel, &self.store.path().join(rel), tag);
        }
        if matches!(how, Some(Some(_))) {
            crate::hooks::pause("delta-commit");
        }
        self.clear_name(dir_rel, name, Some(&backing), Some(id))?;
        let m = self.store.lstat(&dir_rel.join(&backing))?;
        if let Some(inode) = entry.ino.and_then(|i| self.inodes.get(i)) {
            if inode.kind() == (NodeKind::Staged { id }) {
                inode.rebase(backing, kind, (m.dev(), m.ino()));
            }
        }
        if how.is_some() {
            spool.remove(id)?;
        } else {
            spool.forget(id)?;
        }
        ckptfs_format::fsutil::sync_dir(spool.dir())?;
        Ok(true)
    }

    /// With a sink: uploads what the commit will move into STORE (the
    /// compressed file, or the staged bytes when `compressed` is false)
    /// under its final name. Returns that name and the version's tag.
    fn publish_staged(
        &self,
        spool: &Spool,
        id: u64,
        entry: &SpoolEntry,
        compressed: bool,
    ) -> io::Result<Option<(std::path::PathBuf, String)>> {
        let Some(sink) = &self.sink else {
            return Ok(None);
        };
        let name = entry
            .target
            .file_name()
            .ok_or_else(|| io::Error::other("no file name"))?;
        let dir_rel = entry.target.parent().unwrap_or(Path::new(""));
        let (local, rel) = if compressed {
            (
                spool.tmp_path(id),
                dir_rel.join(self.archive_name_in(dir_rel, name)),
            )
        } else {
            (spool.data_path(id), entry.target.clone())
        };
        let t0 = std::time::Instant::now();
        // A panic in the sink (the object-store client) must not end the
        // write-back thread: it is a failed upload, retried.
        let tag =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink.publish(&local, &rel)))
                .unwrap_or_else(|p| {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(io::Error::other(format!("the upload panicked: {msg}")))
            })?;
        let size = std::fs::metadata(&local).map_or(0, |m| m.len());
        log::info!(
            "{}: uploaded {} bytes in {:.2} s ({:.1} MB/s)",
            rel.display(),
            size,
            t0.elapsed().as_secs_f64(),
            size as f64 / 1e6 / t0.elapsed().as_secs_f64().max(1e-6)
        );
        Ok(Some((rel, tag)))
    }

    /// The archive name a staged `name` in `dir` is committed as: for
    /// `X.safetensors`, the existing `X.safetensors.zstn` if there is one
    /// (it would shadow `X.zstn`), else `X.zstn`; for any other name `N`,
    /// `N.zsame` (doc/FORMAT.md §4).
    pub(super) fn archive_name_in(&self, dir: &Path, name: &OsStr) -> OsString {
        if namespace::is_staging_name(name) {
            let cands = namespace::archive_candidates(name);
            if let Some(long) = cands.first() {
                if self.store.lstat(&dir.join(long)).is_ok_and(|m| m.is_file())
                    && namespace::presented_name(long).as_deref() == Some(name)
                {
                    return long.clone();
                }
            }
        }
        namespace::archive_name_for(name)
    }
}

/// Gives `out` the mode, owner (when the daemon is root) and times of `m`.
fn copy_attrs(m: &std::fs::Metadata, out: &File) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    out.set_permissions(std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
    if is_root() {
        std::os::unix::fs::fchown(out, Some(m.uid()), Some(m.gid()))?;
    }
    out.set_times(
        std::fs::FileTimes::new()
            .set_accessed(m.accessed()?)
            .set_modified(m.modified()?),
    )
}
