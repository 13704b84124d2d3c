//! Sparse local copies of remote objects, filled on demand.
//!
//! A [`RemoteFile`] is one version (ETag) of one object, kept as a sparse
//! local file of the object's size (the *mirror file*) plus the set of byte
//! ranges of it that hold the object's bytes. [`RemoteFile::ensure`] fetches
//! the missing parts of a range with ranged, conditional GETs (`If-Match`
//! the version's ETag, so bytes of two versions are never mixed: a replaced
//! object fails the fetch, cleanly), aligned to [`ALIGN`], near runs
//! coalesced into one request, cut in parts of at most [`PART`] bytes with
//! up to [`IN_FLIGHT`] parts in flight. The archive code asks for what a
//! read needs: a frame's structure when it is first used, then the payload
//! bytes of each block it decodes (`archive::zstn`), so a small read of a
//! large tensor moves about one compressed block. A range another thread
//! is already fetching is waited for, not fetched twice.
//!
//! Durability: the fetched bytes are written into the mirror file before
//! they are marked present, and the file is `fdatasync`ed before the
//! range set that says they are there is persisted (atomically, beside the
//! other state files), so after a crash the set never claims bytes the
//! file does not hold. The set is saved by a background thread, at most
//! [`SAVE_DELAY`] after a fetch (one save for all the fetches of that
//! time), and by `Mirror::save_all` when the daemon exits: a reader never waits
//! for a sync, and a crash only costs refetching what the last
//! [`SAVE_DELAY`] fetched. Nothing here trusts
//! the cached bytes: the archive code checks every block against its own
//! checksums and calls [`RemoteFile::refetch`] once when one fails.
//!
//! An archive reads a mirror file through [`RemoteMapped`], the
//! [`ByteSource`](crate::source::ByteSource) the mirror gives for it
//! (`Mirror` implements [`Sources`](crate::source::Sources)).
//!
//! Here: the fetching. Beside it: `save` (the range set persisted),
//! `evict` (the disk cache's side: pins, uses, freeing pages), `mapped`
//! (the archive's source) and `plain` (plain files served by pieces).

use super::budget::{Budget, Evict, Kind};
use super::ranges::{coalesce, RangeSet};
use super::s3::S3Client;
use parking_lot::{Condvar, Mutex};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod evict;
mod mapped;
mod plain;
mod save;

pub use evict::{InUse, Pin};
pub use mapped::RemoteMapped;
pub(crate) use plain::open_plain;
pub use plain::PLAIN_CHUNK;
pub(crate) use save::save_queued;
pub use save::{load_state, State};

/// Fetches start and end on multiples of this (a page: the cache never
/// holds part of one).
pub const ALIGN: u64 = 4 << 10;
/// Runs of missing bytes at most this far apart are fetched by one request
/// (the bytes between them too).
pub const GAP: u64 = 32 << 10;
/// The largest single ranged GET.
pub const PART: u64 = 8 << 20;
/// Ranged GETs in flight per `ensure`.
pub const IN_FLIGHT: usize = 8;
/// Background read-aheads ([`RemoteFile::prefetch`]) running at once per
/// file.
pub const PREFETCHES: usize = 4;
/// How long after a fetch its range set is saved (the saves of the
/// fetches of that time are one).
pub const SAVE_DELAY: Duration = Duration::from_millis(500);

struct Fetching {
    present: RangeSet,
    inflight: RangeSet,
    /// Ranges a decode in progress reads ([`Pin`]): never evicted.
    pins: Vec<Range<u64>>,
    /// Open archives and open plain files on this file ([`InUse`]): while
    /// any, only block payloads may be evicted.
    users: usize,
    /// Moved out of the cache (into the spool): never evicted again.
    detached: bool,
}

