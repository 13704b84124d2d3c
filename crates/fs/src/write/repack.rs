//! `ckptfs repack STORE`: an existing store converted, offline, to the
//! layout `mount --delta auto` keeps ([`super::family`]), by the daemon's
//! own policy code. Older stores hold standalone files only, or *forward*
//! deltas (a newer checkpoint stored against an older one, as `--delta`
//! and `pack --base` wrote them).
//!
//! A family is what [`CheckpointFs::family_candidates`] links, closed
//! transitively, ordered by modification time (oldest first; the
//! presented path breaks ties, [`order_key`]): the order in which the
//! daemon would have seen the checkpoints committed. A repack replays
//! those commits:
//!
//! 1. a `.z4dm` left shadowed beside the `.zstn` of the same checkpoint (a
//!    family rewrite killed half way), then every forward delta (a member
//!    stored against an older member), newest first, becomes standalone
//!    ([`CheckpointFs::make_standalone`], as when a base goes away; newest
//!    first, so no forward delta is left depending on a rewritten one);
//! 2. then, member by member in order, the daemon's step after a commit
//!    ([`CheckpointFs::demote_predecessors`]) with its choice restricted to
//!    members not newer than the target ([`order_key`]): the
//!    most alike standalone older member becomes a reverse delta against
//!    it, unless the depth rule keeps it a keyframe or the 80% rule keeps
//!    it standalone.
//!
//! Every rewrite is the daemon's (spool temporary, fsync, rename, fsync
//! the directory, the old file removed last), so a `kill -9` at any point
//! leaves every file exact, and running again finishes the job: a step is
//! replayed only while it could still change something ([`Self::wants`]:
//! its target standalone with no reverse delta against it yet, and an
//! older standalone member below the depth limit), so on a repacked
//! store none is.
//!
//! The caller holds the store's writer lock: no daemon runs beside it.

use super::family::{chain_height, order_key, OrderKey};
use super::relations::Relation;
use crate::namespace;
use crate::spool::SPOOL_DIR;
use crate::{CheckpointFs, Result};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

fn parent(p: &Path) -> &Path {
    p.parent().unwrap_or(Path::new(""))
}

/// A family: the presented STORE paths of its checkpoints, oldest first.
#[derive(Debug, Clone)]
pub struct Family {
    pub members: Vec<PathBuf>,
}

/// One step of a repack.
#[derive(Debug, Clone)]
pub enum Step {
    /// STORE delta `delta` is rewritten standalone: `why`.
    Standalone { delta: PathBuf, why: String },
    /// The commit of `families[family].members[index]` is replayed.
    Settle { family: usize, index: usize },
}

/// What a repack will do.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Every family of two checkpoints or more.
    pub families: Vec<Family>,
    pub steps: Vec<Step>,
}

/// A family's layout now: its members' backings, and which are deltas.
#[derive(Debug, Clone)]
pub struct Layout {
    /// (presented path, backing, base backing if it is a delta), oldest
    /// first.
    pub members: Vec<(PathBuf, PathBuf, Option<PathBuf>)>,
}

impl Layout {
    pub fn deltas(&self) -> usize {
        self.members.iter().filter(|m| m.2.is_some()).count()
    }
}

impl CheckpointFs {
    /// Every presented `.safetensors` in STORE served from an archive,
    /// with its backing, sorted.
    fn presented_checkpoints(&self) -> Vec<(PathBuf, PathBuf)> {
        let mut out = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(d) = stack.pop() {
            let Ok(rd) = self.store.read_dir(&d) else {
                continue;
            };
            let mut shown = HashSet::new();
            for e in rd.flatten() {
                let name = e.file_name();
                if d.as_os_str().is_empty() && name == SPOOL_DIR {
                    continue;
                }
                let Ok(ft) = e.file_type() else { continue };
                if ft.is_dir() {
                    stack.push(d.join(&name));
                } else if ft.is_file() && !namespace::is_blz_name(&name) {
                    if let Some(p) =
                        namespace::presented_name(&name).filter(|p| namespace::is_staging_name(p))
                    {
                        shown.insert(d.join(p));
                    }
                }
            }
            for s in shown {
                // The plain file or archive presenting it; a plain
                // `.safetensors` is no archive to rewrite.
                if let Some(b) = self
                    .committed_backing(&s)
                    .filter(|b| b.file_name().is_some_and(namespace::is_archive_name))
                {
                    out.push((s, b));
                }
            }
        }
        out.sort();
        out
    }

