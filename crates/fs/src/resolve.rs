//! Name resolution, both ways: which backing entry presents a name in a
//! directory (`lookup`), and which backing path an inode has.
//!
//! A name resolves to, in this order: a staged file of that path in the
//! spool; the entry of that name in STORE (a regular file with an archive
//! name is never shown under it); else the archives presenting it
//! (`X.zstn`, `X.safetensors.zstn`, `X.blz`, see [`super::namespace`]).
//! A plain file hides an archive presenting the same name, and of two
//! archives the first candidate wins; each hidden file is warned about
//! once. The spool itself is never visible.
//!
//! Freshness: every `lookup` re-stats the backing path, so files that
//! appear, change or disappear in STORE show up on the next lookup; no
//! negative entries are kept. Inodes store only their own backing name and
//! parent, so a backing path is found by walking the parents.

use super::inode::{Inode, NodeKind, ROOT_INO};
use super::namespace;
use super::spool::{self, Spool};
use super::{CheckpointFs, Entry, FsError, Result};
use std::ffi::{OsStr, OsString};
use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(super) fn not_found_is(e: io::Error) -> FsError {
    if e.kind() == io::ErrorKind::NotFound {
        FsError::NotFound
    } else {
        FsError::Io(e)
    }
}

impl CheckpointFs {
    /// The backing path of `inode` relative to STORE, found by walking its
    /// parents (inodes store only their own name). For an entry inside a
    /// `.blz`, the path of the `.blz` joined with the path inside it.
    pub(super) fn rel(&self, inode: &Inode) -> Result<PathBuf> {
        let l = inode.loc();
        if let NodeKind::Staged { id } = l.kind {
            return Ok(Spool::data_rel(id));
        }
        if inode.ino == ROOT_INO {
            return Ok(PathBuf::new());
        }
        let mut names = vec![l.backing];
        let mut p = l.parent;
        while p != ROOT_INO {
            let i = self.inode(p)?;
            let pl = i.loc();
            names.push(pl.backing);
            p = pl.parent;
            if names.len() > 4096 {
                return Err(FsError::Stale);
            }
        }
        Ok(names.iter().rev().collect())
    }

    /// The backing path of `inode`, for messages only: STORE is accessed
    /// through [`super::beneath`], never by this path.
    pub(super) fn full(&self, inode: &Inode) -> Result<PathBuf> {
        Ok(self.store.path().join(self.rel(inode)?))
    }

    pub(super) fn inode(&self, ino: u64) -> Result<Arc<Inode>> {
        // The kernel only names inodes we gave it; an unknown one was
        // forgotten and superseded, which is what ESTALE means.
        self.inodes.get(ino).ok_or(FsError::Stale)
    }

    pub(super) fn dir_inode(&self, ino: u64) -> Result<Arc<Inode>> {
        let i = self.inode(ino)?;
        if i.kind().is_dir() {
            Ok(i)
        } else {
            Err(FsError::NotADirectory)
        }
    }

    fn warn_once(&self, path: &Path, msg: impl FnOnce() -> String) {
        let mut w = self.warned.lock();
        if w.insert(path.to_path_buf()) {
            log::warn!("{}", msg());
        }
    }

    pub(super) fn warn_shadowed(&self, dir: &Path, hidden: &OsStr, shown: &OsStr) {
        let hidden = dir.join(hidden);
        self.warn_once(&hidden, || {
            format!(
                "{}: hidden by {} (both present the same name; the plain file is shown)",
                hidden.display(),
                dir.join(shown).display()
            )
        });
    }

    /// Which backing entry presents `name` in directory inode `p`: a
    /// staged file first, then STORE (see [`Self::resolve_name`]).
    pub(super) fn resolve(
        &self,
        p: &Inode,
        name: &OsStr,
    ) -> Result<(OsString, NodeKind, Metadata)> {
        let rel = self.rel(p)?;
        if rel.as_os_str().is_empty() && name == spool::SPOOL_DIR {
            return Err(FsError::NotFound);
        }
        if let Some(s) = &self.spool {
            if let Some((id, _)) = s.find(&rel.join(name)) {
                match std::fs::symlink_metadata(s.data_path(id)) {
                    Ok(m) => return Ok((name.to_os_string(), NodeKind::Staged { id }, m)),
                    // Committed or removed just now: STORE has it.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(FsError::Io(e)),
                }
            }
        }
        self.resolve_name(&rel, name)
    }

