//! `BlockCache`: decoded archive blocks, shared by every open file of a
//! mount, bounded in bytes.
//!
//! **Keys.** A [`CacheKey`] is (archive generation, block). The generation
//! is a process-wide number handed out each time an archive *version* is
//! opened (see `fs::Slot`): a backing file replaced in STORE gets a
//! new generation when it is next opened, so a block decoded from the old
//! version can never be served for the new one. Old generations are not
//! purged eagerly; they simply stop being asked for and age out of the LRU.
//!
//! **Bound.** The LRU counts the decoded bytes of the blocks it holds,
//! plus the free block buffers it keeps for reuse (below), and evicts
//! least-recently-used blocks until it is back under the budget.
//! A block larger than half the budget (z4ai writes whole tensors as one
//! block) would flush the LRU for a single entry, and not caching it would
//! decode it again for every kernel request in it: such a block is kept
//! alone in a side slot instead, the most recent one only. The resident
//! total is therefore bounded by the budget plus one large block (at most
//! `format::frame::MAX_BLOCK_BYTES`). Blocks are `Arc`s, so an evicted block stays alive only while a
//! reader still copies out of it; the resident total is therefore the
//! budget plus the blocks in flight (a few per reader thread).
//!
//! **Served blocks go first.** The kernel keeps what a read returned in
//! its page cache, so a block whose every byte has been served
//! ([`BlockCache::served`]) is rarely asked for again. Such blocks move to
//! a second, small LRU (at most [`BlockCache::served_cap`] bytes, inside
//! the same budget) and are evicted before any block still waiting to be
//! read. A cold load then recycles a few megabytes of block buffers, warm
//! in the CPU cache, instead of taking a fresh, zeroed page from the
//! kernel for every block until the budget is full (page faults and
//! zeroing were 8–18% of the daemon's CPU in a cold load). Blocks decoded
//! ahead of the reader keep the rest of the budget.
//!
//! **Buffers are reused.** An evicted block's buffer, unless a reader
//! still holds the block, goes to the cache's own [`Pool`] when the budget
//! has room for it beside the cached blocks (moving a buffer from a block
//! to the pool keeps the total; over the budget it is freed, and kept
//! buffers are freed before any block is evicted). Every load runs with
//! that pool as its thread's scope (`codec::buffers::with_pool`), so a
//! decoder that writes its whole output takes a recycled buffer instead of
//! fresh, zeroed pages: in a cold load the served LRU's evictions feed the
//! next decodes, and the total of blocks and free buffers never exceeds
//! the budget. A pool holds at most an eighth of the budget (32 MiB at
//! most); the cache's relief frees it too.
//!
//! **Deltas' bases.** A delta's base blocks are cached here too, under a
//! generation of the base file's identity and version
//! (`fs::archive_slot::MountBases`), through [`BlockCache::get_or_load_nowait`]:
//! that runs inside another block's decode, so like prefetch it never
//! waits on a flight (it decodes a private copy instead).
//!
//! **Single flight.** A miss registers an in-flight slot before decoding,
//! outside the lock. Concurrent misses on the same key find the slot and
//! wait on its condition variable instead of decoding again. The result,
//! success or error, is handed to every waiter; only a success is cached,
//! so a later read retries a failed block (and fails again, answering EIO
//! for that read only). A loader that panics wakes its waiters with an
//! error rather than leaving them blocked.
//!
//! **Served and evicted blocks are not prefetched again.** The keys of
//! wholly served blocks evicted from the served LRU are remembered (the
//! last [`GONE_MAX`], keys only): the kernel holds their bytes, so
//! prefetch ([`BlockCache::contains_or_loading`]) skips them. A loader
//! whose page faults jump ahead (the kernel's read-around centred on a
//! tensor's first page) had the blocks it read early decoded a second time
//! when the sequential stream's prefetch reached them: 16 of 1026 blocks
//! in a cold numpy load of the 2-shard bench model. A read that asks for
//! such a block anyway (the kernel dropped those pages) decodes it and
//! forgets every remembered key, so a re-read prefetches as before.
//!
//! Prefetchers use [`BlockCache::load_if_absent`], which never waits on
//! another loader's flight: prefetch runs on rayon workers, and decoders use
//! rayon internally, so a worker parked on a condition variable could starve
//! the very decode it waits for.
//!
//! Where these locks stand in the mount's lock order: see `ckptfs_fs`.