impl Fetching {
    /// The bytes held or being fetched: what freeing pages must keep.
    fn held_or_fetching(&self) -> RangeSet {
        let mut keep = self.present.clone();
        for r in self.inflight.ranges() {
            keep.insert(r.clone());
        }
        keep
    }
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
    budget: Arc<Budget>,
    /// This file's id in `budget`.
    id: u64,
    /// Bytes (in whole pages) being fetched into the mirror file and not
    /// yet accounted in `budget`: what a measurement of the file's
    /// allocation must not take for the file system's own overhead.
    unaccounted: AtomicU64,
    /// Background read-aheads running ([`Self::prefetch`]).
    prefetching: AtomicUsize,
    /// Held while the state is saved (taken before `st`).
    saving: Mutex<()>,
    /// Bytes were fetched since the state was last saved (a save is
    /// queued for the saver thread).
    dirty: AtomicBool,
    /// The version is gone ([`Self::forget`]): its state is never saved
    /// again.
    forgotten: AtomicBool,
    /// This file, for the saver thread's queue.
    this: std::sync::Weak<RemoteFile>,
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
    /// of size `size`), with the ranges `present` already fetched (last
    /// used at tick `last_use` of `budget`, 0 for now); `state_path` is
    /// where the range set is persisted.
    pub fn new(
        client: Arc<S3Client>,
        listed: &super::s3::Listed,
        file: File,
        state_path: PathBuf,
        present: RangeSet,
        budget: &Arc<Budget>,
        last_use: u64,
    ) -> io::Result<Arc<RemoteFile>> {
        let ino = file.metadata()?.ino();
        let held = present.ranges().to_vec();
        let r = Arc::new_cyclic(|this: &std::sync::Weak<RemoteFile>| {
            let me: std::sync::Weak<dyn Evict> = this.clone();
            RemoteFile {
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
                    pins: Vec::new(),
                    users: 0,
                    detached: false,
                }),
                cv: Condvar::new(),
                budget: budget.clone(),
                id: budget.attach(me, last_use),
                unaccounted: AtomicU64::new(0),
                prefetching: AtomicUsize::new(0),
                saving: Mutex::new(()),
                dirty: AtomicBool::new(false),
                forgotten: AtomicBool::new(false),
                this: this.clone(),
            }
        });
        let tick = (last_use > 0).then_some(last_use);
        budget.added(r.id, &held, Kind::Block, tick);
        r.measure();
        Ok(r)
    }

    fn name(&self) -> String {
        self.client.url().display(&self.rel)
    }

    /// The mirror file, open for writing fetched bytes.
    pub(crate) fn mirror_file(&self) -> &File {
        &self.file
    }

    /// Bytes of the object held locally.
    pub fn cached_bytes(&self) -> u64 {
        self.st.lock().present.covered()
    }

    /// Bytes a sequential reader may have fetched ahead of what it reads
    /// at once: a quarter of the disk cache's limit, so that blocks
    /// fetched ahead are not given back before they are read.
    pub fn read_ahead_room(&self) -> u64 {
        self.budget.limit() / 4
    }

    /// The byte ranges held locally.
    pub fn present(&self) -> RangeSet {
        self.st.lock().present.clone()
    }

    /// True when every byte of `ranges` is present in the mirror.
    pub fn has_all(&self, ranges: &[Range<u64>]) -> bool {
        let st = self.st.lock();
        ranges.iter().all(|r| {
            st.present
                .contains(r.start.min(self.size)..r.end.min(self.size))
        })
    }

    /// True when every byte of `ranges` is present or being fetched.
    pub fn has_or_fetching(&self, ranges: &[Range<u64>]) -> bool {
        let st = self.st.lock();
        ranges.iter().all(|r| {
            st.present
                .missing(r.start.min(self.size)..r.end.min(self.size))
                .into_iter()
                .all(|m| st.inflight.contains(m))
        })
    }

    pub fn is_complete(&self) -> bool {
        self.st.lock().present.contains(0..self.size)
    }

    /// Makes bytes `range` of the mirror file hold the object's bytes,
    /// fetching what is missing ([`Self::ensure_all`]).
    pub fn ensure(&self, range: Range<u64>) -> io::Result<()> {
        self.ensure_all(std::slice::from_ref(&range))
    }

    /// Makes the bytes `ranges` hold the object's bytes, fetching what is
    /// missing: one ranged GET per run of missing bytes (widened to
    /// [`ALIGN`], runs less than [`GAP`] apart merged into one, long runs
    /// cut into [`PART`]s), up to [`IN_FLIGHT`] at once. Bytes another
    /// thread is already fetching are waited for, not fetched twice. An
    /// error (network, timeout, the object replaced or removed on the
    /// server) is logged with the object's name and returned; nothing is
    /// marked present then.
    pub fn ensure_all(&self, ranges: &[Range<u64>]) -> io::Result<()> {
        self.ensure_kind(ranges, Kind::Meta)
    }

    /// Makes bytes `ranges` present ([`Self::ensure_all`]) for a decode
    /// of one block, and keeps them from eviction until the returned pin
    /// is dropped.
    pub fn pin_all(&self, ranges: &[Range<u64>]) -> io::Result<Pin<'_>> {
        self.st.lock().pins.extend(ranges.iter().cloned());
        let pin = Pin {
            file: self,
            ranges: ranges.to_vec(),
        };
        self.ensure_kind(ranges, Kind::Block)?;
        Ok(pin)
    }

    /// [`Self::ensure_all`], the bytes accounted in the disk cache as
    /// `kind`.
    fn ensure_kind(&self, ranges: &[Range<u64>], kind: Kind) -> io::Result<()> {
        loop {
            let mine = {
                let mut st = self.st.lock();
                let missing = self.missing(&st, ranges);
                if missing.is_empty() {
                    drop(st);
                    self.budget.touch(self.id, ranges, kind);
                    return Ok(());
                }
                let mine = Self::claim(&mut st, &missing, self.size);
                if mine.is_empty() {
                    // Everything missing is being fetched by others: wait
                    // for them (bounded: they give up within their deadline,
                    // and this thread's request by its own).
                    let what = || match (missing.first(), missing.last()) {
                        (Some(a), Some(z)) => {
                            format!("{} bytes {}..{}", self.name(), a.start, z.end)
                        }
                        _ => self.name(),
                    };
                    let wait = match super::deadline::remaining("") {
                        Ok(Some(left)) => left.min(Duration::from_millis(500)),
                        Ok(None) => Duration::from_millis(500),
                        Err(_) => {
                            let e = super::deadline::expired(&what());
                            log::warn!("{e}");
                            return Err(e);
                        }
                    };
                    self.cv.wait_for(&mut st, wait);
                    continue;
                }
                mine
            };
            self.fetch_claimed(&mine, kind)?;
        }
    }

    /// The parts of `ranges` (clamped to the object) not present.
    fn missing(&self, st: &Fetching, ranges: &[Range<u64>]) -> Vec<Range<u64>> {
        ranges
            .iter()
            .flat_map(|r| {
                st.present
                    .missing(r.start.min(self.size)..r.end.min(self.size))
            })
            .collect()
    }

    /// Marks as being fetched, and returns, the widened runs of `missing`
    /// less what is present or already being fetched by another thread.
    fn claim(st: &mut Fetching, missing: &[Range<u64>], size: u64) -> Vec<Range<u64>> {
        let mut mine = Vec::new();
        for run in coalesce(missing, ALIGN, GAP, size) {
            for m in st.present.missing(run) {
                mine.extend(st.inflight.missing(m));
            }
        }
        for r in &mine {
            st.inflight.insert(r.clone());
        }
        mine
    }

    /// Fetches the ranges `mine` this thread claimed ([`Self::claim`]).
    /// Each part is marked present (and its waiters woken) as soon as its
    /// bytes are written, so a reader waiting for the first
    /// bytes of a long read-ahead does not wait for the last; on an error
    /// what was not fetched is no longer marked as being fetched. The
    /// fetched bytes are accounted in the disk cache as `kind`.
    fn fetch_claimed(&self, mine: &[Range<u64>], kind: Kind) -> io::Result<()> {
        let page = self.budget.page();
        let pages: u64 = mine
            .iter()
            .map(|r| (r.end.div_ceil(page) - r.start / page) * page)
            .sum();
        self.unaccounted.fetch_add(pages, Ordering::Relaxed);
        // Room for the bytes and their partial pages.
        let want: u64 = mine.iter().map(|r| r.end - r.start + 2 * page).sum();
        self.budget.make_room(want);
        let mut done = Vec::new();
        let r = self.fetch(mine, &mut |part| {
            {
                let mut st = self.st.lock();
                st.inflight.remove(part.clone());
                st.present.insert(part.clone());
            }
            self.cv.notify_all();
            done.push(part.clone());
        });
        {
            let mut st = self.st.lock();
            for m in mine {
                st.inflight.remove(m.clone());
            }
            // What a failed fetch wrote and did not finish is not held:
            // freed (but for pages shared with bytes held or being
            // fetched), so it never occupies the cache unaccounted.
            if r.is_err() {
                let keep = st.held_or_fetching();
                for m in mine {
                    self.punch(&keep, m.clone());
                }
            }
        }
        self.cv.notify_all();
        if !done.is_empty() {
            self.save_later();
            self.budget.added(self.id, &done, kind, None);
        }
        self.unaccounted.fetch_sub(pages, Ordering::Relaxed);
        self.measure();
        if let Err(e) = r {
            log::warn!("{e}");
            return Err(e);
        }
        self.budget.enforce();
        Ok(())
    }

    /// Starts fetching the missing bytes of `ranges` in the background
    /// (read-ahead) and returns at once: a reader that needs them later
    /// waits for that fetch instead of starting its own. At most
    /// [`PREFETCHES`] run per file; beyond that, or when a thread cannot
    /// be started, nothing is fetched (the reader fetches what it needs
    /// itself). A failure is only logged: the reader's own fetch reports
    /// it. The bytes are cached as block payloads (evictable).
    pub fn prefetch(self: &Arc<Self>, ranges: &[Range<u64>]) {
        if self.prefetching.fetch_add(1, Ordering::AcqRel) >= PREFETCHES {
            self.prefetching.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let mine = {
            let mut st = self.st.lock();
            let missing = self.missing(&st, ranges);
            Self::claim(&mut st, &missing, self.size)
        };
        if mine.is_empty() {
            self.prefetching.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let me = self.clone();
        let unclaim = mine.clone();
        let spawned = std::thread::Builder::new()
            .name("ckptfs-s3-ahead".into())
            .spawn(move || {
                // Readers may wait for this fetch: it ends by the read
                // timeout too.
                let _deadline = super::deadline::Scope::begin();
                let _ = me.fetch_claimed(&mine, Kind::Block);
                me.prefetching.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            log::debug!("{}: no read-ahead: {e}", self.name());
            let mut st = self.st.lock();
            for m in &unclaim {
                st.inflight.remove(m.clone());
            }
            drop(st);
            self.cv.notify_all();
            self.prefetching.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Forgets bytes `ranges` and fetches them again (a block whose check
    /// failed: the cached copy was damaged).
    pub fn refetch(&self, ranges: &[Range<u64>]) -> io::Result<()> {
        let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
            return Ok(());
        };
        log::warn!(
            "{}: bytes {}..{} ({} ranges) failed their checksum; fetching them again",
            self.name(),
            first.start,
            last.end,
            ranges.len()
        );
        {
            let mut st = self.st.lock();
            for r in ranges {
                st.present.remove(r.clone());
            }
        }
        for r in ranges {
            self.budget.removed(self.id, r.clone());
        }
        self.ensure_all(ranges)
    }

    /// Fetches `ranges` into the mirror file, in parts of at most
    /// [`PART`] bytes, up to [`IN_FLIGHT`] at once; `done` is told of each
    /// part once its bytes are written (not yet synced: see
    /// [`Self::save_locked`]).
    fn fetch(&self, ranges: &[Range<u64>], done: &mut dyn FnMut(&Range<u64>)) -> io::Result<()> {
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
        self.client.get_ranges(
            &self.rel,
            &parts,
            self.version(),
            IN_FLIGHT,
            &|at, bytes| {
                self.file.write_all_at(bytes, at)?;
                FETCHED_BYTES.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                Ok(())
            },
            done,
        )
    }

    /// This file's object and version, as a listing gives them.
    pub fn listed(&self) -> super::s3::Listed {
        super::s3::Listed {
            rel: self.rel.clone(),
            size: self.size,
            etag: self.etag.clone(),
            mtime: self.mtime,
        }
    }

    /// The version this file holds, which every fetch must read.
    pub fn version(&self) -> super::s3::Version<'_> {
        super::s3::Version {
            etag: &self.etag,
            mtime: self.mtime,
        }
    }
}
