//! `mount --delta auto`: storing a committed `X.safetensors` as a delta
//! (`X.z4dm`) against a file already in STORE.
//!
//! The candidate base, first found wins (doc/SEMANTICS.md):
//! 1. the presented path in the staged file's `user.ckptfs.base` xattr,
//!    relative to its directory;
//! 2. the most recently modified committed file of the same name in a
//!    sibling directory (`step-1000/model.safetensors` after
//!    `step-900/model.safetensors`);
//! 3. a committed `.safetensors` in the same directory with the same
//!    tensors (names, dtypes, shapes), among the first
//!    [`MAX_SAME_DIR`] looked at.
//!
//! Whoever names or is given a base, it must be one the writer could read
//! itself: owned by the writer (the staged file's owner) or by root, and
//! readable with the writer's credentials (uid, gid and supplementary
//! groups, directories searched on the way included). Otherwise the size
//! of the stored delta would tell the writer whether its bytes equal a
//! file it may not read, and the writer's file would depend on a file it
//! does not control. A named base that breaks the rule is logged and
//! ignored; the automatic choices skip such files.
//!
//! A base that is a delta at `MAX_CHAIN` is replaced by its own base
//! (re-basing), as `pack --base` does. The delta is packed next to the
//! standalone archive (both in the spool) and kept only when it shares
//! at least one tensor (name, dtype, shape) with the base and is at most
//! 80% of the standalone size. The base's identity is checked again under
//! `ns` at commit: a base replaced meanwhile discards the delta.

use crate::beneath::{on_behalf, Ids};
use crate::inode::Identity;
use crate::namespace;
use crate::spool::Spool;
use crate::xattr::XATTR_BASE;
use crate::CheckpointFs;
use ckptfs_archive::{self as archive, DeltaArchive};
use ckptfs_format::delta::MAX_CHAIN;
use ckptfs_format::safetensors::{self, Header};
use ckptfs_pack::delta::{pack_delta, DeltaBase};
use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Same-directory candidates looked at, at most.
const MAX_SAME_DIR: usize = 32;

/// A delta written for a commit.
pub(super) struct PackedDelta {
    pub stored: u64,
    /// The base's STORE path and identity when packed.
    pub base: PathBuf,
    pub base_identity: Identity,
}

type TensorKey = (String, String, Vec<u64>);

fn tensor_set(h: &Header) -> HashSet<TensorKey> {
    h.tensors
        .iter()
        .map(|t| (t.name.clone(), t.dtype.clone(), t.shape.clone()))
        .collect()
}

fn parent(p: &Path) -> &Path {
    p.parent().unwrap_or(Path::new(""))
}

/// Who wrote a staged file, as the base rule checks it: the staged file's
/// owner and that user's groups.
pub(super) struct Writer {
    ids: Ids,
}

impl Writer {
    /// The owner of staged file `m` (given the caller's ownership when it
    /// was created) with the supplementary groups of that user.
    pub(super) fn of_staged(m: &std::fs::Metadata) -> io::Result<Writer> {
        Ok(Writer {
            ids: Ids {
                uid: m.uid(),
                gid: m.gid(),
                groups: groups_of(m.uid(), m.gid())?,
            },
        })
    }
}

/// The supplementary groups of user `uid` (primary group `gid`) from the
/// user database; only `gid` for a uid it does not know.
fn groups_of(uid: u32, gid: u32) -> io::Result<Vec<u32>> {
    let Some(user) = nix_user_name(uid)? else {
        return Ok(vec![gid]);
    };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut got = n;
        // SAFETY: `user` is a C string; `groups` has room for `got` gids.
        let rc = unsafe { libc::getgrouplist(user.as_ptr(), gid, groups.as_mut_ptr(), &mut got) };
        if rc >= 0 {
            groups.truncate(got.max(0) as usize);
            return Ok(groups);
        }
        if got <= n || got > 1 << 16 {
            return Err(io::Error::other(format!(
                "the groups of uid {uid} cannot be read"
            )));
        }
        n = got;
    }
}

/// The name of user `uid`, if the user database knows it.
fn nix_user_name(uid: u32) -> io::Result<Option<std::ffi::CString>> {
    let mut buf = vec![0 as libc::c_char; 4096];
    loop {
        // SAFETY: a zeroed passwd is a valid out-parameter.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the lengths given.
        let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        if out.is_null() {
            return Ok(None);
        }
        // SAFETY: getpwuid_r succeeded: `pw_name` points into `buf`.
        return Ok(Some(
            unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }.to_owned(),
        ));
    }
}

