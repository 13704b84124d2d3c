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
mod tests;
