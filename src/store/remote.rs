//! Sparse local copies of remote objects, filled on demand.
//!
//! A [`RemoteFile`] is one version (ETag) of one object, kept as a sparse
//! local file of the object's size (the *mirror file*) plus the set of byte
//! ranges of it that hold the object's bytes. [`RemoteFile::ensure`] fetches
//! the missing parts of a range with ranged, conditional GETs (`If-Match`
//! the version's ETag, so bytes of two versions are never mixed: a replaced
//! object fails the fetch, cleanly), aligned to [`ALIGN`], cut in parts of
//! at most [`PART`] bytes with up to [`IN_FLIGHT`] parts in flight. A range
//! another thread is already fetching is waited for, not fetched twice.
//!
//! Durability: the fetched bytes are written into the mirror file and
//! `fdatasync`ed *before* the range set that says they are there is
//! persisted (atomically, beside the other state files), so after a crash
//! the set never claims bytes the file does not hold. Nothing here trusts
//! the cached bytes: the archive code checks every block against its own
//! checksums and calls [`RemoteFile::refetch`] once when one fails.
//!
//! The registry maps a mirror file's (device, inode) to its `RemoteFile`,
//! so that `archive::Backing::map` of an open file finds out, with no
//! change to its callers, that the file is a sparse copy to fill before
//! reading. A process with no remote store has an empty registry.

use super::ranges::RangeSet;
use super::s3::S3Client;
use parking_lot::{Condvar, Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// Fetches start and end on multiples of this (small reads of an archive's
/// metadata become one request).
pub const ALIGN: u64 = 256 << 10;
/// The largest single ranged GET.
pub const PART: u64 = 8 << 20;
/// Ranged GETs in flight per `ensure`.
pub const IN_FLIGHT: usize = 4;

/// What is persisted beside each mirror file.
#[derive(Debug, Serialize, Deserialize)]
pub struct State {
    /// Key relative to the store's prefix.
    pub rel: String,
    pub etag: String,
    pub size: u64,
    pub mtime: i64,
    /// Inode of the mirror file this state describes.
    pub ino: u64,
    pub ranges: Vec<(u64, u64)>,
}

struct Fetching {
    present: RangeSet,
    inflight: RangeSet,
}

pub struct RemoteFile {
    client: Arc<S3Client>,
    pub rel: String,
    pub etag: String,
    pub size: u64,
    pub mtime: i64,
    /// The mirror file, open for writing fetched bytes.
    file: File,
    ino: u64,
    state_path: PathBuf,
    st: Mutex<Fetching>,
    cv: Condvar,
}

/// Bytes fetched from the server by this process (for tests and logs).
pub static FETCHED_BYTES: AtomicU64 = AtomicU64::new(0);

impl std::fmt::Debug for RemoteFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteFile({} {})", self.rel, self.etag)
    }
}

impl RemoteFile {
    /// A version of object `rel` backed by the mirror file `file` (already
    /// of size `size`), with the ranges `present` already fetched;
    /// `state_path` is where the range set is persisted.
    pub fn new(
        client: Arc<S3Client>,
        listed: &super::s3::Listed,
        file: File,
        state_path: PathBuf,
        present: RangeSet,
    ) -> io::Result<Arc<RemoteFile>> {
        let ino = file.metadata()?.ino();
        Ok(Arc::new(RemoteFile {
            client,
            rel: listed.rel.clone(),
            etag: listed.etag.clone(),
            size: listed.size,
            mtime: listed.mtime,
            file,
            ino,
            state_path,
            st: Mutex::new(Fetching {
                present,
                inflight: RangeSet::new(),
            }),
            cv: Condvar::new(),
        }))
    }

    fn name(&self) -> String {
        self.client.url().display(&self.rel)
    }

    /// Bytes of the object held locally.
    pub fn cached_bytes(&self) -> u64 {
        self.st.lock().present.covered()
    }

    /// The byte ranges held locally.
    pub fn present(&self) -> RangeSet {
        self.st.lock().present.clone()
    }

    pub fn is_complete(&self) -> bool {
        self.st.lock().present.contains(0..self.size)
    }

    /// Makes bytes `range` of the mirror file hold the object's bytes,
    /// fetching what is missing. An error (network, timeout, the object
    /// replaced or removed on the server) is logged with the object's name
    /// and returned; nothing is marked present then.
    pub fn ensure(&self, range: Range<u64>) -> io::Result<()> {
        let range = range.start.min(self.size)..range.end.min(self.size);
        if range.start >= range.end {
            return Ok(());
        }
        let aligned = range.start / ALIGN * ALIGN
            ..range
                .end
                .div_ceil(ALIGN)
                .saturating_mul(ALIGN)
                .min(self.size);
        loop {
            let mine = {
                let mut st = self.st.lock();
                let missing = st.present.missing(range.clone());
                if missing.is_empty() {
                    return Ok(());
                }
                // Fetch the aligned neighbourhood of what is missing, less
                // what is present or already being fetched.
                let mut mine = Vec::new();
                for m in st.present.missing(aligned.clone()) {
                    for r in st.inflight.missing(m) {
                        mine.push(r);
                    }
                }
                if mine.is_empty() {
                    // Everything missing is being fetched by others: wait
                    // for them (bounded: they give up within their deadline).
                    self.cv.wait_for(&mut st, Duration::from_millis(500));
                    continue;
                }
                for r in &mine {
                    st.inflight.insert(r.clone());
                }
                mine
            };
            let r = self.fetch(&mine);
            {
                let mut st = self.st.lock();
                for m in &mine {
                    st.inflight.remove(m.clone());
                }
                if r.is_ok() {
                    for m in &mine {
                        st.present.insert(m.clone());
                    }
                }
            }
            self.cv.notify_all();
            if let Err(e) = r {
                log::warn!("{e}");
                return Err(e);
            }
            self.persist();
        }
    }