impl CheckpointFs {
    /// Why STORE file `base` may not be the base of a file `writer` wrote
    /// (see the module doc); None when it may.
    pub(super) fn base_refused(&self, writer: &Writer, base: &Path) -> Option<String> {
        let m = match self.store.lstat(base) {
            Ok(m) => m,
            Err(e) => return Some(e.to_string()),
        };
        if m.uid() != writer.ids.uid && m.uid() != 0 {
            return Some(format!(
                "owned by uid {}, neither the writer (uid {}) nor root",
                m.uid(),
                writer.ids.uid
            ));
        }
        // Opened as the writer: the kernel checks the file and every
        // directory on the way against the writer's uid and groups. (A
        // daemon that is not root acts as itself: every file it can open
        // is its owner's.)
        let _as = on_behalf(writer.ids.clone());
        match self.store.open_file(base, libc::O_RDONLY, 0) {
            Ok(_) => None,
            Err(e) => Some(format!("not readable by uid {}: {e}", writer.ids.uid)),
        }
    }

    /// The committed backing file presenting STORE path `presented`.
    pub(super) fn committed_backing(&self, presented: &Path) -> Option<PathBuf> {
        let name = presented.file_name()?;
        let dir = parent(presented);
        let mut names = vec![name.to_os_string()];
        names.extend(
            namespace::archive_candidates(name)
                .into_iter()
                .filter(|c| !namespace::is_blz_name(c)),
        );
        names
            .into_iter()
            .map(|n| dir.join(n))
            .find(|p| self.store.lstat(p).is_ok_and(|m| m.is_file()))
    }

    /// The header of the file presented by STORE backing `rel`.
    fn presented_header(&self, rel: &Path) -> Option<Header> {
        self.presented_header_at(rel).map(|h| h.0)
    }

    /// The header of the file presented by STORE backing `rel`, and where
    /// its data buffer starts.
    pub(super) fn presented_header_at(&self, rel: &Path) -> Option<(Header, u64)> {
        let a = self.open_store_archive(rel).ok()?;
        let len = a.logical_len(0);
        let mut prefix = [0u8; 8];
        if a.read_at(0, 0, &mut prefix).ok()? != 8 {
            return None;
        }
        let n = safetensors::header_len(&prefix, len).ok()?;
        let mut raw = vec![0u8; n as usize];
        if a.read_at(0, 8, &mut raw).ok()? != raw.len() {
            return None;
        }
        Some((Header::parse(&raw, len - 8 - n).ok()?, 8 + n))
    }

    /// A committed `.safetensors` in `target`'s directory with the same
    /// tensors (names, dtypes, shapes), among the first [`MAX_SAME_DIR`]
    /// looked at; the target's own is never one.
    pub(super) fn same_tensors_in_dir(&self, target: &Path, header: &Header) -> Option<PathBuf> {
        let name = target.file_name()?;
        let dir = parent(target);
        let want = tensor_set(header);
        let mut looked = 0;
        for e in self.store.read_dir(dir).ok()?.flatten() {
            let n = e.file_name();
            let Some(shown) = namespace::presented_name(&n) else {
                continue;
            };
            if shown == name
                || !namespace::is_staging_name(&shown)
                || !e.file_type().is_ok_and(|t| t.is_file())
            {
                continue;
            }
            looked += 1;
            if looked > MAX_SAME_DIR {
                break;
            }
            let rel = dir.join(&n);
            if self
                .presented_header(&rel)
                .is_some_and(|h| tensor_set(&h) == want)
            {
                return Some(rel);
            }
        }
        None
    }

    /// The candidate base of staged `target` (spool entry `id`): its
    /// STORE backing path (see the module doc).
    fn delta_candidate(
        &self,
        id: u64,
        target: &Path,
        header: &Header,
        writer: &Writer,
    ) -> Option<PathBuf> {
        let name = target.file_name()?;
        let dir = parent(target);
        // The target's own current version is never its base.
        let own = |p: &Path| {
            parent(p) == dir
                && p.file_name().is_some_and(|n| {
                    n == name || namespace::presented_name(n).as_deref() == Some(name)
                })
        };
        if let Ok(v) = self
            .store
            .getxattr(&Spool::data_rel(id), OsStr::new(XATTR_BASE))
        {
            let rel = String::from_utf8_lossy(&v).into_owned();
            let found = super::relations::resolve_in(dir, rel.trim_end_matches('\0'))
                .and_then(|p| self.committed_backing(&p))
                .filter(|p| !own(p));
            match found {
                Some(p) => match self.base_refused(writer, &p) {
                    None => return Some(p),
                    Some(why) => log::warn!(
                        "{}: {XATTR_BASE} {rel:?} is not a base this file may have ({why}); looking for another base",
                        target.display()
                    ),
                },
                None => log::warn!(
                    "{}: {XATTR_BASE} {rel:?} names no committed file; looking for another base",
                    target.display()
                ),
            }
        }
        // Without a named base, the file is stored standalone and its
        // family settled in the background (`family`): the newest is
        // standalone, its predecessor becomes a delta against it.
        let _ = header;
        None
    }

