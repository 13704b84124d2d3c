//! Block buffers recycled after use, so that decoding a block does not
//! take fresh, zeroed pages from the kernel each time.
//!
//! A cold load decodes a block of about 1 MiB for every MiB it reads while
//! the block cache evicts blocks of the same size. Page faults and the
//! zeroing of each new buffer before the decoder overwrites it were 6–17%
//! of the daemon in a cold read, so freed block buffers are kept in a
//! [`Pool`] (a few, bounded in count and bytes) and handed to decoders that
//! write every byte of their output ([`take`]).
//!
//! **Which pool.** A mount's block cache owns a pool of its own, counted in
//! its byte budget (`ckptfs_archive::cache`): its evicted blocks go there, and while
//! it runs a decode it makes that pool the thread's scope
//! ([`with_pool`]), so the decoder's [`take`] draws from it. Outside any
//! scope (the CLI's `unpack`, `verify`) [`take`] and [`recycle`] use one
//! process-wide pool of at most [`KEEP_BYTES`].
//!
//! **Unzeroed contents.** A recycled buffer holds an earlier block's
//! bytes. Only decoders that write every byte of their output take one
//! (element decoding joins planes element by element and copies the tail;
//! a delta's XOR block is decoded whole, then XORed; a base range is
//! copied whole): the others get [`super::zeroed`] memory. Builds with
//! debug assertions (every test build) fill a recycled buffer with a
//! poison byte before handing it out, so a decoder that skipped a byte
//! would serve poison, which the block's digest check and the tests'
//! byte-for-byte comparisons catch.

use super::Result;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

/// Bytes of buffers the process-wide pool keeps at most.
pub const KEEP_BYTES: usize = 32 << 20;
/// Buffers a pool keeps at most: `take` and `put` look through all of them.
const KEEP_COUNT: usize = 64;
/// Smaller buffers are not kept: zeroing them costs little, and an archive
/// of many tiny tensors (a million in `tests/hostile.rs`) would otherwise
/// fill the pool with them.
const KEEP_MIN: usize = 64 << 10;
/// What a recycled buffer is filled with first in builds with debug
/// assertions.
const POISON: u8 = 0xA5;

/// Free buffers, bounded in count and in bytes (their capacities).
pub struct Pool {
    inner: Mutex<Inner>,
    /// Bytes kept at most.
    limit: usize,
}

struct Inner {
    bufs: Vec<Vec<u8>>,
    /// The sum of the capacities of `bufs`.
    held: usize,
    /// Buffers handed out from the pool, and taken fresh instead.
    reused: u64,
    fresh: u64,
}

/// How a pool has served (for tests and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes of the buffers kept now.
    pub held: u64,
    pub buffers: usize,
    /// [`take`]s answered with a kept buffer.
    pub reused: u64,
    /// [`take`]s of a size the pool keeps that got fresh memory.
    pub fresh: u64,
}

impl Pool {
    pub const fn new(limit: usize) -> Pool {
        Pool {
            inner: Mutex::new(Inner {
                bufs: Vec::new(),
                held: 0,
                reused: 0,
                fresh: 0,
            }),
            limit,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes of the buffers kept now.
    pub fn held(&self) -> u64 {
        self.lock().held as u64
    }

    pub fn stats(&self) -> PoolStats {
        let p = self.lock();
        PoolStats {
            held: p.held as u64,
            buffers: p.bufs.len(),
            reused: p.reused,
            fresh: p.fresh,
        }
    }

    /// Keeps `v` if it is of a size kept and the pool has room for it
    /// (and `room` more bytes allowed by the caller); else gives it back.
    pub fn put_within(&self, v: Vec<u8>, room: u64) -> Option<Vec<u8>> {
        let cap = v.capacity();
        if !(KEEP_MIN..=self.limit / 4).contains(&cap) || cap as u64 > room {
            return Some(v);
        }
        let mut p = self.lock();
        if p.bufs.len() < KEEP_COUNT && p.held + cap <= self.limit {
            p.held += cap;
            p.bufs.push(v);
            None
        } else {
            Some(v)
        }
    }

    /// Frees kept buffers until `bytes` are freed or none is left.
    pub fn shrink(&self, bytes: u64) {
        let mut freed = Vec::new();
        {
            let mut p = self.lock();
            let mut n = 0u64;
            while n < bytes {
                let Some(v) = p.bufs.pop() else { break };
                p.held -= v.capacity();
                n += v.capacity() as u64;
                freed.push(v);
            }
        }
        drop(freed);
    }

    /// Frees every buffer kept; returns their bytes.
    pub fn release(&self) -> u64 {
        let bufs = {
            let mut p = self.lock();
            p.held = 0;
            std::mem::take(&mut p.bufs)
        };
        bufs.iter().map(|v| v.capacity() as u64).sum()
    }

    /// A kept buffer of `n` bytes (at least as large, not more than twice:
    /// a cache counts a block's length, not its capacity), if any.
    fn take(&self, n: usize) -> Option<Vec<u8>> {
        let mut p = self.lock();
        let i = p
            .bufs
            .iter()
            .rposition(|v| v.capacity() >= n && v.capacity() <= 2 * n);
        match i {
            Some(i) => {
                let v = p.bufs.swap_remove(i);
                p.held -= v.capacity();
                p.reused += 1;
                Some(v)
            }
            None => {
                p.fresh += 1;
                None
            }
        }
    }
}

/// The pool outside any scope.
static GLOBAL: Pool = Pool::new(KEEP_BYTES);

thread_local! {
    static SCOPE: RefCell<Option<Arc<Pool>>> = const { RefCell::new(None) };
}

/// Runs `f` with `pool` as this thread's pool: [`take`] draws from it.
/// Scopes nest; the previous one is back when `f` returns or unwinds.
pub fn with_pool<R>(pool: &Arc<Pool>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<Pool>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            let _ = SCOPE.try_with(|s| *s.borrow_mut() = prev);
        }
    }
    let prev = SCOPE.with(|s| s.borrow_mut().replace(pool.clone()));
    let _restore = Restore(prev);
    f()
}

