//! Replacing a STORE file by a rewritten one that presents the same
//! bytes, for the delta relations (`super`) and the family thread
//! (`write::family`): written to a spool temporary
//! ([`CheckpointFs::spool_tmp`]; a [`TempPath`] removes it if dropped),
//! given the old file's mode, owner and times and fsynced, renamed over
//! (or beside) it, its directory fsynced; the inode presenting it keeps
//! its number ([`CheckpointFs::rebase_inode`]). The rewrites: a trailer
//! re-pointed ([`CheckpointFs::retarget`]), the deltas under a file
//! re-pointed at its new self ([`CheckpointFs::plan_subtree`]), a delta
//! made standalone ([`CheckpointFs::make_standalone`]); and the decoded
//! content of an archive they are packed from ([`Decoded`]).

use super::{bad, base_path_for, err, parent, stamp, Relation, Stamp};
use crate::archive_slot::StoreBases;
use crate::inode::{NodeKind, ROOT_INO};
use crate::namespace;
use crate::{CheckpointFs, FsError, Result};
use ckptfs_archive::{self as archive, ArchiveView};
use ckptfs_format::delta::MAX_CHAIN;
use ckptfs_format::digest::xxh3_64;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static TMP: AtomicU64 = AtomicU64::new(0);

impl CheckpointFs {
    /// Writes `fill` to a new temporary file in the spool (mode 0600 until
    /// the caller sets it), fsynced. The name ends in `.tmp`: removed at
    /// startup if a crash leaves it.
    pub(in crate::write) fn spool_tmp(
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
    pub(in crate::write) fn prepare(&self, tmp: &Path, like: &std::fs::Metadata) -> Result<()> {
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
        let bases = StoreBases {
            store: &self.store,
            sources: &*self.sources,
        };
        archive::from_file_with(&file, &path, &bases).map_err(|e| bad(&path, e))
    }

    /// Rewrites delta `d` as a standalone `.zstn` next to it (see the
    /// module doc); `rels` are the store's relations.
    pub(in crate::write) fn make_standalone(&self, rels: &[Relation], d: &Path) -> Result<()> {
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
    pub(super) fn presents(&self, rel: &Path, bytes: &[u8]) -> bool {
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
    pub(in crate::write) fn rebase_inode(&self, old: &Path, new_name: &OsStr) {
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

    /// The presented content of STORE archive `rel`, which must present
    /// one file, decoded into the spool.
    pub(in crate::write) fn decoded_single(&self, rel: &Path) -> Result<Decoded> {
        let a = self.open_store_archive(rel)?;
        if a.files() != 1 || !a.file_path(0).is_empty() {
            return Err(err(format!("{}: not a single-file archive", rel.display())));
        }
        self.decoded(&*a)
    }

    /// The presented content of single-file archive `a`, decoded into the
    /// spool: not memory, a checkpoint may be many GB.
    pub(in crate::write) fn decoded(&self, a: &dyn ArchiveView) -> Result<Decoded> {
        let tmp = TempPath(
            self.spool_tmp(|w| archive::write_to(a, 0, w, &|_| {}).map_err(io::Error::other))?,
        );
        let f = File::open(&tmp.0)?;
        // SAFETY: a private spool file of this daemon, removed (never
        // truncated) when `tmp` drops, after the map (field order).
        let map = match f.metadata()?.len() {
            0 => None,
            _ => Some(unsafe { memmap2::Mmap::map(&f) }?),
        };
        Ok(Decoded { map, _tmp: tmp })
    }

    /// The trailer rewrites that make every delta under `old` (which
    /// becomes `new`, fingerprint `fp`, real depth `depth`) point at it
    /// with its real depth, recursively (a rewritten trailer is a new
    /// fingerprint for the deltas under it). Prepared in the spool,
    /// fsynced, not installed.
    pub(in crate::write) fn plan_subtree(
        &self,
        rels: &[Relation],
        old: &Path,
        new: &Path,
        fp: u64,
        depth: u32,
    ) -> Result<Vec<Prepared>> {
        let mut out = Vec::new();
        let mut stack = vec![(old.to_path_buf(), new.to_path_buf(), fp, depth)];
        while let Some((old, new, fp, depth)) = stack.pop() {
            for r in rels.iter().filter(|r| r.base == old && r.delta != old) {
                if depth + 1 > MAX_CHAIN {
                    return Err(err(format!(
                        "{}: its chain would be deeper than {MAX_CHAIN}",
                        r.delta.display()
                    )));
                }
                let like = self.store.lstat(&r.delta)?;
                let (t, map) = self.read_trailer(&r.delta)?;
                let mut n = t.clone();
                n.base_path = base_path_for(&r.delta, &new)?;
                n.base_fingerprint = fp;
                n.depth = depth + 1;
                let rendered = n.render();
                let tmp = TempPath(self.spool_tmp(|w| {
                    w.write_all(&map[..t.z4dm_len as usize])?;
                    w.write_all(&rendered)
                })?);
                drop(map);
                self.prepare(&tmp.0, &like)?;
                stack.push((
                    r.delta.clone(),
                    r.delta.clone(),
                    xxh3_64(&rendered),
                    depth + 1,
                ));
                out.push(Prepared {
                    tmp,
                    to: r.delta.clone(),
                    was: Some(stamp(&like)),
                });
            }
        }
        Ok(out)
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
pub(in crate::write) struct TempPath(pub(in crate::write) PathBuf);

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A file rewritten in the spool, waiting to be renamed over `to`.
pub(in crate::write) struct Prepared {
    pub tmp: TempPath,
    pub to: PathBuf,
    /// What `to` was when read (None: `to` is new).
    pub was: Option<Stamp>,
}

/// A decoded file in the spool, mapped.
pub(in crate::write) struct Decoded {
    map: Option<memmap2::Mmap>,
    _tmp: TempPath,
}

impl Decoded {
    pub(in crate::write) fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
