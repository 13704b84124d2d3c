//! The write path of `CheckpointFs`: creating, writing, renaming and
//! removing files, and the write-back that compresses staged
//! `.safetensors` files after their last close.
//!
//! - Plain files (any name but `X.safetensors`) are written straight
//!   through to STORE.
//! - A regular file `X.safetensors` written through the mount (created,
//!   opened for writing, truncated, or renamed to that name) is staged in
//!   the spool ([`super::spool`]) and served from there. Opening an
//!   existing `.zstn` for writing stages an empty file (`O_TRUNC`) or a
//!   decoded copy (copy-up). The old `.zstn` stays in STORE until the new
//!   version is committed, so handles that opened it keep reading it.
//! - After the last writer closes, the write-back thread validates the
//!   staged file, packs it to `ID.zstn.tmp` in the spool, fsyncs it and
//!   renames it to `X.zstn` next to where it belongs, fsyncs that
//!   directory, removes whatever the name presented before, and only then
//!   removes the staged copy. Invalid safetensors are moved back as a plain
//!   `X.safetensors` instead. A version that changed during compression
//!   (a new writer, a truncate) discards the result; the next close queues
//!   it again. Out of space: the staged file stays, served as it is, and
//!   the error is logged; it is retried after the next close or mount.
//!
//! The inode of a committed file keeps its number and page cache: only its
//! backing changes ([`super::inode::Inode::rebase`]), the bytes are the
//! same.
//!
//! Lock order: `ns` (namespace changes and commits), then the inode table,
//! then the spool's state. A compression runs with no lock held; writers
//! register in `writers` before waiting for a running compression of their
//! file (`Spool::bump`), and a compression checks `writers` after marking
//! itself running, so a file is never truncated under the compressor's map.

use super::inode::{Identity, Inode, NodeKind};
use super::namespace;
use super::spool::{Entry as SpoolEntry, Spool};
use super::{
    not_found_is, Attr, CheckpointFs, Entry, FsError, Handle, Opened, PlainHandle, Result,
};
use crate::archive::ArchiveView;
use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// A time to set: now, or a given time.
#[derive(Debug, Clone, Copy)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The attribute changes of a `setattr`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

/// Who asks: the owner new files get (when the daemon runs as root).
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

fn errno(e: i32) -> FsError {
    FsError::Io(io::Error::from_raw_os_error(e))
}

fn cpath(p: &Path) -> Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| errno(libc::EINVAL))
}

fn check(rc: libc::c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(FsError::Io(io::Error::last_os_error()))
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Gives a new entry the caller's ownership, as a local filesystem does
/// (the group of a set-group-ID parent directory wins).
fn set_owner(path: &Path, caller: Caller, parent: &Metadata) -> Result<()> {
    if !is_root() {
        return Ok(());
    }
    let gid = if parent.mode() & libc::S_ISGID != 0 {
        parent.gid()
    } else {
        caller.gid
    };
    let c = cpath(path)?;
    // SAFETY: `c` is a valid NUL-terminated path.
    check(unsafe { libc::lchown(c.as_ptr(), caller.uid, gid) })
}

fn timespec(t: Option<SetTime>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(SetTime::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(SetTime::At(t)) => match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
            Err(e) => {
                let d = e.duration();
                let mut sec = -(d.as_secs() as i64);
                let mut nsec = d.subsec_nanos() as i64;
                if nsec > 0 {
                    sec -= 1;
                    nsec = 1_000_000_000 - nsec;
                }
                libc::timespec {
                    tv_sec: sec as libc::time_t,
                    tv_nsec: nsec as libc::c_long,
                }
            }
        },
    }
}

/// Open flags passed on to a backing file opened for writing.
fn backing_flags(flags: i32) -> i32 {
    flags & (libc::O_APPEND | libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME)
}

fn open_backing(path: &Path, flags: i32) -> io::Result<File> {
    let acc = flags & libc::O_ACCMODE;
    OpenOptions::new()
        .read(acc == libc::O_RDONLY || acc == libc::O_RDWR)
        .write(acc == libc::O_WRONLY || acc == libc::O_RDWR)
        .truncate(flags & libc::O_TRUNC != 0 && acc != libc::O_RDONLY)
        .custom_flags(backing_flags(flags))
        .open(path)
}

fn writes(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(FsError::Io(e)),
        _ => Ok(()),
    }
}

impl CheckpointFs {
    fn spool(&self) -> Result<&Spool> {
        match &self.spool {
            Some(s) if !self.read_only => Ok(s),
            _ => Err(FsError::ReadOnly),
        }
    }

