//! The bytes of an archive: a read-only private map of its file, or memory
//! (tests, fuzzing). The file must not be truncated in place while mapped
//! (ckptfs itself only ever replaces archives by rename).

use memmap2::Mmap;
use std::fs::File;

pub enum Backing {
    Map(Mmap),
    Owned(Vec<u8>),
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
        // the mapped pages stay valid for the map's lifetime.
        Ok(Backing::Map(unsafe { Mmap::map(file) }?))
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}
