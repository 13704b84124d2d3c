//! Checkpoint families under `mount --delta auto` (doc/SEMANTICS.md,
//! "Checkpoint families"): the newest checkpoint of a family standalone,
//! older ones as *reverse* deltas against their successor.
//!
//! A family is what [`CheckpointFs::family_candidates`] finds for a
//! committed `X.safetensors`: the file of the same name in each sibling
//! directory (`checkpoint-12/model.safetensors` for
//! `checkpoint-13/model.safetensors`), or every `.safetensors` of a
//! sibling without one (a checkpoint saved sharded), and a file in the
//! same directory with the same tensors. A commit stores the new file
//! standalone (as without `--delta`, so it reaches STORE as fast) and
//! queues it here. The family thread ([`CheckpointFs::family_loop`])
//! then takes the family's standalone members whose tensors the new file
//! covers, most alike by content first (a sample of the bytes of up to
//! [`SAMPLES`] shared tensors, not modification time), and rewrites each
//! such predecessor `P` as a delta against the new file, unless the chain
//! under `P` would then be deeper than the family depth
//! ([`FAMILY_DEPTH`], `mount --family-depth`): then `P` stays standalone,
//! a keyframe; or unless the delta is not at least 20% smaller than `P`:
//! then `P` stays standalone, tried again only once it changes or a
//! newer file is more alike ([`RETRY`]). Only members not newer than the
//! new file (by modification time) are taken: the new file is normally
//! the newest, but not when a family left queued by an earlier daemon is
//! settled.
//! Members much less alike than the most alike one are not tried
//! ([`WORTH_TRYING`]). So a checkpoint saved sharded between unsharded
//! ones, and a keyframe whose chain retention has shortened, become
//! deltas too.
//!
//! So the newest reads with one decode, every older one within the
//! family depth, and the oldest (what retention deletes) is a leaf:
//! removing it rewrites nothing.
//!
//! The rewrite is packed with no lock held (spool temporaries, fsynced),
//! then installed under `ns`: `P.z4dm` renamed in beside `P.zstn` (which
//! still shadows it), each delta under `P` given its new base path, base
//! fingerprint and real depth (a trailer rewrite, renamed over it), each
//! directory fsynced, and only then `P.zstn` removed. Nothing changes
//! what any name presents, so readers see the same bytes throughout; a
//! `kill -9` at any point leaves every file exact (at worst a shadowed
//! `P.z4dm` next to `P.zstn`, which `release_base` reuses). If any file
//! involved changed while packing, the rewrite is dropped.
//!
//! Here: the queue and the family thread. Beside it: `candidates`, a
//! family's members and how alike two checkpoints are; `demote`, a
//! predecessor rewritten as a delta.
//!
//! Must not be called under `ns`; takes it only to install.

use super::relations::{Relation, Stamp};
use crate::namespace;
use crate::CheckpointFs;
use ckptfs_format::delta::MAX_CHAIN;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::Metadata;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

mod candidates;
mod demote;

/// The deepest a family's chain is made by default: a standalone
/// keyframe and at most this many deltas behind it (so a read decodes at
/// most this + 1 frames per block). `mount --family-depth` sets another
/// (1..=[`MAX_CHAIN`]). Chosen by `scripts/bench-family.sh`.
pub const FAMILY_DEPTH: u32 = 3;

/// Shared tensors sampled to compare two checkpoints.
const SAMPLES: usize = 16;

/// Bytes sampled from the middle of each (a block of 1 MiB is decoded
/// for it anyway).
const SAMPLE_BYTES: u64 = 64 << 10;

/// Candidates whose similarities differ by less than this are equally
/// alike: the most recently modified wins.
const TIE: f64 = 0.002;

/// Candidates less alike than this fraction of the most alike one are
/// not tried: a delta against so different a file would not be kept.
const WORTH_TRYING: f64 = 0.5;

/// How much more alike than when it was found not worth it a standalone
/// member must be to be tried again.
const RETRY: f64 = 0.05;

/// Files looked at in one sibling directory that has no file of the
/// target's name (the shards of a checkpoint saved sharded).
const MAX_SHARDS: usize = 64;