    /// For `--delta auto`: writes staged `bytes` (presented at `target`)
    /// as a delta into `out` when a candidate base gives one at most 80%
    /// of `standalone` bytes. None: no delta (the standalone stays).
    pub(super) fn pack_commit_delta(
        &self,
        id: u64,
        target: &Path,
        bytes: &[u8],
        standalone: u64,
        out: &Path,
    ) -> Option<PackedDelta> {
        if !self.delta_auto || !namespace::is_staging_name(target.file_name()?) {
            return None;
        }
        let (header, _) = safetensors::split_file(bytes).ok()?;
        let writer = match Writer::of_staged(&self.store.lstat(&Spool::data_rel(id)).ok()?) {
            Ok(w) => w,
            Err(e) => {
                log::warn!("{}: not stored as a delta: {e}", target.display());
                return None;
            }
        };
        let mut base = self.delta_candidate(id, target, &header, &writer)?;
        let r = (|| -> io::Result<Option<PackedDelta>> {
            // A delta at the chain limit: its own base instead.
            let (a, depth) = loop {
                let a = self
                    .open_store_archive(&base)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                // The real depth, not the recorded one (an upper bound).
                let depth = (&*a as &dyn std::any::Any)
                    .downcast_ref::<DeltaArchive>()
                    .map_or(0, |d| d.chain_depth());
                if depth < MAX_CHAIN {
                    break (a, depth);
                }
                let d = (&*a as &dyn std::any::Any)
                    .downcast_ref::<DeltaArchive>()
                    .expect("a delta");
                base = d
                    .base()
                    .path()
                    .strip_prefix(self.store.path())
                    .map_err(io::Error::other)?
                    .to_path_buf();
            };
            if a.files() != 1 || !a.file_path(0).is_empty() {
                return Ok(None);
            }
            if let Some(why) = self.base_refused(&writer, &base) {
                // The base a chain at its limit re-bases to.
                log::info!(
                    "{}: not stored as a delta against {}: {why}",
                    target.display(),
                    base.display()
                );
                return Ok(None);
            }
            let m = self.store.lstat(&base)?;
            let mut base_bytes = Vec::new();
            archive::write_to(&*a, 0, &mut base_bytes, &|_| {}).map_err(io::Error::other)?;
            let (bh, _) = safetensors::split_file(&base_bytes).map_err(io::Error::other)?;
            if tensor_set(&bh).is_disjoint(&tensor_set(&header)) {
                return Ok(None);
            }
            let delta_path = parent(target).join(namespace::delta_name_for(
                target.file_name().unwrap_or_default(),
            ));
            let rel_path = super::relations::base_path_for(&delta_path, &base)
                .map_err(|e| io::Error::other(e.to_string()))?;
            let f = std::fs::File::create(out)?;
            let mut w = io::BufWriter::with_capacity(4 << 20, &f);
            let s = pack_delta(
                bytes,
                &DeltaBase {
                    bytes: &base_bytes,
                    rel_path,
                    depth,
                    fingerprint: a.fingerprint().unwrap_or(0),
                },
                &mut w as &mut dyn Write,
                Default::default(),
                &|_| {},
            )
            .map_err(io::Error::other)?;
            w.flush()?;
            drop(w);
            if s.stored_bytes.saturating_mul(5) > standalone.saturating_mul(4) {
                log::info!(
                    "{}: a delta against {} would be {} bytes, the standalone archive {}: stored standalone",
                    target.display(),
                    base.display(),
                    s.stored_bytes,
                    standalone
                );
                return Ok(None);
            }
            log::info!(
                "{}: stored as a delta against {} ({} COPY, {} DELTA, {} FULL): {} bytes, standalone {}",
                target.display(),
                base.display(),
                s.copy,
                s.delta,
                s.full,
                s.stored_bytes,
                standalone
            );
            Ok(Some(PackedDelta {
                stored: s.stored_bytes,
                base: base.clone(),
                base_identity: (m.dev(), m.ino()),
            }))
        })();
        match r {
            Ok(Some(p)) => Some(p),
            Ok(None) => {
                let _ = std::fs::remove_file(out);
                None
            }
            Err(e) => {
                let _ = std::fs::remove_file(out);
                log::warn!(
                    "{}: not stored as a delta against {}: {e}",
                    target.display(),
                    base.display()
                );
                None
            }
        }
    }
}
