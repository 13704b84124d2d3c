//! A set of byte ranges (sorted, disjoint, non-adjacent): which parts of a
//! sparse mirror file hold the object's bytes. Pure; persisted by
//! `remote` as a JSON list of `[start, end)` pairs.

use std::ops::Range;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<Range<u64>>,
}

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Builds a set from any list of pairs (untrusted: empty or inverted
    /// pairs are dropped, overlaps merged).
    pub fn from_pairs(pairs: &[(u64, u64)]) -> RangeSet {
        let mut s = RangeSet::new();
        for &(a, b) in pairs {
            s.insert(a..b);
        }
        s
    }

    pub fn pairs(&self) -> Vec<(u64, u64)> {
        self.ranges.iter().map(|r| (r.start, r.end)).collect()
    }

    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// Total bytes covered.
    pub fn covered(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    pub fn insert(&mut self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        // First range that ends at or after r.start (touching merges).
        let i = self.ranges.partition_point(|x| x.end < r.start);
        let mut j = i;
        let mut merged = r;
        while j < self.ranges.len() && self.ranges[j].start <= merged.end {
            merged.start = merged.start.min(self.ranges[j].start);
            merged.end = merged.end.max(self.ranges[j].end);
            j += 1;
        }
        self.ranges.splice(i..j, std::iter::once(merged));
    }

    pub fn remove(&mut self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        for x in self.ranges.drain(..) {
            if x.end <= r.start || x.start >= r.end {
                out.push(x);
                continue;
            }
            if x.start < r.start {
                out.push(x.start..r.start);
            }
            if x.end > r.end {
                out.push(r.end..x.end);
            }
        }
        self.ranges = out;
    }

    /// The parts of `r` not in the set, in order.
    pub fn missing(&self, r: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut pos = r.start;
        let i = self.ranges.partition_point(|x| x.end <= r.start);
        for x in &self.ranges[i..] {
            if x.start >= r.end {
                break;
            }
            if x.start > pos {
                out.push(pos..x.start);
            }
            pos = pos.max(x.end);
        }
        if pos < r.end {
            out.push(pos..r.end);
        }
        out
    }

    pub fn contains(&self, r: Range<u64>) -> bool {
        r.start >= r.end || self.missing(r).is_empty()
    }
}

/// What to request for the byte ranges `want` of an object of `size`
/// bytes: each widened to multiples of `align` (clamped to the object),
/// sorted, and merged with its neighbour when the gap between them is at
/// most `gap` (one request instead of two, the gap fetched too).
pub fn coalesce(want: &[Range<u64>], align: u64, gap: u64, size: u64) -> Vec<Range<u64>> {
    let align = align.max(1);
    let mut v: Vec<Range<u64>> = want
        .iter()
        .map(|r| r.start.min(size)..r.end.min(size))
        .filter(|r| r.start < r.end)
        .map(|r| r.start / align * align..r.end.div_ceil(align).saturating_mul(align).min(size))
        .collect();
    v.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(v.len());
    for r in v {
        match out.last_mut() {
            Some(last) if r.start <= last.end.saturating_add(gap) => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn insert_merges_touching_and_overlapping() {
        let mut s = RangeSet::new();
        s.insert(10..20);
        s.insert(30..40);
        s.insert(20..25);
        assert_eq!(s.ranges(), &[10..25, 30..40]);
        s.insert(5..35);
        assert_eq!(s.ranges(), &[5..40]);
        assert_eq!(s.missing(0..50), vec![0..5, 40..50]);
        s.remove(10..12);
        assert_eq!(s.ranges(), &[5..10, 12..40]);
        assert!(s.contains(12..40));
        assert!(!s.contains(9..13));
    }

    #[test]
    fn coalesce_aligns_and_merges_near_ranges() {
        let got = coalesce(
            &[9000..9100, 100..200, 5000..5001, 40_000..50_000],
            4096,
            4096,
            45_000,
        );
        assert_eq!(got, vec![0..12288, 36864..45_000]);
        assert_eq!(coalesce(&[10..10, 50..60], 1, 0, 55), vec![50..55]);
    }

    proptest! {
        #[test]
        fn matches_a_bitmap(ops in proptest::collection::vec((any::<bool>(), 0u64..64, 0u64..64), 0..40),
                            q in (0u64..64, 0u64..64)) {
            let mut s = RangeSet::new();
            let mut bits = [false; 64];
            for (add, a, b) in ops {
                let (a, b) = (a.min(b), a.max(b));
                if add { s.insert(a..b) } else { s.remove(a..b) }
                for x in a..b { bits[x as usize] = add; }
            }
            let (a, b) = (q.0.min(q.1), q.0.max(q.1));
            let want: Vec<u64> = (a..b).filter(|&x| !bits[x as usize]).collect();
            let got: Vec<u64> = s.missing(a..b).into_iter().flatten().collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(s.covered(), bits.iter().filter(|&&x| x).count() as u64);
            prop_assert_eq!(RangeSet::from_pairs(&s.pairs()), s);
        }
    }
}
