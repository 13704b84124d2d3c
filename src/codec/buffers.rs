//! Block buffers recycled from the block cache's evictions.
//!
//! A cold load decodes a block of about 1 MiB for every MiB it reads while
//! the cache evicts blocks of the same size. Zeroing each new buffer before
//! the decoder overwrites it cost 5–11% of the daemon in a cold read, so
//! evicted buffers are kept here (a few, bounded in bytes) and handed to
//! decoders that write every byte of their output ([`take`]). Their old
//! bytes are never served: such a decoder overwrites all of them, and a
//! block's bytes are checked against its digest before anyone reads them.

use super::Result;
use std::sync::Mutex;

/// Bytes of buffers kept at most.
const KEEP_BYTES: usize = 32 << 20;
/// Buffers kept at most: `take` and `recycle` look through all of them.
const KEEP_COUNT: usize = 64;
/// Smaller buffers are not kept: zeroing them costs little, and an archive
/// of many tiny tensors (a million in `tests/hostile.rs`) would otherwise
/// fill the pool with them.
const KEEP_MIN: usize = 64 << 10;

struct Pool {
    bufs: Vec<Vec<u8>>,
    /// The sum of the capacities of `bufs`.
    held: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    bufs: Vec::new(),
    held: 0,
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer of `len` bytes whose contents are unspecified (zero or the
/// bytes of an evicted block): only for a decoder that writes all of it.
/// Same limits and errors as [`super::zeroed`].
pub fn take(len: u64, what: &'static str) -> Result<Vec<u8>> {
    if len > super::MAX_BLOCK_BYTES || (len as usize) < KEEP_MIN / 2 {
        return super::zeroed(len, what);
    }
    let n = len as usize;
    let reused = {
        let mut p = pool();
        // A buffer at least as large, but not more than twice (the cache
        // counts a block's length, not its capacity).
        let i = p
            .bufs
            .iter()
            .rposition(|v| v.capacity() >= n && v.capacity() <= 2 * n);
        i.map(|i| {
            let v = p.bufs.swap_remove(i);
            p.held -= v.capacity();
            v
        })
    };
    match reused {
        Some(mut v) => {
            if v.len() >= n {
                v.truncate(n);
            } else {
                v.resize(n, 0);
            }
            Ok(v)
        }
        None => super::zeroed(len, what),
    }
}

/// Frees every buffer kept (when memory runs short: [`crate::memory`]);
/// returns their bytes.
pub fn release() -> u64 {
    let bufs = {
        let mut p = pool();
        p.held = 0;
        std::mem::take(&mut p.bufs)
    };
    bufs.iter().map(|v| v.capacity() as u64).sum()
}

/// Keeps `v` for a later [`take`] if the pool has room; else frees it.
pub fn recycle(v: Vec<u8>) {
    let cap = v.capacity();
    if !(KEEP_MIN..=KEEP_BYTES / 4).contains(&cap) {
        return;
    }
    let mut p = pool();
    if p.bufs.len() < KEEP_COUNT && p.held + cap <= KEEP_BYTES {
        p.held += cap;
        p.bufs.push(v);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn buffers_come_back_at_the_asked_length() {
        let mut v = super::take(100_000, "t").unwrap();
        assert_eq!(v.len(), 100_000);
        v.iter_mut().for_each(|b| *b = 7);
        super::recycle(v);
        // Another test may take it first; either way the length is right.
        for n in [600u64, 70_000, 100_000, 150_000] {
            let v = super::take(n, "t").unwrap();
            assert_eq!(v.len(), n as usize);
            super::recycle(v);
        }
        assert!(super::take(super::super::MAX_BLOCK_BYTES + 1, "t").is_err());
    }

    /// Many small buffers are not kept, and the pool stays bounded in
    /// count and bytes however many are recycled.
    #[test]
    fn the_pool_stays_small() {
        for _ in 0..10_000 {
            super::recycle(vec![0u8; 300]);
        }
        for _ in 0..1_000 {
            super::recycle(vec![0u8; super::KEEP_MIN]);
        }
        let p = super::pool();
        assert!(p.bufs.len() <= super::KEEP_COUNT, "{}", p.bufs.len());
        assert!(p.bufs.iter().all(|v| v.capacity() >= super::KEEP_MIN));
        assert_eq!(p.held, p.bufs.iter().map(Vec::capacity).sum::<usize>());
        assert!(p.held <= super::KEEP_BYTES);
    }
}
