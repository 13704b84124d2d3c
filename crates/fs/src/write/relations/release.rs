//! Bases released when they are removed or replaced (see `super`):
//! [`CheckpointFs::release_base`] moves a base that deltas depend on into
//! the spool's `released/` directory under `ns`, through the rename
//! journal; [`CheckpointFs::release_pending`], on the family thread,
//! rewrites each dependent against the released base's own base (composed
//! from both deltas, or packed standalone) and removes the released file
//! once nothing depends on it.

use super::rewrite::TempPath;
use super::{bad, base_path_for, parent, released_dir, resolve_in, subtree, Relation, RELEASED};
use crate::archive_slot::version_of;
use crate::namespace;
use crate::{CheckpointFs, FsError, Result};
use ckptfs_archive::{self as archive, ArchiveView};
use ckptfs_format::delta::{Trailer, MAX_CHAIN};
use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static RELEASE_SEQ: AtomicU64 = AtomicU64::new(0);

/// A base archive read a tensor at a time, for [`ckptfs_pack::compose`].
struct ArchiveSource(Arc<dyn ArchiveView>);

impl ckptfs_pack::compose::TensorSource for ArchiveSource {
    fn len(&self) -> u64 {
        self.0.logical_len(0)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self
                .0
                .read_at(0, offset + done as u64, &mut buf[done..])
                .map_err(io::Error::other)?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            done += n;
        }
        Ok(())
    }
}

impl CheckpointFs {
    /// Before STORE file `rel` is removed or replaced: if it is a
    /// regular file that deltas depend on, releases it ([`Self::release_base`]).
    pub(crate) fn release_if_base(&self, rel: &Path) -> Result<()> {
        match self.store.lstat(rel) {
            Ok(m) if m.is_file() => self.release_base(rel),
            _ => Ok(()),
        }
    }

    /// Moves `base` out of the namespace if deltas depend on it: renamed
    /// into the spool's `released/` directory through the rename journal
    /// (so every recorded base path stays valid across a crash), the
    /// dependents' trailers re-pointed at it. Their rewrite against the
    /// base's own base happens later, in the background
    /// ([`Self::release_pending`]). Holds `ns`.
    pub(crate) fn release_base(&self, base: &Path) -> Result<()> {
        let rels = self.relations();
        let n = rels
            .iter()
            .filter(|r| r.base == base && r.delta != base)
            .count();
        if n == 0 {
            return Ok(());
        }
        let spool = self.spool()?;
        let dir = spool.dir().join(RELEASED);
        if !dir.exists() {
            std::fs::create_dir(&dir)?;
            ckptfs_format::fsutil::sync_dir(spool.dir())?;
        }
        let name = base.file_name().ok_or(FsError::NotFound)?;
        let mut unique = format!(
            "{:x}-{}-",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
            RELEASE_SEQ.fetch_add(1, Ordering::Relaxed)
        )
        .into_bytes();
        unique.extend_from_slice(name.as_bytes());
        let to = released_dir().join(OsStr::from_bytes(&unique));
        let fixes = self.plan_rename(base, &to);
        self.begin_rename(base, &to, &fixes)?;
        if let Some(s) = &self.sink {
            s.remove(base)?;
        }
        self.store
            .rename_out(base, &dir.join(OsStr::from_bytes(&unique)))?;
        self.store.sync_dir(parent(base))?;
        ckptfs_format::fsutil::sync_dir(&dir)?;
        self.finish_rename(&fixes)?;
        log::info!(
            "{}: released to {} ({n} deltas depend on it; rebased in the background)",
            base.display(),
            to.display()
        );
        Ok(())
    }

