//! The spool: `.safetensors` files written through the mount, staged as
//! plain files until they are compressed.
//!
//! The spool is the directory `STORE/.ckptfs-spool`, on the same filesystem
//! as the store (so files move in and out of it by `rename`), hidden from
//! the mount. Each staged file is two entries:
//!
//! - `ID.path`: the file's presented path relative to STORE (raw bytes,
//!   e.g. `run1/model.safetensors`), written before the data exists and
//!   replaced atomically (`ID.path.tmp` + rename) when the file is renamed;
//! - `ID.data`: the file's bytes, written in place by the application.
//!
//! `ID` is 16 hex digits, never reused within a mount (the next one starts
//! after the largest found at startup).
//!
//! Invariants that make a crash at any moment safe (see `recover`):
//! - a `.data` is only created or moved in after its `.path` exists, and
//!   the `.path` is removed only after the `.data` is gone (committed,
//!   put back, or unlinked); so a `.data` always knows where it belongs,
//!   and a lone `.path` is garbage;
//! - the compressed result is written to `ID.zstn.tmp` here, fsynced, and
//!   renamed to its final name; a `.tmp` is never visible in the mount and
//!   is deleted at startup;
//! - while a `.data` exists it is the newest content of its path: lookups
//!   resolve the path to it before anything in STORE.
//!
//! This module owns the files and the in-memory index only; when to stage,
//! compress and commit is decided by `CheckpointFs`.

use super::inode::Identity;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Name of the spool directory in STORE's root.
pub const SPOOL_DIR: &str = ".ckptfs-spool";

#[derive(Debug, Clone)]
pub struct Entry {
    /// Presented path relative to STORE.
    pub target: PathBuf,
    /// Identity of the `.data` file.
    pub identity: Identity,
    /// Bumped on every change of content (open for writing, truncate); a
    /// compression of an older version is discarded.
    pub version: u64,
    /// A compression of this entry is reading its `.data`.
    pub compressing: bool,
    /// The inode presenting it, once one was assigned.
    pub ino: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    entries: HashMap<u64, Entry>,
    by_target: HashMap<PathBuf, u64>,
}

#[derive(Debug)]
pub struct Spool {
    /// Absolute path of the spool directory.
    dir: PathBuf,
    state: Mutex<State>,
    /// Signalled when a compression ends.
    idle: Condvar,
}

fn data_name(id: u64) -> String {
    format!("{id:016x}.data")
}

fn path_name(id: u64) -> String {
    format!("{id:016x}.path")
}

/// A found spool entry at startup.
#[derive(Debug)]
pub struct Recovered {
    pub id: u64,
    pub target: PathBuf,
}

