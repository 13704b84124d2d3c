//! Checkpoint families under `mount --delta auto` (doc/SEMANTICS.md,
//! "Checkpoint families"): the newest checkpoint of a family standalone,
//! older ones as *reverse* deltas against their successor.
//!
//! A family is what [`CheckpointFs::family_candidates`] finds for a
//! committed `X.safetensors`: files of the same name in sibling
//! directories (`checkpoint-12/model.safetensors` for
//! `checkpoint-13/model.safetensors`) and files in the same directory with
//! the same tensors. A commit stores the new file standalone (as without
//! `--delta`, so it reaches STORE as fast) and queues it here. The family
//! thread ([`CheckpointFs::family_loop`]) then picks, among the family's
//! standalone members whose tensors the new file covers, the one most
//! like it by content (a sample of the bytes of up to [`SAMPLES`] shared
//! tensors, not by modification time), and rewrites that predecessor `P`
//! as a delta against the new file, unless the chain under `P` would then
//! be deeper than [`FAMILY_DEPTH`]: then `P` stays standalone, a keyframe.
//!
//! So the newest reads with one decode, every older one within
//! `FAMILY_DEPTH` levels, and the oldest (what retention deletes) is a
//! leaf: removing it rewrites nothing.
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
use super::relations::{base_path_for, test_pause, Relation, TempPath};
use crate::archive::{self, ArchiveView};
use crate::format::delta::{Trailer, MAX_CHAIN};
use crate::format::digest::xxh3_64;
use crate::format::safetensors::Header;
use crate::fs::archive_slot::version_of;
use crate::fs::namespace;
use crate::fs::{CheckpointFs, FsError, Result};
use crate::pack::delta::{pack_delta, DeltaBase};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::collections::{HashMap, HashSet};
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The deepest a family's chain is made: a standalone keyframe and at
/// most this many deltas behind it (so a read decodes at most this + 1
/// frames per block). Chosen by `scripts/bench-family.sh`; overridden by
/// `CKPTFS_FAMILY_DEPTH` (1..=4) for measurements.
pub(in crate::fs) const FAMILY_DEPTH: u32 = 3;

/// Shared tensors sampled to compare two checkpoints.
const SAMPLES: usize = 16;
/// Bytes sampled from the middle of each (a block of 1 MiB is decoded
/// for it anyway).
const SAMPLE_BYTES: u64 = 64 << 10;
/// Candidates whose similarities differ by less than this are equally
/// alike: the most recently modified wins.
const TIE: f64 = 0.002;

pub(super) fn family_depth() -> u32 {
    std::env::var("CKPTFS_FAMILY_DEPTH")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|d| (1..=MAX_CHAIN).contains(d))
        .unwrap_or(FAMILY_DEPTH)
}

/// Committed files waiting for their family to be settled.
pub(in crate::fs) struct FamilyQueue {
    send: Sender<PathBuf>,
    recv: Receiver<PathBuf>,
    stop: AtomicBool,
}

