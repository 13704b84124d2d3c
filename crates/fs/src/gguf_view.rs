//! GGUF views (`ckptfs mount --gguf CAST`): beside each model in STORE (a
//! directory holding `config.json` and its shards, plain or `.zstn`, or a
//! `.blz` shown as a directory `NAME`), a read-only regular file
//! `NAME.<cast>.gguf` whose bytes are those `ckptfs export NAME --to gguf
//! --cast CAST` writes, computed on demand, block by block, from the
//! compressed store ([`GgufView`]).
//!
//! A view inode (`NodeKind::GgufView`) has the model's backing name (the
//! directory or the `.blz`) and identity, so it follows the same numbering
//! and replacement rules as the model itself; its presented name is the
//! view name. It is opened as an archive handle over the view and read
//! through the block cache and prefetch like any archive.
//!
//! Freshness: each view is kept per model path with a fingerprint of the
//! files it was built from (identity, size and change times of every file
//! of the directory, or of the `.blz`). Every lookup, listing, `getattr`
//! and open re-fingerprints the model (a walk and a `stat` per file, no
//! read) and builds a new view, with a new cache generation, when anything
//! changed. Building reads `config.json`, the tokenizer and the
//! safetensors headers only.
//!
//! A model whose GGUF cannot be made (architecture not supported, no
//! tokenizer, a damaged archive) has no view: it is not listed and a
//! lookup of its view name fails with ENOENT; the reason is logged once
//! per fingerprint. A block that fails to decode answers EIO for the reads
//! that need it, only (as any archive). Views are read-only (EROFS) and
//! hidden by a plain entry of the same name.
//!
//! STORE is read here by path as the daemon (not through `beneath` with
//! the caller's identity); the view carries the model's read permissions.

use super::archive_slot::next_generation;
use super::inode::Inode;
use super::{CheckpointFs, FsError, Result};
use ckptfs_archive::ArchiveView;
use ckptfs_pack::export::gguf_view::GgufView;
use ckptfs_pack::model::Model;
use std::ffi::{OsStr, OsString};
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a model's view was built from: per file, (relative path, dev,
/// ino, size, mtime, mtime ns, ctime, ctime ns).
type Fingerprint = Vec<(String, u64, u64, u64, i64, i64, i64, i64)>;

/// A model's view as last built.
pub(super) struct ViewSlot {
    fingerprint: std::result::Result<Fingerprint, String>,
    generation: u64,
    view: std::result::Result<Arc<GgufView>, Arc<String>>,
}

