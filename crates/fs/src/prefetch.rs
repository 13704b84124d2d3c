//! Sequential-read detection and the prefetch window, per open file.
//!
//! Each archive handle keeps a [`Sequential`] state: where the next
//! sequential read would start (`next`), how far ahead blocks have been
//! requested (`ahead_to`) and the current window. A read counts as
//! sequential when it starts within one window (at least `slack`) of
//! `next`: the kernel's readahead and a multi-threaded session deliver
//! reads slightly out of order, and that must not reset the stream.
//!
//! On the first sequential read the window is `initial` (4 MiB); every
//! further sequential read doubles it up to `max` (32 MiB, and never more
//! than a quarter of the block cache, so prefetched blocks are not evicted
//! before they are read). A prefetch is issued only when less than half a
//! window remains requested ahead of the reader, so a stream of 128 KiB
//! reads triggers one large batch of block decodes every few MiB rather
//! than a trickle. A non-sequential read drops the window to zero, so
//! random access (O_DIRECT 64 KiB probes, safetensors' `get_slice`) never
//! decodes blocks nobody asked for.
//!
//! A read that is not sequential but covers the first byte of a tensor
//! starts a stream of its own ([`Sequential::start_unit`]): loaders read
//! tensors whole, in whatever order they want them (safetensors' key order,
//! a framework's parameter order), so the tensor's first window is decoded
//! in parallel at once instead of one block per kernel request.
//!
//! A short read (under [`FILL_MAX`]) that does not continue the stream
//! leaves it as it is ([`Sequential::fills_hole`]): it is what the kernel
//! sends to refill pages it dropped from a file read before (reclaim takes
//! single pages of a cached file, here and there), and counting those as a
//! stream prefetched windows of blocks the page cache still held: refills a
//! few MiB apart each fell within the growing window's slack. With 100
//! dropped pages of a 1 GiB file a warm `dd` decoded a third to a half of
//! the file again (1.0-1.35 s of daemon CPU). A refill that holds a tensor
//! start still starts a stream there (a loader's first read of a small
//! tensor looks the same).
//!
//! This module only decides *what* to prefetch; `CheckpointFs` turns the
//! byte range into blocks and decodes them in parallel on the rayon pool
//! into the shared `BlockCache`.

use std::ops::Range;

#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub initial: u64,
    pub max: u64,
    pub slack: u64,
}

impl Policy {
    pub fn for_cache(cache_budget: u64) -> Policy {
        let cap = (cache_budget / 4).max(1 << 20);
        Policy {
            initial: (4u64 << 20).min(cap),
            max: (32u64 << 20).min(cap),
            slack: 1 << 20,
        }
    }
}

/// Reads shorter than this that do not continue the stream are taken as
/// refills of pages the page cache dropped (see the module doc). The kernel's
/// readahead requests of a stream are larger, except its first.
pub const FILL_MAX: u64 = 64 << 10;

#[derive(Debug, Default, Clone)]
pub struct Sequential {
    next: u64,
    ahead_to: u64,
    window: u64,
}

impl Sequential {
    /// Records a read of `[offset, offset + len)` in a file of `file_len`
    /// bytes and returns the byte range to prefetch, if any.
    pub fn on_read(
        &mut self,
        offset: u64,
        len: u64,
        file_len: u64,
        p: &Policy,
    ) -> Option<Range<u64>> {
        let end = offset.saturating_add(len).min(file_len);
        let slack = self.slack(p);
        let sequential =
            offset <= self.next.saturating_add(slack) && offset.saturating_add(slack) >= self.next;
        if !sequential {
            self.window = 0;
            self.next = end;
            self.ahead_to = end;
            return None;
        }
        self.window = if self.window == 0 {
            p.initial
        } else {
            (self.window * 2).min(p.max)
        };
        self.next = self.next.max(end);
        self.ahead_to = self.ahead_to.max(self.next);
        let target = self.next.saturating_add(self.window).min(file_len);
        if self.ahead_to >= target || self.ahead_to - self.next > self.window / 2 {
            return None;
        }
        let r = self.ahead_to..target;
        self.ahead_to = target;
        Some(r)
    }

    /// Whether a read of `[offset, offset + len)` is short and away from
    /// the stream (more than its own length past where the stream would
    /// continue, or more than `slack` before it): a page refill, which
    /// must not move, grow or reset the stream (only a tensor start in it
    /// may start one, [`Sequential::start_unit`]).
    pub fn fills_hole(&self, offset: u64, len: u64, p: &Policy) -> bool {
        len < FILL_MAX
            && (offset > self.next.saturating_add(len)
                || offset.saturating_add(self.slack(p)) < self.next)
    }

