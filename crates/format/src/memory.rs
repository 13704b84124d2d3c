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
//!   index cache) give back what they hold, and the allocation is tried
//!   again ([`with_relief`]). While it still fails it waits, asking the
//!   caches again each time, up to [`WAIT_FOR_MEMORY`]: the memory may be
//!   held by decodes in flight on other threads (the kernel's read-ahead
//!   asks for several large blocks at once), whose blocks the caches can
//!   give back once they are done. Only then is it an error
//!   ([`OutOfMemory`]), which the caller reports in one line (EIO through
//!   the mount). An allocation larger than the process's address-space
//!   limit fails at once: no waiting makes it fit.
//!
//! Relievers are held weakly: a cache that is dropped unregisters itself by
//! being gone. Relief runs on the failing thread and takes each cache's
//! own lock only (never while holding another), so it adds no lock order.

use parking_lot::Mutex;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The longest a failing allocation waits for memory held by work in
/// flight on other threads.
pub const WAIT_FOR_MEMORY: Duration = Duration::from_secs(3);

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

/// Process-wide pools (the decoders' spare buffers, the sparse delta index
/// cache): each registers its release function once, when first used, so
/// this bottom layer need not know the layers that own them.
static POOLS: Mutex<Vec<fn() -> u64>> = Mutex::new(Vec::new());

/// Registers a process-wide pool's `release` (it frees what the pool holds
/// and returns the bytes) to be called when an allocation fails. Call it
/// once per pool (a `std::sync::Once` at the pool's first use).
pub fn register_pool(release: fn() -> u64) {
    POOLS.lock().push(release);
}

/// Asks every live reliever and every registered pool for memory; returns
/// the bytes released.
pub fn relieve() -> u64 {
    let live: Vec<Arc<dyn Relieve>> = RELIEVERS.lock().iter().filter_map(Weak::upgrade).collect();
    let pools: Vec<fn() -> u64> = POOLS.lock().clone();
    live.iter().map(|r| r.relieve()).sum::<u64>()
        + pools.iter().map(|release| release()).sum::<u64>()
}

/// The process's address-space limit (`RLIMIT_AS`), None when unlimited.
fn address_space_limit() -> Option<u64> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `l`.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut l) };
    (rc == 0 && l.rlim_cur != libc::RLIM_INFINITY).then_some(l.rlim_cur)
}

/// Runs `attempt` (an allocation of `bytes`) until it succeeds: after a
/// failure the caches give memory back and it is tried again, waiting
/// between tries (5 ms, doubling up to 200 ms) up to [`WAIT_FOR_MEMORY`]
/// in all; None if it never does. One log line says what happened.
pub fn with_relief<T>(bytes: u64, mut attempt: impl FnMut() -> Option<T>) -> Option<T> {
    if let Some(v) = attempt() {
        return Some(v);
    }
    let t0 = Instant::now();
    // More than the address-space limit, or than a 47-bit user address
    // space holds: no wait makes it fit.
    let hopeless = bytes > 1 << 47 || address_space_limit().is_some_and(|l| bytes > l);
    let mut pause = Duration::from_millis(5);
    let (mut freed, mut tries) = (0u64, 0u32);
    let got = loop {
        freed += relieve();
        tries += 1;
        if let Some(v) = attempt() {
            break Some(v);
        }
        if hopeless || t0.elapsed() >= WAIT_FOR_MEMORY {
            break None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    };
    log::warn!(
        "memory: an allocation of {bytes} bytes failed; the caches gave back {freed} bytes \
         over {tries} {} in {:.2} s; {}",
        if tries == 1 { "try" } else { "tries" },
        t0.elapsed().as_secs_f64(),
        if got.is_some() {
            "then it succeeded"
        } else {
            "it still failed"
        }
    );
    got
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
    let bytes = (n as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    with_relief(bytes, || {
        let mut v = Vec::new();
        v.try_reserve_exact(n).ok().map(|_| v)
    })
    .ok_or(OutOfMemory { bytes })
}

/// Checks that `bytes` more can be allocated now: reserves them (address
/// space only: nothing is written, so nothing becomes resident) and frees
/// them at once, asking the caches for memory when they cannot be had.
pub fn ensure_headroom(bytes: u64) -> Result<(), OutOfMemory> {
    let err = OutOfMemory { bytes };
    let n = usize::try_from(bytes).map_err(|_| err)?;
    with_relief(bytes, || Vec::<u8>::new().try_reserve_exact(n).ok()).ok_or(err)
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