/// Committed files waiting for their family to be settled, and how.
pub(crate) struct FamilyQueue {
    /// Oldest first; a file leaves when its family is settled. Kept in
    /// the spool as [`PENDING`] too, so that what an unmount or a crash
    /// interrupts is settled at the next mount.
    pending: Mutex<Vec<PathBuf>>,
    wake: Condvar,
    stop: AtomicBool,
    /// The deepest chain made ([`FAMILY_DEPTH`] unless the mount says).
    depth: u32,
    /// Files found not worth storing as a delta (the delta was too
    /// large), as they were then: not tried again until they change.
    /// With the similarity then: tried again only against a file more
    /// alike by [`RETRY`].
    kept: Mutex<HashMap<PathBuf, (Stamp, f64)>>,
}

/// The spool file listing [`FamilyQueue::pending`]: STORE paths, each
/// followed by a NUL.
const PENDING: &str = "family.pending";

impl FamilyQueue {
    pub(crate) fn new() -> Self {
        FamilyQueue {
            pending: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            depth: FAMILY_DEPTH,
            kept: Mutex::new(HashMap::new()),
        }
    }

    /// Chains at most `depth` deltas deep (1..=[`MAX_CHAIN`]).
    pub(crate) fn set_depth(&mut self, depth: u32) {
        self.depth = depth.clamp(1, MAX_CHAIN);
    }
}

fn parent(p: &Path) -> &Path {
    p.parent().unwrap_or(Path::new(""))
}

/// A family member's place in its family's order: (modification time,
/// presented path).
pub(super) type OrderKey = ((i64, i64), PathBuf);

/// Where committed backing `rel` (metadata `m`) stands in its family's
/// order: modification time, then the presented path (the same before
/// and after a rewrite, which keeps the time).
pub(super) fn order_key(rel: &Path, m: &Metadata) -> OrderKey {
    let shown = rel
        .file_name()
        .and_then(namespace::presented_name)
        .map_or_else(|| rel.to_path_buf(), |n| parent(rel).join(n));
    ((m.mtime(), m.mtime_nsec()), shown)
}

impl CheckpointFs {
    /// After committed file `target` (a presented path) was stored
    /// standalone under `--delta auto`: settles its family in the
    /// background.
    pub(super) fn queue_family(&self, target: &Path) {
        let mut q = self.family.pending.lock();
        if !q.iter().any(|p| p == target) {
            q.push(target.to_path_buf());
            self.save_pending(&q);
        }
        self.family.wake.notify_one();
    }

    /// The family thread: first what an earlier daemon left (files still
    /// to settle, shadowed deltas), then queued families and released
    /// bases (`relations`: any writable mount), until
    /// [`Self::stop_family`].
    pub fn family_loop(&self) {
        if self.read_only {
            return;
        }
        if self.delta_auto {
            self.load_pending();
            self.drop_shadowed_deltas();
        }
        while !self.family.stop.load(Ordering::Relaxed) {
            if !self.settle_next() {
                let mut q = self.family.pending.lock();
                if q.is_empty() && !self.family.stop.load(Ordering::Relaxed) {
                    self.family
                        .wake
                        .wait_for(&mut q, Duration::from_millis(200));
                }
            }
            // Bases released by deletes (`relations`), in any writable
            // mount.
            self.release_pending();
        }
    }

    /// Makes the family thread return after its current rewrite. What is
    /// still queued stays listed in the spool: settled at the next mount
    /// (every file is already exact in STORE, only not yet as small as it
    /// could be).
    pub fn stop_family(&self) {
        self.family.stop.store(true, Ordering::Relaxed);
        self.family.wake.notify_all();
    }

    /// Settles every queued family now, on this thread (tests).
    pub fn run_family(&self) {
        while self.settle_next() {}
        self.release_pending();
    }

    /// Settles the oldest queued family; false if none was queued.
    fn settle_next(&self) -> bool {
        let Some(t) = self.family.pending.lock().first().cloned() else {
            return false;
        };
        if self.settle_family(&t) {
            let mut q = self.family.pending.lock();
            if let Some(i) = q.iter().position(|p| *p == t) {
                q.remove(i);
                self.save_pending(&q);
            }
        }
        true
    }

    /// Writes the queue to the spool (replaced atomically). Losing it
    /// loses only disk space, so it is not fsynced.
    fn save_pending(&self, q: &[PathBuf]) {
        let Ok(spool) = self.spool() else { return };
        let path = spool.dir().join(PENDING);
        let r = if q.is_empty() {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            let tmp = spool.dir().join(format!("{PENDING}.tmp"));
            let mut raw = Vec::new();
            for p in q {
                raw.extend_from_slice(p.as_os_str().as_bytes());
                raw.push(0);
            }
            std::fs::write(&tmp, raw).and_then(|()| std::fs::rename(&tmp, &path))
        };
        if let Err(e) = r {
            log::warn!("{}: not saved: {e}", path.display());
        }
    }

