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
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}
