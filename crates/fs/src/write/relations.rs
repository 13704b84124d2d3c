//! Delta relations in STORE, kept intact by every change made through the
//! mount (doc/SEMANTICS.md, "Bases of deltas").
//!
//! A relation is a delta archive (a file whose `CKD1` trailer records a
//! base path, `format::delta`) and the STORE path its base path resolves
//! to. [`CheckpointFs::relations`] finds them by walking STORE and reading
//! the trailer of every archive-named file (`.z4dm`, `.zstn`, `.zsame`);
//! trailers are cached by backing identity and version, so a walk reads
//! only files that changed, and the cache holds only files the last walk
//! saw (bounded by STORE). Nothing is kept across restarts: the first walk
//! after a restart reads every trailer again, so changes made while the
//! daemon was down are seen.
//!
//! Policy, all under `ns`:
//! - a backing file about to be removed or replaced (unlink, rename onto,
//!   a commit over it) that deltas depend on is *released*
//!   ([`CheckpointFs::release_base`]): renamed into the spool's
//!   `released/` directory through the rename journal below (the
//!   dependents re-pointed at it), which is all the user's call waits
//!   for. The family thread then rewrites each dependent against the
//!   released base's own base ([`CheckpointFs::release_pending`]:
//!   composed from the two deltas, `pack::compose`; or packed standalone
//!   when the released base is standalone), and removes the released
//!   file once nothing depends on it. A crash at any step leaves every
//!   file presented with its content; released files are found again at
//!   the next start;
//! - a rename that changes a recorded relative path (the base moves, or a
//!   delta moves to another directory, or a directory holding either) is
//!   journalled in the spool (`relations.journal`: from, to, and each
//!   delta's new base path) before the rename, and the trailers are
//!   rewritten after it; a daemon that starts with a journal left finishes
//!   it if the rename happened, and drops it otherwise.
//!
//! A trailer rewrite copies the Z4DM body, renders the new trailer and
//! replaces the file atomically (spool temporary, fsync, rename, fsync the
//! directory); the presented content does not change, so the inode keeps
//! its number ([`CheckpointFs::rebase_inode`]).

use crate::archive_slot::{version_of, StoreBases};
use crate::inode::{NodeKind, ROOT_INO};
use crate::namespace;
use crate::spool::SPOOL_DIR;
use crate::{CheckpointFs, FsError, Result};
use ckptfs_archive::{self as archive, ArchiveView};
use ckptfs_format::delta::{check_base_path, Trailer, MAX_CHAIN};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The rename journal's name in the spool.
const JOURNAL: &str = "relations.journal";

/// Where released bases wait in the spool until nothing depends on them.
pub(crate) const RELEASED: &str = "released";

/// The released bases' directory, as a STORE path.
pub(crate) fn released_dir() -> PathBuf {
    Path::new(SPOOL_DIR).join(RELEASED)
}

static RELEASE_SEQ: AtomicU64 = AtomicU64::new(0);

/// One delta and its base, as STORE paths of backing files.
#[derive(Debug, Clone)]
pub(crate) struct Relation {
    pub delta: PathBuf,
    /// The base path resolved against the delta's directory.
    pub base: PathBuf,
    /// The base path as recorded.
    pub recorded: String,
}

type Version = (u64, i64, i64, i64, i64);

/// A backing file's (identity, version) and the base path it records.
type Seen = ((u64, u64), Version, Option<String>);

/// Trailers seen, by backing path: (identity, version, recorded base).
#[derive(Default)]
pub(crate) struct RelationCache {
    seen: Mutex<HashMap<PathBuf, Seen>>,
    /// Released bases whose release failed, and when.
    retry: Mutex<HashMap<PathBuf, std::time::Instant>>,
}

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

/// A backing name that may hold a delta (by its magic, whatever the name).
fn may_be_delta(name: &OsStr) -> bool {
    let b = name.as_bytes();
    [b".z4dm".as_slice(), b".zstn", b".zsame"]
        .iter()
        .any(|s| b.ends_with(s))
}

