//! **ckptfs-fs**: the filesystem, the top layer below the command line.
//! Depends on `ckptfs-format`, `ckptfs-store`, `ckptfs-archive` and
//! `ckptfs-pack` (decoding happens inside the archive readers); nothing
//! depends on it but the `ckptfs` binary.
//!
//! `CheckpointFs`: the filesystem logic of `ckptfs mount`, with no FUSE in
//! it. [`fuse`] is a thin adapter that converts fuser types and calls
//! these methods; tests drive them directly, without a mount.
//!
//! The mount presents STORE: `X.zstn` / `X.safetensors.zstn` as
//! `X.safetensors` (exact size, original bytes, decoded block by block on
//! demand), `X.blz` as a read-only directory of its files, everything else
//! passed through. Each behaviour has its module:
//!
//! - `types`: what the methods take and answer (`Attr`, `Entry`,
//!   `Opened`, `DirectoryReplier`, ...); [`error`]: [`FsError`] and its
//!   exhaustive errno mapping;
//! - [`namespace`]: the naming rules (pure); `resolve`: lookup of a name
//!   and the backing path of an inode; [`inode`]: stable inode numbers per
//!   (path, backing file);
//! - `archive_slot`: the parsed archive of each backing version; `attr`:
//!   `getattr`, `readlink`, `statfs`; `xattr`: `user.ckptfs.*`;
//! - `dir`: listings of STORE; `blz_dir`: `.blz` archives as directories;
//!   `gguf_view`: the GGUF of each model (`mount --gguf`);
//! - `handles`: the open-handle table; `read`: open for reading and the
//!   read path through the block cache; [`prefetch`]: the read-ahead
//!   window; [`stats`]: counters of reads and block decodes;
//! - [`spool`] and `write`: files written through the mount, staged and
//!   compressed after their last close; `sys`: the libc calls they need;
//!   [`hold`]: commits paused while `ckptfs hold` backs STORE up;
//! - `hooks`: points where a test stops or delays the daemon (debug
//!   builds only).
//!
//! Freshness: every `lookup` and `getattr` re-stats the backing path, and
//! directory listings are read from STORE at `opendir`, so files that
//! appear, change or disappear in STORE show up on the next lookup or
//! listing. No negative entries are kept.
//!
//! Errors: one [`FsError`] with an exhaustive errno mapping. A backing
//! archive that cannot be parsed is still listed (with its stored size);
//! opening it fails with EIO and logs the file and reason. A block that
//! fails to decode answers EIO for the reads that need it, only.
//!
//! Lock order (the one place it is written down, for the whole mount):
//! `ns` first (held across a namespace change or a commit; a lookup that
//! raced a change is done again under it, see `ns_lock`), then the inode
//! table (`InodeTable::tables`), then one inode's `loc` or `state`: never
//! both at once, and nothing is taken under `state` (a path is walked
//! before `state` is locked). Every other lock is a leaf, released before
//! anything else is taken: the handle table, `writers`, `warned`, the
//! write-back queue, the spool's state, a handle's `Sequential`,
//! `gguf_views` (never held while a view is built), `base_generations`
//! (looked up while a delta's base is opened, which may be under the
//! delta inode's `state`: it is a leaf, so that adds no order), the set of decoded
//! block keys of [`stats`], the block
//! cache's `inner` and a flight's `state` (never held together: a flight is
//! published after `inner` is released), and the adapter's passthrough
//! table in `crate::fuse` (taken with no lock of this module held). Three
//! waits: `Spool::bump` waits, possibly under `ns`, for a running
//! compression, which takes no lock until it has ended; a cache miss waits
//! for another reader's decode of the same block holding no other lock; a
//! commit waits for `ckptfs hold` ([`hold`]) after its compression has
//! ended and before it takes `ns`, holding no lock. No
//! lock is held while a block is decoded for a read or a prefetch, nor
//! while a staged file is compressed; copy-up decodes an archive under
//! `ns`.

mod archive_slot;
mod attr;
pub mod beneath;
mod blz_dir;
mod dir;
pub mod error;
mod gguf_view;
mod handles;
pub mod hold;
mod hooks;
pub mod inode;
pub mod namespace;
mod ns_lock;
pub mod prefetch;
mod read;
mod resolve;
pub mod sink;
pub mod spool;
pub mod stats;
mod sys;
#[cfg(test)]
#[path = "../../../tests/common/support.rs"]
#[allow(dead_code)] // each crate's tests use some of the helpers
mod test_support;
mod types;
mod write;
mod xattr;

pub mod fuse;
pub mod metrics;

pub use archive_slot::Slot;
use beneath::Beneath;
pub use error::{FsError, Result};
pub use handles::AfterRelease;
pub use inode::{NodeKind, ROOT_INO};
pub use read::{Piece, ReadData};
pub use types::{
    Attr, Caller, DirectoryReplier, Entry, FileKind, Opened, SetAttr, SetTime, StatFs,
};
pub use write::repack;
pub use xattr::{XATTR_CHECKSUMS, XATTR_ERROR, XATTR_FORMAT, XATTR_RATIO, XATTR_STORED_SIZE};

