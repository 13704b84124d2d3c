//! The registry through which `archive::Backing::map` of an open file
//! finds out that it is a mirror file to fill before reading (by device
//! and inode; empty in a process with no remote store), and the plain
//! (non-archive) mirror files served through it: fetched whole when
//! small, else by aligned pieces with read-ahead.

use super::{InUse, Pin, RemoteFile, PART};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

/// Mirror files by (device, inode).
type Registry = RwLock<HashMap<(u64, u64), Arc<RemoteFile>>>;
pub(super) static REGISTRY: LazyLock<Registry> = LazyLock::new(|| RwLock::new(HashMap::new()));
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

/// A plain file at most this large is fetched whole when opened (one
/// request); a larger one is read by ranges, in aligned pieces of this
/// size ([`InUse::pin_for_read`]).
pub const PLAIN_CHUNK: u64 = PART;
/// Pieces of a plain file fetched ahead of a reader going through it in
/// order.
const PLAIN_AHEAD: u64 = 2;

/// Prepares a plain (non-archive) mirror file to be served, for the
/// mount's open of a plain file, which keeps the returned use while the
/// file is open. A file of at most [`PLAIN_CHUNK`] bytes, or one wanted
/// whole (`whole`: opened for writing), is fetched whole now, and its bytes
/// are then never evicted while open; a larger one is left to be fetched
/// by the reads ([`InUse::pin_for_read`]). A file that is not a mirror
/// file is left alone (None). The flag says whether the file is complete
/// on return (it may then be served by the kernel directly).
pub fn open_plain(file: &File, whole: bool) -> io::Result<Option<(InUse, bool)>> {
    let Some(r) = lookup(file) else {
        return Ok(None);
    };
    let u = InUse::new(r);
    if whole || u.size <= PLAIN_CHUNK || u.is_complete() {
        u.ensure(0..u.size)?;
        return Ok(Some((u, true)));
    }
    Ok(Some((u, false)))
}

/// Fills a whole plain (non-archive) mirror file ([`open_plain`] with
/// `whole`).
pub fn fill_whole(file: &File) -> io::Result<Option<InUse>> {
    Ok(open_plain(file, true)?.map(|(u, _)| u))
}

impl InUse {
    /// Makes bytes `range` of a plain file present for a read, and keeps
    /// them from eviction until the returned pin is dropped. Whole aligned
    /// pieces of [`PLAIN_CHUNK`] are fetched (a read of a large file
    /// mostly comes in 128 KiB to 1 MiB requests: one GET each would cost
    /// a round trip per request); when the piece before the read's first
    /// is held or being fetched, the reader is going through the file in
    /// order, and the next [`PLAIN_AHEAD`] pieces are fetched in the
    /// background.
    pub fn pin_for_read(&self, range: Range<u64>) -> io::Result<Pin<'_>> {
        let size = self.size;
        let start = range.start.min(size) / PLAIN_CHUNK * PLAIN_CHUNK;
        let end = range.end.min(size).div_ceil(PLAIN_CHUNK) * PLAIN_CHUNK;
        let end = end.max(start).min(size);
        if start >= PLAIN_CHUNK && self.has_or_fetching(&[start - PLAIN_CHUNK..start]) {
            let ahead = end..(end + PLAIN_AHEAD * PLAIN_CHUNK).min(size);
            if !ahead.is_empty() {
                self.file().prefetch(&[ahead]);
            }
        }
        self.pin_all(&[start..end])
    }
}

/// Fills a whole mirror file that is about to leave the cache (moved into
/// the spool of a writable mount): it is never evicted after this.
pub fn fill_and_take(file: &File) -> io::Result<()> {
    if let Some(u) = fill_whole(file)? {
        u.leave_cache();
    }
    Ok(())
}