    fn ns_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.ns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A directory that may be changed: not read-only, not inside a
    /// `.blz`. Returns it with its path relative to STORE.
    fn writable_dir(&self, parent: u64) -> Result<(Arc<Inode>, PathBuf)> {
        self.spool()?;
        let p = self.dir_inode(parent)?;
        if matches!(p.kind(), NodeKind::Blz | NodeKind::BlzDir { .. }) {
            return Err(FsError::ReadOnly);
        }
        let rel = self.rel(&p)?;
        Ok((p, rel))
    }

    /// Names the mount cannot create: the spool, and regular-file names
    /// that STORE uses for archives (`X.zstn`, `X.blz`).
    fn check_new_name(&self, rel: &Path, name: &OsStr, dir: bool) -> Result<()> {
        if name.len() > 255 {
            return Err(errno(libc::ENAMETOOLONG));
        }
        if rel.as_os_str().is_empty() && name == super::spool::SPOOL_DIR {
            return Err(errno(libc::EPERM));
        }
        if !dir && namespace::is_archive_name(name) {
            // A regular file with this name in STORE is presented as an
            // archive under another name; refuse rather than surprise.
            log::debug!("refusing to create {name:?}: names ending in .zstn/.blz are reserved");
            return Err(errno(libc::EPERM));
        }
        Ok(())
    }

    fn writer_count(&self, id: Identity) -> usize {
        self.writers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .copied()
            .unwrap_or(0)
    }

    fn add_writer(&self, id: Identity) {
        *self
            .writers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_default() += 1;
    }