use ckptfs_archive::cache::{BlockCache, CacheStats};
use ckptfs_archive::ArchiveError;
use ckptfs_store::source::Sources;
use handles::{Handle, OPEN_MODE_STRIPES};
use inode::{Identity, InodeTable};
use parking_lot::{Mutex, RwLock};
use prefetch::Policy;
use spool::Spool;
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use write::{RelationCache, WritebackQueue};

#[derive(Debug, Clone)]
pub struct FsConfig {
    pub store: PathBuf,
    /// Byte budget of the decoded-block cache.
    pub cache_bytes: u64,
    /// How long the kernel may cache entries and attributes.
    pub ttl: Duration,
    /// Refuse every change (EROFS); nothing in STORE is touched.
    pub read_only: bool,
    /// Serve only archives whose checksums cover every byte served
    /// (ckptfs-written or sealed); any other fails like an unparseable one.
    pub require_checksums: bool,
    /// Other users use the mount (`--allow-other`): STORE is accessed
    /// with each caller's fs identity (see [`beneath`]).
    pub allow_other: bool,
}

pub struct CheckpointFs {
    /// STORE's root descriptor; every access to STORE goes through it.
    store: Beneath,
    allow_other: bool,
    inodes: InodeTable,
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
    /// Locks by inode number (striped): held from an open's choice of io
    /// mode (passthrough or page cache) to its handle's insertion in
    /// `handles`, and by a commit from its check for open handles to the
    /// change of the inode's kind, so that two opens of one inode never
    /// choose differently (the kernel answers EIO to the second). Taken
    /// after `ns`, never before it.
    open_mode: Box<[Mutex<()>]>,
    next_fh: AtomicU64,
    cache: Arc<BlockCache<ArchiveError>>,
    /// The cache generation of each delta base's file version, so that
    /// deltas over one base share its decoded blocks
    /// (`archive_slot::MountBases`). A leaf lock.
    base_generations: Mutex<lru::LruCache<archive_slot::BaseVersion, u64>>,
    /// Reads answered and blocks decoded (`user.ckptfs.stats`).
    stats: Arc<stats::ReadStats>,
    /// Counters the fs does not keep itself (an S3 store's), read when
    /// the counters are asked for ([`CheckpointFs::with_metric`]).
    more_metrics: Vec<Box<dyn Fn() -> stats::Metric + Send + Sync>>,
    policy: Policy,
    ttl: Duration,
    /// Backing paths already warned about (shadowed archives).
    warned: Mutex<HashSet<PathBuf>>,
    read_only: bool,
    require_checksums: bool,
    /// Staged `.safetensors` files (None when read-only).
    spool: Option<Spool>,
    /// Serialises changes of the namespace (create, rename, unlink, commit
    /// of a compressed file). Reads and lookups do not take it.
    ns: ns_lock::NsLock,
    /// Open handles with write access, per backing identity.
    writers: Mutex<HashMap<Identity, usize>>,
    /// Staged files waiting to be compressed.
    writeback: WritebackQueue,
    /// STORE's directory, locked shared by each commit ([`hold`]).
    hold: Option<std::fs::File>,
    /// The cast of the GGUF views beside each model (`mount --gguf`).
    gguf: Option<ckptfs_pack::export::Cast>,
    /// Each model's GGUF view as last built, by model path (a leaf lock).
    gguf_views: Mutex<HashMap<PathBuf, gguf_view::ViewSlot>>,
    /// Where commits go beyond STORE (an `s3://` mount); None for a local
    /// store.
    sink: Option<Arc<dyn sink::Sink>>,
    /// What STORE's files are read as: local maps, or the remote copies
    /// of an `s3://` store's mirror ([`Self::with_sources`]).
    sources: Arc<dyn Sources>,
    /// `mount --delta auto`: commits may be stored as deltas.
    delta_auto: bool,
    relation_cache: RelationCache,
    /// Committed files whose family the family thread settles
    /// (`write::family`).
    family: write::FamilyQueue,
}

impl std::fmt::Debug for CheckpointFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointFs")
            .field("store", &self.store.path())
            .finish()
    }
}