use crate::BlockKey;
use ckptfs_codec::buffers::{self, Pool};
use lru::LruCache;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;

/// A decoded block, shared between the cache and its readers.
pub type Block = Arc<Vec<u8>>;

/// Identity of one decoded block of one archive version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The generation of the opened archive version (unique per process).
    pub generation: u64,
    pub block: BlockKey,
}

/// Why a cached fetch failed: the loader's own error, shared between all
/// the callers that waited for it.
#[derive(Debug)]
pub enum FetchError<E> {
    Load(Arc<E>),
    /// The loading thread panicked.
    Panicked,
}

impl<E> Clone for FetchError<E> {
    fn clone(&self) -> Self {
        match self {
            FetchError::Load(e) => FetchError::Load(e.clone()),
            FetchError::Panicked => FetchError::Panicked,
        }
    }
}

struct Flight<E> {
    state: Mutex<Option<Result<Block, FetchError<E>>>>,
    done: Condvar,
}

/// A cached block and how many of its bytes reads have returned.
struct Entry {
    block: Block,
    served: u64,
}

struct Inner<E> {
    /// Blocks not yet wholly served.
    lru: LruCache<CacheKey, Entry>,
    /// Blocks wholly served, evicted first.
    served: LruCache<CacheKey, Block>,
    /// Bytes of both LRUs.
    bytes: u64,
    served_bytes: u64,
    /// The most recent block larger than half the budget.
    large: Option<(CacheKey, Block)>,
    /// Keys of wholly served blocks evicted since (not prefetched again).
    gone: LruCache<CacheKey, ()>,
    flights: HashMap<CacheKey, Arc<Flight<E>>>,
    hits: u64,
    misses: u64,
}

impl<E> Inner<E> {
    fn large_is(&self, key: &CacheKey) -> bool {
        self.large.as_ref().is_some_and(|(k, _)| k == key)
    }
    fn large_get(&self, key: &CacheKey) -> Option<Block> {
        self.large
            .as_ref()
            .filter(|(k, _)| k == key)
            .map(|(_, b)| b.clone())
    }
    fn contains(&self, key: &CacheKey) -> bool {
        self.lru.contains(key) || self.served.contains(key) || self.large_is(key)
    }
    /// Evicts the least recently used wholly served block, if any.
    fn evict_served(&mut self) -> Option<Block> {
        let (k, b) = self.served.pop_lru()?;
        self.gone.put(k, ());
        self.bytes -= b.len() as u64;
        self.served_bytes -= b.len() as u64;
        Some(b)
    }
    /// Evicts the least recently used block, served ones first.
    fn evict_one(&mut self) -> Option<Block> {
        if let Some(b) = self.evict_served() {
            return Some(b);
        }
        let (_, e) = self.lru.pop_lru()?;
        self.bytes -= e.block.len() as u64;
        Some(e.block)
    }
}

/// Keys of served and evicted blocks remembered (about 64 bytes each).
const GONE_MAX: usize = 1 << 16;

/// Counters for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub bytes: u64,
    /// Bytes of free block buffers kept for the next decodes (counted in
    /// the budget with `bytes`).
    pub pooled: u64,
    pub blocks: usize,
    pub hits: u64,
    pub misses: u64,
}

pub struct BlockCache<E> {
    inner: Mutex<Inner<E>>,
    budget: u64,
    /// Buffers of evicted blocks, for the decoders this cache runs.
    pool: Arc<Pool>,
}

impl<E> std::fmt::Debug for BlockCache<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("budget", &self.budget)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Removes the flight and wakes its waiters even if the loader unwinds.
struct FlightGuard<'a, E> {
    cache: &'a BlockCache<E>,
    key: CacheKey,
    flight: Arc<Flight<E>>,
    finished: bool,
}

