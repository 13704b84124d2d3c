//! The bytes of an archive: a read-only private map of its file, or memory
//! (tests, fuzzing). The file must not be truncated in place while mapped
//! (ckptfs itself only ever replaces archives by rename).
//!
//! A file that is a sparse local copy of an object in object storage
//! (`ckptfs_store::remote`) is mapped the same way, as `Remote`: its bytes
//! are only valid once [`Backing::ensure`] has fetched them, which each
//! kind of archive calls before it reads a range (its metadata at open, a
//! frame's structure before its grid is built, a block's payload before
//! it is decoded, pinned in the disk cache meanwhile). For the other
//! variants `ensure` does nothing. A remote map is a use of its file
//! (`store::remote::InUse`): the disk cache keeps its metadata meanwhile.

use ckptfs_store::remote::{InUse, Pin};
use memmap2::Mmap;
use std::fs::File;
use std::ops::Range;

pub enum Backing {
    Map(Mmap),
    Owned(Vec<u8>),
    /// A map of a sparse copy of a remote object, filled on demand (in
    /// use while mapped: its metadata is never evicted from the cache).
    Remote(Mmap, InUse),
}

impl Backing {
    /// Maps a file read-only (an empty file cannot be mapped: it is held as
    /// an empty buffer).
    pub fn map(file: &File) -> std::io::Result<Backing> {
        if file.metadata()?.len() == 0 {
            return Ok(Backing::Owned(Vec::new()));
        }
        // SAFETY: the map is read-only and private to this process; ckptfs
        // never truncates archives in place (it replaces them by rename), so
        // the mapped pages stay valid for the map's lifetime. A remote
        // object's mirror file is created at its full size and only ever
        // written in place (never truncated) while it is registered.
        let map = unsafe { Mmap::map(file) }?;
        Ok(match ckptfs_store::remote::lookup(file) {
            Some(r) => Backing::Remote(map, InUse::new(r)),
            None => Backing::Map(map),
        })
    }

    /// Makes bytes `range` valid, fetching them when the backing is a
    /// remote object's copy (a no-op otherwise). Fails when they cannot
    /// be fetched (the error names the object and why).
    pub fn ensure(&self, range: Range<u64>) -> std::io::Result<()> {
        self.ensure_all(std::slice::from_ref(&range))
    }

    /// [`Self::ensure`] for several ranges at once (fetched together).
    pub fn ensure_all(&self, ranges: &[Range<u64>]) -> std::io::Result<()> {
        match self {
            Backing::Remote(_, r) => r.ensure_all(ranges),
            _ => Ok(()),
        }
    }

    /// [`Self::ensure_all`] for the bytes one block decode reads: they are
    /// kept from eviction while the returned pin lives (None: not remote).
    pub fn pin_all(&self, ranges: &[Range<u64>]) -> std::io::Result<Option<Pin<'_>>> {
        match self {
            Backing::Remote(_, r) => r.pin_all(ranges).map(Some),
            _ => Ok(None),
        }
    }

    /// Starts fetching bytes `ranges` in the background when the backing
    /// is a remote copy (read-ahead; a no-op otherwise): a later
    /// [`Self::ensure_all`] of them waits for that fetch.
    pub fn prefetch(&self, ranges: &[Range<u64>]) {
        if let Backing::Remote(_, r) = self {
            r.file().prefetch(ranges);
        }
    }

    /// After a check of bytes `ranges` failed: fetches them again from the
    /// server when the backing is a remote copy (true: try the check once
    /// more), else false (the damage is in the file itself).
    pub fn refetch(&self, ranges: &[Range<u64>]) -> bool {
        match self {
            Backing::Remote(_, r) => r.refetch(ranges).is_ok(),
            _ => false,
        }
    }

    /// True when bytes `ranges` need no fetch (always, unless remote).
    pub fn has_all(&self, ranges: &[Range<u64>]) -> bool {
        match self {
            Backing::Remote(_, r) => r.has_all(ranges),
            _ => true,
        }
    }

    /// True when bytes `ranges` are present or being fetched (always,
    /// unless remote).
    pub fn has_or_fetching(&self, ranges: &[Range<u64>]) -> bool {
        match self {
            Backing::Remote(_, r) => r.has_or_fetching(ranges),
            _ => true,
        }
    }

    /// Bytes a sequential reader may fetch ahead at once (a share of the
    /// disk cache's limit; unbounded unless remote).
    pub fn read_ahead_room(&self) -> u64 {
        match self {
            Backing::Remote(_, r) => r.read_ahead_room(),
            _ => u64::MAX,
        }
    }

    pub fn is_remote(&self) -> bool {
        matches!(self, Backing::Remote(..))
    }

    /// Asks the kernel to start reading bytes `range` of the file in the
    /// background, so that a decode about to touch them does not wait for
    /// the disk page by page. Only a hint: out-of-range parts are ignored,
    /// and so is any error.
    pub fn will_need(&self, range: std::ops::Range<u64>) {
        if let Backing::Map(m) = self {
            let end = range.end.min(m.len() as u64);
            if range.start < end {
                let len = (end - range.start) as usize;
                let _ = m.advise_range(memmap2::Advice::WillNeed, range.start as usize, len);
            }
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) | Backing::Remote(m, _) => m,
            Backing::Owned(v) => v,
        }
    }
}
