//! The local mirror of a bucket prefix: the directory a mount serves as
//! its STORE when the store is `s3://BUCKET/PREFIX`.
//!
//! Every object under the prefix appears at its relative key as a sparse
//! file of the object's size (and modification time), whose bytes are
//! fetched on demand: archives block by block, other files whole when
//! opened or by pieces. The fs layer serves the mirror as a local store,
//! except that it opens files through the mirror, which is its
//! [`Sources`]: a mirror file (known by device and inode, whatever name
//! it has now) becomes a [`remote::RemoteMapped`], any other file a plain
//! map.
//!
//! [`Mirror::refresh`] lists the prefix again (every `--metadata-ttl`):
//! a new object gets a mirror file; an object whose ETag or size changed
//! is a new version, a new mirror file renamed over the old name, so
//! handles open on the old one keep its bytes (and fetches of bytes it
//! lacks fail cleanly: they are conditional on the old ETag); an object
//! gone from the listing has its mirror file removed.
//!
//! Layout under the cache directory: `mirror/` (the STORE), `state/` (one
//! JSON per mirror file: object, ETag, size, the mirror file's inode and
//! the byte ranges present; written after the bytes are synced) and `tmp/`
//! (new mirror files before they are renamed into place). On start the
//! states whose mirror file is still there (same inode and size) are
//! registered again, so the cache survives a restart and serves, without
//! the server, every byte it holds. The bytes held are kept under the
//! disk cache's limit (`budget`), least recently used given back first.
//!
//! A writable mount changes the bucket through the mirror
//! ([`Mirror::publish`], [`Mirror::published`], [`Mirror::remove`],
//! [`Mirror::copy`], [`Mirror::moved`]): each records the key as changed
//! locally, and a listing that started before that change leaves the key
//! alone (it may predate the change); a key being uploaded is left alone
//! by every listing until the upload ends.
//!
//! Keys that cannot be a path below the mirror (empty, `.` or `..`
//! components, NUL, names longer than 255 bytes, names the store
//! reserves) are skipped with a log line: nothing is ever written outside
//! the mirror.

use super::budget::Budget;
use super::ranges::RangeSet;
use super::remote::{self, RemoteFile};
use super::s3::{Listed, S3Client};
use crate::source::{ByteSource, Sources};
use ckptfs_format::digest::xxh3_64;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

pub struct Mirror {
    client: Arc<S3Client>,
    budget: Arc<Budget>,
    root: PathBuf,
    state_dir: PathBuf,
    tmp_dir: PathBuf,
    /// The current version of each object, by relative key.
    known: Mutex<HashMap<String, Arc<RemoteFile>>>,
    /// Keys this daemon changed: the change's sequence number (`BUSY`
    /// while an upload or copy runs).
    touched: Mutex<HashMap<String, u64>>,
    seq: std::sync::atomic::AtomicU64,
    /// Every version's mirror file, by (device, inode): an open file of
    /// the mirror is one of them even after a new version was renamed
    /// over its name.
    files: RwLock<HashMap<(u64, u64), Arc<RemoteFile>>>,
}

const BUSY: u64 = u64::MAX;

/// Whether `rel` can be a file below the mirror.
pub fn valid_rel(rel: &str) -> bool {
    !rel.is_empty()
        && !rel.contains('\0')
        && rel.split('/').all(|c| {
            !c.is_empty() && c != "." && c != ".." && c.len() <= 255 && !c.starts_with(".ckptfs")
        })
}