impl<E> FlightGuard<'_, E> {
    fn finish(mut self, result: Result<Block, FetchError<E>>) {
        self.publish(result);
        self.finished = true;
    }

    fn publish(&self, result: Result<Block, FetchError<E>>) {
        {
            let mut inner = self.cache.inner.lock();
            inner.flights.remove(&self.key);
            if let Ok(block) = &result {
                self.cache
                    .insert_locked(&mut inner, self.key, block.clone());
            }
        }
        *self.flight.state.lock() = Some(result);
        self.flight.done.notify_all();
    }
}

impl<E> Drop for FlightGuard<'_, E> {
    fn drop(&mut self) {
        if !self.finished {
            self.publish(Err(FetchError::Panicked));
        }
    }
}

/// When an allocation fails ([`ckptfs_format::memory`]), every cached block is
/// dropped: they are all decoded again on demand. Blocks being loaded and
/// blocks a reader still holds stay (their memory is in use).
impl<E: Send + Sync + 'static> ckptfs_format::memory::Relieve for BlockCache<E> {
    fn relieve(&self) -> u64 {
        let (lru, served, large) = {
            let mut i = self.inner.lock();
            let lru = std::mem::replace(&mut i.lru, LruCache::unbounded());
            let served = std::mem::replace(&mut i.served, LruCache::unbounded());
            i.bytes = 0;
            i.served_bytes = 0;
            (lru, served, i.large.take())
        };
        // Freed outside the lock; nothing goes back to the buffer pool.
        let freed: u64 = lru.iter().map(|(_, e)| e.block.len() as u64).sum::<u64>()
            + served.iter().map(|(_, b)| b.len() as u64).sum::<u64>()
            + large.as_ref().map_or(0, |(_, b)| b.len() as u64);
        drop((lru, served, large));
        freed + self.pool.release()
    }
}

impl<E> BlockCache<E> {
    pub fn new(budget_bytes: u64) -> Self {
        BlockCache {
            inner: Mutex::new(Inner {
                lru: LruCache::unbounded(),
                served: LruCache::unbounded(),
                bytes: 0,
                served_bytes: 0,
                large: None,
                gone: LruCache::new(std::num::NonZeroUsize::new(GONE_MAX).expect("non-zero")),
                flights: HashMap::new(),
                hits: 0,
                misses: 0,
            }),
            budget: budget_bytes,
            pool: Arc::new(Pool::new(Self::pool_limit(budget_bytes))),
        }
    }

    /// The most bytes of free buffers kept: an eighth of the budget, at
    /// most the process-wide pool's size.
    fn pool_limit(budget: u64) -> usize {
        (budget / 8).min(buffers::KEEP_BYTES as u64) as usize
    }

    /// How the pool of free block buffers has served.
    pub fn pool_stats(&self) -> buffers::PoolStats {
        self.pool.stats()
    }

    /// Gives an evicted block's buffer to the pool if no reader still
    /// holds it and the budget has room for it beside the cached blocks
    /// (moving a block's buffer to the pool keeps the total as it was;
    /// when the total is over the budget, the buffer is freed).
    fn recycle_locked(&self, inner: &Inner<E>, b: Block) {
        if let Ok(v) = Arc::try_unwrap(b) {
            let room = self.budget.saturating_sub(inner.bytes + self.pool.held());
            drop(self.pool.put_within(v, room));
        }
    }

