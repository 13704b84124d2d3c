//! The byte limit of an S3 mount's disk cache (`--disk-cache-size`): which
//! cached byte ranges to give back, least recently used first.
//!
//! The cache is the set of sparse mirror files (`remote`). Every range of a
//! file that holds the object's bytes is accounted here as *entries* of at
//! most [`CHUNK`] bytes, each with the tick of its last use and a kind:
//!
//! - [`Kind::Block`]: a block's payload, fetched or read for one decode. It
//!   can be given back whenever no decode is using it (the file pins the
//!   ranges of a decode in progress; see `remote::RemoteFile::pin_all`).
//! - [`Kind::Meta`]: anything else (an archive's header, index, checksum
//!   block and frame structures, which an open archive reads from its map
//!   at any time; a plain file, served from the mirror file while open). It
//!   can be given back only while nothing uses the file.
//!
//! A range used as `Meta` stays `Meta` until it is given back. Entries are
//! charged whole pages (the file system's block size), plus an estimate of
//! each file's state file and of the cache directory's own small files, so
//! that what `du` counts of the cache stays at or under the limit once the
//! files in use allow it: bytes in use are never given back, and the limit
//! can be exceeded while they alone are larger.
//!
//! The estimate of a mirror file is checked against what the file system
//! says it occupies (`st_blocks`, [`Evict::allocated`]) after every change
//! the budget hears of, and what the file occupies beyond the estimate is
//! charged too (the file's *slack*). It is not a rounding error: ext4 keeps
//! an extent tree block (a page) allocated for a file that once had more
//! than four extents after holes punched in it bring it back under four, so
//! the extent count of the moment does not tell what the map occupies. The
//! measurement is taken under this module's lock, after the change, so the
//! last one of a file describes its final state.
//!
//! [`Budget::enforce`] gives back the oldest entries until the total is at
//! or under the limit, asking each file through [`Evict`] (which refuses a
//! range in use). Nothing here does I/O but the `fstat` of a measurement;
//! the files do. Lock order: this module's lock is never held while a file
//! is called (but for [`Evict::allocated`], which takes no lock), and a
//! file never calls in here while holding its own lock.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Weak};

/// The largest entry: ranges are accounted (and given back) in pieces of
/// at most this size, aligned to it.
pub const CHUNK: u64 = 1 << 20;

/// Charged once for the cache directory's own files (lock, owner, limit).
const BASE_PAGES: u64 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Block,
    Meta,
}

/// A cached file, asked to give ranges back.
pub trait Evict: Send + Sync {
    /// Gives back (drops from the cache and frees on disk) each of
    /// `ranges` that is not in use; returns those given back.
    fn evict(&self, ranges: &[(Range<u64>, Kind)]) -> Vec<Range<u64>>;

    /// Bytes the file occupies on disk now (its `st_blocks`), None if
    /// unknown. Called with the budget's lock held: it must take no lock.
    fn allocated(&self) -> Option<u64>;
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    end: u64,
    tick: u64,
    kind: Kind,
}

struct File {
    evict: Weak<dyn Evict>,
    /// By start; disjoint.
    entries: BTreeMap<u64, Entry>,
    /// What the file system allocated for the file beyond its estimate
    /// (entries and extent map), at its last measurement; charged.
    slack: u64,
}

#[derive(Default)]
struct Inner {
    files: HashMap<u64, File>,
    /// (tick, file, start) of every entry: the eviction order.
    order: BTreeMap<(u64, u64, u64), ()>,
    used: u64,
    tick: u64,
    next_id: u64,
}

pub struct Budget {
    limit: u64,
    page: u64,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Budget({} of {} bytes)", self.used(), self.limit)
    }
}

/// `r` cut at multiples of [`CHUNK`].
fn chunks(r: Range<u64>) -> impl Iterator<Item = Range<u64>> {
    let mut a = r.start;
    std::iter::from_fn(move || {
        (a < r.end).then(|| {
            let b = ((a / CHUNK + 1) * CHUNK).min(r.end);
            let piece = a..b;
            a = b;
            piece
        })
    })
}

