//! The decoded indexes of sliced sparse frames (`codec::sparse`), shared by
//! every open archive and bounded in bytes.
//!
//! A delta's DELTA unit whose XOR is a `ZSP1` frame is read block by block
//! (`archive::delta`); each block needs the frame's bitmap and values,
//! which decode only whole. They are decoded once per unit and kept here,
//! least recently used first out, up to [`BUDGET`] bytes in all, beside the
//! block cache (the blocks themselves are cached there as any other). An
//! index larger than the budget is built for each block that needs it
//! (ckptfs writes sparse frames only for tensors up to 64 MiB, whose index
//! is at most about 20 MiB).
//!
//! Concurrency: the first block of a unit builds its index while the other
//! blocks of that unit wait for it, so an index is built once. A build
//! must not use rayon: a worker waiting in it for a stolen task could take
//! a block of the same unit and wait on the index it is building (a ZSP1
//! frame's bitmap and value streams are single zstd frames or stored, so
//! `SparseFrame::index` decodes on its own thread).

use ckptfs_codec::sparse::SparseIndex;
use ckptfs_codec::Result;
use lru::LruCache;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Bytes of indexes kept at most.
pub const BUDGET: usize = 64 << 20;

/// An archive's key in the cache: unique for the process's lifetime.
pub fn new_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

type Slot = Arc<OnceLock<Result<Arc<SparseIndex>>>>;

struct Cache {
    /// Each unit's slot, and the bytes counted for it in `held` (0 until
    /// its index is built and counted).
    slots: LruCache<(u64, u32), (Slot, usize)>,
    held: usize,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn with_cache<T>(f: impl FnOnce(&mut Cache) -> T) -> T {
    let mut g = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let c = g.get_or_insert_with(|| Cache {
        slots: LruCache::unbounded(),
        held: 0,
    });
    f(c)
}

impl Cache {
    fn pop(&mut self, key: &(u64, u32)) {
        if let Some((_, n)) = self.slots.pop(key) {
            self.held -= n;
        }
    }
}

/// The index of unit `unit` of archive `owner`, built by `build` when it
/// is not kept. A failed build is not kept: the next call builds again.
pub fn get_or_build(
    owner: u64,
    unit: u32,
    build: impl FnOnce() -> Result<SparseIndex>,
) -> Result<Arc<SparseIndex>> {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| ckptfs_format::memory::register_pool(release));
    let key = (owner, unit);
    let slot = with_cache(|c| {
        c.slots
            .get_or_insert(key, || (Slot::default(), 0))
            .0
            .clone()
    });
    let mut built = false;
    let r = slot
        .get_or_init(|| {
            built = true;
            build().map(Arc::new)
        })
        .clone();
    if built {
        with_cache(|c| {
            if !c.slots.peek(&key).is_some_and(|e| Arc::ptr_eq(&e.0, &slot)) {
                return;
            }
            match &r {
                Err(_) => c.pop(&key),
                Ok(ix) => {
                    let n = ix.held_bytes();
                    if let Some(e) = c.slots.peek_mut(&key) {
                        e.1 = n;
                    }
                    c.held += n;
                    while c.held > BUDGET {
                        let Some((_, (_, n))) = c.slots.pop_lru() else {
                            break;
                        };
                        c.held -= n;
                    }
                }
            }
        });
    }
    r
}

/// Forgets every index of archive `owner` (when it is dropped).
pub fn forget(owner: u64) {
    with_cache(|c| {
        let keys: Vec<(u64, u32)> = c
            .slots
            .iter()
            .filter(|(k, _)| k.0 == owner)
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            c.pop(&k);
        }
    });
}

/// Forgets every built index (when memory runs short: [`ckptfs_format::memory`]);
/// returns the bytes they held. Each is built again on its next use.
pub fn release() -> u64 {
    let slots = with_cache(|c| {
        c.held = 0;
        std::mem::replace(&mut c.slots, LruCache::unbounded())
    });
    slots.iter().map(|(_, (_, n))| *n as u64).sum()
}

/// Bytes held now (for tests).
pub fn held_bytes() -> usize {
    with_cache(|c| c.held)
}