    /// Forgets bytes `range` and fetches them again (a block whose check
    /// failed: the cached copy was damaged).
    pub fn refetch(&self, range: Range<u64>) -> io::Result<()> {
        log::warn!(
            "{}: bytes {}..{} failed their checksum; fetching them again",
            self.name(),
            range.start,
            range.end
        );
        self.st.lock().present.remove(range.clone());
        self.ensure(range)
    }

    /// Fetches `ranges` into the mirror file and syncs it.
    fn fetch(&self, ranges: &[Range<u64>]) -> io::Result<()> {
        let parts: Vec<Range<u64>> = ranges
            .iter()
            .flat_map(|r| {
                let mut v = Vec::new();
                let mut a = r.start;
                while a < r.end {
                    let b = (a + PART).min(r.end);
                    v.push(a..b);
                    a = b;
                }
                v
            })
            .collect();
        self.client
            .get_ranges(&self.rel, &parts, &self.etag, IN_FLIGHT, &mut |r, bytes| {
                self.file.write_all_at(bytes, r.start)?;
                FETCHED_BYTES.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                Ok(())
            })?;
        self.file.sync_data()
    }

    /// Writes the range set (after the bytes it names are synced). A
    /// failure only costs refetching after a restart.
    fn persist(&self) {
        if let Err(e) = self.persist_now() {
            log::warn!(
                "{}: cannot save the cache state: {e}",
                self.state_path.display()
            );
        }
    }

    pub fn persist_now(&self) -> io::Result<()> {
        let state = State {
            rel: self.rel.clone(),
            etag: self.etag.clone(),
            size: self.size,
            mtime: self.mtime,
            ino: self.ino,
            ranges: self.st.lock().present.pairs(),
        };
        crate::fsutil::write_atomic(&self.state_path, true, |w| {
            serde_json::to_writer(w, &state).map_err(io::Error::other)
        })
    }

    /// Removes the persisted state (the version is gone).
    pub fn forget(&self) {
        let _ = std::fs::remove_file(&self.state_path);
    }
}

/// Reads a persisted state (None when missing or unreadable).
pub fn load_state(path: &Path) -> Option<State> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Mirror files by (device, inode).
type Registry = RwLock<HashMap<(u64, u64), Arc<RemoteFile>>>;
static REGISTRY: LazyLock<Registry> = LazyLock::new(|| RwLock::new(HashMap::new()));
static REGISTERED: AtomicUsize = AtomicUsize::new(0);

/// Makes `remote` the source of the mirror file it writes.
pub fn register(remote: &Arc<RemoteFile>) -> io::Result<()> {
    let m = remote.file.metadata()?;
    REGISTRY.write().insert((m.dev(), m.ino()), remote.clone());
    REGISTERED.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The remote object an open mirror file is a copy of, if any.
pub fn lookup(file: &File) -> Option<Arc<RemoteFile>> {
    if REGISTERED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let m = file.metadata().ok()?;
    REGISTRY.read().get(&(m.dev(), m.ino())).cloned()
}

/// Fills a whole plain (non-archive) mirror file before it is served: the
/// mount's open of a plain file calls this. A file that is not a mirror
/// file is left alone.
pub fn fill_whole(file: &File) -> io::Result<()> {
    match lookup(file) {
        Some(r) => r.ensure(0..r.size),
        None => Ok(()),
    }
}

/// Background fetches started by read-ahead hints, at most this many at once.
const PREFETCHES: usize = 4;
static PREFETCHING: AtomicUsize = AtomicUsize::new(0);

/// Starts fetching `range` in the background (a read-ahead hint: dropped
/// when enough fetches are already running; errors are only logged).
pub fn prefetch(r: &Arc<RemoteFile>, range: Range<u64>) {
    {
        let st = r.st.lock();
        if st.present.contains(range.clone()) {
            return;
        }
    }
    if PREFETCHING.fetch_add(1, Ordering::AcqRel) >= PREFETCHES {
        PREFETCHING.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let r = r.clone();
    let spawned = std::thread::Builder::new()
        .name("ckptfs-s3-prefetch".into())
        .spawn(move || {
            let _ = r.ensure(range);
            PREFETCHING.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        PREFETCHING.fetch_sub(1, Ordering::AcqRel);
    }
}