    /// Which backing entry presents `name` in directory `dir`.
    fn resolve_name(&self, rel: &Path, name: &OsStr) -> Result<(OsString, NodeKind, Metadata)> {
        let cands = namespace::archive_candidates(name);
        let dir = &self.store.path().join(rel);
        match self.store.lstat(&rel.join(name)) {
            Ok(m) => {
                if m.is_file() && namespace::is_archive_name(name) {
                    // Shown under its `.safetensors` name instead.
                    return Err(FsError::NotFound);
                }
                for c in &cands {
                    if self.store.lstat(&rel.join(c)).is_ok_and(|m| m.is_file()) {
                        self.warn_shadowed(dir, c, name);
                    }
                }
                let kind = if m.is_dir() {
                    NodeKind::Directory
                } else {
                    NodeKind::Plain
                };
                Ok((name.to_os_string(), kind, m))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut found: Option<(OsString, Metadata)> = None;
                for c in cands {
                    match self.store.lstat(&rel.join(&c)) {
                        Ok(m) if m.is_file() => match &found {
                            None => found = Some((c, m)),
                            Some((winner, _)) => self.warn_shadowed(dir, &c, winner),
                        },
                        _ => {}
                    }
                }
                let Some((c, m)) = found else {
                    // Nothing in STORE has this name: a model's GGUF view?
                    return match self.gguf_model(rel, name) {
                        Some((backing, m)) => Ok((backing, NodeKind::GgufView, m)),
                        None => Err(FsError::NotFound),
                    };
                };
                let kind = if namespace::is_blz_name(&c) {
                    NodeKind::Blz
                } else {
                    NodeKind::Archive
                };
                Ok((c, kind, m))
            }
            Err(e) => Err(FsError::Io(e)),
        }
    }

    /// `lookup`. Resolves without `ns`; if a namespace change ran
    /// meanwhile (the inode table would record what the name showed before
    /// it, or the name was found in neither place while a rename-over or a
    /// commit moved it), it is done again under `ns` (see `ns_lock`).
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Entry> {
        if let Some(g) = self.ns.stable() {
            match self.lookup_at(parent, name, Some(g)) {
                Ok(Some(e)) => return Ok(e),
                Err(e) if self.ns.unchanged(g) => return Err(e),
                Ok(None) | Err(_) => {}
            }
        }
        let _g = self.ns.lock();
        self.lookup_locked(parent, name)
    }

    /// `lookup` for a caller that holds `ns`.
    pub(super) fn lookup_locked(&self, parent: u64, name: &OsStr) -> Result<Entry> {
        Ok(self
            .lookup_at(parent, name, None)?
            .expect("nothing changes the namespace under ns"))
    }

    /// Resolves `name` and records its inode, unless the namespace
    /// changed since generation `g` (then None, nothing recorded).
    fn lookup_at(&self, parent: u64, name: &OsStr, g: Option<u64>) -> Result<Option<Entry>> {
        let p = self.dir_inode(parent)?;
        if matches!(p.kind(), NodeKind::Blz | NodeKind::BlzDir { .. }) {
            return self.lookup_blz(&p, name).map(Some);
        }
        let (backing, kind, meta) = self.resolve(&p, name)?;
        let Some(inode) = self.inodes.assign_if(
            parent,
            name,
            &backing,
            kind,
            (meta.dev(), meta.ino()),
            || g.is_none_or(|g| self.ns.unchanged(g)),
            true,
        ) else {
            return Ok(None);
        };
        if let (NodeKind::Staged { id }, Some(s)) = (kind, &self.spool) {
            s.set_ino(id, inode.ino);
        }
        let attr = match self.attr_of(&inode, &meta) {
            Ok(a) => a,
            Err(e) => {
                // Not replied: the kernel will not count this lookup.
                self.inodes.forget(inode.ino, 1);
                return Err(e);
            }
        };
        Ok(Some(Entry {
            attr,
            ttl: self.attr_ttl(inode.ino),
        }))
    }

    pub fn forget(&self, ino: u64, nlookup: u64) {
        self.inodes.forget(ino, nlookup);
    }
}