    /// Called when a handle with write access to `id` closes.
    pub(super) fn writer_closed(&self, id: Identity) {
        let last = {
            let mut w = self.writers.lock().unwrap_or_else(|p| p.into_inner());
            match w.get_mut(&id) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    w.remove(&id);
                    true
                }
                None => false,
            }
        };
        if last {
            self.handle_closed(id);
        }
    }

    /// Called when a handle of backing file `id` closes: a staged file
    /// nothing has open any more is queued for compression.
    pub(super) fn handle_closed(&self, id: Identity) {
        if self.writer_count(id) == 0 && !self.is_open(id) {
            if let Some(s) = &self.spool {
                if let Some(sid) = s.find_identity(id) {
                    self.schedule(sid);
                }
            }
        }
    }

    /// Queues staged file `id` for compression.
    pub(super) fn schedule(&self, id: u64) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if !q.contains(&id) {
            q.push_back(id);
        }
        self.queue_cv.notify_one();
    }

    /// The write-back thread: compresses queued files until `stop`.
    pub fn writeback_loop(&self, stop: &std::sync::atomic::AtomicBool) {
        use std::sync::atomic::Ordering;
        loop {
            let id = {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Some(id) = q.pop_front() {
                        break id;
                    }
                    q = self
                        .queue_cv
                        .wait_timeout(q, std::time::Duration::from_millis(500))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            };
            self.commit(id);
        }
    }

    /// Wakes the write-back thread (to notice `stop`).
    pub fn wake_writeback(&self) {
        self.queue_cv.notify_all();
    }

    /// Compresses every queued file now, on this thread (tests, unmount).
    pub fn run_writeback(&self) {
        loop {
            let id = self
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            match id {
                Some(id) => self.commit(id),
                None => return,
            }
        }
    }

    /// Queues every staged file nobody writes (at unmount).
    pub fn requeue_all(&self) {
        if let Some(s) = &self.spool {
            for id in s.ids_under(Path::new("")) {
                self.schedule(id);
            }
        }
    }

    /// Staged files not yet compressed.
    pub fn staged_count(&self) -> usize {
        self.spool.as_ref().map_or(0, |s| s.len())
    }

    /// Compresses staged file `id` and commits it, if nothing writes it.
    fn commit(&self, id: u64) {
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
        spool.end_compress(id);
        let packed = match packed {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_file(spool.tmp_path(id));
                log::error!(
                    "{}: compression failed, the file stays staged at {} and readable: {e}",
                    entry.target.display(),
                    spool.data_path(id).display()
                );
                return;
            }
        };
        let _g = self.ns_lock();
        let current = spool.entry(id);
        if current.as_ref().map(|c| c.version) != Some(entry.version)
            || self.writer_count(entry.identity) > 0
            || self.is_open(entry.identity)
        {
            // Changed while compressing: the next close queues it again.
            let _ = std::fs::remove_file(spool.tmp_path(id));
            return;
        }
        let current = current.expect("checked");
        match self.commit_locked(spool, id, &current, packed.is_some()) {
            Ok(()) => {
                if let Some((raw, stored)) = packed {
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
                log::error!(
                    "{}: commit failed, the file stays staged and readable: {e}",
                    current.target.display()
                );
            }
        }
    }

    /// Packs the staged bytes into the spool's temporary file. Returns
    /// (raw, stored) sizes, or None when the bytes are not valid
    /// safetensors (they will be kept as a plain file).
    fn compress_staged(
        &self,
        spool: &Spool,
        id: u64,
        entry: &SpoolEntry,
    ) -> io::Result<Option<(u64, u64)>> {
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
        if let Err(e) = crate::format::safetensors::split_file(bytes) {
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
            let s = crate::pack::pack(bytes, &mut w, Default::default(), &|_| {})
                .map_err(io::Error::other)?;
            w.flush()?;
            s
        };
        // The archive keeps the file's mode, owner and times.
        use std::os::unix::fs::PermissionsExt;
        out.set_permissions(std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
        if is_root() {
            std::os::unix::fs::fchown(&out, Some(m.uid()), Some(m.gid()))?;
        }
        out.set_times(
            std::fs::FileTimes::new()
                .set_accessed(m.accessed()?)
                .set_modified(m.modified()?),
        )?;
        out.sync_all()?;
        Ok(Some((stats.raw_bytes, stats.stored_bytes)))
    }

    /// Moves the compressed file (or, when `compressed` is false, the
    /// staged bytes) to its final name and removes the staged copy. Holds
    /// `ns`.
    fn commit_locked(
        &self,
        spool: &Spool,
        id: u64,
        entry: &SpoolEntry,
        compressed: bool,
    ) -> Result<()> {
        let name = entry.target.file_name().ok_or(FsError::NotFound)?;
        let dir_rel = entry.target.parent().unwrap_or(Path::new(""));
        let dir = self.store.join(dir_rel);
        if !dir.is_dir() {
            // Removed in STORE behind the mount's back: never drop data.
            std::fs::create_dir_all(&dir)?;
        }
        let (backing, kind) = if compressed {
            let zname = self.archive_name_in(&dir, name);
            std::fs::rename(spool.tmp_path(id), dir.join(&zname))?;
            (zname, NodeKind::Archive)
        } else {
            std::fs::rename(spool.data_path(id), dir.join(name))?;
            (name.to_os_string(), NodeKind::Plain)
        };
        crate::fsutil::sync_dir(&dir)?;
        self.clear_name(dir_rel, name, Some(&backing), Some(id))?;
        let m = std::fs::symlink_metadata(dir.join(&backing))?;
        if let Some(inode) = entry.ino.and_then(|i| self.inodes.get(i)) {
            if inode.kind() == (NodeKind::Staged { id }) {
                inode.rebase(backing, kind, (m.dev(), m.ino()));
            }
        }
        if compressed {
            spool.remove(id)?;
        } else {
            spool.forget(id)?;
        }
        crate::fsutil::sync_dir(spool.dir())?;
        Ok(())
    }

    /// The archive name a staged `name` in `dir` is committed as: the
    /// existing `X.safetensors.zstn` if there is one (it would shadow
    /// `X.zstn`), else `X.zstn`.
    fn archive_name_in(&self, dir: &Path, name: &OsStr) -> OsString {
        let cands = namespace::archive_candidates(name);
        if let Some(long) = cands.first() {
            if std::fs::symlink_metadata(dir.join(long)).is_ok_and(|m| m.is_file())
                && namespace::presented_name(long).as_deref() == Some(name)
            {
                return long.clone();
            }
        }
        namespace::zstn_name_for(name)
    }

    /// Removes what presented `name` in `dir_rel` before, except `keep`
    /// (a backing name) and spool entry `keep_id`: a plain file of that
    /// name, its `.zstn` archives, and a staged version.
    fn clear_name(
        &self,
        dir_rel: &Path,
        name: &OsStr,
        keep: Option<&OsStr>,
        keep_id: Option<u64>,
    ) -> Result<()> {
        let dir = self.store.join(dir_rel);
        if let Some(s) = &self.spool {
            if let Some((id, _)) = s.find(&dir_rel.join(name)) {
                if Some(id) != keep_id {
                    s.remove(id)?;
                }
            }
        }
        let mut names = vec![name.to_os_string()];
        if namespace::is_staging_name(name) {
            names.extend(
                namespace::archive_candidates(name)
                    .into_iter()
                    .filter(|c| !namespace::is_blz_name(c)),
            );
        }
        for n in names {
            if Some(n.as_os_str()) == keep {
                continue;
            }
            let p = dir.join(&n);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if !m.is_dir() => remove_if_exists(&p)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Opens `ino` for writing (or with `O_TRUNC`).
    pub(super) fn open_write(&self, ino: u64, flags: i32) -> Result<Opened> {
        if flags & libc::O_ACCMODE == libc::O_ACCMODE {
            return Err(errno(libc::EINVAL));
        }
        let spool = self.spool()?;
        let inode = self.inode(ino)?;
        match inode.kind() {
            NodeKind::Directory | NodeKind::Blz | NodeKind::BlzDir { .. } => {
                Err(FsError::IsADirectory)
            }
            NodeKind::BlzFile { .. } => Err(FsError::ReadOnly),
            NodeKind::Plain => {
                let path = self.full(&inode)?;
                let m = std::fs::symlink_metadata(&path).map_err(not_found_is)?;
                if (m.dev(), m.ino()) != inode.identity() {
                    return Err(FsError::Stale);
                }
                if m.is_file() && namespace::is_staging_name(&inode.loc().name) && writes(flags) {
                    let id = self.stage_plain(spool, &inode)?;
                    return self.open_staged(spool, &inode, id, flags);
                }
                let file = open_backing(&path, flags).map_err(not_found_is)?;
                let writer = writes(flags).then_some(inode.identity());
                if let Some(w) = writer {
                    self.add_writer(w);
                }
                Ok(self.plain_handle(ino, file, writer, true))
            }
            NodeKind::Staged { id } => self.open_staged(spool, &inode, id, flags),
            NodeKind::Archive => {
                let id = self.stage_archive(spool, &inode, flags & libc::O_TRUNC != 0)?;
                self.open_staged(spool, &inode, id, flags & !libc::O_TRUNC)
            }
        }
    }

    fn open_staged(&self, spool: &Spool, inode: &Inode, id: u64, flags: i32) -> Result<Opened> {
        let entry = spool.entry(id).ok_or(FsError::Stale)?;
        let writer = writes(flags) || flags & libc::O_TRUNC != 0;
        if writer {
            // Register first, then wait out a running compression (see
            // the module doc).
            self.add_writer(entry.identity);
            spool.bump(id);
        }
        let file = match open_backing(&spool.data_path(id), flags) {
            Ok(f) => f,
            Err(e) => {
                if writer {
                    self.writer_closed(entry.identity);
                }
                return Err(not_found_is(e));
            }
        };
        let passthrough = !self.has_cached_opens(inode.ino);
        Ok(self.plain_handle(
            inode.ino,
            file,
            writer.then_some(entry.identity),
            passthrough,
        ))
    }

    /// Moves plain `X.safetensors` into the spool (it is being written).
    fn stage_plain(&self, spool: &Spool, inode: &Inode) -> Result<u64> {
        let _g = self.ns_lock();
        if let NodeKind::Staged { id } = inode.kind() {
            return Ok(id);
        }
        let l = inode.loc();
        let parent = self.inode(l.parent)?;
        let target = self.rel(&parent)?.join(&l.name);
        let id = spool.adopt(&target, &self.full(inode)?)?;
        spool.set_ino(id, inode.ino);
        let identity = spool.entry(id).ok_or(FsError::Stale)?.identity;
        inode.rebase(l.name.clone(), NodeKind::Staged { id }, identity);
        Ok(id)
    }

    /// Stages a new version of archive `inode`: empty when `truncate`,
    /// else a decoded copy (copy-up). The `.zstn` stays until the new
    /// version is committed.
    fn stage_archive(&self, spool: &Spool, inode: &Inode, truncate: bool) -> Result<u64> {
        let _g = self.ns_lock();
        if let NodeKind::Staged { id } = inode.kind() {
            return Ok(id);
        }
        let path = self.full(inode)?;
        let m = std::fs::symlink_metadata(&path).map_err(not_found_is)?;
        if (m.dev(), m.ino()) != inode.identity() {
            return Err(FsError::Stale);
        }
        let l = inode.loc();
        let parent = self.inode(l.parent)?;
        let target = self.rel(&parent)?.join(&l.name);
        let archive = if truncate {
            None
        } else {
            let slot = self.archive_slot(inode, &m)?;
            Some(slot.archive.map_err(|reason| {
                let e = FsError::BadArchive {
                    path: path.clone(),
                    reason,
                };
                log::error!("{e}");
                e
            })?)
        };
        let (id, file) = spool.create(&target, m.mode() & 0o7777, 0)?;
        let fill = || -> Result<()> {
            if is_root() {
                std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()))?;
            }
            if let Some(a) = &archive {
                copy_up(&**a, &file)?;
            }
            Ok(())
        };
        if let Err(e) = fill() {
            let _ = spool.remove(id);
            return Err(e);
        }
        let fm = file.metadata()?;
        spool.set_ino(id, inode.ino);
        inode.rebase(l.name, NodeKind::Staged { id }, (fm.dev(), fm.ino()));
        Ok(id)
    }

    /// `create` with `O_CREAT`: a new file (staged for `X.safetensors`),
    /// or the existing one opened with `flags` (without `O_EXCL`).
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Entry, Opened)> {
        let (p, rel) = self.writable_dir(parent)?;
        match self.resolve(&p, name) {
            Ok(_) if flags & libc::O_EXCL != 0 => return Err(errno(libc::EEXIST)),
            Ok(_) => {
                let e = self.lookup(parent, name)?;
                let o = self.open(e.attr.ino, flags)?;
                return Ok((e, o));
            }
            Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        self.check_new_name(&rel, name, false)?;
        let dir = self.store.join(&rel);
        let dm = std::fs::metadata(&dir).map_err(not_found_is)?;
        let _g = self.ns_lock();
        let spool = self.spool()?;
        if namespace::is_staging_name(name) {
            let (id, file) = spool.create(&rel.join(name), mode, flags)?;
            if let Err(e) = set_owner(&spool.data_path(id), caller, &dm) {
                let _ = spool.remove(id);
                return Err(e);
            }
            let m = file.metadata()?;
            let identity = (m.dev(), m.ino());
            let inode = self
                .inodes
                .assign(parent, name, name, NodeKind::Staged { id }, identity);
            spool.set_ino(id, inode.ino);
            self.add_writer(identity);
            spool.bump(id);
            let opened = self.plain_handle(inode.ino, file, Some(identity), true);
            let entry = self.entry_of(&inode, &m)?;
            Ok((entry, opened))
        } else {
            let path = dir.join(name);
            let acc = flags & libc::O_ACCMODE;
            let file = OpenOptions::new()
                .read(acc != libc::O_WRONLY)
                .write(acc != libc::O_RDONLY)
                .mode(mode & 0o7777)
                // Not `create_new`: std refuses it without write access,
                // and open(O_CREAT | O_RDONLY) is valid.
                .custom_flags(backing_flags(flags) | libc::O_CREAT | libc::O_EXCL)
                .open(&path)?;
            if let Err(e) = set_owner(&path, caller, &dm) {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
            let m = file.metadata()?;
            let identity = (m.dev(), m.ino());
            let inode = self
                .inodes
                .assign(parent, name, name, NodeKind::Plain, identity);
            let writer = (acc != libc::O_RDONLY).then_some(identity);
            if let Some(w) = writer {
                self.add_writer(w);
            }
            let opened = self.plain_handle(inode.ino, file, writer, true);
            let entry = self.entry_of(&inode, &m)?;
            Ok((entry, opened))
        }
    }

    fn entry_of(&self, inode: &Inode, m: &Metadata) -> Result<Entry> {
        let attr = self.attr_of(inode, m)?;
        inode.state().lookups += 1;
        Ok(Entry {
            attr,
            ttl: self.ttl,
        })
    }

    /// `mknod`: regular files (as `create`), FIFOs, sockets and devices.
    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<Entry> {
        if mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0 {
            let (e, o) = self.create(
                parent,
                name,
                mode & 0o7777,
                libc::O_EXCL | libc::O_WRONLY,
                caller,
            )?;
            let fh = match o {
                Opened::Plain { fh, .. } | Opened::Archive { fh, .. } => fh,
            };
            self.release(fh);
            return Ok(e);
        }
        let (path, dm) = self.new_entry(parent, name, false)?;
        let c = cpath(&path)?;
        // SAFETY: `c` is a valid NUL-terminated path.
        check(unsafe { libc::mknod(c.as_ptr(), mode, rdev as libc::dev_t) })?;
        set_owner(&path, caller, &dm)?;
        self.lookup(parent, name)
    }

    /// The backing path for a new entry `name` in `parent` (writable,
    /// allowed, not existing) and the metadata of its directory.
    fn new_entry(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(PathBuf, Metadata)> {
        let (p, rel) = self.writable_dir(parent)?;
        self.check_new_name(&rel, name, dir)?;
        if self.resolve(&p, name).is_ok() {
            return Err(errno(libc::EEXIST));
        }
        let d = self.store.join(&rel);
        let dm = std::fs::metadata(&d).map_err(not_found_is)?;
        Ok((d.join(name), dm))
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, caller: Caller) -> Result<Entry> {
        let (path, dm) = self.new_entry(parent, name, true)?;
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(mode & 0o7777)
            .create(&path)?;
        set_owner(&path, caller, &dm)?;
        // mkdir(2) ignores set-ID bits of mode except as the fs decides;
        // keep what the backing filesystem did.
        self.lookup(parent, name)
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> Result<Entry> {
        let (path, dm) = self.new_entry(parent, name, false)?;
        std::os::unix::fs::symlink(target, &path)?;
        set_owner(&path, caller, &dm)?;
        self.lookup(parent, name)
    }

    /// Hard links, for plain files only (an archive or staged file has no
    /// single backing file to link).
    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Entry> {
        let (np, rel) = self.writable_dir(newparent)?;
        self.check_new_name(&rel, newname, false)?;
        let inode = self.inode(ino)?;
        match inode.kind() {
            NodeKind::Plain => {}
            NodeKind::Directory | NodeKind::Blz => return Err(errno(libc::EPERM)),
            NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } => return Err(FsError::ReadOnly),
            // Deliberate: see doc/SEMANTICS.md.
            NodeKind::Archive | NodeKind::Staged { .. } => return Err(errno(libc::EPERM)),
        }
        if namespace::is_staging_name(newname) {
            return Err(errno(libc::EPERM));
        }
        if self.resolve(&np, newname).is_ok() {
            return Err(errno(libc::EEXIST));
        }
        let _g = self.ns_lock();
        std::fs::hard_link(self.full(&inode)?, self.store.join(&rel).join(newname))?;
        self.lookup(newparent, newname)
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<()> {
        let (p, rel) = self.writable_dir(parent)?;
        let _g = self.ns_lock();
        let (backing, kind, _) = self.resolve(&p, name)?;
        match kind {
            NodeKind::Directory | NodeKind::Blz => return Err(FsError::IsADirectory),
            NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } => return Err(FsError::ReadOnly),
            NodeKind::Plain => {
                std::fs::remove_file(self.store.join(&rel).join(&backing))?;
            }
            NodeKind::Archive | NodeKind::Staged { .. } => {
                self.clear_name(&rel, name, None, None)?;
            }
        }
        self.inodes.remove_name(parent, name);
        Ok(())
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<()> {
        let (p, rel) = self.writable_dir(parent)?;
        let _g = self.ns_lock();
        let (backing, kind, _) = self.resolve(&p, name)?;
        match kind {
            NodeKind::Directory => {}
            // A `.blz` is a directory with content; it is removed by
            // unlinking the `.blz` in STORE.
            NodeKind::Blz => return Err(errno(libc::ENOTEMPTY)),
            NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } => return Err(FsError::ReadOnly),
            NodeKind::Plain | NodeKind::Archive | NodeKind::Staged { .. } => {
                return Err(FsError::NotADirectory)
            }
        }
        let drel = rel.join(&backing);
        if !self.spool()?.ids_under(&drel).is_empty() {
            return Err(errno(libc::ENOTEMPTY));
        }
        std::fs::remove_dir(self.store.join(&drel))?;
        self.inodes.remove_name(parent, name);
        Ok(())
    }

    /// `rename(2)`. `flags`: `RENAME_NOREPLACE` is honoured;
    /// `RENAME_EXCHANGE` and `RENAME_WHITEOUT` are refused with EINVAL.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return Err(errno(libc::EINVAL));
        }
        let (p, rel) = self.writable_dir(parent)?;
        let (np, nrel) = self.writable_dir(newparent)?;
        let spool = self.spool()?;
        let _g = self.ns_lock();
        let (backing, kind, meta) = self.resolve(&p, name)?;
        let dst = match self.resolve(&np, newname) {
            Ok(d) => Some(d),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        self.check_new_name(&nrel, newname, kind.is_dir())?;
        if parent == newparent && name == newname {
            return Ok(());
        }
        if let Some((_, dkind, dmeta)) = &dst {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(errno(libc::EEXIST));
            }
            if (dmeta.dev(), dmeta.ino()) == (meta.dev(), meta.ino()) {
                // Two names of one file: rename(2) does nothing.
                return Ok(());
            }
            match (kind.is_dir(), dkind.is_dir()) {
                (true, false) => return Err(FsError::NotADirectory),
                (false, true) => return Err(FsError::IsADirectory),
                _ => {}
            }
            if *dkind == NodeKind::Blz {
                return Err(errno(libc::ENOTEMPTY));
            }
            if *dkind == NodeKind::Directory && !spool.ids_under(&nrel.join(newname)).is_empty() {
                return Err(errno(libc::ENOTEMPTY));
            }
        }
        let src_dir = self.store.join(&rel);
        let dst_dir = self.store.join(&nrel);
        let identity = (meta.dev(), meta.ino());
        let staging = namespace::is_staging_name(newname);
        let (new_backing, new_kind, new_identity) = match kind {
            NodeKind::Directory => {
                std::fs::rename(src_dir.join(&backing), dst_dir.join(newname))?;
                spool.move_dir(&rel.join(name), &nrel.join(newname))?;
                (newname.to_os_string(), kind, identity)
            }
            NodeKind::Blz => {
                if dst.is_some() {
                    // Deliberate: see doc/SEMANTICS.md.
                    return Err(errno(libc::EXDEV));
                }
                let mut b = newname.to_os_string();
                b.push(".blz");
                if std::fs::symlink_metadata(dst_dir.join(&b)).is_ok() {
                    return Err(errno(libc::EEXIST));
                }
                std::fs::rename(src_dir.join(&backing), dst_dir.join(&b))?;
                (b, kind, identity)
            }
            NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } => return Err(FsError::ReadOnly),
            NodeKind::Plain if staging && meta.is_file() => {
                // `a.safetensors.incomplete` -> `a.safetensors`: a new
                // compression candidate.
                let id = spool.adopt(&nrel.join(newname), &src_dir.join(&backing))?;
                self.clear_name(&nrel, newname, None, Some(id))?;
                if self.writer_count(identity) == 0 {
                    self.schedule(id);
                }
                (newname.to_os_string(), NodeKind::Staged { id }, identity)
            }
            NodeKind::Plain => {
                std::fs::rename(src_dir.join(&backing), dst_dir.join(newname))?;
                self.clear_name(&nrel, newname, Some(newname), None)?;
                (newname.to_os_string(), kind, identity)
            }
            NodeKind::Staged { id } if staging => {
                spool.retarget(id, &nrel.join(newname))?;
                // The version it replaced at the old name goes with it.
                self.clear_name(&rel, name, None, Some(id))?;
                self.clear_name(&nrel, newname, None, Some(id))?;
                (newname.to_os_string(), kind, identity)
            }
            NodeKind::Staged { id } => {
                spool.bump(id);
                std::fs::rename(spool.data_path(id), dst_dir.join(newname))?;
                spool.forget(id)?;
                self.clear_name(&rel, name, None, None)?;
                self.clear_name(&nrel, newname, Some(newname), None)?;
                (newname.to_os_string(), NodeKind::Plain, identity)
            }
            NodeKind::Archive if staging => {
                let z = self.archive_name_in(&dst_dir, newname);
                std::fs::rename(src_dir.join(&backing), dst_dir.join(&z))?;
                self.clear_name(&nrel, newname, Some(&z), None)?;
                (z, kind, identity)
            }
            // An archive is only presented under an `X.safetensors` name;
            // EXDEV makes mv(1) and shutil.move copy (decoding) instead.
            NodeKind::Archive => return Err(errno(libc::EXDEV)),
        };
        crate::fsutil::sync_dir(&dst_dir)?;
        if rel != nrel {
            crate::fsutil::sync_dir(&src_dir)?;
        }
        match self.inodes.find(parent, name) {
            Some(i) => {
                self.inodes.rename(
                    i.ino,
                    newparent,
                    newname,
                    new_backing,
                    new_kind,
                    new_identity,
                );
                if let NodeKind::Staged { id } = new_kind {
                    spool.set_ino(id, i.ino);
                }
            }
            None => self.inodes.remove_name(newparent, newname),
        }
        Ok(())
    }

    /// `setattr`: mode, owner, size and times, through `fh` when given.
    pub fn setattr(&self, ino: u64, a: SetAttr, fh: Option<u64>) -> Result<Attr> {
        let spool = self.spool()?;
        let inode = self.inode(ino)?;
        let handle_file = fh
            .and_then(|f| self.handle(f).ok())
            .and_then(|h| match &*h {
                Handle::Plain(PlainHandle { file, ino: hi, .. }) if *hi == ino => {
                    Some(file.clone())
                }
                _ => None,
            });
        match inode.kind() {
            NodeKind::Blz | NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } => {
                return Err(FsError::ReadOnly)
            }
            _ => {}
        }
        if let Some(size) = a.size {
            let kind = inode.kind();
            match kind {
                NodeKind::Directory => return Err(FsError::IsADirectory),
                NodeKind::Plain
                    if namespace::is_staging_name(&inode.loc().name) && handle_file.is_none() =>
                {
                    let path = self.full(&inode)?;
                    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
                        let id = self.stage_plain(spool, &inode)?;
                        self.truncate_staged(spool, id, size, None)?;
                    }
                }
                NodeKind::Plain => match &handle_file {
                    Some(f) => f.set_len(size)?,
                    None => OpenOptions::new()
                        .write(true)
                        .open(self.full(&inode)?)
                        .map_err(not_found_is)?
                        .set_len(size)?,
                },
                NodeKind::Staged { id } => {
                    self.truncate_staged(spool, id, size, handle_file.as_deref())?
                }
                NodeKind::Archive => {
                    let id = self.stage_archive(spool, &inode, size == 0)?;
                    self.truncate_staged(spool, id, size, None)?;
                }
                NodeKind::Blz | NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } => {
                    unreachable!("refused above")
                }
            }
        }
        let path = self.full(&inode)?;
        let c = cpath(&path)?;
        if a.uid.is_some() || a.gid.is_some() {
            let uid = a.uid.unwrap_or(u32::MAX);
            let gid = a.gid.unwrap_or(u32::MAX);
            // SAFETY: `c` is a valid NUL-terminated path.
            check(unsafe { libc::lchown(c.as_ptr(), uid, gid) })?;
        }
        if let Some(mode) = a.mode {
            // SAFETY: `c` is a valid NUL-terminated path.
            check(unsafe { libc::chmod(c.as_ptr(), (mode & 0o7777) as libc::mode_t) })?;
        }
        if a.atime.is_some() || a.mtime.is_some() {
            let ts = [timespec(a.atime), timespec(a.mtime)];
            // SAFETY: `c` is a valid path and `ts` two timespecs.
            check(unsafe {
                libc::utimensat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    ts.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
        }
        self.getattr_fh(ino, fh)
    }

    /// Truncates staged file `id` (through `file` when the caller has it
    /// open) and queues it when nothing has it open for writing.
    fn truncate_staged(
        &self,
        spool: &Spool,
        id: u64,
        size: u64,
        file: Option<&File>,
    ) -> Result<()> {
        let entry = spool.entry(id).ok_or(FsError::Stale)?;
        self.add_writer(entry.identity);
        spool.bump(id);
        let r = match file {
            Some(f) => f.set_len(size),
            None => OpenOptions::new()
                .write(true)
                .open(spool.data_path(id))
                .and_then(|f| f.set_len(size)),
        };
        self.writer_closed(entry.identity);
        r.map_err(not_found_is)
    }

    /// Writes `data` at `offset` through a handle opened for writing.
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.handle(fh)?;
        match &*h {
            Handle::Plain(PlainHandle {
                file,
                writer: Some(_),
                ..
            }) => {
                file.write_all_at(data, offset)?;
                Ok(data.len() as u32)
            }
            Handle::Plain(_) | Handle::Archive(_) => Err(FsError::BadHandle(fh)),
            Handle::Dir(_) => Err(FsError::IsADirectory),
        }
    }

    /// `fsync`: the file, and for a staged file its spool record, so that
    /// it survives a power loss too.
    pub fn fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        let h = self.handle(fh)?;
        let Handle::Plain(PlainHandle { file, writer, .. }) = &*h else {
            return Ok(());
        };
        if datasync {
            file.sync_data()?;
        } else {
            file.sync_all()?;
        }
        if let (Some(id), Some(s)) = (writer, &self.spool) {
            if let Some(sid) = s.find_identity(*id) {
                s.sync(sid)?;
            }
        }
        Ok(())
    }

    /// `fallocate(2)` on a handle opened for writing.
    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        let h = self.handle(fh)?;
        let Handle::Plain(PlainHandle {
            file,
            writer: Some(_),
            ..
        }) = &*h
        else {
            return Err(FsError::BadHandle(fh));
        };
        use std::os::fd::AsRawFd;
        // SAFETY: the fd is open for as long as `file` lives.
        check(unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        })
    }
}

/// Decodes all of `a` into `out` (copy-up of an archive opened for
/// writing).
fn copy_up(a: &dyn ArchiveView, out: &File) -> Result<()> {
    let len = a.logical_len(0);
    let mut buf = vec![0u8; 16 << 20];
    let mut off = 0u64;
    while off < len {
        let n = ((len - off) as usize).min(buf.len());
        let got = a
            .read_at(0, off, &mut buf[..n])
            .map_err(|e| FsError::Decode(Arc::new(e)))?;
        if got == 0 {
            return Err(errno(libc::EIO));
        }
        out.write_all_at(&buf[..got], off)?;
        off += got as u64;
    }
    Ok(())
}