    /// STORE backing `b`'s presented path.
    fn shown_of(b: &Path) -> Option<PathBuf> {
        Some(parent(b).join(namespace::presented_name(b.file_name()?)?))
    }

    /// Presented path `shown`'s backing now and its place in the order.
    fn member_now(&self, shown: &Path) -> Option<(PathBuf, OrderKey)> {
        let b = self.committed_backing(shown)?;
        let m = self.store.lstat(&b).ok()?;
        let k = order_key(&b, &m);
        Some((b, k))
    }

    /// The families of STORE and the steps that convert it (see the
    /// module doc).
    pub fn repack_plan(&self) -> Plan {
        let all = self.presented_checkpoints();
        let at: HashMap<&Path, usize> = all
            .iter()
            .enumerate()
            .map(|(i, (s, _))| (s.as_path(), i))
            .collect();
        let mut up: Vec<usize> = (0..all.len()).collect();
        fn root(up: &mut [usize], mut i: usize) -> usize {
            while up[i] != i {
                up[i] = up[up[i]];
                i = up[i];
            }
            i
        }
        for (i, (s, b)) in all.iter().enumerate() {
            let Some(h) = self.presented_header_at(b) else {
                continue;
            };
            for c in self.family_candidates(s, &h.0) {
                if let Some(&j) = Self::shown_of(&c).as_deref().and_then(|c| at.get(c)) {
                    let (a, z) = (root(&mut up, i), root(&mut up, j));
                    up[a] = z;
                }
            }
        }
        let mut groups: HashMap<usize, Vec<(OrderKey, PathBuf)>> = HashMap::new();
        for (i, (s, b)) in all.iter().enumerate() {
            let Ok(m) = self.store.lstat(b) else { continue };
            let r = root(&mut up, i);
            groups
                .entry(r)
                .or_default()
                .push((order_key(b, &m), s.clone()));
        }
        let mut families: Vec<Family> = groups
            .into_values()
            .filter(|g| g.len() >= 2)
            .map(|mut g| {
                g.sort();
                Family {
                    members: g.into_iter().map(|(_, s)| s).collect(),
                }
            })
            .collect();
        families.sort_by(|a, b| a.members[0].cmp(&b.members[0]));
        let backing: HashMap<&Path, &Path> = all
            .iter()
            .map(|(s, b)| (s.as_path(), b.as_path()))
            .collect();
        let mut rels = self.relations();
        let mut steps = Vec::new();
        for f in &families {
            let keys: HashMap<&Path, usize> = f
                .members
                .iter()
                .enumerate()
                .filter_map(|(i, s)| Some((*backing.get(s.as_path())?, i)))
                .collect();
            // Leftovers of a killed rewrite: a `.z4dm` shadowed by the
            // `.zstn` of the same checkpoint.
            for s in &f.members {
                let (Some(b), Some(name)) = (backing.get(s.as_path()), s.file_name()) else {
                    continue;
                };
                // (Only where `make_standalone` reuses the file shadowing
                // it, of the name it would write.)
                let d = parent(s).join(namespace::delta_name_for(name));
                if d != *b
                    && b.file_name() == Some(namespace::archive_name_for(name).as_os_str())
                    && self.store.lstat(&d).is_ok_and(|m| m.is_file())
                {
                    steps.push(Step::Standalone {
                        why: format!("left shadowed by {}", b.display()),
                        delta: d,
                    });
                }
            }
            // Forward deltas, newest first.
            for (i, s) in f.members.iter().enumerate().rev() {
                let Some(b) = backing.get(s.as_path()) else {
                    continue;
                };
                if let Some(r) = rels.iter().find(|r| r.delta == *b) {
                    if keys.get(r.base.as_path()).is_some_and(|&j| j < i) {
                        steps.push(Step::Standalone {
                            delta: b.to_path_buf(),
                            why: format!("a forward delta against older {}", r.base.display()),
                        });
                    }
                }
            }
        }
        // The relations once those are standalone: a leftover's
        // dependents re-pointed at the file shadowing it.
        let gone: HashMap<PathBuf, Option<PathBuf>> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Standalone { delta, .. } => Some((
                    delta.clone(),
                    Self::shown_of(delta)
                        .and_then(|s| backing.get(s.as_path()).map(|b| b.to_path_buf()))
                        .filter(|b| b != delta),
                )),
                Step::Settle { .. } => None,
            })
            .collect();
        rels.retain(|r| !gone.contains_key(&r.delta));
        for r in &mut rels {
            if let Some(Some(b)) = gone.get(&r.base) {
                r.base = b.clone();
            }
        }
        for (fi, f) in families.iter().enumerate() {
            for k in 1..f.members.len() {
                if self.wants(&rels, f, k) {
                    steps.push(Step::Settle {
                        family: fi,
                        index: k,
                    });
                }
            }
        }
        Plan { families, steps }
    }

    /// Whether replaying the commit of `f.members[k]` could change
    /// anything, by relations `rels`: it is standalone, no member is a
    /// delta against it yet (then its step was done), and a standalone
    /// member not newer than it could become a delta below the depth
    /// limit.
    fn wants(&self, rels: &[Relation], f: &Family, k: usize) -> bool {
        let Some((x, x_key)) = self.member_now(&f.members[k]) else {
            return false;
        };
        let deltas: HashSet<&Path> = rels.iter().map(|r| r.delta.as_path()).collect();
        if deltas.contains(x.as_path()) {
            return false;
        }
        let members: HashSet<PathBuf> = f
            .members
            .iter()
            .filter_map(|s| self.committed_backing(s))
            .collect();
        if rels
            .iter()
            .any(|r| r.base == x && members.contains(&r.delta))
        {
            return false;
        }
        let Some(h) = self.presented_header_at(&x) else {
            return false;
        };
        let limit = self.family_depth();
        self.family_candidates(&f.members[k], &h.0)
            .into_iter()
            .any(|p| {
                p != x
                    && !deltas.contains(p.as_path())
                    && self
                        .store
                        .lstat(&p)
                        .is_ok_and(|m| order_key(&p, &m) < x_key)
                    && chain_height(rels, &p) < limit
            })
    }

    /// Runs `plan`'s steps in order. `said` gets, for each step, the
    /// file it works on (`Ok(None)` before it starts) and then one line
    /// saying what was done (`Ok(Some)`): skipped steps say nothing.
    pub fn repack_run(
        &self,
        plan: &Plan,
        said: &mut dyn FnMut(usize, &Path, Option<String>),
    ) -> Result<()> {
        for (i, step) in plan.steps.iter().enumerate() {
            match step {
                Step::Standalone { delta, why } => {
                    if !self.store.lstat(delta).is_ok_and(|m| m.is_file()) {
                        continue;
                    }
                    said(i, delta, None);
                    {
                        let _held = self.hold_commits(delta);
                        let _g = self.ns.lock();
                        let rels = self.relations();
                        self.make_standalone(&rels, delta)?;
                    }
                    said(
                        i,
                        delta,
                        Some(format!("{} made standalone ({why})", delta.display())),
                    );
                }
                Step::Settle { family, index } => {
                    let f = &plan.families[*family];
                    let target = &f.members[*index];
                    if !self.wants(&self.relations(), f, *index) {
                        continue;
                    }
                    said(i, target, None);
                    let done = self.demote_predecessors(target)?;
                    let line = if done.is_empty() {
                        format!("{}: no predecessor", target.display())
                    } else {
                        done.join("; ")
                    };
                    said(i, target, Some(line));
                }
            }
        }
        Ok(())
    }

    /// `f`'s layout now.
    pub fn family_layout(&self, f: &Family) -> Layout {
        let rels = self.relations();
        Layout {
            members: f
                .members
                .iter()
                .map(|s| {
                    let b = self.committed_backing(s).unwrap_or_default();
                    let base = rels.iter().find(|r| r.delta == b).map(|r| r.base.clone());
                    (s.clone(), b, base)
                })
                .collect(),
        }
    }
}
