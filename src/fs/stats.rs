//! Counters of the read path: the FUSE reads the daemon answers and the
//! blocks it decodes, so that a benchmark or a test can tell how a load
//! reached the daemon (request sizes) and what it cost (blocks decoded,
//! decoded again).
//!
//! - Every read that reaches [`CheckpointFs::read_data`](super::CheckpointFs)
//!   (an archive, or a plain file not passed through) is counted with the
//!   size the kernel asked for, in a histogram of 4 KiB pages (requests
//!   are whole pages but for a file's last one), so the median is exact to
//!   the page.
//! - Every block decoded into the cache, by a read or by prefetch, is
//!   counted; one whose key (archive version, unit, block) was decoded
//!   before in this mount is also counted in `decoded_again`. Keys are
//!   remembered as 64-bit hashes, the first [`SEEN_MAX`] of them (16 MiB
//!   at most); past that, a repeat of a later block is not seen.
//!
//! The counters are relaxed atomics (two adds per read); a decode (about
//! 1 MiB of work) also takes the leaf lock of the set of keys. The mount
//! answers them as the `user.ckptfs.stats` attribute of its root
//! (doc/SEMANTICS.md, "Reads"): one line of `name=value` pairs.

use crate::cache::CacheKey;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The attribute of the mount's root that answers the counters.
pub const XATTR_STATS: &str = "user.ckptfs.stats";

/// Distinct block keys remembered (16 bytes each in the set, about).
const SEEN_MAX: usize = 1 << 20;

/// Histogram buckets: requests of 0..=1024 pages, then one for longer.
const PAGE: u64 = 4096;
const BUCKETS: usize = 1026;

pub struct ReadStats {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    /// Reads by requested size in pages (rounded up).
    sizes: Box<[AtomicU64]>,
    decoded: AtomicU64,
    decoded_bytes: AtomicU64,
    decoded_again: AtomicU64,
    seen: Mutex<HashSet<u64, BuildHasherDefault<NoHash>>>,
}

impl Default for ReadStats {
    fn default() -> Self {
        ReadStats {
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            sizes: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            decoded: AtomicU64::new(0),
            decoded_bytes: AtomicU64::new(0),
            decoded_again: AtomicU64::new(0),
            seen: Mutex::new(HashSet::default()),
        }
    }
}

/// The set holds hashes already: no second hash.
#[derive(Default)]
struct NoHash(u64);

impl std::hash::Hasher for NoHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl ReadStats {
    /// A read of `size` bytes asked by the kernel.
    pub fn read(&self, size: u32) {
        self.reads.fetch_add(1, Relaxed);
        self.read_bytes.fetch_add(size as u64, Relaxed);
        let pages = (size as u64).div_ceil(PAGE).min(BUCKETS as u64 - 1);
        self.sizes[pages as usize].fetch_add(1, Relaxed);
    }

    /// A block decoded (`len` bytes), successfully.
    pub fn decoded(&self, key: &CacheKey, len: usize) {
        self.decoded.fetch_add(1, Relaxed);
        self.decoded_bytes.fetch_add(len as u64, Relaxed);
        let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
        let mut seen = self.seen.lock();
        if seen.contains(&h) {
            drop(seen);
            self.decoded_again.fetch_add(1, Relaxed);
            log::debug!("block decoded again: {key:?}");
        } else if seen.len() < SEEN_MAX {
            seen.insert(h);
        }
    }

    /// The median requested size, in bytes (a whole number of pages; 0
    /// when there was no read).
    fn median(&self) -> u64 {
        let counts: Vec<u64> = self.sizes.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        let mut below = 0;
        for (pages, n) in counts.iter().enumerate() {
            below += n;
            if total > 0 && 2 * below >= total {
                return pages as u64 * PAGE;
            }
        }
        0
    }

    /// `name=value` pairs, space-separated: reads, read_bytes,
    /// read_median (bytes), decoded (blocks), decoded_bytes,
    /// decoded_again (blocks decoded more than once), decoded_distinct.
    pub fn render(&self) -> String {
        let decoded = self.decoded.load(Relaxed);
        let again = self.decoded_again.load(Relaxed);
        format!(
            "reads={} read_bytes={} read_median={} decoded={decoded} decoded_bytes={} \
             decoded_again={again} decoded_distinct={}",
            self.reads.load(Relaxed),
            self.read_bytes.load(Relaxed),
            self.median(),
            self.decoded_bytes.load(Relaxed),
            decoded - again,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::BlockKey;

    fn key(g: u64, block: u32) -> CacheKey {
        CacheKey {
            generation: g,
            block: BlockKey { unit: 0, block },
        }
    }

    fn field(s: &str, name: &str) -> u64 {
        s.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn counts_reads_by_size_and_blocks_decoded_again() {
        let s = ReadStats::default();
        for size in [4096, 131072, 131072, 1 << 20, 100] {
            s.read(size);
        }
        s.decoded(&key(1, 0), 10);
        s.decoded(&key(1, 1), 10);
        s.decoded(&key(1, 0), 10);
        s.decoded(&key(2, 0), 10);
        let r = s.render();
        assert_eq!(field(&r, "reads"), 5, "{r}");
        assert_eq!(field(&r, "read_median"), 131072, "{r}");
        assert_eq!(field(&r, "read_bytes"), 4096 + 2 * 131072 + (1 << 20) + 100);
        assert_eq!(field(&r, "decoded"), 4);
        assert_eq!(field(&r, "decoded_again"), 1);
        assert_eq!(field(&r, "decoded_distinct"), 3);
        assert_eq!(field(&r, "decoded_bytes"), 40);
        assert_eq!(field(&ReadStats::default().render(), "read_median"), 0);
    }
}
