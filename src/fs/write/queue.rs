//! The write-back queue: staged files waiting to be compressed, and the
//! thread that compresses them one at a time (`commit`).
//!
//! A staged file is queued when its last handle closes (`writers`), when a
//! rename makes it a compression candidate, for every staged file recovered
//! at startup and for every one left at unmount. Queuing sends its spool id
//! on a channel. An id already waiting is not sent twice; an id queued again
//! while its file is being compressed is sent again, since the file changed
//! (that compression's result is discarded, see `commit`).
//!
//! The write-back thread blocks on the queue and on the stop channel at
//! once, so it wakes at once for work and for shutdown, with no polling;
//! when both are ready, stop wins. Once stopped it returns before the next
//! file, and the caller compresses what is left on its own thread
//! (`requeue_all`, then `run_writeback`), so nothing queued is dropped.
//!
//! A commit that failed to upload (a store with a sink) is queued again
//! after [`RETRY_AFTER`] while the thread runs.

use crate::fs::CheckpointFs;
use crossbeam_channel::{select_biased, Receiver, Sender};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

/// How long a failed upload waits before it is tried again.
pub(in crate::fs) const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Spool ids of staged files waiting to be compressed.
pub(in crate::fs) struct WritebackQueue {
    send: Sender<u64>,
    recv: Receiver<u64>,
    /// Ids sent and not yet received: each waits in the channel once.
    waiting: Mutex<HashSet<u64>>,
    /// Never carries a message: dropped (closing the channel) to stop.
    stop_send: Mutex<Option<Sender<()>>>,
    stop_recv: Receiver<()>,
    /// Ids whose commit failed, queued again after `RETRY_AFTER`.
    retry: Mutex<HashSet<u64>>,
}

impl WritebackQueue {
    pub(in crate::fs) fn new() -> Self {
        let (send, recv) = crossbeam_channel::unbounded();
        let (stop_send, stop_recv) = crossbeam_channel::bounded(0);
        WritebackQueue {
            send,
            recv,
            waiting: Mutex::new(HashSet::new()),
            stop_send: Mutex::new(Some(stop_send)),
            stop_recv,
            retry: Mutex::new(HashSet::new()),
        }
    }

    fn push(&self, id: u64) {
        let mut waiting = self.waiting.lock();
        if waiting.insert(id) {
            // Never fails: `self` holds the receiver.
            let _ = self.send.send(id);
        }
    }

    fn received(&self, id: u64) -> u64 {
        self.waiting.lock().remove(&id);
        id
    }

    /// Queues `id` again after `RETRY_AFTER` (while `next` is waited on).
    pub(in crate::fs) fn retry_later(&self, id: u64) {
        self.retry.lock().insert(id);
    }

    /// The next id, waiting until one is queued; None once stopped.
    fn next(&self) -> Option<u64> {
        loop {
            if self.retry.lock().is_empty() {
                return select_biased! {
                    recv(self.stop_recv) -> _ => None,
                    recv(self.recv) -> id => id.ok().map(|id| self.received(id)),
                };
            }
            select_biased! {
                recv(self.stop_recv) -> _ => return None,
                recv(self.recv) -> id => return id.ok().map(|id| self.received(id)),
                default(RETRY_AFTER) => {
                    let ids: Vec<u64> = self.retry.lock().drain().collect();
                    for id in ids {
                        self.push(id);
                    }
                }
            }
        }
    }

    /// The next id if one is queued now.
    fn try_next(&self) -> Option<u64> {
        self.recv.try_recv().ok().map(|id| self.received(id))
    }

    /// Makes `next` answer None from now on, waking a caller blocked in it.
    fn stop(&self) {
        self.stop_send.lock().take();
    }
}

impl CheckpointFs {
    /// Queues staged file `id` for compression.
    pub(in crate::fs) fn schedule(&self, id: u64) {
        self.writeback.push(id);
    }

    /// The write-back thread: compresses queued files until
    /// [`Self::stop_writeback`].
    pub fn writeback_loop(&self) {
        while let Some(id) = self.writeback.next() {
            self.commit(id);
        }
    }

    /// Makes the write-back thread return (after the file it is
    /// compressing, if any); what is still queued stays queued.
    pub fn stop_writeback(&self) {
        self.writeback.stop();
    }

    /// Compresses every queued file now, on this thread (tests, unmount).
    pub fn run_writeback(&self) {
        while let Some(id) = self.writeback.try_next() {
            self.commit(id);
        }
    }

    /// Queues every staged file nobody writes (at unmount).
    pub fn requeue_all(&self) {
        if let Some(s) = &self.spool {
            for id in s.ids_under(Path::new("")) {
                self.schedule(id);
            }
        }
    }

    /// Staged files not yet compressed.
    pub fn staged_count(&self) -> usize {
        self.spool.as_ref().map_or(0, |s| s.len())
    }
}
