//! Where an archive's bytes come from: one [`ByteSource`] trait, which
//! every archive reader reads through, and [`Sources`], which turns an
//! open file of a store into one.
//!
//! - [`Mapped`]: a read-only private map of a local file (a local store:
//!   every byte is there; the kernel is asked to read ahead);
//! - `Vec<u8>`: bytes in memory (tests, fuzzing, the Python package);
//! - [`remote::RemoteMapped`](crate::remote::RemoteMapped): a map of a
//!   sparse local copy of an object (an `s3://` store): its bytes are
//!   only valid once [`ByteSource::ensure_all`] has fetched them.
//!
//! A reader calls `ensure_all` (or `pin_all`, for the bytes of one block
//! decode) before it reads a range it has not read before: its metadata at
//! open ([`ByteSource::bytes`] is valid there only), a frame's structure
//! before its grid is built, a block's payload before it is decoded. What
//! it asks for next, it asks [`read_ahead`](crate::read_ahead), which
//! decides what to fetch ahead of a reader going through the file in
//! order. Over a local file the fetch calls do nothing: the reader code is
//! the same for both, and a fetch is visible where it happens.
//!
//! Which source a file gets is decided by whoever opened it, through the
//! [`Sources`] it was given: [`Local`] maps every file; the mirror of an
//! `s3://` store ([`crate::mirror::Mirror`]) maps its own sparse copies as
//! remote and anything else as local. There is no process-wide registry.

use crate::remote::{InUse, Pin};
use memmap2::Mmap;
use std::fs::File;
use std::io;
use std::ops::Range;

/// The bytes of one archive file, and how to make them present.
///
/// Only [`Self::bytes`] is required: the defaults are those of a source
/// whose every byte is already there (a local file, memory).
pub trait ByteSource: Send + Sync {
    /// Every byte of the file, addressable at once (valid, for a remote
    /// copy, only where [`Self::ensure_all`] has fetched them).
    fn bytes(&self) -> &[u8];

    /// Makes bytes `ranges` valid, fetching them if needed (several
    /// ranges at once: fetched together). Fails when they cannot be
    /// fetched (the error names the object and why).
    fn ensure_all(&self, _ranges: &[Range<u64>]) -> io::Result<()> {
        Ok(())
    }

    /// [`Self::ensure_all`] for the bytes one block decode reads: they are
    /// kept from eviction while the returned pin lives (None: nothing can
    /// evict them).
    fn pin_all(&self, ranges: &[Range<u64>]) -> io::Result<Option<Pin<'_>>> {
        self.ensure_all(ranges).map(|()| None)
    }

    /// Starts fetching bytes `ranges` in the background (read-ahead): a
    /// later [`Self::ensure_all`] of them waits for that fetch. Nothing to
    /// do by default.
    fn prefetch(&self, _ranges: &[Range<u64>]) {}

    /// After a check of bytes `ranges` failed: fetches them again (true:
    /// try the check once more), or false when the damage can only be in
    /// the file itself (the default).
    fn refetch(&self, _ranges: &[Range<u64>]) -> bool {
        false
    }

    /// True when bytes `ranges` need no fetch.
    fn has_all(&self, _ranges: &[Range<u64>]) -> bool {
        true
    }

    /// True when bytes `ranges` are present or being fetched.
    fn has_or_fetching(&self, _ranges: &[Range<u64>]) -> bool {
        true
    }

    /// Bytes a sequential reader may have fetched ahead at once (a share
    /// of a disk cache's limit; unbounded by default).
    fn read_ahead_room(&self) -> u64 {
        u64::MAX
    }

    /// True when bytes must be fetched before they are read (a reader
    /// then reads block by block rather than whole frames ahead).
    fn is_remote(&self) -> bool {
        false
    }

    /// Asks for bytes `range` to be read in the background, so that a
    /// decode about to touch them does not wait for a disk page by page.
    /// Only a hint: out-of-range parts and errors are ignored.
    fn will_need(&self, _range: Range<u64>) {}
}

impl dyn ByteSource + '_ {
    /// [`ByteSource::ensure_all`] of one range.
    pub fn ensure(&self, range: Range<u64>) -> io::Result<()> {
        self.ensure_all(std::slice::from_ref(&range))
    }
}

/// Bytes held in memory (tests, fuzzing, an archive read from a pipe).
impl ByteSource for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// A read-only private map of a local file, whose bytes are all there.
pub struct Mapped(Mmap);

impl Mapped {
    /// Maps `file` read-only. The file must not be truncated in place
    /// while mapped (ckptfs only ever replaces archives by rename).
    pub fn new(file: &File) -> io::Result<Mapped> {
        // SAFETY: the map is read-only and private to this process; ckptfs
        // never truncates archives in place (it replaces them by rename),
        // so the mapped pages stay valid for the map's lifetime.
        unsafe { Mmap::map(file) }.map(Mapped)
    }
}

impl ByteSource for Mapped {
    fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn will_need(&self, range: Range<u64>) {
        let end = range.end.min(self.0.len() as u64);
        if range.start < end {
            let len = (end - range.start) as usize;
            let _ = self
                .0
                .advise_range(memmap2::Advice::WillNeed, range.start as usize, len);
        }
    }
}

/// A local file as a source: mapped (an empty file, which cannot be
/// mapped, is held as an empty buffer).
pub fn map_file(file: &File) -> io::Result<Box<dyn ByteSource>> {
    if file.metadata()?.len() == 0 {
        return Ok(Box::new(Vec::new()));
    }
    Ok(Box::new(Mapped::new(file)?))
}

/// How the files of a store become byte sources: given to whatever opens
/// archives of a store (the mount, a delta's base opener), which then
/// never has to know where the store's bytes come from.
pub trait Sources: Send + Sync {
    /// The source of an open file of the store, to read an archive from.
    fn map(&self, file: &File) -> io::Result<Box<dyn ByteSource>>;

    /// Prepares an open plain (non-archive) file of the store to be
    /// served, when its bytes must be fetched first: the use the caller
    /// keeps while the file is open, and whether the file is complete now
    /// (see [`crate::mirror::Mirror`]); None for a file whose bytes are
    /// all there (the default).
    fn open_plain(&self, _file: &File, _whole: bool) -> io::Result<Option<(InUse, bool)>> {
        Ok(None)
    }
}

/// A local store: every file is mapped, every byte is there.
#[derive(Debug, Default, Clone, Copy)]
pub struct Local;

impl Sources for Local {
    fn map(&self, file: &File) -> io::Result<Box<dyn ByteSource>> {
        map_file(file)
    }
}
