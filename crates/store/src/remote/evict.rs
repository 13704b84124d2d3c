//! The disk cache's side of a [`RemoteFile`] (`store::budget`): what its
//! mirror file occupies, which of its ranges may be given back (none a
//! decode pins, [`Pin`]; only block payloads while an open archive or
//! plain file uses it, [`InUse`]), and freeing their pages (holes punched
//! in the mirror file).

use super::RemoteFile;
use crate::budget::{Evict, Kind};
use crate::ranges::RangeSet;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl RemoteFile {
    /// Tells the disk cache what the mirror file occupies now (after a
    /// change of its bytes on disk).
    pub(super) fn measure(&self) {
        self.budget.measure(self.id, || self.allocated());
    }

    /// Frees on disk the bytes of the mirror file that no range holds
    /// (left by a crash between saving the state and freeing them).
    pub fn free_missing(&self) {
        let st = self.st.lock();
        for m in st.present.missing(0..self.size) {
            self.punch(&st.present, m);
        }
        drop(st);
        self.measure();
    }

    /// Frees the pages of bytes `r` (no longer present) that hold no
    /// present byte. A file system that cannot punch holes keeps them
    /// (logged once per file): the limit is then not kept on disk. The
    /// last page of a file whose size is not a whole number of pages is
    /// punched whole (past the end: the size is kept), else the file
    /// system would only zero it and keep its block.
    pub(super) fn punch(&self, present: &RangeSet, r: Range<u64>) {
        let page = self.budget.page();
        let down = r.start / page * page;
        let up = r.end.div_ceil(page).saturating_mul(page);
        let holds = |x: Range<u64>| x.start < x.end && present.missing(x.clone()) != [x];
        let a = if holds(down..r.start) {
            r.start.div_ceil(page) * page
        } else {
            down
        };
        let z = if holds(r.end..up) {
            r.end / page * page
        } else {
            up
        };
        if a >= z {
            return;
        }
        // SAFETY: fallocate on a descriptor this struct owns; it changes
        // only the file's bytes in [a, z), which no range claims.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                a as libc::off_t,
                (z - a) as libc::off_t,
            )
        };
        if rc != 0 {
            log::warn!(
                "{}: cannot free bytes {a}..{z} of the cache: {}",
                self.name(),
                io::Error::last_os_error()
            );
        }
    }

    /// Stops accounting this file in the disk cache, for good: its mirror
    /// file is being moved out of the cache (into the spool of a writable
    /// mount), so nothing of it may ever be freed.
    pub fn leave_cache(&self) {
        self.st.lock().detached = true;
        self.budget.detach(self.id);
    }
}

impl Evict for RemoteFile {
    /// Gives back the ranges that no decode pins, and `Meta` ones only
    /// while nothing uses the file. The state is saved without them
    /// before their pages are freed, so it never claims freed bytes.
    fn evict(&self, ranges: &[(Range<u64>, Kind)]) -> Vec<Range<u64>> {
        let _saving = self.saving.lock();
        let mut st = self.st.lock();
        if st.detached {
            return Vec::new();
        }
        let give: Vec<Range<u64>> = ranges
            .iter()
            .filter(|(r, k)| {
                (*k == Kind::Block || st.users == 0)
                    && !st.pins.iter().any(|p| p.start < r.end && r.start < p.end)
            })
            .map(|(r, _)| r.clone())
            .collect();
        log::trace!(
            "{}: evict {ranges:?} ({} users, pins {:?}): {give:?}",
            self.rel,
            st.users,
            st.pins
        );
        if give.is_empty() {
            return give;
        }
        let before = st.present.clone();
        for r in &give {
            st.present.remove(r.clone());
        }
        if let Err(e) = self.persist_locked(&st) {
            log::warn!(
                "{}: cannot save the cache state, nothing evicted: {e}",
                self.state_path.display()
            );
            st.present = before;
            return Vec::new();
        }
        // Pages shared with bytes being fetched stay too: on a file system
        // whose blocks are larger than the 4 KiB a fetch is aligned to, a
        // fetch may be writing into the page that holds an evicted range.
        let keep = st.held_or_fetching();
        for r in &give {
            self.punch(&keep, r.clone());
        }
        give
    }

    /// The mirror file's `st_blocks` in bytes (an `fstat`, no lock), less
    /// the pages of fetches in progress (not yet accounted: counted once
    /// they are).
    fn allocated(&self) -> Option<u64> {
        let m = self.file.metadata().ok()?;
        let busy = self.unaccounted.load(Ordering::Relaxed);
        Some((m.blocks() * 512).saturating_sub(busy))
    }
}

/// Keeps the ranges of one block decode from eviction while it lives.
pub struct Pin<'a> {
    pub(super) file: &'a RemoteFile,
    pub(super) ranges: Vec<Range<u64>>,
}

impl Drop for Pin<'_> {
    /// Unpins, then gives back what the pin kept over the limit.
    fn drop(&mut self) {
        {
            let mut st = self.file.st.lock();
            for r in &self.ranges {
                if let Some(i) = st.pins.iter().position(|p| p == r) {
                    st.pins.swap_remove(i);
                }
            }
        }
        self.file.budget.relax();
    }
}

/// A use of a remote file (an open archive's map, an open plain file):
/// while one lives, only block payloads of the file may be evicted.
pub struct InUse(Arc<RemoteFile>);

impl InUse {
    pub fn new(r: Arc<RemoteFile>) -> InUse {
        r.st.lock().users += 1;
        InUse(r)
    }

    pub fn file(&self) -> &Arc<RemoteFile> {
        &self.0
    }
}

impl Drop for InUse {
    /// Ends the use, then gives back what it kept over the limit.
    fn drop(&mut self) {
        self.0.st.lock().users -= 1;
        self.0.budget.relax();
    }
}

impl std::ops::Deref for InUse {
    type Target = RemoteFile;
    fn deref(&self) -> &RemoteFile {
        &self.0
    }
}