impl FamilyQueue {
    pub(in crate::fs) fn new() -> Self {
        let (send, recv) = crossbeam_channel::unbounded();
        FamilyQueue {
            send,
            recv,
            stop: AtomicBool::new(false),
        }
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

/// Which family members may be a target's predecessor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Predecessors {
    /// Any (the daemon: the target is the newest).
    Any,
    /// Only those not after the target in [`order_key`]'s order (`ckptfs
    /// repack`, which replays a family's commits in that order).
    NotNewer,
}

/// A predecessor considered: (similarity, mtime, path, stamp, archive).
type Candidate = (f64, (i64, i64), PathBuf, Stamp, Arc<dyn ArchiveView>);

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
        let _ = self.family.send.send(target.to_path_buf());
    }

    /// The family thread: settles queued families until
    /// [`Self::stop_family`].
    pub fn family_loop(&self) {
        while !self.family.stop.load(Ordering::Relaxed) {
            match self.family.recv.recv_timeout(Duration::from_millis(200)) {
                Ok(t) => self.settle_family(&t),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Makes the family thread return after its current rewrite. What is
    /// queued is dropped: every file is already exact in STORE, only not
    /// yet as small as it could be.
    pub fn stop_family(&self) {
        self.family.stop.store(true, Ordering::Relaxed);
    }

    /// Settles every queued family now, on this thread (tests).
    pub fn run_family(&self) {
        while let Ok(t) = self.family.recv.try_recv() {
            self.settle_family(&t);
        }
    }

    fn settle_family(&self, target: &Path) {
        let t0 = std::time::Instant::now();
        match self.demote_predecessor(target, Predecessors::Any) {
            Ok(Some(what)) => log::info!(
                "{}: family: {what} in {:.2} s",
                target.display(),
                t0.elapsed().as_secs_f64()
            ),
            Ok(None) => {}
            Err(e) => log::warn!(
                "{}: family: predecessor not rewritten (every file stays exact): {e}",
                target.display()
            ),
        }
        // Tests wait for this line.
        log::info!("{}: family settled", target.display());
    }

    /// Committed `.safetensors` backings of `target`'s family but its own:
    /// the same name in sibling directories, and the same tensors in the
    /// same directory.
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
                        || (up.as_os_str().is_empty() && s == crate::fs::spool::SPOOL_DIR)
                        || !e.file_type().is_ok_and(|t| t.is_dir())
                    {
                        continue;
                    }
                    if let Some(b) = self.committed_backing(&up.join(&s).join(name)) {
                        out.push(b);
                    }
                }
            }
        }
        if let Some(b) = self.same_tensors_in_dir(target, header) {
            out.push(b);
        }
        out
    }

    /// See the module doc. Returns what was done, if anything.
    pub(super) fn demote_predecessor(
        &self,
        target: &Path,
        which: Predecessors,
    ) -> Result<Option<String>> {
        let Some(x) = self.committed_backing(target) else {
            return Ok(None);
        };
        let mut xf = self.store.open_file(&x, libc::O_RDONLY, 0)?;
        if is_delta_file(&mut xf) {
            return Ok(None);
        }
        let xm = xf.metadata()?;
        let (x_stamp, x_key) = (stamp(&xm), order_key(&x, &xm));
        drop(xf);
        let Some(xh) = self.presented_header_at(&x) else {
            return Ok(None);
        };
        let xa = self.open_store_archive(&x)?;
        let want: HashMap<&str, (&str, &[u64])> =
            xh.0.tensors
                .iter()
                .map(|t| (t.name.as_str(), (t.dtype.as_str(), t.shape.as_slice())))
                .collect();
        let mut best: Option<Candidate> = None;
        for p in self.family_candidates(target, &xh.0) {
            if p == x {
                continue;
            }
            let Ok(mut pf) = self.store.open_file(&p, libc::O_RDONLY, 0) else {
                continue;
            };
            let Ok(pm) = pf.metadata() else { continue };
            if is_delta_file(&mut pf)
                || (which == Predecessors::NotNewer && order_key(&p, &pm) > x_key)
            {
                continue;
            }
            // P comes to depend on X: X must be a base P's owner may have.
            let refused = match Writer::of_staged(&pm) {
                Ok(w) => self.base_refused(&w, &x),
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
            let score = similarity(&*pa, &ph, &*xa, &xh);
            let t = (pm.mtime(), pm.mtime_nsec());
            let better = best
                .as_ref()
                .is_none_or(|b| score > b.0 + TIE || ((score - b.0).abs() <= TIE && t > b.1));
            if better {
                best = Some((score, t, p, stamp(&pm), pa));
            }
        }
        let Some((score, _, p, p_stamp, pa)) = best else {
            return Ok(None);
        };
        let rels = self.relations();
        let height = chain_height(&rels, &p);
        let limit = family_depth();
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
        test_pause("family");
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

    /// The presented content of single-file archive `a`, decoded into the
    /// spool.
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
fn subtree(rels: &[Relation], p: &Path) -> Vec<PathBuf> {
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
struct Decoded {
    map: Option<memmap2::Mmap>,
    _tmp: TempPath,
}

impl Decoded {
    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