/// A buffer of `len` bytes whose contents are unspecified (zero, or the
/// bytes of a freed block): only for a decoder that writes all of it.
/// From the thread's scoped pool, else the process-wide one, else fresh.
/// Same limits and errors as [`super::zeroed`].
pub fn take(len: u64, what: &'static str) -> Result<Vec<u8>> {
    if len > super::MAX_BLOCK_BYTES || (len as usize) < KEEP_MIN / 2 {
        return super::zeroed(len, what);
    }
    let n = len as usize;
    let reused = SCOPE
        .with(|s| s.borrow().clone())
        .map_or_else(|| GLOBAL.take(n), |p| p.take(n));
    match reused {
        Some(mut v) => {
            if v.len() >= n {
                v.truncate(n);
            } else {
                v.resize(n, 0);
            }
            if cfg!(debug_assertions) {
                v.fill(POISON);
            }
            Ok(v)
        }
        None => super::zeroed(len, what),
    }
}

/// Frees every buffer the process-wide pool keeps (when memory runs short:
/// [`ckptfs_format::memory`]); returns their bytes. A cache's own pool is freed by
/// the cache's relief.
pub fn release() -> u64 {
    GLOBAL.release()
}

/// Keeps `v` in the process-wide pool for a later [`take`] if it has room;
/// else frees it.
pub fn recycle(v: Vec<u8>) {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| ckptfs_format::memory::register_pool(release));
    drop(GLOBAL.put_within(v, u64::MAX));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_at_the_asked_length() {
        let mut v = take(100_000, "t").unwrap();
        assert_eq!(v.len(), 100_000);
        v.iter_mut().for_each(|b| *b = 7);
        recycle(v);
        // Another test may take it first; either way the length is right.
        for n in [600u64, 70_000, 100_000, 150_000] {
            let v = take(n, "t").unwrap();
            assert_eq!(v.len(), n as usize);
            recycle(v);
        }
        assert!(take(super::super::MAX_BLOCK_BYTES + 1, "t").is_err());
    }

    /// Many small buffers are not kept, and a pool stays bounded in count
    /// and bytes however many are put back.
    #[test]
    fn a_pool_stays_small() {
        let pool = Pool::new(KEEP_BYTES);
        for _ in 0..10_000 {
            assert!(pool.put_within(vec![0u8; 300], u64::MAX).is_some());
        }
        for _ in 0..1_000 {
            let _ = pool.put_within(vec![0u8; KEEP_MIN], u64::MAX);
        }
        let p = pool.lock();
        assert!(p.bufs.len() <= KEEP_COUNT, "{}", p.bufs.len());
        assert!(p.bufs.iter().all(|v| v.capacity() >= KEEP_MIN));
        assert_eq!(p.held, p.bufs.iter().map(Vec::capacity).sum::<usize>());
        assert!(p.held <= KEEP_BYTES);
    }

    /// Inside a scope, `take` draws from the scoped pool only; the scope
    /// ends with the call, even by a panic.
    #[test]
    fn take_draws_from_the_scoped_pool() {
        let pool = Arc::new(Pool::new(8 << 20));
        assert!(pool.put_within(vec![1u8; 1 << 20], u64::MAX).is_none());
        assert!(
            pool.put_within(vec![1u8; 1 << 20], 1000).is_some(),
            "no room"
        );
        let v = with_pool(&pool, || take(1 << 20, "t").unwrap());
        assert_eq!(v.len(), 1 << 20);
        if cfg!(debug_assertions) {
            assert!(v.iter().all(|&b| b == POISON), "poisoned");
        }
        let s = pool.stats();
        assert_eq!((s.reused, s.fresh, s.held, s.buffers), (1, 0, 0, 0));
        let r = std::panic::catch_unwind(|| with_pool(&pool, || panic!("decoder bug")));
        assert!(r.is_err());
        assert!(SCOPE.with(|s| s.borrow().is_none()), "scope restored");
        // Empty now: a fresh buffer, counted.
        with_pool(&pool, || take(1 << 20, "t").unwrap());
        assert_eq!(pool.stats().fresh, 1);
    }
}