    /// Evicts until the cached blocks and the free buffers are within the
    /// budget: free buffers go first (they hold nothing to read).
    fn trim_locked(&self, inner: &mut Inner<E>) {
        let excess = (inner.bytes + self.pool.held()).saturating_sub(self.budget);
        if excess > 0 {
            self.pool.shrink(excess);
        }
        while inner.bytes + self.pool.held() > self.budget {
            match inner.evict_one() {
                Some(b) => self.recycle_locked(inner, b),
                None => break,
            }
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The most bytes of wholly served blocks kept: enough for a reader to
    /// come back to the blocks it just read, small enough that a cold load
    /// recycles buffers still in the CPU cache.
    pub fn served_cap(&self) -> u64 {
        (self.budget / 16).max(4 << 20)
    }

    pub fn stats(&self) -> CacheStats {
        let i = self.inner.lock();
        CacheStats {
            bytes: i.bytes,
            blocks: i.lru.len() + i.served.len(),
            hits: i.hits,
            misses: i.misses,
            pooled: self.pool.held(),
        }
    }

    /// True when the block is cached, being loaded, or was wholly served
    /// and evicted since (the kernel holds it): prefetch skips it.
    pub fn contains_or_loading(&self, key: &CacheKey) -> bool {
        let i = self.inner.lock();
        i.contains(key) || i.flights.contains_key(key) || i.gone.contains(key)
    }

    /// The cached block without touching recency.
    pub fn peek(&self, key: &CacheKey) -> Option<Block> {
        let i = self.inner.lock();
        i.lru
            .peek(key)
            .map(|e| e.block.clone())
            .or_else(|| i.served.peek(key).cloned())
            .or_else(|| i.large_get(key))
    }

    /// Records that a read returned `bytes` bytes of block `key`. Once the
    /// bytes recorded reach the block's length, the block moves to the
    /// served LRU, which is evicted first and kept to
    /// [`Self::served_cap`].
    pub fn served(&self, key: &CacheKey, bytes: u64) {
        let mut inner = self.inner.lock();
        let Some(e) = inner.lru.peek_mut(key) else {
            return;
        };
        e.served = e.served.saturating_add(bytes);
        if e.served < e.block.len() as u64 {
            return;
        }
        let Some(e) = inner.lru.pop(key) else {
            return;
        };
        let len = e.block.len() as u64;
        inner.served.put(*key, e.block);
        inner.served_bytes += len;
        let cap = self.served_cap();
        while inner.served_bytes > cap {
            match inner.evict_served() {
                Some(b) => self.recycle_locked(&inner, b),
                None => break,
            }
        }
    }

    fn insert_locked(&self, inner: &mut Inner<E>, key: CacheKey, block: Block) {
        let len = block.len() as u64;
        if len > self.budget / 2 {
            inner.large = Some((key, block));
            return;
        }
        if let Some(old) = inner.served.pop(&key) {
            inner.bytes -= old.len() as u64;
            inner.served_bytes -= old.len() as u64;
        }
        if let Some(old) = inner.lru.put(key, Entry { block, served: 0 }) {
            inner.bytes -= old.block.len() as u64;
        }
        inner.bytes += len;
        self.trim_locked(inner);
    }

    /// Loads `key` into the cache unless it is cached or already being
    /// loaded; never waits for another loader. Prefetch uses this: it runs
    /// on rayon workers, and a worker blocked on a flight whose owner needs
    /// a rayon worker (decoders use rayon inside) would deadlock the pool.
    pub fn load_if_absent<F>(&self, key: CacheKey, load: F) -> Option<Result<(), FetchError<E>>>
    where
        F: FnOnce() -> Result<Vec<u8>, E>,
    {
        let flight = {
            let mut inner = self.inner.lock();
            if inner.contains(&key) || inner.flights.contains_key(&key) || inner.gone.contains(&key)
            {
                return None;
            }
            let f = Arc::new(Flight {
                state: Mutex::new(None),
                done: Condvar::new(),
            });
            inner.flights.insert(key, f.clone());
            f
        };
        let guard = FlightGuard {
            cache: self,
            key,
            flight,
            finished: false,
        };
        let result = buffers::with_pool(&self.pool, load)
            .map(Arc::new)
            .map_err(|e| FetchError::Load(Arc::new(e)));
        let out = result.as_ref().map(|_| ()).map_err(Clone::clone);
        guard.finish(result);
        Some(out)
    }

    /// Returns the block for `key`, calling `load` on a miss. Concurrent
    /// callers with the same key share one `load`.
    pub fn get_or_load<F>(&self, key: CacheKey, load: F) -> Result<Block, FetchError<E>>
    where
        F: FnOnce() -> Result<Vec<u8>, E>,
    {
        self.get_or_load_as(key, load, true)
    }

    /// [`Self::get_or_load`] that never waits for another loader: while
    /// `key` is being loaded elsewhere, it calls `load` itself and returns
    /// that block without caching it. For loads nested in another block's
    /// decode (a delta's base blocks), which may run on rayon workers: see
    /// [`Self::load_if_absent`] for why those must not wait.
    pub fn get_or_load_nowait<F>(&self, key: CacheKey, load: F) -> Result<Block, FetchError<E>>
    where
        F: FnOnce() -> Result<Vec<u8>, E>,
    {
        self.get_or_load_as(key, load, false)
    }

    fn get_or_load_as<F>(&self, key: CacheKey, load: F, wait: bool) -> Result<Block, FetchError<E>>
    where
        F: FnOnce() -> Result<Vec<u8>, E>,
    {
        let flight = {
            let mut inner = self.inner.lock();
            let hit = match inner.lru.get(&key) {
                Some(e) => Some(e.block.clone()),
                None => inner
                    .served
                    .get(&key)
                    .cloned()
                    .or_else(|| inner.large_get(&key)),
            };
            if let Some(b) = hit {
                inner.hits += 1;
                return Ok(b);
            }
            inner.misses += 1;
            if inner.gone.contains(&key) {
                // The kernel dropped pages it had read: prefetch everything
                // again rather than guess which.
                inner.gone.clear();
            }
            match inner.flights.get(&key) {
                Some(f) => Err(f.clone()),
                None => {
                    let f = Arc::new(Flight {
                        state: Mutex::new(None),
                        done: Condvar::new(),
                    });
                    inner.flights.insert(key, f.clone());
                    Ok(f)
                }
            }
        };
        match flight {
            // We own the flight: load outside every lock.
            Ok(flight) => {
                let guard = FlightGuard {
                    cache: self,
                    key,
                    flight,
                    finished: false,
                };
                let result = buffers::with_pool(&self.pool, load)
                    .map(Arc::new)
                    .map_err(|e| FetchError::Load(Arc::new(e)));
                guard.finish(result.clone());
                result
            }
            // Someone else is loading it, and this caller may not wait:
            // load a copy of its own.
            Err(_) if !wait => buffers::with_pool(&self.pool, load)
                .map(Arc::new)
                .map_err(|e| FetchError::Load(Arc::new(e))),
            // Someone else is loading it: wait for their result.
            Err(flight) => {
                let mut state = flight.state.lock();
                while state.is_none() {
                    flight.done.wait(&mut state);
                }
                state.as_ref().expect("flight finished").clone()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    fn key(g: u64, b: u32) -> CacheKey {
        CacheKey {
            generation: g,
            block: BlockKey { unit: 0, block: b },
        }
    }

    #[test]
    fn hit_after_miss_and_generation_separates_versions() {
        let c: BlockCache<String> = BlockCache::new(1 << 20);
        let a = c.get_or_load(key(1, 0), || Ok(vec![1; 10])).unwrap();
        let b = c
            .get_or_load(key(1, 0), || panic!("must be cached"))
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        // Same block of another archive version: a different entry.
        let v2 = c.get_or_load(key(2, 0), || Ok(vec![2; 10])).unwrap();
        assert_eq!(v2[0], 2);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.blocks, s.bytes), (1, 2, 2, 20));
    }

    #[test]
    fn relief_gives_back_every_cached_block_but_those_still_held() {
        use ckptfs_format::memory::Relieve;
        let c: BlockCache<String> = BlockCache::new(300);
        let held = c.get_or_load(key(1, 0), || Ok(vec![1; 100])).unwrap();
        c.get_or_load(key(1, 1), || Ok(vec![2; 100])).unwrap();
        // Larger than half the budget: the side slot.
        c.get_or_load(key(1, 2), || Ok(vec![3; 200])).unwrap();
        assert_eq!(c.relieve(), 400);
        assert_eq!((c.stats().bytes, c.stats().blocks), (0, 0));
        for b in 0..3 {
            assert!(c.peek(&key(1, b)).is_none());
        }
        // A reader's block stays valid; the next load decodes again.
        assert_eq!(held[0], 1);
        let again = c.get_or_load(key(1, 0), || Ok(vec![1; 100])).unwrap();
        assert_eq!(c.stats().misses, 4);
        assert_eq!(*again, *held);
    }

    #[test]
    fn evicts_least_recently_used_to_stay_within_budget() {
        let c: BlockCache<String> = BlockCache::new(300);
        for b in 0..3 {
            c.get_or_load(key(1, b), || Ok(vec![0; 100])).unwrap();
        }
        // Touch block 0 so block 1 is the oldest.
        c.get_or_load(key(1, 0), || unreachable!()).unwrap();
        c.get_or_load(key(1, 3), || Ok(vec![0; 100])).unwrap();
        assert!(c.peek(&key(1, 0)).is_some());
        assert!(c.peek(&key(1, 1)).is_none());
        assert_eq!(c.stats().bytes, 300);
    }

    #[test]
    fn wholly_served_blocks_are_evicted_first_and_kept_to_their_cap() {
        // Budget 64 MiB: the served LRU holds at most 4 MiB.
        let c: BlockCache<String> = BlockCache::new(64 << 20);
        assert_eq!(c.served_cap(), 4 << 20);
        let mib = |v: u8| -> Result<Vec<u8>, String> { Ok(vec![v; 1 << 20]) };
        for b in 0..10 {
            c.get_or_load(key(1, b), || mib(b as u8)).unwrap();
        }
        // Block 0 read in two halves, block 1 only half: 0 is served.
        c.served(&key(1, 0), 1 << 19);
        c.served(&key(1, 0), 1 << 19);
        c.served(&key(1, 1), 1 << 19);
        // Filling the budget evicts block 0 before the older block 1 or
        // any block not yet read.
        for b in 10..64 {
            c.get_or_load(key(1, b), || mib(b as u8)).unwrap();
        }
        assert!(c.peek(&key(1, 0)).is_some(), "within budget: kept");
        c.get_or_load(key(1, 64), || mib(64)).unwrap();
        assert!(c.peek(&key(1, 0)).is_none(), "the served block went first");
        assert!(c.peek(&key(1, 1)).is_some() && c.peek(&key(1, 2)).is_some());
        // Serving more than the cap keeps only the most recent 4 MiB of
        // served blocks, and never touches unread ones.
        for b in 10..20 {
            c.served(&key(1, b), 1 << 20);
        }
        let kept: Vec<u32> = (10..20).filter(|&b| c.peek(&key(1, b)).is_some()).collect();
        assert_eq!(kept, vec![16, 17, 18, 19]);
        assert!((20..65).all(|b| c.peek(&key(1, b)).is_some()));
        assert_eq!(c.stats().bytes, (9 + 4 + 45) << 20);
        // A served block is still a hit until it is evicted.
        let b = c.get_or_load(key(1, 19), || panic!("cached")).unwrap();
        assert_eq!(b[0], 19);
    }

    #[test]
    fn served_and_evicted_blocks_are_not_prefetched_until_the_kernel_asks_again() {
        let c: BlockCache<String> = BlockCache::new(64 << 20);
        let mib = |v: u8| -> Result<Vec<u8>, String> { Ok(vec![v; 1 << 20]) };
        // Ten blocks read whole: the served LRU keeps the last 4 MiB.
        for b in 0..10 {
            c.get_or_load(key(1, b), || mib(b as u8)).unwrap();
            c.served(&key(1, b), 1 << 20);
        }
        assert!(c.peek(&key(1, 0)).is_none(), "evicted");
        // The kernel holds them: prefetch does not decode them again.
        assert!(c.contains_or_loading(&key(1, 0)));
        assert!(c.load_if_absent(key(1, 0), || unreachable!()).is_none());
        assert!(!c.contains_or_loading(&key(1, 10)), "never read");
        // A read that needs one anyway decodes it, and prefetch may again.
        assert_eq!(c.get_or_load(key(1, 1), || mib(1)).unwrap()[0], 1);
        assert!(!c.contains_or_loading(&key(1, 0)));
    }

    #[test]
    fn a_block_over_half_the_budget_is_decoded_once_and_kept_alone() {
        let c: BlockCache<String> = BlockCache::new(300);
        for b in 0..2 {
            c.get_or_load(key(1, b), || Ok(vec![0; 100])).unwrap();
        }
        // Larger than the whole budget: kept in the side slot, and the
        // LRU's blocks stay.
        let big = c.get_or_load(key(1, 9), || Ok(vec![0; 1000])).unwrap();
        assert_eq!(big.len(), 1000);
        for _ in 0..3 {
            let again = c.get_or_load(key(1, 9), || unreachable!()).unwrap();
            assert!(Arc::ptr_eq(&big, &again));
        }
        assert!(c.contains_or_loading(&key(1, 9)));
        assert!(c.peek(&key(1, 0)).is_some() && c.peek(&key(1, 1)).is_some());
        assert_eq!(c.stats().bytes, 200);
        // Only the most recent large block is kept.
        c.get_or_load(key(1, 10), || Ok(vec![0; 200])).unwrap();
        assert!(c.peek(&key(1, 9)).is_none());
        assert!(c.peek(&key(1, 10)).is_some());
        assert_eq!(c.stats().bytes, 200);
    }

    #[test]
    fn errors_reach_the_caller_and_are_not_cached() {
        let c: BlockCache<String> = BlockCache::new(1 << 20);
        let e = c
            .get_or_load(key(1, 0), || Err("checksum".to_string()))
            .unwrap_err();
        assert!(matches!(e, FetchError::Load(m) if *m == "checksum"));
        let ok = c.get_or_load(key(1, 0), || Ok(vec![7])).unwrap();
        assert_eq!(*ok, vec![7]);
    }

    #[test]
    fn load_if_absent_never_waits_for_another_loader() {
        let c: Arc<BlockCache<String>> = Arc::new(BlockCache::new(1 << 20));
        let c2 = c.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let owner = std::thread::spawn(move || {
            c2.get_or_load(key(1, 0), || {
                tx.send(()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(200));
                Ok(vec![1])
            })
        });
        rx.recv().unwrap();
        // In flight elsewhere: returns at once instead of blocking.
        assert!(c.load_if_absent(key(1, 0), || unreachable!()).is_none());
        owner.join().unwrap().unwrap();
        assert!(c.load_if_absent(key(1, 0), || unreachable!()).is_none());
        assert!(matches!(
            c.load_if_absent(key(1, 1), || Ok(vec![2])),
            Some(Ok(()))
        ));
        assert!(c.peek(&key(1, 1)).is_some());
    }

    /// A decoder's output: every byte written, a pattern of the block.
    fn decode_into_taken(b: u32, len: usize) -> Result<Vec<u8>, String> {
        let mut v = buffers::take(len as u64, "t").map_err(|e| e.to_string())?;
        for (i, x) in v.iter_mut().enumerate() {
            *x = (i as u32).wrapping_mul(31).wrapping_add(b) as u8;
        }
        Ok(v)
    }

    fn is_block(v: &[u8], b: u32) -> bool {
        v.iter()
            .enumerate()
            .all(|(i, &x)| x == (i as u32).wrapping_mul(31).wrapping_add(b) as u8)
    }

    #[test]
    fn decodes_after_eviction_reuse_the_evicted_buffers_within_the_budget() {
        const MIB: usize = 1 << 20;
        let budget = 64 << 20;
        let c: BlockCache<String> = BlockCache::new(budget);
        let within = |c: &BlockCache<String>| {
            let s = c.stats();
            assert!(s.bytes + s.pooled <= budget, "{s:?}");
        };
        // A reader holds block 7 throughout: its buffer is never reused.
        let mut held = None;
        // A cold load: each block decoded, then read whole (served).
        for b in 0..200 {
            let blk = c
                .get_or_load(key(1, b), || decode_into_taken(b, MIB))
                .unwrap();
            assert!(is_block(&blk, b), "block {b}");
            c.served(&key(1, b), MIB as u64);
            if b == 7 {
                held = Some(blk);
            }
            within(&c);
        }
        let p = c.pool_stats();
        // The served LRU keeps 4 MiB; after it filled, every decode took
        // the buffer of the block it evicted.
        assert!(p.fresh <= 6 && p.reused >= 194, "{p:?}");
        assert!(
            is_block(held.as_ref().unwrap(), 7),
            "a held block is never reused"
        );
        // Blocks decoded ahead and not read fill the budget: evicted
        // blocks' buffers are then freed, not kept, and cached plus kept
        // bytes stay within the budget.
        for b in 1000..1100 {
            c.get_or_load(key(1, b), || decode_into_taken(b, MIB))
                .unwrap();
            within(&c);
        }
        for b in 1090..1100 {
            assert!(is_block(&c.peek(&key(1, b)).unwrap(), b), "block {b}");
        }
        // Relief frees the kept buffers too.
        use ckptfs_format::memory::Relieve;
        c.relieve();
        assert_eq!((c.stats().bytes, c.stats().pooled), (0, 0));
    }

    #[test]
    fn get_or_load_nowait_loads_its_own_copy_while_another_loads() {
        let c: Arc<BlockCache<String>> = Arc::new(BlockCache::new(1 << 20));
        let c2 = c.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let owner = std::thread::spawn(move || {
            c2.get_or_load(key(1, 0), || {
                tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok(vec![1; 10])
            })
        });
        rx.recv().unwrap();
        // The owner is parked until we return: waiting would hang.
        let own = c.get_or_load_nowait(key(1, 0), || Ok(vec![1; 10])).unwrap();
        assert_eq!(*own, vec![1; 10]);
        go_tx.send(()).unwrap();
        let cached = owner.join().unwrap().unwrap();
        // The owner's block is the one cached; later calls hit it.
        let again = c
            .get_or_load_nowait(key(1, 0), || panic!("cached"))
            .unwrap();
        assert!(Arc::ptr_eq(&cached, &again));
        assert_eq!(c.stats().blocks, 1);
    }

    #[test]
    fn concurrent_misses_load_once() {
        let c: Arc<BlockCache<String>> = Arc::new(BlockCache::new(1 << 20));
        let loads = Arc::new(AtomicUsize::new(0));
        let n = 8;
        let barrier = Arc::new(Barrier::new(n));
        let threads: Vec<_> = (0..n)
            .map(|_| {
                let (c, loads, barrier) = (c.clone(), loads.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    c.get_or_load(key(1, 0), || {
                        loads.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        Ok(vec![5; 1000])
                    })
                    .unwrap()
                })
            })
            .collect();
        let blocks: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        assert!(blocks.iter().all(|b| Arc::ptr_eq(b, &blocks[0])));
    }

    #[test]
    fn concurrent_waiters_all_get_the_error() {
        let c: Arc<BlockCache<String>> = Arc::new(BlockCache::new(1 << 20));
        let loads = Arc::new(AtomicUsize::new(0));
        let n = 6;
        let barrier = Arc::new(Barrier::new(n));
        let threads: Vec<_> = (0..n)
            .map(|_| {
                let (c, loads, barrier) = (c.clone(), loads.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    c.get_or_load(key(3, 1), || {
                        loads.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        Err::<Vec<u8>, _>("bad block".to_string())
                    })
                })
            })
            .collect();
        for t in threads {
            assert!(matches!(t.join().unwrap(), Err(FetchError::Load(_))));
        }
        // All callers overlapped the single slow load (a straggler that
        // arrived after it finished would load again; allow that).
        assert!(loads.load(Ordering::SeqCst) >= 1);
        assert!(c.peek(&key(3, 1)).is_none());
    }

    #[test]
    fn a_panicking_loader_releases_its_waiters() {
        let c: Arc<BlockCache<String>> = Arc::new(BlockCache::new(1 << 20));
        let c2 = c.clone();
        let loader = std::thread::spawn(move || {
            let _ = c2.get_or_load(key(1, 0), || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                panic!("decoder bug")
            });
        });
        std::thread::sleep(std::time::Duration::from_millis(10));
        let r = c.get_or_load(key(1, 0), || Ok(vec![1]));
        assert!(loader.join().is_err());
        // Either we waited on the panicking flight, or it had finished and
        // we loaded ourselves; never a hang.
        assert!(matches!(r, Err(FetchError::Panicked) | Ok(_)));
        assert_eq!(*c.get_or_load(key(1, 0), || Ok(vec![1])).unwrap(), vec![1]);
    }
}
