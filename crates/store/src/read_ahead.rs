//! The one read-ahead policy of sources whose bytes are fetched
//! ([`ByteSource::is_remote`]): what to fetch beside the bytes a reader
//! asks for, when it goes through a file in order.
//!
//! A reader sees a file as a sequence of *pieces*, each some byte ranges
//! of the source: an archive's frames, a frame's blocks (a block's
//! payload in each plane), a plain file's aligned chunks. A piece whose
//! predecessor is here or on its way belongs to a reader going through
//! the pieces in order ([`in_order`]): [`ReadAhead::plan`] then says which
//! pieces to fetch *with* it (the rest of its aligned window: one
//! coalesced request per run instead of one per piece), and which to
//! fetch *later*, in the background, after the window, as far as the
//! byte limits allow. A random read (its predecessor absent) fetches its
//! piece only. Windows are aligned, so that concurrent readers of one
//! window ask for the same bytes (the source fetches them once).
//!
//! Every limit is bounded by the source's [`ByteSource::read_ahead_room`]
//! (a share of the disk cache's limit): more would be given back before it
//! is read.

use crate::source::ByteSource;
use std::ops::Range;

/// What the policy asks of a source: which bytes are here or coming, and
/// how much may be fetched ahead (every [`ByteSource`] answers it; so
/// does a plain file's [`crate::remote::InUse`]).
pub trait Presence {
    /// True when every byte of `ranges` is present or being fetched.
    fn has_or_fetching(&self, ranges: &[Range<u64>]) -> bool;
    /// Bytes that may be fetched ahead of a reader at once.
    fn read_ahead_room(&self) -> u64;
}

impl<T: ByteSource + ?Sized> Presence for T {
    fn has_or_fetching(&self, ranges: &[Range<u64>]) -> bool {
        ByteSource::has_or_fetching(self, ranges)
    }
    fn read_ahead_room(&self) -> u64 {
        ByteSource::read_ahead_room(self)
    }
}

/// How far ahead of a reader going in order to fetch.
#[derive(Debug, Clone, Copy)]
pub struct ReadAhead {
    /// Pieces are fetched with the one read in aligned windows of this
    /// many (1: the piece alone).
    pub window: usize,
    /// Bytes fetched in the background beyond the window, at most.
    pub beyond: u64,
}

/// What to fetch for a read of one piece in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Ranges to fetch with the piece (the missing rest of its window).
    pub with: Vec<Range<u64>>,
    /// Ranges to fetch in the background ([`ByteSource::prefetch`]).
    pub later: Vec<Range<u64>>,
}

/// True when a reader of the piece after `prev` (its ranges) goes in order:
/// `prev` is here or being fetched.
pub fn in_order(src: &(impl Presence + ?Sized), prev: &[Range<u64>]) -> bool {
    !prev.is_empty() && src.has_or_fetching(prev)
}

fn len(rs: &[Range<u64>]) -> u64 {
    rs.iter().map(|r| r.end - r.start).sum()
}

impl ReadAhead {
    /// For a read in order of piece `current` (of `count`), whose own
    /// ranges are `own` bytes long: the pieces of its aligned window not
    /// here nor on their way, as many as fit in the source's read-ahead
    /// room, and after the window, up to [`Self::beyond`] bytes of the
    /// next such pieces. The walk after the window stops at the first
    /// piece already here or on its way (the reader has fetched ahead from
    /// there on). `ranges_of(i)` gives piece `i`'s ranges (None: a piece
    /// with nothing to fetch).
    pub fn plan(
        &self,
        src: &(impl Presence + ?Sized),
        count: usize,
        current: usize,
        own: u64,
        ranges_of: impl Fn(usize) -> Option<Vec<Range<u64>>>,
    ) -> Plan {
        let mut plan = Plan::default();
        let mut room = src.read_ahead_room().saturating_sub(own);
        let window = self.window.max(1);
        let w0 = current / window * window;
        let w_end = w0 + window;
        let mut later_room = room.min(self.beyond);
        for i in w0..count {
            let Some(rs) = ranges_of(i) else {
                continue;
            };
            if i == current || src.has_or_fetching(&rs) {
                if i >= w_end {
                    break;
                }
                continue;
            }
            let n = len(&rs);
            if i < w_end {
                if n > room {
                    break;
                }
                room -= n;
                later_room = later_room.min(room);
                plan.with.extend(rs);
            } else {
                if n > later_room {
                    break;
                }
                later_room -= n;
                plan.later.extend(rs);
            }
        }
        plan
    }

    /// [`Self::plan`], with its background part started: returns the
    /// ranges to fetch with the piece.
    pub fn start(
        &self,
        src: &(impl ByteSource + ?Sized),
        count: usize,
        current: usize,
        own: u64,
        ranges_of: impl Fn(usize) -> Option<Vec<Range<u64>>>,
    ) -> Vec<Range<u64>> {
        let plan = self.plan(src, count, current, own, ranges_of);
        if !plan.later.is_empty() {
            src.prefetch(&plan.later);
        }
        plan.with
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A source of 100 pieces of 10 bytes whose present bytes are given.
    struct Fake {
        present: Mutex<Vec<Range<u64>>>,
        room: u64,
    }

    impl Presence for Fake {
        fn has_or_fetching(&self, ranges: &[Range<u64>]) -> bool {
            let p = self.present.lock().unwrap();
            ranges
                .iter()
                .all(|r| p.iter().any(|q| q.start <= r.start && r.end <= q.end))
        }
        fn read_ahead_room(&self) -> u64 {
            self.room
        }
    }

    fn piece(i: usize) -> Option<Vec<Range<u64>>> {
        Some(vec![i as u64 * 10..i as u64 * 10 + 10])
    }

    fn fake(present: &[Range<u64>], room: u64) -> Fake {
        Fake {
            present: Mutex::new(present.to_vec()),
            room,
        }
    }

    #[test]
    fn window_then_beyond() {
        let src = fake(&[0..10], 1000);
        let p = ReadAhead {
            window: 4,
            beyond: 30,
        }
        .plan(&src, 100, 1, 10, piece);
        assert_eq!(p.with, vec![20..30, 30..40]);
        assert_eq!(p.later, vec![40..50, 50..60, 60..70]);
    }

    #[test]
    fn stops_where_already_fetched_ahead() {
        let src = fake(&[0..10, 50..60], 1000);
        let p = ReadAhead {
            window: 4,
            beyond: 1000,
        }
        .plan(&src, 100, 1, 10, piece);
        assert_eq!(p.later, vec![40..50]);
    }

    #[test]
    fn room_bounds_both() {
        let src = fake(&[0..10], 35);
        let p = ReadAhead {
            window: 4,
            beyond: 1000,
        }
        .plan(&src, 100, 1, 10, piece);
        assert_eq!(p.with, vec![20..30, 30..40]);
        assert!(p.later.is_empty(), "{p:?}");
        let p = ReadAhead {
            window: 1,
            beyond: 1000,
        }
        .plan(&src, 3, 1, 10, piece);
        assert!(p.with.is_empty());
        assert_eq!(p.later, vec![20..30]);
    }

    #[test]
    fn in_order_needs_the_predecessor() {
        let src = fake(&[0..10], 1000);
        assert!(in_order(&src, &[0..10]));
        assert!(!in_order(&src, &[10..20]));
        assert!(!in_order(&src, &[]));
    }
}
