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
//! - Beside the read path: the bytes each reply carried (`bytes_served`),
//!   the time spent decoding (`decode_seconds`, summed over threads),
//!   commits of written files and their failures, and every error answered
//!   to the kernel by errno (`fuse.rs` counts them where it maps them).
//!
//! The counters are relaxed atomics (two adds per read); a decode (about
//! 1 MiB of work) also takes the leaf lock of the set of keys. The mount
//! answers them, with the cache's and the write-back's, as the
//! `user.ckptfs.stats` attribute of its root (doc/SEMANTICS.md, "Reads"):
//! one line of `name=value` pairs, which `ckptfs stats` prints and
//! `--metrics-addr` serves to Prometheus ([`Snapshot`]).

use ckptfs_archive::cache::CacheKey;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

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
    decode_nanos: AtomicU64,
    served: AtomicU64,
    commits: AtomicU64,
    commit_failures: AtomicU64,
    /// Errors answered, by errno (`ERRNO_MAX` and above in the last).
    errors: Box<[AtomicU64]>,
    seen: Mutex<HashSet<u64, BuildHasherDefault<NoHash>>>,
}

/// Errnos counted one by one (Linux's go up to 133).
const ERRNO_MAX: usize = 160;

impl Default for ReadStats {
    fn default() -> Self {
        ReadStats {
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            sizes: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            decoded: AtomicU64::new(0),
            decoded_bytes: AtomicU64::new(0),
            decoded_again: AtomicU64::new(0),
            decode_nanos: AtomicU64::new(0),
            served: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            commit_failures: AtomicU64::new(0),
            errors: (0..=ERRNO_MAX).map(|_| AtomicU64::new(0)).collect(),
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

    /// A reply to a read carried `len` bytes.
    pub fn served(&self, len: usize) {
        self.served.fetch_add(len as u64, Relaxed);
    }

    /// A written file committed to STORE (or its commit failed: it stays
    /// staged and is tried again).
    pub fn commit(&self, ok: bool) {
        let c = if ok {
            &self.commits
        } else {
            &self.commit_failures
        };
        c.fetch_add(1, Relaxed);
    }

    /// An error answered to the kernel.
    pub fn error(&self, errno: i32) {
        let i = (errno.max(0) as usize).min(ERRNO_MAX);
        self.errors[i].fetch_add(1, Relaxed);
    }

    /// A block decoded (`len` bytes), successfully, in `took`.
    pub fn decoded(&self, key: &CacheKey, len: usize, took: Duration) {
        self.decoded.fetch_add(1, Relaxed);
        self.decode_nanos
            .fetch_add(took.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
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

    /// The read path's counters, then `more` (the cache's, the
    /// write-back's, the store's, which their owners know).
    pub fn snapshot(&self, more: Vec<Metric>) -> Snapshot {
        let decoded = self.decoded.load(Relaxed);
        let again = self.decoded_again.load(Relaxed);
        let mut m = vec![
            Metric::counter("bytes_served", "Bytes of file data the daemon answered reads with (passthrough reads of plain files do not reach it)", self.served.load(Relaxed)),
            Metric::counter("reads", "Reads the daemon answered", self.reads.load(Relaxed)),
            Metric::counter("read_bytes", "Bytes the kernel asked for in those reads", self.read_bytes.load(Relaxed)),
            Metric::gauge("read_median", "Median size of a read, in bytes (whole pages)", self.median()),
            Metric::counter("blocks_decoded", "Blocks decoded, by reads and prefetch", decoded),
            Metric::counter("decoded_bytes", "Bytes those blocks decoded to", self.decoded_bytes.load(Relaxed)),
            Metric::counter("decoded_again", "Blocks decoded more than once", again),
            Metric::counter("decoded_distinct", "Distinct blocks decoded", decoded - again),
            Metric::seconds("decode_seconds", "Time spent decoding blocks, summed over threads", self.decode_nanos.load(Relaxed)),
            Metric::counter("commits", "Written files committed to the store", self.commits.load(Relaxed)),
            Metric::counter("commit_failures", "Commits that failed (the file stays staged and is tried again)", self.commit_failures.load(Relaxed)),
        ];
        m.extend(more);
        let errors = self
            .errors
            .iter()
            .enumerate()
            .filter_map(|(n, c)| {
                let c = c.load(Relaxed);
                (c > 0).then(|| (errno_name(n as i32), c))
            })
            .collect();
        Snapshot { metrics: m, errors }
    }
}

/// One counter or gauge of [`Snapshot`].
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    /// A total that only grows (else a level: a gauge).
    pub counter: bool,
    /// Whole units, or nanoseconds shown as seconds.
    pub value: u64,
    pub nanos: bool,
}

impl Metric {
    pub fn counter(name: &'static str, help: &'static str, value: u64) -> Metric {
        Metric {
            name,
            help,
            counter: true,
            value,
            nanos: false,
        }
    }
    pub fn gauge(name: &'static str, help: &'static str, value: u64) -> Metric {
        Metric {
            name,
            help,
            counter: false,
            value,
            nanos: false,
        }
    }
    pub fn seconds(name: &'static str, help: &'static str, nanos: u64) -> Metric {
        Metric {
            name,
            help,
            counter: true,
            value: nanos,
            nanos: true,
        }
    }
    /// The value as printed: an integer, or seconds with 6 decimals.
    pub fn text(&self) -> String {
        if self.nanos {
            format!("{:.6}", self.value as f64 / 1e9)
        } else {
            self.value.to_string()
        }
    }
    pub fn as_f64(&self) -> f64 {
        if self.nanos {
            self.value as f64 / 1e9
        } else {
            self.value as f64
        }
    }
}

/// The daemon's counters at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub metrics: Vec<Metric>,
    /// Errors answered to the kernel, by errno name (`ENOENT`), non-zero
    /// ones only.
    pub errors: Vec<(String, u64)>,
}

/// The prefix of an error count in [`Snapshot::render`].
pub const ERRNO_PREFIX: &str = "errors.";

impl Snapshot {
    /// `name=value` pairs, space-separated, errors as `errors.ENOENT=N`:
    /// what `user.ckptfs.stats` answers.
    pub fn render(&self) -> String {
        let mut out: Vec<String> = self
            .metrics
            .iter()
            .map(|m| format!("{}={}", m.name, m.text()))
            .collect();
        out.extend(
            self.errors
                .iter()
                .map(|(n, c)| format!("{ERRNO_PREFIX}{n}={c}")),
        );
        out.join(" ")
    }

    pub fn get(&self, name: &str) -> Option<&Metric> {
        self.metrics.iter().find(|m| m.name == name)
    }

    /// The one-line summary the daemon logs at unmount.
    pub fn summary(&self) -> String {
        let v = |n: &str| self.get(n).map_or(0, |m| m.value);
        let errors: u64 = self.errors.iter().map(|(_, c)| c).sum();
        let by: Vec<String> = self
            .errors
            .iter()
            .map(|(n, c)| format!("{n} {c}"))
            .collect();
        format!(
            "served {} bytes in {} reads, decoded {} blocks ({:.2} s), {} commits, {} commit failures, {} errors{}",
            v("bytes_served"),
            v("reads"),
            v("blocks_decoded"),
            v("decode_seconds") as f64 / 1e9,
            v("commits"),
            v("commit_failures"),
            errors,
            if by.is_empty() { String::new() } else { format!(" ({})", by.join(", ")) },
        )
    }
}

/// The symbolic name of an errno (`E` and the number for one not listed).
pub fn errno_name(n: i32) -> String {
    let name = match n {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOTTY => "ENOTTY",
        libc::ETXTBSY => "ETXTBSY",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ESTALE => "ESTALE",
        libc::EDQUOT => "EDQUOT",
        libc::ECANCELED => "ECANCELED",
        _ => return format!("E{n}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckptfs_archive::BlockKey;

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
        let ms = Duration::from_millis(1);
        s.decoded(&key(1, 0), 10, ms);
        s.decoded(&key(1, 1), 10, ms);
        s.decoded(&key(1, 0), 10, ms);
        s.decoded(&key(2, 0), 10, ms);
        s.served(4096);
        s.served(100);
        s.commit(true);
        s.commit(false);
        s.commit(true);
        s.error(libc::ENOENT);
        s.error(libc::ENOENT);
        s.error(libc::EIO);
        let snap = s.snapshot(vec![Metric::gauge("cache_bytes", "", 7)]);
        let r = snap.render();
        assert_eq!(field(&r, "reads"), 5, "{r}");
        assert_eq!(field(&r, "read_median"), 131072, "{r}");
        assert_eq!(field(&r, "read_bytes"), 4096 + 2 * 131072 + (1 << 20) + 100);
        assert_eq!(field(&r, "blocks_decoded"), 4);
        assert_eq!(field(&r, "decoded_again"), 1);
        assert_eq!(field(&r, "bytes_served"), 4196);
        assert_eq!((field(&r, "commits"), field(&r, "commit_failures")), (2, 1));
        assert_eq!(field(&r, "cache_bytes"), 7);
        assert_eq!(field(&r, "errors.ENOENT"), 2);
        assert_eq!(field(&r, "errors.EIO"), 1);
        assert!(r.contains(" decode_seconds=0.004000 "), "{r}");
        assert_eq!(
            snap.summary(),
            "served 4196 bytes in 5 reads, decoded 4 blocks (0.00 s), 2 commits, \
             1 commit failures, 3 errors (ENOENT 2, EIO 1)"
        );
        assert_eq!(field(&r, "decoded_distinct"), 3);
        assert_eq!(field(&r, "decoded_bytes"), 40);
        assert_eq!(
            field(
                &ReadStats::default().snapshot(Vec::new()).render(),
                "read_median"
            ),
            0
        );
    }
}
