//! Allocations sized by archive content, made fallible, and the hook
//! through which caches give memory back when one fails.
//!
//! The daemon must stay up under an address-space limit (`prlimit --as`,
//! doc/SEMANTICS.md): an allocation whose size an archive decides (a
//! header's parsed structures, a decoded block) must fail as an error for
//! that archive or read, never abort the process. Rust's ordinary
//! allocations abort on failure, so:
//!
//! - vectors sized by a count or length read from an archive are made with
//!   [`try_vec`] (a `try_reserve_exact`);
//! - work whose allocations cannot be made fallible one by one (serde
//!   building a parsed header, a codec filling its output) first asks for
//!   its worst case with [`ensure_headroom`]: the address space is
//!   reserved and released at once (large allocations are their own
//!   mappings, so this costs no resident memory), which tells whether the
//!   work fits now;
//! - when either fails, every registered [`Relieve`] (the mount's block
//!   cache) and the process-wide pools (decoder buffers, the sparse delta
//!   index cache) give back what they hold, and the
//!   allocation is tried once more. Only then is it an error
//!   ([`OutOfMemory`]), which the caller reports in one line (EIO through
//!   the mount).
//!
//! Relievers are held weakly: a cache that is dropped unregisters itself by
//! being gone. Relief runs on the failing thread and takes each cache's
//! own lock only (never while holding another), so it adds no lock order.

use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// A cache that can give memory back.
pub trait Relieve: Send + Sync {
    /// Drops everything it can rebuild; returns the bytes released.
    fn relieve(&self) -> u64;
}

static RELIEVERS: Mutex<Vec<Weak<dyn Relieve>>> = Mutex::new(Vec::new());

/// Registers `r` to be asked for memory when an allocation fails.
pub fn register(r: &Arc<dyn Relieve>) {
    let mut v = RELIEVERS.lock();
    v.retain(|w| w.strong_count() > 0);
    v.push(Arc::downgrade(r));
}

/// Asks every live reliever for memory; returns the bytes released.
pub fn relieve() -> u64 {
    let live: Vec<Arc<dyn Relieve>> = RELIEVERS.lock().iter().filter_map(Weak::upgrade).collect();
    let freed = live.iter().map(|r| r.relieve()).sum::<u64>()
        + crate::codec::buffers::release()
        + crate::archive::sparse_cache::release();
    log::warn!("memory: an allocation failed; caches gave back {freed} bytes");
    freed
}

/// An allocation of `bytes` failed even after the caches gave memory back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not enough memory for {bytes} bytes (the caches gave back what they held)")]
pub struct OutOfMemory {
    pub bytes: u64,
}

/// An empty vector with room for exactly `n` elements, or an error (after
/// the caches gave memory back) instead of an abort.
pub fn try_vec<T>(n: usize) -> Result<Vec<T>, OutOfMemory> {
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_ok() {
        return Ok(v);
    }
    relieve();
    v.try_reserve_exact(n).map_err(|_| OutOfMemory {
        bytes: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    })?;
    Ok(v)
}

/// Checks that `bytes` more can be allocated now: reserves them (address
/// space only: nothing is written, so nothing becomes resident) and frees
/// them at once, asking the caches for memory when they cannot be had.
pub fn ensure_headroom(bytes: u64) -> Result<(), OutOfMemory> {
    let err = OutOfMemory { bytes };
    let n = usize::try_from(bytes).map_err(|_| err)?;
    let probe = || Vec::<u8>::new().try_reserve_exact(n).is_ok();
    if probe() {
        return Ok(());
    }
    relieve();
    if probe() {
        Ok(())
    } else {
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Counting(AtomicU64);
    impl Relieve for Counting {
        fn relieve(&self) -> u64 {
            self.0.fetch_add(1, Ordering::SeqCst);
            7
        }
    }

    #[test]
    fn an_impossible_allocation_is_an_error_after_asking_the_caches() {
        let c = Arc::new(Counting(AtomicU64::new(0)));
        let r: Arc<dyn Relieve> = c.clone();
        register(&r);
        let e = try_vec::<u64>(usize::MAX / 8).unwrap_err();
        assert_eq!(e.bytes, (usize::MAX / 8) as u64 * 8);
        assert!(ensure_headroom(u64::MAX / 2).is_err());
        assert!(c.0.load(Ordering::SeqCst) >= 2);
        // A possible one is made, with exactly the room asked for.
        let v = try_vec::<u32>(1000).unwrap();
        assert!(v.capacity() >= 1000 && v.is_empty());
        assert!(ensure_headroom(1 << 20).is_ok());
    }
}
