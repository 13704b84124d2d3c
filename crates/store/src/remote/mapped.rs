//! A map of a mirror file as an archive's [`ByteSource`]: its bytes are
//! valid once fetched ([`RemoteFile::ensure_all`]), and the map is a use
//! of the file ([`InUse`]: the disk cache keeps its metadata meanwhile).

use super::{InUse, Pin, RemoteFile};
use crate::source::ByteSource;
use memmap2::Mmap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::Arc;

pub struct RemoteMapped {
    map: Mmap,
    file: InUse,
}

impl RemoteMapped {
    /// Maps `file`, the mirror file of `remote`, read-only.
    pub fn new(file: &File, remote: Arc<RemoteFile>) -> io::Result<RemoteMapped> {
        // SAFETY: the map is read-only and private to this process; a
        // mirror file is created at its object's full size and only ever
        // written in place (never truncated), so the mapped pages stay
        // valid for the map's lifetime.
        let map = unsafe { Mmap::map(file) }?;
        Ok(RemoteMapped {
            map,
            file: InUse::new(remote),
        })
    }
}

impl ByteSource for RemoteMapped {
    fn bytes(&self) -> &[u8] {
        &self.map
    }
    fn ensure_all(&self, ranges: &[Range<u64>]) -> io::Result<()> {
        self.file.ensure_all(ranges)
    }
    fn pin_all(&self, ranges: &[Range<u64>]) -> io::Result<Option<Pin<'_>>> {
        self.file.pin_all(ranges).map(Some)
    }
    fn prefetch(&self, ranges: &[Range<u64>]) {
        self.file.file().prefetch(ranges);
    }
    fn refetch(&self, ranges: &[Range<u64>]) -> bool {
        self.file.refetch(ranges).is_ok()
    }
    fn has_all(&self, ranges: &[Range<u64>]) -> bool {
        self.file.has_all(ranges)
    }
    fn has_or_fetching(&self, ranges: &[Range<u64>]) -> bool {
        self.file.has_or_fetching(ranges)
    }
    fn read_ahead_room(&self) -> u64 {
        self.file.read_ahead_room()
    }
    fn is_remote(&self) -> bool {
        true
    }
}