impl Mirror {
    /// Opens (creating it if needed) the mirror under `cache_dir`,
    /// registers the versions a previous run left, and evicts what exceeds
    /// `budget`.
    pub fn open(
        client: Arc<S3Client>,
        cache_dir: &Path,
        budget: Arc<Budget>,
    ) -> io::Result<Mirror> {
        let m = Mirror {
            client,
            budget,
            root: cache_dir.join("mirror"),
            state_dir: cache_dir.join("state"),
            tmp_dir: cache_dir.join("tmp"),
            known: Mutex::new(HashMap::new()),
            touched: Mutex::new(HashMap::new()),
            seq: std::sync::atomic::AtomicU64::new(0),
            files: RwLock::new(HashMap::new()),
        };
        for d in [&m.root, &m.state_dir, &m.tmp_dir] {
            ckptfs_format::fsutil::create_dirs(d, 0o700, 0o700)?;
        }
        for e in std::fs::read_dir(&m.tmp_dir)? {
            let _ = std::fs::remove_file(e?.path());
        }
        for e in std::fs::read_dir(&m.state_dir)? {
            let path = e?.path();
            match m.restore(&path) {
                Ok(true) => {}
                Ok(false) => {
                    let _ = std::fs::remove_file(&path);
                }
                Err(e) => log::warn!("{}: {e}", path.display()),
            }
        }
        let used = m.budget.enforce();
        log::info!(
            "{}: disk cache holds {used} of {} bytes",
            cache_dir.display(),
            m.budget.limit()
        );
        Ok(m)
    }

