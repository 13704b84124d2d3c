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
//! Must not be called under `ns`; takes it only to install.

use super::delta_commit::Writer;
use super::relations::{base_path_for, Relation, TempPath};
use crate::archive_slot::version_of;
use crate::namespace;
use crate::{CheckpointFs, FsError, Result};
use ckptfs_archive::{self as archive, ArchiveView};
use ckptfs_format::delta::{Trailer, MAX_CHAIN};
use ckptfs_format::digest::xxh3_64;
use ckptfs_format::safetensors::Header;
use ckptfs_pack::delta::{pack_delta, DeltaBase};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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

fn err(e: impl std::fmt::Display) -> FsError {
    FsError::Io(io::Error::other(e.to_string()))
}

/// A backing file's identity and version, to notice a change.
type Stamp = ((u64, u64), (u64, i64, i64, i64, i64));

fn stamp(m: &Metadata) -> Stamp {
    ((m.dev(), m.ino()), version_of(m))
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

/// A file rewritten in the spool, waiting to be renamed over `to`.
pub(super) struct Prepared {
    pub tmp: TempPath,
    pub to: PathBuf,
    /// What `to` was when read (None: `to` is new).
    was: Option<Stamp>,
}

/// The fraction of equal elements in `SAMPLE_BYTES` taken from the middle
/// of up to `SAMPLES` tensors both files have (name, dtype, shape).
/// Elements, not bytes: a float that moved by a step differs in its low
/// byte only, and counting bytes halves the signal.
fn similarity(
    a: &dyn ArchiveView,
    ah: &(Header, u64),
    b: &dyn ArchiveView,
    bh: &(Header, u64),
) -> f64 {
    let by_name: HashMap<&str, _> = bh.0.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut shared: Vec<_> =
        ah.0.tensors
            .iter()
            .filter_map(|t| {
                let u = by_name.get(t.name.as_str())?;
                (u.dtype == t.dtype && u.shape == t.shape && !t.is_empty()).then_some((t, *u))
            })
            .collect();
    if shared.is_empty() {
        return 0.0;
    }
    shared.sort_by(|x, y| x.0.name.cmp(&y.0.name));
    let step = shared.len().div_ceil(SAMPLES);
    let (mut same, mut all) = (0u64, 0u64);
    for (t, u) in shared.iter().step_by(step) {
        let w = match t.dtype.as_str() {
            "BF16" | "F16" | "I16" | "U16" => 2,
            "F32" | "I32" | "U32" => 4,
            "F64" | "I64" | "U64" => 8,
            _ => 1,
        };
        let n = SAMPLE_BYTES.min(t.len()) / w * w;
        if n == 0 {
            continue;
        }
        let at = (t.len() - n) / 2 / w * w;
        let mut x = vec![0u8; n as usize];
        let mut y = vec![0u8; n as usize];
        let ok = a
            .read_at(0, ah.1 + t.begin + at, &mut x)
            .is_ok_and(|k| k == x.len())
            && b.read_at(0, bh.1 + u.begin + at, &mut y)
                .is_ok_and(|k| k == y.len());
        if ok {
            same += x
                .chunks_exact(w as usize)
                .zip(y.chunks_exact(w as usize))
                .filter(|(p, q)| p == q)
                .count() as u64;
            all += n / w;
        }
    }
    same as f64 / all.max(1) as f64
}

/// True when the file at `path` starts like a delta (`Z4DM`), whatever
/// its name.
fn is_delta_file(f: &mut File) -> bool {
    use std::io::Read;
    let mut m = [0u8; 4];
    f.read_exact(&mut m).is_ok() && &m == b"Z4DM"
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

    /// Committed `.safetensors` backings of `target`'s family but its own:
    /// in each sibling directory, the file of the same name, or, in one
    /// without it, every `.safetensors` there (the shards of a checkpoint
    /// saved sharded, or one saved unsharded before shards); and the same
    /// tensors in the same directory. Which of them `target` covers is
    /// the caller's to check.
    pub(super) fn family_candidates(&self, target: &Path, header: &Header) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let Some(name) = target.file_name() else {
            return out;
        };
        let dir = parent(target);
        if let Some(this) = dir.file_name() {
            let up = parent(dir);
            if let Ok(rd) = self.store.read_dir(up) {
                for e in rd.flatten() {
                    let s = e.file_name();
                    if s == this
                        || (up.as_os_str().is_empty() && s == crate::spool::SPOOL_DIR)
                        || !e.file_type().is_ok_and(|t| t.is_dir())
                    {
                        continue;
                    }
                    let sib = up.join(&s);
                    match self.committed_backing(&sib.join(name)) {
                        Some(b) => out.push(b),
                        None => out.extend(self.safetensors_in(&sib)),
                    }
                }
            }
        }
        if let Some(b) = self.same_tensors_in_dir(target, header) {
            out.push(b);
        }
        out
    }

    /// The committed backings of the `.safetensors` in STORE directory
    /// `dir`, at most [`MAX_SHARDS`].
    fn safetensors_in(&self, dir: &Path) -> Vec<PathBuf> {
        let Ok(rd) = self.store.read_dir(dir) else {
            return Vec::new();
        };
        let mut shown: Vec<_> = rd
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| namespace::presented_name(&e.file_name()))
            .filter(|n| namespace::is_staging_name(n))
            .collect();
        shown.sort();
        shown.dedup();
        shown
            .iter()
            .take(MAX_SHARDS)
            .filter_map(|n| self.committed_backing(&dir.join(n)))
            .collect()
    }

    /// See the module doc: stores the standalone members of `target`'s
    /// family that it covers and that are not newer than it in
    /// [`order_key`]'s order, most alike first, as deltas against it.
    /// (The target is normally the newest; not when a family left queued
    /// by an earlier daemon is settled, or when `ckptfs repack` replays a
    /// family's commits in that order.) Returns what was done.
    pub(super) fn demote_predecessors(&self, target: &Path) -> Result<Vec<String>> {
        let Some(x) = self.committed_backing(target) else {
            return Ok(Vec::new());
        };
        let mut xf = self.store.open_file(&x, libc::O_RDONLY, 0)?;
        if is_delta_file(&mut xf) {
            return Ok(Vec::new());
        }
        let xm = xf.metadata()?;
        let (x_stamp, x_key) = (stamp(&xm), order_key(&x, &xm));
        drop(xf);
        let Some(xh) = self.presented_header_at(&x) else {
            return Ok(Vec::new());
        };
        let xa = self.open_store_archive(&x)?;
        let mut found = self.predecessors(target, (&x, x_key), &xh, &*xa);
        drop(xa);
        // Most alike first; near-ties to the most recently modified.
        let key = |c: &(f64, (i64, i64), PathBuf, Stamp)| ((c.0 / TIE).floor() as i64, c.1);
        found.sort_by_key(|c| std::cmp::Reverse(key(c)));
        let best = found.first().map_or(0.0, |c| c.0);
        let mut done = Vec::new();
        for (score, _, p, p_stamp) in found {
            if score < best * WORTH_TRYING {
                break;
            }
            if self.family.stop.load(Ordering::Relaxed) {
                break;
            }
            if let Some(what) = self.demote_one(target, (&x, x_stamp), (&p, p_stamp), score)? {
                done.push(what);
            }
        }
        Ok(done)
    }

    /// The standalone members of `target`'s family (backing `x`, header
    /// `xh`) whose tensors `x` holds nearly all of, that their owner may
    /// store against `x`, and that were not found not worth it before:
    /// (similarity, mtime, path, stamp).
    fn predecessors(
        &self,
        target: &Path,
        (x, x_key): (&Path, OrderKey),
        xh: &(Header, u64),
        xa: &dyn ArchiveView,
    ) -> Vec<(f64, (i64, i64), PathBuf, Stamp)> {
        let want: HashMap<&str, (&str, &[u64])> =
            xh.0.tensors
                .iter()
                .map(|t| (t.name.as_str(), (t.dtype.as_str(), t.shape.as_slice())))
                .collect();
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for p in self.family_candidates(target, &xh.0) {
            if p == x || !seen.insert(p.clone()) {
                continue;
            }
            let Ok(mut pf) = self.store.open_file(&p, libc::O_RDONLY, 0) else {
                continue;
            };
            let Ok(pm) = pf.metadata() else { continue };
            if is_delta_file(&mut pf) || order_key(&p, &pm) > x_key {
                continue;
            }
            // P comes to depend on X: X must be a base P's owner may have.
            let refused = match Writer::of_staged(&pm) {
                Ok(w) => self.base_refused(&w, x),
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = refused {
                log::debug!("{}: not stored against {}: {why}", p.display(), x.display());
                continue;
            }
            let Some(ph) = self.presented_header_at(&p) else {
                continue;
            };
            // X must hold (nearly) all of P's tensors: else P's delta
            // would be mostly FULL records.
            let covered =
                ph.0.tensors
                    .iter()
                    .filter(|t| {
                        want.get(t.name.as_str())
                            .is_some_and(|(d, s)| *d == t.dtype && *s == t.shape.as_slice())
                    })
                    .count();
            if covered * 10 < ph.0.tensors.len() * 9 {
                continue;
            }
            let Ok(pa) = self.open_store_archive(&p) else {
                continue;
            };
            let score = similarity(&*pa, &ph, xa, xh);
            let tried = self.family.kept.lock().get(&p).copied();
            if tried.is_some_and(|(s, was)| s == stamp(&pm) && score <= was + RETRY) {
                continue;
            }
            out.push((score, (pm.mtime(), pm.mtime_nsec()), p, stamp(&pm)));
        }
        out
    }

    /// Stores standalone `p` (as it was at `p_stamp`) as a delta against
    /// `x` (at `x_stamp`), the file committed at `target`, unless its
    /// chain would be too deep or the delta too large. Returns what was
    /// done.
    fn demote_one(
        &self,
        target: &Path,
        (x, x_stamp): (&Path, Stamp),
        (p, p_stamp): (&Path, Stamp),
        score: f64,
    ) -> Result<Option<String>> {
        let (x, p) = (x.to_path_buf(), p.to_path_buf());
        let pa = self.open_store_archive(&p)?;
        let xa = self.open_store_archive(&x)?;
        let rels = self.relations();
        let height = chain_height(&rels, &p);
        let limit = self.family.depth;
        if 1 + height > limit {
            return Ok(Some(format!(
                "{} kept standalone as a keyframe ({height} deltas depend on it in a chain; at most {limit})",
                p.display()
            )));
        }
        let p_name = p.file_name().ok_or(FsError::NotFound)?;
        let presented = namespace::presented_name(p_name).ok_or_else(|| err("not an archive"))?;
        let p_delta = parent(&p).join(namespace::delta_name_for(&presented));
        let p_stored = self.store.lstat(&p)?.len();
        let (pb, xb) = (self.decoded(&*pa)?, self.decoded(&*xa)?);
        drop((pa, xa));
        let rel_path = base_path_for(&p_delta, &x)?;
        let x_fp = self.open_store_archive(&x)?.fingerprint().unwrap_or(0);
        let mut stats = None;
        let tmp = TempPath(self.spool_tmp(|w| {
            stats = Some(
                pack_delta(
                    pb.bytes(),
                    &DeltaBase {
                        bytes: xb.bytes(),
                        rel_path,
                        depth: 0,
                        fingerprint: x_fp,
                    },
                    w,
                    Default::default(),
                    &|_| {},
                )
                .map_err(io::Error::other)?,
            );
            Ok(())
        })?);
        drop((pb, xb));
        let s = stats.expect("packed");
        if s.stored_bytes.saturating_mul(5) > p_stored.saturating_mul(4) {
            let mut kept = self.family.kept.lock();
            if kept.len() >= 4096 {
                kept.clear();
            }
            kept.insert(p.clone(), (p_stamp, score));
            drop(kept);
            return Ok(Some(format!(
                "{} kept standalone: a delta against {} would be {} bytes, it is {p_stored}",
                p.display(),
                x.display(),
                s.stored_bytes
            )));
        }
        let p_fp = trailer_fingerprint(&tmp.0)?;
        let like = self.store.lstat(&p)?;
        self.prepare(&tmp.0, &like)?;
        let mut todo = vec![Prepared {
            tmp,
            to: p_delta.clone(),
            was: None,
        }];
        todo.extend(self.plan_subtree(&rels, &p, &p_delta, p_fp, 1)?);
        // Installed as `ckptfs hold` allows, under `ns`.
        let _held = self.hold_commits(target);
        let _g = self.ns.lock();
        let now = |q: &Path| self.store.lstat(q).ok().map(|m| stamp(&m));
        // The deltas under P now: a delta committed against P meanwhile
        // (a named base) must be re-pointed too, so the plan is stale.
        let planned: HashSet<&Path> = todo[1..].iter().map(|t| t.to.as_path()).collect();
        let rels_now = self.relations();
        let under_now = subtree(&rels_now, &p);
        if now(&x) != Some(x_stamp)
            || now(&p) != Some(p_stamp)
            || todo.iter().any(|t| t.was.is_some() && now(&t.to) != t.was)
            || under_now
                .iter()
                .map(PathBuf::as_path)
                .collect::<HashSet<_>>()
                != planned
        {
            return Ok(Some(format!(
                "{} not rewritten: it, {} or a delta under it changed meanwhile",
                p.display(),
                x.display()
            )));
        }
        for t in &todo {
            self.store.rename_in(&t.tmp.0, &t.to)?;
            self.store.sync_dir(parent(&t.to))?;
        }
        crate::hooks::pause("family");
        self.store.unlink(&p)?;
        self.store.sync_dir(parent(&p))?;
        self.rebase_inode(&p, p_delta.file_name().unwrap_or_default());
        for t in &todo[1..] {
            self.rebase_inode(&t.to, t.to.file_name().unwrap_or_default());
        }
        Ok(Some(format!(
            "{} stored as a delta against {} ({} COPY, {} DELTA, {} FULL; {} -> {} bytes; similarity {score:.3}; {} deltas under it re-pointed)",
            p.display(),
            x.display(),
            s.copy,
            s.delta,
            s.full,
            p_stored,
            s.stored_bytes,
            todo.len() - 1
        )))
    }

    /// The presented content of STORE archive `rel`, which must present
    /// one file, decoded into the spool.
    pub(super) fn decoded_single(&self, rel: &Path) -> Result<Decoded> {
        let a = self.open_store_archive(rel)?;
        if a.files() != 1 || !a.file_path(0).is_empty() {
            return Err(err(format!("{}: not a single-file archive", rel.display())));
        }
        self.decoded(&*a)
    }

    /// The presented content of single-file archive `a`, decoded into the
    /// spool: not memory, a checkpoint may be many GB.
    fn decoded(&self, a: &dyn ArchiveView) -> Result<Decoded> {
        let tmp = TempPath(
            self.spool_tmp(|w| archive::write_to(a, 0, w, &|_| {}).map_err(io::Error::other))?,
        );
        let f = File::open(&tmp.0)?;
        // SAFETY: a private spool file of this daemon, removed (never
        // truncated) when `tmp` drops, after the map (field order).
        let map = match f.metadata()?.len() {
            0 => None,
            _ => Some(unsafe { memmap2::Mmap::map(&f) }?),
        };
        Ok(Decoded { map, _tmp: tmp })
    }

    /// The trailer rewrites that make every delta under `old` (which
    /// becomes `new`, fingerprint `fp`, real depth `depth`) point at it
    /// with its real depth, recursively (a rewritten trailer is a new
    /// fingerprint for the deltas under it). Prepared in the spool,
    /// fsynced, not installed.
    pub(super) fn plan_subtree(
        &self,
        rels: &[Relation],
        old: &Path,
        new: &Path,
        fp: u64,
        depth: u32,
    ) -> Result<Vec<Prepared>> {
        let mut out = Vec::new();
        let mut stack = vec![(old.to_path_buf(), new.to_path_buf(), fp, depth)];
        while let Some((old, new, fp, depth)) = stack.pop() {
            for r in rels.iter().filter(|r| r.base == old && r.delta != old) {
                if depth + 1 > MAX_CHAIN {
                    return Err(err(format!(
                        "{}: its chain would be deeper than {MAX_CHAIN}",
                        r.delta.display()
                    )));
                }
                let like = self.store.lstat(&r.delta)?;
                let (t, map) = self.read_trailer(&r.delta)?;
                let mut n = t.clone();
                n.base_path = base_path_for(&r.delta, &new)?;
                n.base_fingerprint = fp;
                n.depth = depth + 1;
                let rendered = n.render();
                let tmp = TempPath(self.spool_tmp(|w| {
                    w.write_all(&map[..t.z4dm_len as usize])?;
                    w.write_all(&rendered)
                })?);
                drop(map);
                self.prepare(&tmp.0, &like)?;
                stack.push((
                    r.delta.clone(),
                    r.delta.clone(),
                    xxh3_64(&rendered),
                    depth + 1,
                ));
                out.push(Prepared {
                    tmp,
                    to: r.delta.clone(),
                    was: Some(stamp(&like)),
                });
            }
        }
        Ok(out)
    }
}

/// Every delta under STORE file `p`, directly or through others.
pub(super) fn subtree(rels: &[Relation], p: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut stack = vec![p.to_path_buf()];
    while let Some(n) = stack.pop() {
        for r in rels.iter().filter(|r| r.base == n && r.delta != n) {
            if !out.contains(&r.delta) && out.len() < 1024 {
                out.push(r.delta.clone());
                stack.push(r.delta.clone());
            }
        }
    }
    out
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

/// The fingerprint a delta file's readers check: the xxh3 of its trailer.
fn trailer_fingerprint(path: &Path) -> Result<u64> {
    let f = File::open(path)?;
    // SAFETY: a private spool file of this daemon, not changed while mapped.
    let bytes = unsafe { memmap2::Mmap::map(&f) }?;
    let t = Trailer::find(&bytes)
        .map_err(err)?
        .ok_or_else(|| err("no CKD1 trailer"))?;
    Ok(xxh3_64(&bytes[t.z4dm_len as usize..]))
}

/// A decoded file in the spool, mapped.
pub(super) struct Decoded {
    map: Option<memmap2::Mmap>,
    _tmp: TempPath,
}

impl Decoded {
    pub(super) fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