    /// Queues what an earlier daemon listed in the spool.
    fn load_pending(&self) {
        let Ok(spool) = self.spool() else { return };
        let Ok(raw) = std::fs::read(spool.dir().join(PENDING)) else {
            return;
        };
        let mut q = self.family.pending.lock();
        for p in raw.split(|&b| b == 0).filter(|p| !p.is_empty()) {
            let p = PathBuf::from(OsStr::from_bytes(p));
            // Only paths inside STORE, as they were written.
            let inside = p
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if inside && !q.contains(&p) {
                log::info!(
                    "{}: family left to settle by an earlier daemon",
                    p.display()
                );
                q.push(p);
            }
        }
    }

    /// A `kill -9` during a rewrite can leave a delta `P.z4dm` beside the
    /// standalone `P.zstn` that shadows it and presents the same bytes
    /// (this module's and `release_base`'s rewrites both make one beside
    /// the other before removing it). Each such delta is removed, the
    /// deltas under it re-pointed at `P.zstn` first (`make_standalone`),
    /// so `P` is standalone as before the interrupted rewrite; its
    /// family's next commit tries again.
    fn drop_shadowed_deltas(&self) {
        let mut stack = vec![PathBuf::new()];
        let mut found = Vec::new();
        while let Some(d) = stack.pop() {
            let Ok(rd) = self.store.read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name();
                if d.as_os_str().is_empty() && name == crate::spool::SPOOL_DIR {
                    continue;
                }
                let Ok(ft) = e.file_type() else { continue };
                if ft.is_dir() {
                    stack.push(d.join(&name));
                    continue;
                }
                let Some(shown) = namespace::presented_name(&name) else {
                    continue;
                };
                if ft.is_file()
                    && namespace::is_staging_name(&shown)
                    && name == namespace::delta_name_for(&shown)
                    && self
                        .store
                        .lstat(&d.join(namespace::zstn_name_for(&shown)))
                        .is_ok_and(|m| m.is_file())
                {
                    found.push(d.join(&name));
                }
            }
        }
        for delta in found {
            if self.family.stop.load(Ordering::Relaxed) {
                return;
            }
            let _held = self.hold_commits(&delta);
            let _g = self.ns.lock();
            let rels = self.relations();
            match self.make_standalone(&rels, &delta) {
                Ok(()) => log::info!(
                    "{}: left shadowed by an interrupted rewrite; removed",
                    delta.display()
                ),
                Err(e) => log::warn!("{}: shadowed delta left as it is: {e}", delta.display()),
            }
        }
    }

    /// The deepest chain a family is given.
    pub(super) fn family_depth(&self) -> u32 {
        self.family.depth
    }

    /// Settles `target`'s family; false if the daemon is stopping before
    /// it is done.
    fn settle_family(&self, target: &Path) -> bool {
        crate::hooks::delay("settle");
        let t0 = std::time::Instant::now();
        match self.demote_predecessors(target) {
            Ok(done) => {
                for what in done {
                    log::info!(
                        "{}: family: {what} ({:.2} s since settling began)",
                        target.display(),
                        t0.elapsed().as_secs_f64()
                    );
                }
            }
            Err(e) => log::warn!(
                "{}: family: predecessor not rewritten (every file stays exact): {e}",
                target.display()
            ),
        }
        if self.family.stop.load(Ordering::Relaxed) {
            return false;
        }
        // Tests wait for this line.
        log::info!("{}: family settled", target.display());
        true
    }
}

/// The longest chain of deltas under STORE file `p` (0: none).
pub(super) fn chain_height(rels: &[Relation], p: &Path) -> u32 {
    fn h(rels: &[Relation], p: &Path, left: u32) -> u32 {
        if left == 0 {
            return 0;
        }
        rels.iter()
            .filter(|r| r.base == p && r.delta != p)
            .map(|r| 1 + h(rels, &r.delta, left - 1))
            .max()
            .unwrap_or(0)
    }
    h(rels, p, MAX_CHAIN + 1)
}
