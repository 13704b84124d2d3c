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
//!
//! Here: the relations found in STORE ([`CheckpointFs::relations`]) and
//! the deltas under a file ([`subtree`]). Beside it: `rewrite`, replacing
//! a STORE file by a rewritten one that presents the same bytes (spool
//! temporaries, a delta made standalone, a trailer re-pointed, the deltas
//! under a file re-pointed); `release`, bases released when they are
//! removed or replaced; `journal`, the rename journal.

use crate::archive_slot::version_of;
use crate::spool::SPOOL_DIR;
use crate::{CheckpointFs, FsError, Result};
use ckptfs_format::delta::{check_base_path, Trailer};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

mod journal;
mod release;
mod rewrite;

pub(super) use rewrite::{Prepared, TempPath};

/// Where released bases wait in the spool until nothing depends on them.
pub(crate) const RELEASED: &str = "released";

/// The released bases' directory, as a STORE path.
pub(crate) fn released_dir() -> PathBuf {
    Path::new(SPOOL_DIR).join(RELEASED)
}

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

/// A backing file's identity and version, to notice a change.
pub(super) type Stamp = ((u64, u64), Version);

pub(super) fn stamp(m: &std::fs::Metadata) -> Stamp {
    ((m.dev(), m.ino()), version_of(m))
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

/// An I/O error saying `e`.
pub(super) fn err(e: impl std::fmt::Display) -> FsError {
    FsError::Io(io::Error::other(e.to_string()))
}

fn bad(path: &Path, e: impl std::fmt::Display) -> FsError {
    FsError::BadArchive {
        path: path.to_path_buf(),
        reason: Arc::new(e.to_string()),
    }
}

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
}

/// Every delta under STORE file `p`, directly or through others.
pub(super) fn subtree(rels: &[Relation], p: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut stack = vec![p.to_path_buf()];
    while let Some(n) = stack.pop() {
        for r in rels.iter().filter(|r| r.base == n && r.delta != n) {
            if !out.contains(&r.delta) && out.len() < 1024 {
                out.push(r.delta.clone());
                stack.push(r.delta.clone());
            }
        }
    }
    out
}