fn stamp(rel: String, m: &Metadata) -> (String, u64, u64, u64, i64, i64, i64, i64) {
    (
        rel,
        m.dev(),
        m.ino(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

/// The fingerprint of the model at `full` (a directory or a `.blz`).
fn fingerprint(full: &Path) -> std::result::Result<Fingerprint, String> {
    let m = std::fs::metadata(full).map_err(|e| e.to_string())?;
    if !m.is_dir() {
        return Ok(vec![stamp(String::new(), &m)]);
    }
    let walked = ckptfs_pack::walk(full, None).map_err(|e| e.to_string())?;
    walked
        .into_iter()
        .map(|(rel, p)| {
            std::fs::metadata(&p)
                .map(|m| stamp(rel, &m))
                .map_err(|e| format!("{}: {e}", p.display()))
        })
        .collect()
}

impl CheckpointFs {
    /// Presents a GGUF view with `cast` beside each model (see the module
    /// doc).
    pub fn with_gguf(mut self, cast: ckptfs_pack::export::Cast) -> CheckpointFs {
        self.gguf = Some(cast);
        self
    }

    /// The view name of model `presented`, when views are on.
    pub(super) fn gguf_name(&self, presented: &OsStr) -> Option<OsString> {
        let cast = self.gguf?;
        let mut n = presented.to_os_string();
        n.push(format!(".{}.gguf", cast.name()));
        Some(n)
    }

    /// The model name `NAME` of a view name `NAME.<cast>.gguf`.
    fn gguf_stem<'a>(&self, name: &'a OsStr) -> Option<&'a OsStr> {
        let cast = self.gguf?;
        let suffix = format!(".{}.gguf", cast.name());
        let stem = name.as_bytes().strip_suffix(suffix.as_bytes())?;
        (!stem.is_empty() && stem != b"." && stem != b"..").then(|| OsStr::from_bytes(stem))
    }

    /// True when directory `rel` of STORE is a model directory (holds a
    /// regular `config.json`).
    pub(super) fn is_model_dir(&self, rel: &Path) -> bool {
        self.store
            .lstat(&rel.join("config.json"))
            .is_ok_and(|m| m.is_file())
    }

    /// The model whose view `name` would be in directory `rel`: its
    /// backing name (a directory `NAME` holding config.json, or, when
    /// nothing else presents `NAME`, a regular `NAME.blz`) and metadata;
    /// only when its view can be made.
    pub(super) fn gguf_model(&self, rel: &Path, name: &OsStr) -> Option<(OsString, Metadata)> {
        let stem = self.gguf_stem(name)?;
        let backing = match self.store.lstat(&rel.join(stem)) {
            Ok(m) if m.is_dir() && self.is_model_dir(&rel.join(stem)) => stem.to_os_string(),
            Ok(_) => return None,
            Err(_) => {
                // `NAME.zsame` presents a file NAME, not a model.
                let kept = super::namespace::kept_name_for(stem);
                if self.store.lstat(&rel.join(&kept)).is_ok() {
                    return None;
                }
                let mut blz = stem.to_os_string();
                blz.push(".blz");
                blz
            }
        };
        let m = self.store.lstat(&rel.join(&backing)).ok()?;
        if !(m.is_dir() || m.is_file()) {
            return None;
        }
        self.gguf_view(&rel.join(&backing), name).ok()?;
        Some((backing, m))
    }

    /// The view of the model at `rel_model` (a directory or a `.blz` in
    /// STORE) named `name`, and its cache generation: reused while the
    /// model's fingerprint is unchanged, else built again.
    pub(super) fn gguf_view(
        &self,
        rel_model: &Path,
        name: &OsStr,
    ) -> Result<(Arc<dyn ArchiveView>, u64)> {
        let cast = self.gguf.ok_or(FsError::NotFound)?;
        let full = self.store.path().join(rel_model);
        let shown: PathBuf = full.with_file_name(name);
        let fp = fingerprint(&full);
        let answer = |s: &ViewSlot| match &s.view {
            Ok(v) => Ok((v.clone() as Arc<dyn ArchiveView>, s.generation)),
            Err(reason) => Err(FsError::BadArchive {
                path: shown.clone(),
                reason: reason.clone(),
            }),
        };
        if let Some(s) = self.gguf_views.lock().get(rel_model) {
            if s.fingerprint == fp {
                return answer(s);
            }
        }
        // Built with no lock held (it reads the model's small files).
        let view = match &fp {
            Err(e) => Err(e.clone()),
            Ok(_) => Model::open_with(&full, &ckptfs_archive::LocalSources(&*self.sources))
                .map_err(ckptfs_pack::export::ExportError::from)
                .and_then(|m| GgufView::new(m, Some(cast), shown.clone()))
                .map_err(|e| e.to_string()),
        };
        let slot = ViewSlot {
            fingerprint: fp,
            generation: next_generation(),
            view: view.map(Arc::new).map_err(|e| {
                log::warn!("{}: no GGUF view: {e}", shown.display());
                Arc::new(e)
            }),
        };
        let r = answer(&slot);
        self.gguf_views.lock().insert(rel_model.to_path_buf(), slot);
        r
    }

    /// The view behind view inode `inode`, if its model is still the one
    /// the inode names.
    pub(super) fn gguf_view_of(&self, inode: &Inode) -> Result<(Arc<dyn ArchiveView>, u64)> {
        let rel = self.rel(inode)?;
        let m = self
            .store
            .lstat(&rel)
            .map_err(super::resolve::not_found_is)?;
        if (m.dev(), m.ino()) != inode.identity() {
            return Err(FsError::Stale);
        }
        let name = inode.loc().name;
        self.gguf_view(&rel, &name)
    }
}
