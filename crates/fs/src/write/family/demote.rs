//! A family's predecessors rewritten as deltas against the file just
//! committed (see `super`): most alike first, each unless its chain would
//! be too deep or its delta not small enough; packed with no lock held,
//! installed under `ns` only if nothing involved changed meanwhile.

use super::candidates::is_delta_file;
use super::{chain_height, order_key, parent, TIE, WORTH_TRYING};
use crate::namespace;
use crate::write::relations::{base_path_for, err, stamp, subtree, Prepared, Stamp, TempPath};
use crate::{CheckpointFs, FsError, Result};
use ckptfs_format::delta::Trailer;
use ckptfs_format::digest::xxh3_64;
use ckptfs_pack::delta::{pack_delta, DeltaBase};
use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

impl CheckpointFs {
    /// See the module doc: stores the standalone members of `target`'s
    /// family that it covers and that are not newer than it in
    /// [`order_key`]'s order, most alike first, as deltas against it.
    /// (The target is normally the newest; not when a family left queued
    /// by an earlier daemon is settled, or when `ckptfs repack` replays a
    /// family's commits in that order.) Returns what was done.
    pub(in crate::write) fn demote_predecessors(&self, target: &Path) -> Result<Vec<String>> {
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