impl Budget {
    /// A budget of `limit` bytes on a file system of `page`-byte blocks.
    pub fn new(limit: u64, page: u64) -> Arc<Budget> {
        let page = page.max(512);
        Arc::new(Budget {
            limit,
            page,
            inner: Mutex::new(Inner {
                used: BASE_PAGES * page,
                ..Inner::default()
            }),
        })
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The block size of the cache's file system (what is charged per
    /// page).
    pub fn page(&self) -> u64 {
        self.page
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.inner.lock().used
    }

    /// The tick of the last use so far (persisted by the files, so that
    /// the order survives a restart).
    pub fn now(&self) -> u64 {
        self.inner.lock().tick
    }

    fn cost(&self, start: u64, e: &Entry) -> u64 {
        (e.end.div_ceil(self.page) - start / self.page) * self.page
    }

    /// What a file of `n` entries costs beyond its bytes: its state file
    /// (about 48 bytes an entry), and the file system's map of a file
    /// with holes ([`Self::map_cost`]), in whole pages.
    fn overhead(&self, n: usize) -> u64 {
        let state = (256 + 48 * n as u64).div_ceil(self.page);
        state * self.page + self.map_cost(n)
    }

    /// The estimated extent map of a mirror file of `n` entries (ext4: a
    /// block for every 340 extents beyond the 4 an inode holds).
    fn map_cost(&self, n: usize) -> u64 {
        let n = n as u64;
        if n > 4 {
            n.div_ceil(256) * self.page
        } else {
            0
        }
    }

    /// Re-estimates file `id`'s slack from `allocated` (its `st_blocks`
    /// now; None leaves it as it was), charging the difference.
    fn settle(&self, g: &mut Inner, id: u64, allocated: Option<u64>) {
        let Some(alloc) = allocated else {
            return;
        };
        let Some(f) = g.files.get_mut(&id) else {
            return;
        };
        let estimate: u64 = f.entries.iter().map(|(s, e)| self.cost(*s, e)).sum::<u64>()
            + self.map_cost(f.entries.len());
        let slack = alloc.saturating_sub(estimate);
        let old = std::mem::replace(&mut f.slack, slack);
        if slack != old {
            log::debug!(
                "disk cache: file {id} occupies {alloc} bytes, {slack} beyond the estimate"
            );
        }
        g.used = g.used + slack - old;
    }

    /// Measures file `id` (`allocated` is its [`Evict::allocated`]) after
    /// a change of its bytes on disk, and charges what it occupies beyond
    /// the estimate.
    pub fn measure(&self, id: u64, allocated: impl FnOnce() -> Option<u64>) {
        let mut g = self.inner.lock();
        if g.files.contains_key(&id) {
            self.settle(&mut g, id, allocated());
        }
    }

    /// Starts accounting a file; `last_use` is the tick of its last use in
    /// an earlier run (0 if unknown). Returns its id.
    pub fn attach(&self, evict: Weak<dyn Evict>, last_use: u64) -> u64 {
        let mut g = self.inner.lock();
        g.next_id += 1;
        g.tick = g.tick.max(last_use);
        let id = g.next_id;
        let over = self.overhead(0);
        g.used += over;
        g.files.insert(
            id,
            File {
                evict,
                entries: BTreeMap::new(),
                slack: 0,
            },
        );
        id
    }

    /// Stops accounting file `id` (its version is gone or it left the
    /// cache); later calls about it are ignored.
    pub fn detach(&self, id: u64) {
        let mut g = self.inner.lock();
        let Some(f) = g.files.remove(&id) else {
            return;
        };
        let mut freed = self.overhead(f.entries.len()) + f.slack;
        for (s, e) in &f.entries {
            g.order.remove(&(e.tick, id, *s));
            freed += self.cost(*s, e);
        }
        g.used -= freed;
    }

    /// Bytes `ranges` of file `id` now hold the object's bytes (fetched,
    /// or found at a restart with tick `tick`; None: now), used as `kind`.
    pub fn added(&self, id: u64, ranges: &[Range<u64>], kind: Kind, tick: Option<u64>) {
        let mut g = self.inner.lock();
        let tick = tick.unwrap_or_else(|| {
            g.tick += 1;
            g.tick
        });
        for r in ranges {
            remove_in(&mut g, self, id, r.clone());
            for c in chunks(r.clone()) {
                let e = Entry {
                    end: c.end,
                    tick,
                    kind,
                };
                let Some(f) = g.files.get_mut(&id) else {
                    return;
                };
                let before = f.entries.len();
                f.entries.insert(c.start, e);
                let n = f.entries.len();
                let delta = self.cost(c.start, &e) + self.overhead(n) - self.overhead(before);
                g.used += delta;
                g.order.insert((tick, id, c.start), ());
            }
        }
    }

    /// Bytes `range` of file `id` no longer hold the object's bytes.
    pub fn removed(&self, id: u64, range: Range<u64>) {
        let mut g = self.inner.lock();
        remove_in(&mut g, self, id, range);
    }

    /// Bytes `ranges` of file `id` were just used as `kind`: their entries
    /// become the most recent (and `Meta` when used so).
    pub fn touch(&self, id: u64, ranges: &[Range<u64>], kind: Kind) {
        let mut g = self.inner.lock();
        g.tick += 1;
        let tick = g.tick;
        let Inner { files, order, .. } = &mut *g;
        let Some(f) = files.get_mut(&id) else {
            return;
        };
        for r in ranges {
            let first = f
                .entries
                .range(..=r.start)
                .next_back()
                .map_or(r.start, |(s, _)| *s);
            for (s, e) in f.entries.range_mut(first..r.end) {
                if e.end <= r.start {
                    continue;
                }
                order.remove(&(e.tick, id, *s));
                e.tick = tick;
                e.kind = e.kind.max(kind);
                order.insert((tick, id, *s), ());
            }
        }
    }

    /// Gives back the least recently used entries until the total is at
    /// or under the limit, or every entry left is in use. Returns the
    /// bytes charged after.
    pub fn enforce(&self) -> u64 {
        self.enforce_to(self.limit)
    }

    /// After a use of cached bytes ended: [`Self::enforce`] if the total
    /// is over the limit (what was in use may go now).
    pub fn relax(&self) {
        if self.used() > self.limit {
            self.enforce();
        }
    }

    /// Before `bytes` are fetched: gives back what keeps them from fitting
    /// under the limit, with a page for a block of the file's extent map
    /// they may need (so the limit holds while they are written, too).
    pub fn make_room(&self, bytes: u64) {
        self.enforce_to(self.limit.saturating_sub(bytes + self.page));
    }

    fn enforce_to(&self, target: u64) -> u64 {
        // Entries found in use during this call, skipped.
        let mut busy: std::collections::HashSet<(u64, u64)> = Default::default();
        loop {
            // The oldest entries not known to be busy, by file, up to the
            // excess (one call per file).
            let (file, victims) = {
                let g = self.inner.lock();
                if g.used <= target {
                    return g.used;
                }
                let mut excess = g.used - target;
                let mut pick: Option<(u64, Weak<dyn Evict>)> = None;
                let mut victims = Vec::new();
                for &(_, id, start) in g.order.keys() {
                    if busy.contains(&(id, start)) {
                        continue;
                    }
                    let Some(f) = g.files.get(&id) else {
                        continue;
                    };
                    match &pick {
                        None => pick = Some((id, f.evict.clone())),
                        Some((p, _)) if *p != id => continue,
                        _ => {}
                    }
                    let Some(&e) = f.entries.get(&start) else {
                        continue;
                    };
                    victims.push((start..e.end, e.kind));
                    let c = self.cost(start, &e);
                    if c >= excess {
                        break;
                    }
                    excess -= c;
                }
                match pick {
                    Some(p) => (p, victims),
                    None => {
                        log::debug!(
                            "disk cache: {} bytes, {} over the limit in use",
                            g.used,
                            g.used - target
                        );
                        return g.used;
                    }
                }
            };
            let (id, evict) = file;
            let live = evict.upgrade();
            let given = match &live {
                Some(f) => f.evict(&victims),
                // The file is gone: nothing of it is in use.
                None => victims.iter().map(|v| v.0.clone()).collect(),
            };
            let mut g = self.inner.lock();
            for r in &given {
                remove_in(&mut g, self, id, r.clone());
            }
            if !given.is_empty() {
                if let Some(f) = &live {
                    self.settle(&mut g, id, f.allocated());
                }
            }
            for (r, _) in &victims {
                if !given.contains(r) {
                    busy.insert((id, r.start));
                }
            }
        }
    }
}

/// Drops `range` from file `id`'s entries (cutting those that straddle
/// it), updating the order and the charge.
fn remove_in(g: &mut Inner, b: &Budget, id: u64, range: Range<u64>) {
    let Inner {
        files, order, used, ..
    } = g;
    let Some(f) = files.get_mut(&id) else {
        return;
    };
    if range.start >= range.end {
        return;
    }
    let first = f
        .entries
        .range(..=range.start)
        .next_back()
        .map_or(range.start, |(s, _)| *s);
    let hit: Vec<(u64, Entry)> = f
        .entries
        .range(first..range.end)
        .filter(|(_, e)| e.end > range.start)
        .map(|(s, e)| (*s, *e))
        .collect();
    for (s, e) in hit {
        let before = f.entries.len();
        f.entries.remove(&s);
        order.remove(&(e.tick, id, s));
        *used -= b.cost(s, &e);
        let mut keep = Vec::new();
        if s < range.start {
            keep.push((s, range.start));
        }
        if e.end > range.end {
            keep.push((range.end, e.end));
        }
        for (a, z) in keep {
            let piece = Entry { end: z, ..e };
            f.entries.insert(a, piece);
            order.insert((e.tick, id, a), ());
            *used += b.cost(a, &piece);
        }
        *used = *used + b.overhead(f.entries.len()) - b.overhead(before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that gives back everything but `busy`, and records what.
    struct Fake {
        busy: Vec<Range<u64>>,
        meta_ok: bool,
        given: Mutex<Vec<Range<u64>>>,
        /// What the file occupies on disk (None: unknown).
        alloc: Mutex<Option<u64>>,
    }

    impl Evict for Fake {
        fn evict(&self, ranges: &[(Range<u64>, Kind)]) -> Vec<Range<u64>> {
            let out: Vec<Range<u64>> = ranges
                .iter()
                .filter(|(r, k)| {
                    (*k == Kind::Block || self.meta_ok)
                        && !self.busy.iter().any(|b| b.start < r.end && r.start < b.end)
                })
                .map(|(r, _)| r.clone())
                .collect();
            self.given.lock().extend(out.iter().cloned());
            out
        }

        fn allocated(&self) -> Option<u64> {
            *self.alloc.lock()
        }
    }

    fn fake(busy: Vec<Range<u64>>, meta_ok: bool) -> Arc<Fake> {
        Arc::new(Fake {
            busy,
            meta_ok,
            given: Mutex::new(Vec::new()),
            alloc: Mutex::new(None),
        })
    }

    const M: u64 = 1 << 20;

    #[test]
    fn least_recently_used_goes_first_and_busy_ranges_stay() {
        let b = Budget::new(5 * M, 4096);
        let f = fake(vec![M..2 * M], false);
        let id = b.attach(Arc::downgrade(&(f.clone() as Arc<dyn Evict>)), 0);
        b.added(id, &[0..4 * M], Kind::Block, None);
        b.added(id, &[10 * M..11 * M], Kind::Meta, None);
        b.touch(id, &[0..M], Kind::Block);
        assert!(b.used() > 5 * M);
        b.added(id, &[20 * M..22 * M], Kind::Block, None);
        let used = b.enforce();
        assert!(used <= 5 * M, "{used}");
        // Oldest first: 2M..4M (1M..2M is busy, 0..1M was touched, the
        // meta range cannot go while the file is in use).
        let given = f.given.lock().clone();
        assert_eq!(given[..2], [2 * M..3 * M, 3 * M..4 * M], "{given:?}");
        assert!(!given.iter().any(|r| r.start == M || r.start == 10 * M));
    }

    #[test]
    fn the_limit_is_kept_when_everything_can_go() {
        let b = Budget::new(3 * M, 4096);
        let f = fake(vec![], true);
        let id = b.attach(Arc::downgrade(&(f.clone() as Arc<dyn Evict>)), 0);
        for i in 0..20 {
            b.added(id, &[i * M + 100..(i + 1) * M - 100], Kind::Meta, None);
            assert!(b.enforce() <= 3 * M);
        }
        // Removing part of an entry charges only what is left.
        let before = b.used();
        b.removed(id, 19 * M + 100..19 * M + 4196);
        assert_eq!(b.used(), before - 4096);
        b.detach(id);
        assert_eq!(b.used(), BASE_PAGES * 4096);
    }

    #[test]
    fn what_the_file_system_allocates_beyond_the_estimate_is_charged() {
        const P: u64 = 4096;
        let b = Budget::new(4 * M, P);
        let f = fake(vec![], false);
        let id = b.attach(Arc::downgrade(&(f.clone() as Arc<dyn Evict>)), 0);
        // Four entries (no extent map estimated) that fill the limit.
        let base = b.used();
        b.added(id, &[0..M, 2 * M..3 * M], Kind::Block, None);
        b.added(id, &[4 * M..6 * M - base], Kind::Block, None);
        assert_eq!(b.enforce(), 4 * M);
        assert!(f.given.lock().is_empty());
        // The file system says a page more (an extent tree block kept from
        // when the file had more extents): it is charged, and the oldest
        // entry is given back to get under the limit again.
        *f.alloc.lock() = Some(4 * M - base + P);
        b.measure(id, || f.allocated());
        assert_eq!(b.used(), 4 * M + P);
        *f.alloc.lock() = Some(3 * M - base + P);
        assert_eq!(b.enforce(), 3 * M + P);
        assert_eq!(f.given.lock()[..], [0..M]);
        // A measurement at or under the estimate charges nothing more.
        b.measure(id, || Some(0));
        assert_eq!(b.used(), 3 * M);
        b.detach(id);
        assert_eq!(b.used(), BASE_PAGES * P);
    }

    #[test]
    fn a_file_gone_is_given_back_without_being_asked() {
        let b = Budget::new(0, 4096);
        let id = {
            let f = fake(vec![], false);
            let id = b.attach(Arc::downgrade(&(f as Arc<dyn Evict>)), 7);
            b.added(id, &[0..3 * M], Kind::Meta, Some(7));
            id
        };
        assert_eq!(b.now(), 7);
        b.enforce();
        assert_eq!(b.used(), BASE_PAGES * 4096 + b.overhead(0));
        b.detach(id);
    }
}