impl Spool {
    /// Opens (creating if needed) the spool in `store`, deletes temporary
    /// files and lone records, and indexes every staged file.
    pub fn open(store: &Path) -> io::Result<(Spool, Vec<Recovered>)> {
        let dir = store.join(SPOOL_DIR);
        let created = match std::fs::create_dir(&dir) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(e),
        };
        secure_dir(&dir)?;
        if created {
            ckptfs_format::fsutil::sync_dir(store)?;
        }
        let mut ids = Vec::new();
        let mut max = 0u64;
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let name = e.file_name();
            let n = name.to_string_lossy();
            let stem = n.split('.').next().unwrap_or("");
            if let Ok(id) = u64::from_str_radix(stem, 16) {
                max = max.max(id);
            }
            if n.ends_with(".tmp") {
                log::info!("spool: removing leftover {}", dir.join(&name).display());
                std::fs::remove_file(dir.join(&name))?;
            } else if let Some(s) = n.strip_suffix(".path") {
                if let Ok(id) = u64::from_str_radix(s, 16) {
                    ids.push(id);
                }
            }
        }
        let spool = Spool {
            dir,
            state: Mutex::new(State {
                next: max + 1,
                ..Default::default()
            }),
            idle: Condvar::new(),
        };
        let mut found = Vec::new();
        let mut data_ids = Vec::new();
        for e in std::fs::read_dir(&spool.dir)? {
            let n = e?.file_name();
            if let Some(s) = n.to_string_lossy().strip_suffix(".data") {
                if let Ok(id) = u64::from_str_radix(s, 16) {
                    data_ids.push(id);
                }
            }
        }
        ids.sort();
        for id in ids {
            let target = PathBuf::from(std::ffi::OsStr::from_bytes(&std::fs::read(
                spool.dir.join(path_name(id)),
            )?));
            let data = spool.dir.join(data_name(id));
            match std::fs::symlink_metadata(&data) {
                Ok(m) if valid_target(&target) => {
                    let mut st = spool.state.lock();
                    if let Some(old) = st.by_target.get(&target).copied() {
                        // Two staged versions of one path cannot happen
                        // through the mount; keep the newer (larger id),
                        // but never delete data: the older one is put in
                        // the store root under a recovered name.
                        let keep = PathBuf::from(format!(
                            "ckptfs-recovered-{old:016x}-{}",
                            target
                                .file_name()
                                .map(|n| n.to_string_lossy().into_owned())
                                .unwrap_or_default()
                        ));
                        log::warn!(
                            "spool: two staged versions of {}; keeping the older as {}",
                            target.display(),
                            keep.display()
                        );
                        st.entries.get_mut(&old).expect("indexed").target = keep.clone();
                        st.by_target.insert(keep, old);
                    }
                    st.by_target.insert(target.clone(), id);
                    st.entries.insert(
                        id,
                        Entry {
                            target: target.clone(),
                            identity: (m.dev(), m.ino()),
                            version: 0,
                            compressing: false,
                            ino: None,
                        },
                    );
                    found.push(Recovered { id, target });
                }
                Ok(_) => {
                    let keep = PathBuf::from(format!("ckptfs-recovered-{id:016x}"));
                    log::warn!(
                        "spool: {} names an invalid path {:?}; recovering it as {}",
                        path_name(id),
                        target,
                        keep.display()
                    );
                    let m = std::fs::symlink_metadata(&data)?;
                    spool.index(id, &keep, (m.dev(), m.ino()), 0);
                    found.push(Recovered { id, target: keep });
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // Committed, put back or unlinked before the record
                    // was removed.
                    std::fs::remove_file(spool.dir.join(path_name(id)))?;
                }
                Err(e) => return Err(e),
            }
        }
        for id in data_ids {
            if !spool.state.lock().entries.contains_key(&id) {
                // Cannot happen (the record is written first); never drop
                // data anyway.
                let keep = PathBuf::from(format!("ckptfs-recovered-{id:016x}"));
                log::warn!(
                    "spool: {} has no record; recovering it as {}",
                    data_name(id),
                    keep.display()
                );
                let m = std::fs::symlink_metadata(spool.dir.join(data_name(id)))?;
                spool.write_record(id, &keep, false)?;
                spool.index(id, &keep, (m.dev(), m.ino()), 0);
                found.push(Recovered { id, target: keep });
            }
        }
        Ok((spool, found))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the staged bytes, relative to STORE.
    pub fn data_rel(id: u64) -> PathBuf {
        Path::new(SPOOL_DIR).join(data_name(id))
    }

    pub fn data_path(&self, id: u64) -> PathBuf {
        self.dir.join(data_name(id))
    }

    pub fn tmp_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id:016x}.zstn.tmp"))
    }

    /// Writes the record of `id` (through a temporary file when it
    /// `replace`s one). A record that cannot be written whole (out of
    /// space) is removed, not left behind half written: an orphan record
    /// would keep the spool from ever being empty.
    fn write_record(&self, id: u64, target: &Path, replace: bool) -> io::Result<()> {
        let dst = self.dir.join(path_name(id));
        let written = if replace {
            self.dir.join(format!("{}.tmp", path_name(id)))
        } else {
            dst.clone()
        };
        // The daemon runs with umask 0: records are private by mode.
        let mut o = OpenOptions::new();
        o.write(true).mode(0o600);
        if replace {
            o.create(true).truncate(true);
        } else {
            o.create_new(true);
        }
        let mut f = o.open(&written)?;
        let r = f.write_all(target.as_os_str().as_bytes()).and_then(|_| {
            if replace {
                f.sync_all()?;
                std::fs::rename(&written, &dst)?;
            }
            Ok(())
        });
        if r.is_err() {
            let _ = std::fs::remove_file(&written);
        }
        r
    }

    fn insert(&self, id: u64, target: &Path, identity: Identity) {
        self.index(id, target, identity, 1);
    }

    /// Adds `id` to the index as staged for `target`.
    fn index(&self, id: u64, target: &Path, identity: Identity, version: u64) {
        let mut st = self.state.lock();
        st.by_target.insert(target.to_path_buf(), id);
        st.entries.insert(
            id,
            Entry {
                target: target.to_path_buf(),
                identity,
                version,
                compressing: false,
                ino: None,
            },
        );
    }

    fn next_id(&self) -> u64 {
        let mut st = self.state.lock();
        let id = st.next;
        st.next += 1;
        id
    }

    /// Stages a new, empty file for `target`, created with `mode` (the
    /// caller's umask already applied) and opened with `flags`.
    pub fn create(&self, target: &Path, mode: u32, flags: i32) -> io::Result<(u64, File)> {
        let id = self.next_id();
        self.write_record(id, target, false)?;
        let data = self.data_path(id);
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode & 0o7777)
            .custom_flags(flags & (libc::O_APPEND | libc::O_SYNC | libc::O_DSYNC))
            .open(&data)
        {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(self.dir.join(path_name(id)));
                return Err(e);
            }
        };
        // The process umask is 0 in the daemon; set the exact mode anyway.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))?;
        let m = file.metadata()?;
        self.insert(id, target, (m.dev(), m.ino()));
        Ok((id, file))
    }

    /// Stages an existing plain file for `target`: `move_in` moves it to
    /// the spool path it is given (from STORE, which only the caller may
    /// resolve safely).
    pub fn adopt(
        &self,
        target: &Path,
        move_in: impl FnOnce(&Path) -> io::Result<()>,
    ) -> io::Result<u64> {
        let id = self.next_id();
        self.write_record(id, target, false)?;
        let data = self.data_path(id);
        if let Err(e) = move_in(&data) {
            let _ = std::fs::remove_file(self.dir.join(path_name(id)));
            return Err(e);
        }
        let m = std::fs::symlink_metadata(&data)?;
        self.insert(id, target, (m.dev(), m.ino()));
        Ok(id)
    }

    /// The staged file presenting `target`, if any.
    pub fn find(&self, target: &Path) -> Option<(u64, Entry)> {
        let st = self.state.lock();
        let id = *st.by_target.get(target)?;
        Some((id, st.entries.get(&id)?.clone()))
    }

    pub fn entry(&self, id: u64) -> Option<Entry> {
        self.state.lock().entries.get(&id).cloned()
    }

    /// The entry whose `.data` has `identity`.
    pub fn find_identity(&self, identity: Identity) -> Option<u64> {
        let st = self.state.lock();
        st.entries
            .iter()
            .find(|(_, e)| e.identity == identity)
            .map(|(id, _)| *id)
    }

    pub fn set_ino(&self, id: u64, ino: u64) {
        if let Some(e) = self.state.lock().entries.get_mut(&id) {
            e.ino = Some(ino);
        }
    }

    /// Staged entries whose target is inside directory `dir`.
    pub fn ids_under(&self, dir: &Path) -> Vec<u64> {
        let st = self.state.lock();
        st.entries
            .iter()
            .filter(|(_, e)| e.target.parent() == Some(dir) || e.target.starts_with(dir))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Names (presented) of staged files directly in `dir`.
    pub fn names_in(&self, dir: &Path) -> Vec<(u64, std::ffi::OsString)> {
        let st = self.state.lock();
        st.entries
            .iter()
            .filter(|(_, e)| e.target.parent() == Some(dir))
            .filter_map(|(id, e)| Some((*id, e.target.file_name()?.to_os_string())))
            .collect()
    }

    /// The content of `id` changes: a compression in progress is waited
    /// for (it maps the file; a truncation under it would fault) and its
    /// result will be discarded.
    pub fn bump(&self, id: u64) {
        let mut st = self.state.lock();
        loop {
            match st.entries.get_mut(&id) {
                Some(e) if e.compressing => {
                    self.idle.wait(&mut st);
                }
                Some(e) => {
                    e.version += 1;
                    return;
                }
                None => return,
            }
        }
    }

    /// Marks `id` as being compressed; returns its entry, or None if it
    /// is gone or already being compressed.
    pub fn begin_compress(&self, id: u64) -> Option<Entry> {
        let mut st = self.state.lock();
        let e = st.entries.get_mut(&id)?;
        if e.compressing {
            return None;
        }
        e.compressing = true;
        Some(e.clone())
    }

    pub fn end_compress(&self, id: u64) {
        if let Some(e) = self.state.lock().entries.get_mut(&id) {
            e.compressing = false;
        }
        self.idle.notify_all();
    }

    /// The file now presents `target`: the record is replaced atomically.
    pub fn retarget(&self, id: u64, target: &Path) -> io::Result<()> {
        self.write_record(id, target, true)?;
        let mut st = self.state.lock();
        if let Some(e) = st.entries.get_mut(&id) {
            let old = std::mem::replace(&mut e.target, target.to_path_buf());
            if st.by_target.get(&old) == Some(&id) {
                st.by_target.remove(&old);
            }
            st.by_target.insert(target.to_path_buf(), id);
        }
        Ok(())
    }

    /// A directory was renamed: every staged file under `from` moves to
    /// `to`.
    pub fn move_dir(&self, from: &Path, to: &Path) -> io::Result<()> {
        let moves: Vec<(u64, PathBuf)> = {
            let st = self.state.lock();
            st.entries
                .iter()
                .filter_map(|(id, e)| {
                    let rest = e.target.strip_prefix(from).ok()?;
                    Some((*id, to.join(rest)))
                })
                .collect()
        };
        for (id, t) in moves {
            self.retarget(id, &t)?;
        }
        Ok(())
    }

    /// The entry is finished: its `.data` was moved out (committed as a
    /// plain file) or already removed. Removes the record.
    pub fn forget(&self, id: u64) -> io::Result<()> {
        {
            let mut st = self.state.lock();
            if let Some(e) = st.entries.remove(&id) {
                if st.by_target.get(&e.target) == Some(&id) {
                    st.by_target.remove(&e.target);
                }
            }
        }
        self.idle.notify_all();
        match std::fs::remove_file(self.dir.join(path_name(id))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Deletes a staged file (unlinked through the mount): the data first,
    /// then the record.
    pub fn remove(&self, id: u64) -> io::Result<()> {
        match std::fs::remove_file(self.data_path(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        self.forget(id)
    }

    /// Makes the record and the spool directory durable (fsync of a staged
    /// file).
    pub fn sync(&self, id: u64) -> io::Result<()> {
        File::open(self.dir.join(path_name(id)))?.sync_all()?;
        ckptfs_format::fsutil::sync_dir(&self.dir)
    }

    pub fn len(&self) -> usize {
        self.state.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A relative path with no `..`, root or empty components.
fn valid_target(p: &Path) -> bool {
    use std::path::Component;
    !p.as_os_str().is_empty()
        && p.components().all(|c| matches!(c, Component::Normal(_)))
        && p.components().next().map(|c| c.as_os_str()) != Some(std::ffi::OsStr::new(SPOOL_DIR))
}

/// Makes the spool directory `dir` the daemon's own, mode 0700, whether
/// it was just made or found (an older build, a restore from a backup or
/// another user may have left it open to others): staged names and sizes
/// are nobody else's business. Refuses a symlink or a non-directory, and a
/// directory owned by someone else when the daemon cannot take it over.
fn secure_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{}: the spool must be a directory ({e})", dir.display()),
            )
        })?;
    let m = f.metadata()?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        if me != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: owned by uid {}, not by the daemon's uid {me}",
                    dir.display(),
                    m.uid()
                ),
            ));
        }
        // SAFETY: getegid has no preconditions.
        std::os::unix::fs::fchown(&f, Some(me), Some(unsafe { libc::getegid() }))?;
        log::warn!(
            "{}: was owned by uid {}; now root's",
            dir.display(),
            m.uid()
        );
    }
    if m.mode() & 0o7777 != 0o700 {
        f.set_permissions(std::fs::Permissions::from_mode(0o700))?;
        if m.mode() & 0o077 != 0 {
            log::warn!(
                "{}: was mode {:04o}, open to other users; now 0700",
                dir.display(),
                m.mode() & 0o7777
            );
        }
    }
    Ok(())
}