    /// The background half of [`Self::release_base`] (the family thread
    /// calls it between families): every released base in the spool has
    /// its dependents rebased ([`Self::rebase_dependent`]) and is removed
    /// once nothing depends on it. Released bases a crash left are found
    /// here at the next start. A failure is logged and retried a minute
    /// later; every file stays exact meanwhile.
    pub fn release_pending(&self) {
        let Ok(spool) = self.spool() else { return };
        // Listed under `ns`: `release_base` holds it from its rename into
        // `released/` until the trailers under the file point there, so a
        // file listed here is never one still being released.
        let dir = spool.dir().join(RELEASED);
        if !dir.exists() {
            return;
        }
        let listed = {
            let _g = self.ns.lock();
            std::fs::read_dir(&dir).map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name())
                    .collect::<Vec<OsString>>()
            })
        };
        let Ok(mut names) = listed else {
            return;
        };
        names.sort();
        for n in names {
            let r = released_dir().join(&n);
            let due = self
                .relation_cache
                .retry
                .lock()
                .get(&r)
                .is_none_or(|t| t.elapsed() > std::time::Duration::from_secs(60));
            if !due {
                continue;
            }
            crate::hooks::delay("release");
            match self.release_one(&r, MAX_CHAIN) {
                Ok(()) => {
                    self.relation_cache.retry.lock().remove(&r);
                }
                Err(e) => {
                    log::warn!(
                        "{}: release not finished (every file stays exact; retried in a minute): {e}",
                        r.display()
                    );
                    self.relation_cache
                        .retry
                        .lock()
                        .insert(r, std::time::Instant::now());
                }
            }
        }
    }

    /// Rebases every dependent of released base `r`, then removes it.
    /// A dependent released too goes first (it then stops depending on
    /// `r`); `left` bounds that recursion.
    fn release_one(&self, r: &Path, left: u32) -> Result<()> {
        loop {
            let rels = self.relations();
            let deps: Vec<&Relation> = rels
                .iter()
                .filter(|x| x.base == r && x.delta != r)
                .collect();
            let Some(first) = deps
                .iter()
                .find(|x| x.delta.starts_with(released_dir()))
                .or(deps.first())
            else {
                let _g = self.ns.lock();
                if self.relations().iter().any(|x| x.base == r && x.delta != r) {
                    continue;
                }
                self.store.unlink(r)?;
                self.store.sync_dir(parent(r))?;
                // Gone when empty, so an idle spool holds no directory.
                let _ = self.store.rmdir(parent(r));
                log::info!(
                    "{}: released base removed (nothing depends on it)",
                    r.display()
                );
                return Ok(());
            };
            if first.delta.starts_with(released_dir()) {
                if left == 0 {
                    return Err(bad(r, "released bases chain deeper than a delta can"));
                }
                self.release_one(&first.delta.clone(), left - 1)?;
            } else {
                self.rebase_dependent(&rels, r, &first.delta.clone())?;
            }
        }
    }

    /// Rewrites delta `d` (based on released `r`) against `r`'s own base:
    /// composed from both deltas ([`ckptfs_pack::compose`]), or, when `r`
    /// is standalone, packed standalone as `D.zstn`. Packed with no lock
    /// held; installed under `ns` (dropped if `d`, `r` or a delta under
    /// `d` changed meanwhile), the deltas under `d` re-pointed as in
    /// `family`. Same content throughout; the inode keeps its number.
    fn rebase_dependent(&self, rels: &[Relation], r: &Path, d: &Path) -> Result<()> {
        let t0 = std::time::Instant::now();
        let stamp = |p: &Path| {
            self.store
                .lstat(p)
                .ok()
                .map(|m| ((m.dev(), m.ino()), version_of(&m)))
        };
        let like = self.store.lstat(d)?;
        let (d_was, r_was) = (stamp(d), stamp(r));
        let under: Vec<(PathBuf, Option<_>)> = subtree(rels, d)
            .into_iter()
            .map(|p| {
                let s = stamp(&p);
                (p, s)
            })
            .collect();
        let (tmp, new_rel, fp, depth, what) = match self.read_trailer(r) {
            Ok((rt, rmap)) => {
                let c = resolve_in(parent(r), &rt.base_path)
                    .ok_or_else(|| bad(r, "its base path leaves the store"))?;
                let ca = self.open_store_archive(&c)?;
                let base_path = base_path_for(d, &c)?;
                let (_, dmap) = self.read_trailer(d)?;
                let src = ArchiveSource(ca);
                let mut stats = None;
                let tmp = TempPath(self.spool_tmp(|w| {
                    stats = Some(
                        ckptfs_pack::compose::compose(
                            &dmap,
                            &rmap,
                            &src,
                            &base_path,
                            w,
                            Default::default(),
                        )
                        .map_err(io::Error::other)?,
                    );
                    Ok(())
                })?);
                let s = stats.expect("composed");
                let fp = {
                    let f = File::open(&tmp.0)?;
                    // SAFETY: a private spool file of this daemon, not
                    // changed while mapped.
                    let m = unsafe { memmap2::Mmap::map(&f) }?;
                    let t = Trailer::find(&m)
                        .map_err(|e| bad(&tmp.0, e))?
                        .ok_or_else(|| bad(&tmp.0, "no CKD1 trailer"))?;
                    ckptfs_format::digest::xxh3_64(&m[t.z4dm_len as usize..])
                };
                let what = format!(
                    "composed against {} ({} records reused, {} XORed, {} packed again; {} bytes)",
                    c.display(),
                    s.reused,
                    s.xored,
                    s.recoded,
                    s.stored_bytes
                );
                (Some(tmp), d.to_path_buf(), fp, rt.depth, what)
            }
            Err(_) => {
                let plain = self.decoded_single(d)?;
                let bytes = plain.bytes();
                let name = d.file_name().ok_or(FsError::NotFound)?;
                let presented =
                    namespace::presented_name(name).ok_or_else(|| bad(d, "not an archive"))?;
                let new_rel = parent(d).join(namespace::archive_name_for(&presented));
                // A crash may have left the standalone copy in place
                // (it shadows the delta): kept if it presents the same.
                let tmp = if new_rel != d && self.store.lstat(&new_rel).is_ok() {
                    if !self.presents(&new_rel, bytes) {
                        return Err(bad(
                            d,
                            format!("cannot be made standalone, {} exists", new_rel.display()),
                        ));
                    }
                    None
                } else {
                    Some(TempPath(self.spool_tmp(|w| {
                        ckptfs_pack::pack(bytes, w, Default::default(), &|_| {})
                            .map(|_| ())
                            .map_err(io::Error::other)
                    })?))
                };
                drop(plain);
                let fp = match &tmp {
                    Some(t) => archive::open(&t.0).ok(),
                    None => self.open_store_archive(&new_rel).ok(),
                }
                .and_then(|a| a.fingerprint())
                .unwrap_or(0);
                (
                    tmp,
                    new_rel,
                    fp,
                    0,
                    "packed standalone (its base was standalone)".to_string(),
                )
            }
        };
        if let Some(t) = &tmp {
            self.prepare(&t.0, &like)?;
        }
        let todo = self.plan_subtree(rels, d, &new_rel, fp, depth)?;
        let _g = self.ns.lock();
        let now_under: HashSet<PathBuf> = subtree(&self.relations(), d).into_iter().collect();
        if stamp(d) != d_was
            || stamp(r) != r_was
            || (tmp.is_some() && new_rel != d && self.store.lstat(&new_rel).is_ok())
            || now_under != under.iter().map(|u| u.0.clone()).collect()
            || under.iter().any(|(p, s)| stamp(p) != *s)
        {
            return Err(bad(d, "it, its base or a delta under it changed meanwhile"));
        }
        if let Some(t) = &tmp {
            self.store.rename_in(&t.0, &new_rel)?;
            self.store.sync_dir(parent(&new_rel))?;
        }
        crate::hooks::pause("release");
        for t in &todo {
            self.store.rename_in(&t.tmp.0, &t.to)?;
            self.store.sync_dir(parent(&t.to))?;
        }
        if new_rel != d {
            self.store.unlink(d)?;
            self.store.sync_dir(parent(d))?;
        }
        self.rebase_inode(d, new_rel.file_name().unwrap_or_default());
        for t in &todo {
            self.rebase_inode(&t.to, t.to.file_name().unwrap_or_default());
        }
        log::info!(
            "{}: rebased off released {}: {what} in {:.2} s",
            d.display(),
            r.display(),
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }
}
