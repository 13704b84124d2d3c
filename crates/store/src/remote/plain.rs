//! Plain (non-archive) mirror files served through the mount: fetched
//! whole when small, else by aligned pieces with read-ahead
//! ([`crate::read_ahead`]).

use super::{InUse, Pin, RemoteFile, PART};
use crate::read_ahead::{in_order, ReadAhead};
use std::io;
use std::ops::Range;
use std::sync::Arc;

/// A plain file at most this large is fetched whole when opened (one
/// request); a larger one is read by ranges, in aligned pieces of this
/// size ([`InUse::pin_for_read`]).
pub const PLAIN_CHUNK: u64 = PART;
/// Pieces of a plain file fetched ahead of a reader going through it in
/// order.
const PLAIN_AHEAD: u64 = 2;

/// Prepares a plain (non-archive) mirror file, the copy of `r`, to be
/// served, for the mount's open of a plain file, which keeps the returned
/// use while the file is open. A file of at most [`PLAIN_CHUNK`] bytes, or one wanted
/// whole (`whole`: opened for writing), is fetched whole now, and its bytes
/// are then never evicted while open; a larger one is left to be fetched
/// by the reads ([`InUse::pin_for_read`]). The flag says whether the file is complete
/// on return (it may then be served by the kernel directly).
pub(crate) fn open_plain(r: Arc<RemoteFile>, whole: bool) -> io::Result<(InUse, bool)> {
    let u = InUse::new(r);
    if whole || u.size <= PLAIN_CHUNK || u.is_complete() {
        u.ensure(0..u.size)?;
        return Ok((u, true));
    }
    Ok((u, false))
}

impl InUse {
    /// Makes bytes `range` of a plain file present for a read, and keeps
    /// them from eviction until the returned pin is dropped. Whole aligned
    /// pieces of [`PLAIN_CHUNK`] are fetched (a read of a large file
    /// mostly comes in 128 KiB to 1 MiB requests: one GET each would cost
    /// a round trip per request); when the piece before the read's first
    /// is held or being fetched, the reader is going through the file in
    /// order, and up to [`PLAIN_AHEAD`] pieces after the read's last are
    /// fetched in the background (the store's one policy,
    /// [`ReadAhead`]).
    pub fn pin_for_read(&self, range: Range<u64>) -> io::Result<Pin<'_>> {
        let size = self.size;
        let start = range.start.min(size) / PLAIN_CHUNK * PLAIN_CHUNK;
        let end = range.end.min(size).div_ceil(PLAIN_CHUNK) * PLAIN_CHUNK;
        let end = end.max(start).min(size);
        let chunk = (start / PLAIN_CHUNK) as usize;
        let last = (end.max(start + 1) - 1) / PLAIN_CHUNK;
        if chunk > 0 && in_order(self, &[start - PLAIN_CHUNK..start]) {
            let ahead = ReadAhead {
                window: 1,
                beyond: PLAIN_AHEAD * PLAIN_CHUNK,
            };
            let count = size.div_ceil(PLAIN_CHUNK) as usize;
            let plan = ahead.plan(self, count, last as usize, end - start, |i| {
                let at = i as u64 * PLAIN_CHUNK;
                Some(vec![at..(at + PLAIN_CHUNK).min(size)])
            });
            if !plan.later.is_empty() {
                self.file().prefetch(&plan.later);
            }
        }
        self.pin_all(&[start..end])
    }
}

impl crate::read_ahead::Presence for InUse {
    fn has_or_fetching(&self, ranges: &[Range<u64>]) -> bool {
        RemoteFile::has_or_fetching(self, ranges)
    }
    /// A plain file's read-ahead is bounded by [`PLAIN_AHEAD`] alone.
    fn read_ahead_room(&self) -> u64 {
        u64::MAX
    }
}
