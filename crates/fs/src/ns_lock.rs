//! `NsLock`: the lock that serialises namespace changes (`ns`), with a
//! generation counter so that lookups, which do not take it, can tell
//! whether a change ran while they resolved a name.
//!
//! The generation is odd while a change holds the lock and even otherwise:
//! taking the lock increments it, releasing it increments it again. A
//! lookup reads it before resolving (`stable`: None while a change runs)
//! and checks it (`unchanged`) under the inode table's lock before it
//! records what it found. A lookup that raced a change (or found nothing
//! while one ran) is done again under the lock, so a rename-over or a
//! commit is never seen half done: a name shows the old or the new file,
//! never nothing, and the inode table never records the old file under a
//! name after the change moved the new one there.

use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub(super) struct NsLock {
    m: Mutex<()>,
    generation: AtomicU64,
}

/// Held across one namespace change; ends it on drop.
pub(super) struct NsGuard<'a> {
    _g: MutexGuard<'a, ()>,
    generation: &'a AtomicU64,
}

impl Drop for NsGuard<'_> {
    fn drop(&mut self) {
        // Runs before the mutex guard (a field) is dropped.
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

impl NsLock {
    pub(super) fn lock(&self) -> NsGuard<'_> {
        let g = self.m.lock();
        self.generation.fetch_add(1, Ordering::SeqCst);
        NsGuard {
            _g: g,
            generation: &self.generation,
        }
    }

    /// The current generation, unless a change is running.
    pub(super) fn stable(&self) -> Option<u64> {
        let g = self.generation.load(Ordering::SeqCst);
        g.is_multiple_of(2).then_some(g)
    }

    /// No change started since `stable` answered `g`.
    pub(super) fn unchanged(&self, g: u64) -> bool {
        self.generation.load(Ordering::SeqCst) == g
    }
}