    /// The directory the mount serves.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn client(&self) -> &Arc<S3Client> {
        &self.client
    }

    /// Makes `remote` the source of the mirror file it writes.
    fn register(&self, remote: &Arc<RemoteFile>) -> io::Result<()> {
        let m = remote.mirror_file().metadata()?;
        self.files
            .write()
            .insert((m.dev(), m.ino()), remote.clone());
        Ok(())
    }

    /// The version an open mirror file is a copy of, if it is one.
    fn lookup(&self, file: &File) -> Option<Arc<RemoteFile>> {
        let m = file.metadata().ok()?;
        self.files.read().get(&(m.dev(), m.ino())).cloned()
    }

    /// Saves now every range set not saved yet (the daemon is exiting).
    pub fn save_all(&self) {
        remote::save_queued();
        let all: Vec<Arc<RemoteFile>> = self.files.read().values().cloned().collect();
        for f in all {
            f.save_if_dirty();
        }
    }

    /// Fills a whole mirror file that is about to leave the cache (moved
    /// into the spool of a writable mount): it is never evicted after
    /// this. Any other file is left alone.
    pub fn fill_and_take(&self, file: &File) -> io::Result<()> {
        if let Some(r) = self.lookup(file) {
            let (u, _) = remote::open_plain(r, true)?;
            u.leave_cache();
        }
        Ok(())
    }

    /// Registers the version a state file describes if its mirror file is
    /// still the one it names (false: the state is stale).
    fn restore(&self, state_path: &Path) -> io::Result<bool> {
        let Some(st) = remote::load_state(state_path) else {
            return Ok(false);
        };
        if !valid_rel(&st.rel) {
            return Ok(false);
        }
        let path = self.root.join(&st.rel);
        let Ok(file) = OpenOptions::new().read(true).write(true).open(&path) else {
            return Ok(false);
        };
        let meta = file.metadata()?;
        if meta.ino() != st.ino || meta.len() != st.size || !meta.is_file() {
            return Ok(false);
        }
        let listed = Listed {
            rel: st.rel.clone(),
            size: st.size,
            etag: st.etag.clone(),
            mtime: st.mtime,
        };
        let present = RangeSet::from_pairs(&st.ranges);
        let r = RemoteFile::new(
            self.client.clone(),
            &listed,
            file,
            state_path.to_path_buf(),
            present,
            &self.budget,
            st.used.max(1),
        )?;
        r.free_missing();
        self.register(&r)?;
        self.known.lock().insert(st.rel, r);
        Ok(true)
    }

    /// Lists the prefix and brings the mirror up to date with it.
    pub fn refresh(&self) -> io::Result<()> {
        let start = self.seq.load(std::sync::atomic::Ordering::SeqCst);
        let listed = self.client.list()?;
        // Keys changed by this daemon since the listing started: the
        // listing may predate the change.
        let fresh = |rel: &str| self.touched.lock().get(rel).is_some_and(|&s| s > start);
        let mut seen = std::collections::HashSet::new();
        for l in listed {
            if l.rel.ends_with('/') {
                continue; // a "directory marker" object
            }
            if !valid_rel(&l.rel) {
                log::warn!(
                    "{}: skipped: not a name the mount can show",
                    self.client.url().display(&l.rel)
                );
                continue;
            }
            seen.insert(l.rel.clone());
            if fresh(&l.rel) {
                continue;
            }
            let current = self.known.lock().get(&l.rel).cloned();
            if current.is_some_and(|c| c.listed().same_version(&l)) {
                continue;
            }
            match self.add_version(&l) {
                Ok(r) => {
                    if let Some(old) = self.known.lock().insert(l.rel.clone(), r) {
                        log::info!(
                            "{}: new version ({}); open handles keep the old one",
                            self.client.url().display(&l.rel),
                            l.version_key()
                        );
                        old.forget();
                    }
                }
                Err(e) => log::warn!(
                    "{}: cannot add to the mirror: {e}",
                    self.client.url().display(&l.rel)
                ),
            }
        }
        let gone: Vec<(String, Arc<RemoteFile>)> = self
            .known
            .lock()
            .iter()
            .filter(|(k, _)| !seen.contains(*k) && !fresh(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (rel, r) in gone {
            let path = self.root.join(&rel);
            if let Ok(file) = File::open(&path) {
                if self.lookup(&file).is_some_and(|x| Arc::ptr_eq(&x, &r)) {
                    let _ = std::fs::remove_file(&path);
                }
            }
            r.forget();
            self.known.lock().remove(&rel);
            log::info!(
                "{}: removed from the bucket",
                self.client.url().display(&rel)
            );
        }
        Ok(())
    }

    /// A new mirror file for version `l`, renamed into place.
    fn add_version(&self, l: &Listed) -> io::Result<Arc<RemoteFile>> {
        let dest = self.root.join(&l.rel);
        if let Some(parent) = dest.parent() {
            ckptfs_format::fsutil::create_dirs(parent, 0o700, 0o700)?;
        }
        if dest.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            return Err(io::Error::other("a directory of the mirror has that name"));
        }
        let name = version_name(l);
        let tmp = self.tmp_dir.join(&name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.set_len(l.size)?;
        let mtime = UNIX_EPOCH + Duration::from_secs(l.mtime.max(0) as u64);
        file.set_modified(mtime)?;
        let state_path = self.state_dir.join(format!("{name}.json"));
        let r = RemoteFile::new(
            self.client.clone(),
            l,
            file,
            state_path,
            RangeSet::new(),
            &self.budget,
            0,
        )?;
        r.persist_now()?;
        std::fs::rename(&tmp, &dest)?;
        self.register(&r)?;
        Ok(r)
    }

    fn touch(&self, rel: &str, busy: bool) {
        let s = self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        self.touched
            .lock()
            .insert(rel.to_string(), if busy { BUSY } else { s });
    }

    /// Uploads the finished local file `local` as object `rel` (whole or
    /// not at all). Returns the object's ETag.
    pub fn publish(&self, local: &Path, rel: &str) -> io::Result<String> {
        self.touch(rel, true);
        let r = self.client.put_file(local, rel);
        if r.is_err() {
            self.touch(rel, false);
        }
        r
    }

    /// The object `rel` (ETag `etag`) just uploaded is the mirror file at
    /// `rel`, whole: it is registered as the current version, with every
    /// byte present.
    ///
    /// The version is what a HEAD of the object says (its modification
    /// time identifies it where listings carry no ETag); if the HEAD
    /// fails, the upload's ETag and the local file's time stand in, and
    /// the next listing may then take the object for a new version
    /// (fetched again when read: slower, never wrong).
    pub fn published(&self, rel: &str, etag: &str) -> io::Result<()> {
        let version = self.client.head(rel).unwrap_or_else(|e| {
            log::warn!("{e}: after uploading it");
            Listed {
                rel: rel.to_string(),
                size: 0,
                etag: etag.to_string(),
                mtime: 0,
            }
        });
        let r = self.adopt(rel, version, None);
        self.touch(rel, false);
        r
    }

    /// Registers the mirror file at `rel` as version `v` of object `rel`
    /// (its size is the file's; a time of 0 is taken from the file), with
    /// bytes `present` (None: all).
    fn adopt(&self, rel: &str, v: Listed, present: Option<RangeSet>) -> io::Result<()> {
        let path = self.root.join(rel);
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let m = file.metadata()?;
        let listed = Listed {
            rel: rel.to_string(),
            size: m.len(),
            mtime: if v.mtime == 0 { m.mtime() } else { v.mtime },
            etag: v.etag,
        };
        let present = present.unwrap_or_else(|| {
            let mut all = RangeSet::new();
            all.insert(0..m.len());
            all
        });
        if let Some(old) = self.known.lock().remove(rel) {
            old.forget();
        }
        let name = version_name(&listed);
        let state_path = self.state_dir.join(format!("{name}.json"));
        let r = RemoteFile::new(
            self.client.clone(),
            &listed,
            file,
            state_path,
            present,
            &self.budget,
            0,
        )?;
        r.persist_now()?;
        self.register(&r)?;
        self.known.lock().insert(rel.to_string(), r);
        Ok(())
    }

    /// An upload of `rel` whose result was not committed: the object is
    /// removed unless the mirror has a file at `rel`.
    pub fn unpublish(&self, rel: &str) {
        if self.root.join(rel).symlink_metadata().is_err() {
            if let Err(e) = self.client.delete(rel) {
                log::error!("{e}");
            }
        }
        self.touch(rel, false);
    }

    /// Removes object `rel` (absent is not an error) and forgets it. A key
    /// the mirror neither lists nor has a file for is not asked about.
    pub fn remove(&self, rel: &str) -> io::Result<()> {
        if !self.known.lock().contains_key(rel) && self.root.join(rel).symlink_metadata().is_err() {
            return Ok(());
        }
        self.touch(rel, false);
        match self.client.delete(rel) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        if let Some(old) = self.known.lock().remove(rel) {
            old.forget();
        }
        self.touch(rel, false);
        Ok(())
    }

    /// Copies object `from` to `to` on the server (before the mirror file
    /// is renamed).
    pub fn copy(&self, from: &str, to: &str) -> io::Result<()> {
        self.touch(to, true);
        let r = self.client.copy(from, to);
        self.touch(to, false);
        r
    }

    /// The mirror file `from` was renamed to `to` after [`Self::copy`]:
    /// removes object `from` and registers the file as object `to`, with
    /// the bytes it held.
    pub fn moved(&self, from: &str, to: &str) -> io::Result<()> {
        self.touch(from, false);
        self.touch(to, false);
        let old = self.known.lock().remove(from);
        let present = old.as_ref().map(|r| {
            r.forget();
            r.present()
        });
        let head = self.client.head(to)?;
        self.adopt(to, head, present)?;
        self.touch(to, false);
        match self.client.delete(from) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Lists every few `ttl` until the process exits (a failed listing
    /// keeps the mirror as it is, logged).
    pub fn spawn_refresher(self: &Arc<Self>, ttl: Duration) -> io::Result<()> {
        let m = self.clone();
        std::thread::Builder::new()
            .name("ckptfs-s3-list".into())
            .spawn(move || loop {
                std::thread::sleep(ttl);
                if let Err(e) = m.refresh() {
                    log::warn!("listing {}: {e} (keeping the last listing)", m.client.url());
                }
            })?;
        Ok(())
    }
}

/// The name of the mirror's state (and temporary) file for version `l`.
fn version_name(l: &Listed) -> String {
    format!(
        "{:016x}-{:016x}",
        xxh3_64(l.rel.as_bytes()),
        xxh3_64(l.version_key().as_bytes())
    )
}

/// The mount opens the mirror's files through it: a mirror file is read
/// from its remote object, block by block; any other file (the spool's)
/// is a local file.
impl Sources for Mirror {
    fn map(&self, file: &File) -> io::Result<Box<dyn ByteSource>> {
        match self.lookup(file) {
            Some(r) if file.metadata()?.len() > 0 => {
                Ok(Box::new(remote::RemoteMapped::new(file, r)?))
            }
            _ => crate::source::map_file(file),
        }
    }

    fn open_plain(&self, file: &File, whole: bool) -> io::Result<Option<(remote::InUse, bool)>> {
        self.lookup(file)
            .map(|r| remote::open_plain(r, whole))
            .transpose()
    }
}
