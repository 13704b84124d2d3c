//! A family's members (see `super`): the committed files
//! [`CheckpointFs::family_candidates`] finds for a target, those of them
//! the target may become the base of ([`CheckpointFs::predecessors`]),
//! and how alike two checkpoints are by a sample of their shared tensors
//! ([`similarity`]).

use super::{order_key, parent, OrderKey, MAX_SHARDS, RETRY, SAMPLES, SAMPLE_BYTES};
use crate::namespace;
use crate::write::delta_commit::Writer;
use crate::write::relations::{stamp, Stamp};
use crate::CheckpointFs;
use ckptfs_archive::ArchiveView;
use ckptfs_format::safetensors::Header;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
pub(super) fn is_delta_file(f: &mut File) -> bool {
    use std::io::Read;
    let mut m = [0u8; 4];
    f.read_exact(&mut m).is_ok() && &m == b"Z4DM"
}

impl CheckpointFs {
    /// Committed `.safetensors` backings of `target`'s family but its own:
    /// in each sibling directory, the file of the same name, or, in one
    /// without it, every `.safetensors` there (the shards of a checkpoint
    /// saved sharded, or one saved unsharded before shards); and the same
    /// tensors in the same directory. Which of them `target` covers is
    /// the caller's to check.
    pub(in crate::write) fn family_candidates(
        &self,
        target: &Path,
        header: &Header,
    ) -> Vec<PathBuf> {
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

    /// The standalone members of `target`'s family (backing `x`, header
    /// `xh`) whose tensors `x` holds nearly all of, that their owner may
    /// store against `x`, and that were not found not worth it before:
    /// (similarity, mtime, path, stamp).
    pub(super) fn predecessors(
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
}