/// `rel` (a recorded base path) resolved against STORE directory `dir`,
/// lexically; None when it leaves STORE.
pub(crate) fn resolve_in(dir: &Path, rel: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in dir.join(rel).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir if out.pop() => {}
            _ => return None,
        }
    }
    Some(out)
}

/// The base path a delta at `delta` records for STORE path `base`.
pub(crate) fn base_path_for(delta: &Path, base: &Path) -> Result<String> {
    let r = ckptfs_format::fsutil::relative(delta.parent().unwrap_or(Path::new("")), base);
    let s = r
        .to_str()
        .ok_or_else(|| FsError::Io(io::Error::other("base path is not UTF-8")))?
        .to_string();
    check_base_path(&s).map_err(|e| FsError::Io(io::Error::other(e)))?;
    Ok(s)
}

fn parent(p: &Path) -> &Path {
    p.parent().unwrap_or(Path::new(""))
}

fn bad(path: &Path, e: impl std::fmt::Display) -> FsError {
    FsError::BadArchive {
        path: path.to_path_buf(),
        reason: Arc::new(e.to_string()),
    }
}

static TMP: AtomicU64 = AtomicU64::new(0);

impl CheckpointFs {
    /// Every delta relation in STORE (see the module doc).
    pub(crate) fn relations(&self) -> Vec<Relation> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut stack = vec![PathBuf::new(), released_dir()];
        while let Some(d) = stack.pop() {
            let Ok(rd) = self.store.read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name();
                if d.as_os_str().is_empty() && name == SPOOL_DIR {
                    continue;
                }
                let Ok(ft) = e.file_type() else { continue };
                let rel = d.join(&name);
                if ft.is_dir() {
                    stack.push(rel);
                    continue;
                }
                if !ft.is_file() || !may_be_delta(&name) {
                    continue;
                }
                seen.insert(rel.clone());
                if let Some(recorded) = self.recorded_base(&rel) {
                    if let Some(base) = resolve_in(&d, &recorded) {
                        out.push(Relation {
                            delta: rel,
                            base,
                            recorded,
                        });
                    }
                }
            }
        }
        self.relation_cache
            .seen
            .lock()
            .retain(|k, _| seen.contains(k));
        out
    }

    /// The base path recorded by the delta at `rel`, if it is one.
    fn recorded_base(&self, rel: &Path) -> Option<String> {
        let m = self.store.lstat(rel).ok()?;
        let key = ((m.dev(), m.ino()), version_of(&m));
        if let Some((id, v, b)) = self.relation_cache.seen.lock().get(rel) {
            if (*id, *v) == key {
                return b.clone();
            }
        }
        let b = self.read_trailer(rel).ok().map(|(t, _)| t.base_path);
        self.relation_cache
            .seen
            .lock()
            .insert(rel.to_path_buf(), (key.0, key.1, b.clone()));
        b
    }

    /// The trailer of the delta at `rel` and the file's map.
    pub(super) fn read_trailer(&self, rel: &Path) -> Result<(Trailer, memmap2::Mmap)> {
        let f = self.store.open_file(rel, libc::O_RDONLY, 0)?;
        if f.metadata()?.len() == 0 {
            return Err(bad(rel, "empty"));
        }
        // SAFETY: read-only map of a backing file that ckptfs replaces by
        // rename, never truncates.
        let map = unsafe { memmap2::Mmap::map(&f) }?;
        match Trailer::find(&map) {
            Ok(Some(t)) => Ok((t, map)),
            Ok(None) => Err(bad(rel, "no CKD1 trailer")),
            Err(e) => Err(bad(rel, e)),
        }
    }

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
        let under: Vec<(PathBuf, Option<_>)> = super::family::subtree(rels, d)
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
        let now_under: HashSet<PathBuf> = super::family::subtree(&self.relations(), d)
            .into_iter()
            .collect();
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

    /// Writes `fill` to a new temporary file in the spool (mode 0600 until
    /// the caller sets it), fsynced. The name ends in `.tmp`: removed at
    /// startup if a crash leaves it.
    pub(super) fn spool_tmp(
        &self,
        fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> Result<PathBuf> {
        let spool = self.spool()?;
        let n = TMP.fetch_add(1, Ordering::Relaxed);
        let tmp = spool
            .dir()
            .join(format!("rewrite-{}-{n}.tmp", std::process::id()));
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let r = (|| -> io::Result<()> {
            let mut w = io::BufWriter::with_capacity(4 << 20, &f);
            fill(&mut w)?;
            w.flush()?;
            Ok(())
        })();
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        Ok(tmp)
    }

    /// Gives the temporary file the mode, owner and times of `like` and
    /// fsyncs it (removed on failure).
    pub(super) fn prepare(&self, tmp: &Path, like: &std::fs::Metadata) -> Result<()> {
        let r = (|| -> io::Result<()> {
            let f = OpenOptions::new().write(true).open(tmp)?;
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(like.mode() & 0o7777))?;
            if crate::sys::is_root() {
                std::os::unix::fs::fchown(&f, Some(like.uid()), Some(like.gid()))?;
            }
            f.set_times(
                std::fs::FileTimes::new()
                    .set_accessed(like.accessed()?)
                    .set_modified(like.modified()?),
            )?;
            f.sync_all()
        })();
        if let Err(e) = r {
            let _ = std::fs::remove_file(tmp);
            return Err(e.into());
        }
        Ok(())
    }

    /// [`Self::prepare`]s the temporary file, renames it to STORE path
    /// `to`, then fsyncs the directory.
    fn install(&self, tmp: &Path, like: &std::fs::Metadata, to: &Path) -> Result<()> {
        self.prepare(tmp, like)?;
        if let Err(e) = self.store.rename_in(tmp, to) {
            let _ = std::fs::remove_file(tmp);
            return Err(e.into());
        }
        self.store.sync_dir(parent(to))?;
        Ok(())
    }

    /// Opens STORE file `rel` as an archive (bases inside STORE).
    pub(crate) fn open_store_archive(&self, rel: &Path) -> Result<Arc<dyn ArchiveView>> {
        let file: File = self.store.open_file(rel, libc::O_RDONLY, 0)?;
        let path = self.store.path().join(rel);
        let bases = StoreBases { store: &self.store };
        archive::from_file_with(&file, &path, &bases).map_err(|e| bad(&path, e))
    }

    /// Rewrites delta `d` as a standalone `.zstn` next to it (see the
    /// module doc); `rels` are the store's relations.
    pub(super) fn make_standalone(&self, rels: &[Relation], d: &Path) -> Result<()> {
        let like = self.store.lstat(d)?;
        let plain = self.decoded_single(d)?;
        let bytes = plain.bytes();
        let name = d.file_name().ok_or(FsError::NotFound)?;
        let presented = namespace::presented_name(name).ok_or_else(|| bad(d, "not an archive"))?;
        let new_name = namespace::archive_name_for(&presented);
        let new_rel = parent(d).join(&new_name);
        let exists = new_rel != d && self.store.lstat(&new_rel).is_ok();
        if exists && !self.presents(&new_rel, bytes) {
            // Something else is stored under the standalone name (it
            // shadows this delta): nowhere to put it without a loss.
            log::error!(
                "{}: cannot be made standalone, {} exists; the change to its base is refused",
                d.display(),
                new_rel.display()
            );
            return Err(FsError::Io(io::Error::from_raw_os_error(libc::EBUSY)));
        }
        if !exists {
            let tmp = self.spool_tmp(|w| {
                ckptfs_pack::pack(bytes, w, Default::default(), &|_| {})
                    .map(|_| ())
                    .map_err(io::Error::other)
            })?;
            drop(plain);
            self.install(&tmp, &like, &new_rel)?;
            crate::hooks::pause("standalone");
        }
        // Else a crash left the standalone copy in place already.
        let fp = self
            .open_store_archive(&new_rel)
            .ok()
            .and_then(|a| a.fingerprint());
        // The deltas under it: the new base path, its fingerprint, and
        // their real depths (one less now), recursively.
        for t in self.plan_subtree(rels, d, &new_rel, fp.unwrap_or(0), 0)? {
            self.store.rename_in(&t.tmp.0, &t.to)?;
            self.store.sync_dir(parent(&t.to))?;
            self.rebase_inode(&t.to, t.to.file_name().unwrap_or_default());
        }
        if new_rel != d {
            self.store.unlink(d)?;
            self.store.sync_dir(parent(d))?;
        }
        self.rebase_inode(d, &new_name);
        log::info!(
            "{}: its base is going away; rewritten standalone as {}",
            d.display(),
            new_rel.display()
        );
        Ok(())
    }

    /// Whether STORE archive `rel` presents exactly `bytes`.
    fn presents(&self, rel: &Path, bytes: &[u8]) -> bool {
        let Ok(a) = self.open_store_archive(rel) else {
            return false;
        };
        if a.files() != 1 || a.logical_len(0) != bytes.len() as u64 {
            return false;
        }
        // Compared as it decodes, block by block, without a second copy.
        let mut same = SameAs(bytes);
        archive::write_to(&*a, 0, &mut same, &|_| {}).is_ok() && same.0.is_empty()
    }

    /// Rewrites the trailer of delta `d` to record base path `base_path`
    /// (and `fingerprint`, when given). The presented content is the same.
    pub(crate) fn retarget(
        &self,
        d: &Path,
        base_path: &str,
        fingerprint: Option<u64>,
    ) -> Result<()> {
        let like = self.store.lstat(d)?;
        let (t, map) = self.read_trailer(d)?;
        let mut n = t.clone();
        n.base_path = base_path.to_string();
        if let Some(fp) = fingerprint {
            n.base_fingerprint = fp;
        }
        if n == t {
            return Ok(());
        }
        let tmp = self.spool_tmp(|w| {
            w.write_all(&map[..t.z4dm_len as usize])?;
            w.write_all(&n.render())
        })?;
        drop(map);
        self.install(&tmp, &like, d)?;
        self.rebase_inode(d, d.file_name().unwrap_or_default());
        log::info!("{}: base path now {base_path}", d.display());
        Ok(())
    }

    /// The inode presenting STORE archive `old` (if the table has one)
    /// now has backing `new_name` in the same directory: same content,
    /// same number.
    pub(super) fn rebase_inode(&self, old: &Path, new_name: &OsStr) {
        let mut ino = ROOT_INO;
        for c in parent(old).components() {
            match self.inodes.find(ino, c.as_os_str()) {
                Some(i) => ino = i.ino,
                None => return,
            }
        }
        let Some(old_name) = old.file_name() else {
            return;
        };
        let Some(presented) = namespace::presented_name(old_name) else {
            return;
        };
        let Some(inode) = self.inodes.find(ino, &presented) else {
            return;
        };
        let l = inode.loc();
        if l.kind != NodeKind::Archive || l.backing != old_name {
            return;
        }
        if let Ok(m) = self.store.lstat(&parent(old).join(new_name)) {
            inode.rebase(
                new_name.to_os_string(),
                NodeKind::Archive,
                (m.dev(), m.ino()),
            );
        }
    }

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

/// A `Write` that accepts only the bytes of its slice, in order: what is
/// left of the slice is what has not been written yet.
struct SameAs<'a>(&'a [u8]);

impl Write for SameAs<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.0.strip_prefix(buf) {
            Some(rest) => {
                self.0 = rest;
                Ok(buf.len())
            }
            None => Err(io::Error::other("content differs")),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A spool file removed when dropped.
pub(super) struct TempPath(pub(super) PathBuf);

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
