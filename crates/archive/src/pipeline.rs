//! Streaming a run of blocks out in order while the pool decodes ahead:
//! the engine under `unpack`, `verify` and whole-unit digests.
//!
//! The calling thread hands each decoded block to a sink (a write, a hash)
//! in block order; the pool's threads decode the blocks after it, at most
//! `ahead` decoded bytes beyond the one being consumed. A continuous
//! pipeline rather than alternating windows, so that the sink and the
//! decoders overlap from the first block to the last even for a file of a
//! few blocks, and block buffers go back to `codec::buffers` soon enough to
//! be reused (a fresh buffer costs a page fault per 4 KiB).
//!
//! Invariants: the sink sees every block exactly once, in order, or the run
//! stops at the first error (a decode's or the sink's), which is returned;
//! decoded bytes held at once stay under `ahead` plus one block (or one
//! block per pool thread, when blocks are larger); a decoder that panicked
//! is an error for its block, never a consumer waiting forever.

use super::{ArchiveError, ArchiveView, BlockKey};
use rayon::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

type Decoded = std::result::Result<Vec<u8>, ArchiveError>;

/// Hands the blocks `keys` of `a` to `sink` in order, on the calling
/// thread, decoded by the rayon pool at most `ahead` bytes in advance.
/// With a pool of one thread everything runs on the calling thread, one
/// block at a time (`--threads 1` means one core). Called from one of the
/// pool's own threads (`verify` digests units in parallel), it must not
/// block that thread on a condition variable, since every thread of the
/// pool could end up waiting for work none is left to run: it decodes in
/// [`windows`] instead, whose waits run pending work.
pub(super) fn each_decoded<A: ArchiveView + ?Sized, E: From<ArchiveError> + Send>(
    a: &A,
    keys: &[BlockKey],
    ahead: u64,
    sink: &mut dyn FnMut(&[u8]) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let consume = |d: Vec<u8>, sink: &mut dyn FnMut(&[u8]) -> Result<(), E>| {
        let r = sink(&d);
        ckptfs_codec::buffers::recycle(d);
        r
    };
    if rayon::current_num_threads() <= 1 {
        for key in keys {
            consume(a.decode_block(*key)?, sink)?;
        }
        return Ok(());
    }
    if rayon::current_thread_index().is_some() {
        return windows(a, keys, ahead, sink);
    }
    let lens = keys
        .iter()
        .map(|k| a.block_len(*k))
        .collect::<Result<Vec<u64>, _>>()?;
    let slots: Mutex<Vec<Option<Decoded>>> = Mutex::new((0..keys.len()).map(|_| None).collect());
    let ready = Condvar::new();
    // Set when the consumer stops early: blocks not yet started are skipped.
    let stop = AtomicBool::new(false);
    // At least this many blocks are in flight whatever their size, so that
    // every thread of the pool has one.
    let min_ahead = rayon::current_num_threads();
    rayon::in_place_scope(|s| {
        let (mut next, mut held) = (0usize, 0u64);
        let mut run = || -> std::result::Result<(), E> {
            for i in 0..keys.len() {
                while next < keys.len() && (next < i + min_ahead || held + lens[next] <= ahead) {
                    let (j, key) = (next, keys[next]);
                    let (slots, ready, stop) = (&slots, &ready, &stop);
                    s.spawn(move |_| {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        // A decoder must not panic; if one did, the
                        // consumer waiting for this slot gets an error
                        // instead of waiting forever.
                        let d = catch_unwind(AssertUnwindSafe(|| a.decode_block(key)))
                            .unwrap_or_else(|_| {
                                Err(a.integrity(format!(
                                    "decoding block {} of unit {} panicked",
                                    key.block, key.unit
                                )))
                            });
                        lock(slots)[j] = Some(d);
                        ready.notify_all();
                    });
                    held += lens[next];
                    next += 1;
                }
                let d = {
                    let mut g = lock(&slots);
                    loop {
                        if let Some(d) = g[i].take() {
                            break d;
                        }
                        g = ready.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                };
                held -= lens[i];
                consume(d?, sink)?;
            }
            Ok(())
        };
        let r = run();
        if r.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        r
    })
}

/// The pipeline for callers on a pool thread: windows of about `window`
/// decoded bytes, each decoded by a parallel iterator while `sink` takes
/// the one before; waiting on a window runs pending pool work, so nested
/// use cannot starve the pool. Two windows are held at once.
fn windows<A: ArchiveView + ?Sized, E: From<ArchiveError> + Send>(
    a: &A,
    keys: &[BlockKey],
    window: u64,
    sink: &mut dyn FnMut(&[u8]) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let mut runs = Vec::new();
    let mut k = 0;
    while k < keys.len() {
        let (mut j, mut bytes) = (k, 0);
        while j < keys.len() && (j == k || bytes < window) {
            bytes += a.block_len(keys[j])?;
            j += 1;
        }
        runs.push(&keys[k..j]);
        k = j;
    }
    let decode = |w: &[BlockKey]| -> Result<Vec<Vec<u8>>, ArchiveError> {
        w.par_iter().map(|key| a.decode_block(*key)).collect()
    };
    let mut next = runs.first().map(|w| decode(w));
    for i in 0..runs.len() {
        let blocks = next
            .take()
            .expect("a window is decoded before it is consumed")?;
        let ahead = runs.get(i + 1).copied();
        rayon::in_place_scope(|s| {
            if let Some(w) = ahead {
                s.spawn(|_| next = Some(decode(w)));
            }
            for d in blocks {
                let r = sink(&d);
                ckptfs_codec::buffers::recycle(d);
                r?;
            }
            Ok::<(), E>(())
        })?;
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