impl CheckpointFs {
    pub fn new(cfg: FsConfig) -> io::Result<CheckpointFs> {
        let store = cfg.store.canonicalize()?;
        let m = std::fs::metadata(&store)?;
        if !m.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{}: not a directory", store.display()),
            ));
        }
        let (spool, recovered) = if cfg.read_only {
            (None, Vec::new())
        } else {
            let (s, r) = Spool::open(&store)?;
            (Some(s), r)
        };
        let fs = CheckpointFs {
            inodes: InodeTable::new((m.dev(), m.ino())),
            store: Beneath::open(&store)?.with_own(spool::SPOOL_DIR),
            allow_other: cfg.allow_other,
            handles: RwLock::new(HashMap::new()),
            open_mode: (0..OPEN_MODE_STRIPES).map(|_| Mutex::new(())).collect(),
            next_fh: AtomicU64::new(1),
            cache: {
                // Gives its blocks back when an allocation fails.
                let c = Arc::new(BlockCache::new(cfg.cache_bytes));
                ckptfs_format::memory::register(
                    &(c.clone() as Arc<dyn ckptfs_format::memory::Relieve>),
                );
                c
            },
            base_generations: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(archive_slot::BASE_GENERATIONS).expect("non-zero"),
            )),
            stats: Arc::default(),
            more_metrics: Vec::new(),
            policy: Policy::for_cache(cfg.cache_bytes),
            ttl: cfg.ttl,
            warned: Mutex::new(HashSet::new()),
            read_only: cfg.read_only,
            require_checksums: cfg.require_checksums,
            spool,
            ns: ns_lock::NsLock::default(),
            writers: Mutex::new(HashMap::new()),
            writeback: WritebackQueue::new(),
            hold: if cfg.read_only {
                None
            } else {
                Some(hold::open_dir(&store)?)
            },
            gguf: None,
            gguf_views: Mutex::new(HashMap::new()),
            sink: None,
            sources: Arc::new(ckptfs_store::source::Local),
            delta_auto: false,
            relation_cache: Default::default(),
            family: write::FamilyQueue::new(),
        };
        fs.recover_relations();
        for r in recovered {
            log::info!(
                "recovering staged {} (spool entry {:016x}); it will be compressed",
                r.target.display(),
                r.id
            );
            fs.schedule(r.id);
        }
        Ok(fs)
    }

    /// `mount --delta auto`: committed `.safetensors` may be stored as
    /// deltas (`write::delta_commit`).
    pub fn with_delta_auto(mut self) -> CheckpointFs {
        self.delta_auto = true;
        self
    }

    /// `mount --family-depth`: a family's chains are at most `depth`
    /// deltas deep (`write::family`).
    pub fn with_family_depth(mut self, depth: u32) -> CheckpointFs {
        self.family.set_depth(depth);
        self
    }

    pub fn store(&self) -> &Path {
        self.store.path()
    }

    /// Makes every commit and change of STORE go through `sink` first
    /// (see [`sink`]).
    pub fn with_sink(mut self, sink: Arc<dyn sink::Sink>) -> CheckpointFs {
        self.sink = Some(sink);
        self
    }

    /// Reads STORE's files through `sources` (an `s3://` store's mirror,
    /// whose files are sparse copies of objects fetched on demand) instead
    /// of as local files.
    pub fn with_sources(mut self, sources: Arc<dyn Sources>) -> CheckpointFs {
        self.sources = sources;
        self
    }

    /// Until the guard is dropped, this thread accesses STORE as the
    /// caller `uid`/`gid` (with the groups of process `pid`) when other
    /// users may use the mount; else as the daemon (the mount's owner is
    /// the only caller).
    pub fn on_behalf(&self, uid: u32, gid: u32, pid: u32) -> Option<beneath::OnBehalf> {
        self.allow_other
            .then(|| beneath::on_behalf(beneath::Ids::of_process(uid, gid, pid)))
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Adds a counter that `f` reads when the counters are asked for.
    pub fn with_metric(mut self, f: impl Fn() -> stats::Metric + Send + Sync + 'static) -> Self {
        self.more_metrics.push(Box::new(f));
        self
    }

    /// Every counter: the read path's, the cache's, the write-back's and
    /// any added with [`Self::with_metric`] (`user.ckptfs.stats`, `ckptfs
    /// stats`, `--metrics-addr`).
    pub fn counters(&self) -> stats::Snapshot {
        use stats::Metric;
        let c = self.cache.stats();
        let mut more = vec![
            Metric::counter("cache_hits", "Block lookups the cache answered", c.hits),
            Metric::counter(
                "cache_misses",
                "Block lookups that decoded the block",
                c.misses,
            ),
            Metric::gauge(
                "cache_bytes",
                "Bytes of decoded blocks held in the cache",
                c.bytes,
            ),
            Metric::gauge(
                "cache_blocks",
                "Decoded blocks held in the cache",
                c.blocks as u64,
            ),
            Metric::gauge(
                "writeback_queued",
                "Written files staged and not yet committed to the store",
                self.staged_count() as u64,
            ),
        ];
        more.extend(self.more_metrics.iter().map(|f| f()));
        self.stats.snapshot(more)
    }

    /// The counters as `user.ckptfs.stats` answers them ([`stats`]).
    pub fn read_stats(&self) -> String {
        self.counters().render()
    }

    /// An error answered to the kernel (counted by errno).
    pub fn count_error(&self, errno: i32) {
        self.stats.error(errno);
    }

    /// A reply to a read carried `len` bytes.
    pub fn count_served(&self, len: usize) {
        self.stats.served(len);
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_tests;