    /// How far from where the stream would continue a read may start and
    /// still belong to it: one window, at least the policy's `slack`.
    fn slack(&self, p: &Policy) -> u64 {
        self.window.max(p.slack)
    }

    /// A read that was not sequential but covers the first byte of a
    /// tensor (`unit_start`): a reader of model files reads a tensor whole,
    /// so a stream starts there. Returns the range to prefetch: from the end
    /// of this read to one initial window past the tensor's start.
    pub fn start_unit(
        &mut self,
        read_end: u64,
        unit_start: u64,
        file_len: u64,
        p: &Policy,
    ) -> Option<Range<u64>> {
        self.window = p.initial;
        self.next = read_end;
        let target = unit_start.saturating_add(p.initial).min(file_len);
        self.ahead_to = target.max(read_end);
        (read_end < target).then_some(read_end..target)
    }

    pub fn window(&self) -> u64 {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn policy() -> Policy {
        Policy {
            initial: 4 * MIB,
            max: 32 * MIB,
            slack: MIB,
        }
    }

    #[test]
    fn window_grows_on_sequential_reads_and_stays_ahead() {
        let p = policy();
        let mut s = Sequential::default();
        let len = 1000 * MIB;
        let first = s.on_read(0, 128 << 10, len, &p).unwrap();
        assert_eq!(first, (128 << 10)..(128 << 10) + 4 * MIB);
        let mut off = 128 << 10;
        let mut covered = first.end;
        for _ in 0..200 {
            if let Some(r) = s.on_read(off, 128 << 10, len, &p) {
                assert_eq!(r.start, covered, "prefetches are contiguous");
                covered = r.end;
            }
            off += 128 << 10;
            assert!(covered > off, "prefetch stays ahead of the reader");
        }
        assert_eq!(s.window(), 32 * MIB);
    }

    #[test]
    fn random_reads_do_not_prefetch() {
        let p = policy();
        let mut s = Sequential::default();
        assert!(s.on_read(500 * MIB, 65536, 1000 * MIB, &p).is_none());
        assert!(s.on_read(100 * MIB, 65536, 1000 * MIB, &p).is_none());
        assert!(s.on_read(700 * MIB, 65536, 1000 * MIB, &p).is_none());
        assert_eq!(s.window(), 0);
    }

    #[test]
    fn slightly_out_of_order_reads_stay_sequential() {
        let p = policy();
        let mut s = Sequential::default();
        s.on_read(0, MIB, 100 * MIB, &p);
        s.on_read(2 * MIB, MIB, 100 * MIB, &p);
        s.on_read(MIB, MIB, 100 * MIB, &p);
        assert!(s.window() >= 16 * MIB);
    }

    #[test]
    fn a_jump_to_a_tensor_start_starts_a_stream() {
        let p = policy();
        let mut s = Sequential::default();
        assert!(s.on_read(500 * MIB, 65536, 1000 * MIB, &p).is_none());
        let r = s.start_unit(700 * MIB + 65536, 700 * MIB, 1000 * MIB, &p);
        assert_eq!(r, Some(700 * MIB + 65536..704 * MIB));
        // The reads that follow are sequential and keep the stream going.
        let next = s.on_read(700 * MIB + 65536, MIB, 1000 * MIB, &p);
        assert_eq!(next.map(|r| r.start), Some(704 * MIB));
    }

    #[test]
    fn page_refills_across_a_cached_file_neither_prefetch_nor_break_a_stream() {
        let p = policy();
        let mut s = Sequential::default();
        let len = 1000 * MIB;
        // A stream of 1 MiB reads up to 40 MiB.
        for i in 0..40 {
            s.on_read(i * MIB, MIB, len, &p);
        }
        let window = s.window();
        assert!(window >= 16 * MIB);
        // Single pages refilled further on: each one is a hole fill.
        for k in 1..50u64 {
            let off = 40 * MIB + k * 3 * MIB + 4096 * k;
            assert!(s.fills_hole(off, 4096, &p), "page at {off}");
        }
        // The stream's own next read, a short one, and one a little out of
        // order are not.
        assert!(!s.fills_hole(40 * MIB, 4096, &p));
        assert!(!s.fills_hole(40 * MIB + 8192, 16384, &p));
        assert!(!s.fills_hole(39 * MIB, 4096, &p));
        // Long reads are never taken as refills.
        assert!(!s.fills_hole(500 * MIB, MIB, &p));
        assert_eq!(s.window(), window, "the stream is untouched");
    }

    #[test]
    fn never_prefetches_past_the_end() {
        let p = policy();
        let mut s = Sequential::default();
        let r = s.on_read(0, 4096, 10_000, &p).unwrap();
        assert_eq!(r, 4096..10_000);
        assert!(s.on_read(4096, 4096, 10_000, &p).is_none());
    }
}
