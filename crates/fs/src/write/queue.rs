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
//! A commit that failed (out of space, an upload refused) is queued again
//! while the thread runs, with exponential back-off: [`RETRY_AFTER`] after
//! the first failure, doubling up to [`RETRY_MAX`]. Its last error is kept
//! until it succeeds: what is still staged when the daemon exits is
//! reported ([`CheckpointFs::not_uploaded`]), never dropped.

use crate::CheckpointFs;
use crossbeam_channel::{select_biased, Receiver, Sender};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a failed upload waits before it is tried again the first time.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(2);
/// The longest wait between two tries of a failing upload.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(60);

/// The wait before try `failures + 1` of a commit that failed `failures`
/// times in a row.
pub(crate) fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (RETRY_AFTER * (1u32 << doublings)).min(RETRY_MAX)
}

/// A commit that failed: how many times in a row, and the last error.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub count: u32,
    pub error: String,
}

/// Spool ids of staged files waiting to be compressed.
pub(crate) struct WritebackQueue {
    send: Sender<u64>,
    recv: Receiver<u64>,
    /// Ids sent and not yet received: each waits in the channel once.
    waiting: Mutex<HashSet<u64>>,
    /// Never carries a message: dropped (closing the channel) to stop.
    stop_send: Mutex<Option<Sender<()>>>,
    stop_recv: Receiver<()>,
    /// Ids whose commit failed, and when each is queued again.
    retry: Mutex<HashMap<u64, Instant>>,
    /// Ids whose last commit failed (until one succeeds).
    failures: Mutex<HashMap<u64, Failure>>,
}

impl WritebackQueue {
    pub(crate) fn new() -> Self {
        let (send, recv) = crossbeam_channel::unbounded();
        let (stop_send, stop_recv) = crossbeam_channel::bounded(0);
        WritebackQueue {
            send,
            recv,
            waiting: Mutex::new(HashSet::new()),
            stop_send: Mutex::new(Some(stop_send)),
            stop_recv,
            retry: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
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

    /// Records that the commit of `id` failed with `error`, and queues it
    /// again after its back-off (while `next` is waited on). Returns the
    /// wait.
    pub(crate) fn retry_later(&self, id: u64, error: String) -> Duration {
        let count = {
            let mut f = self.failures.lock();
            let e = f.entry(id).or_insert(Failure {
                count: 0,
                error: String::new(),
            });
            e.count += 1;
            e.error = error;
            e.count
        };
        let wait = backoff(count);
        self.retry.lock().insert(id, Instant::now() + wait);
        wait
    }

    /// The commit of `id` succeeded (or `id` is gone): forgets its failures.
    pub(crate) fn succeeded(&self, id: u64) {
        self.failures.lock().remove(&id);
        self.retry.lock().remove(&id);
    }

    /// The last failure of `id`'s commit, if its last commit failed.
    pub(crate) fn failure(&self, id: u64) -> Option<Failure> {
        self.failures.lock().get(&id).cloned()
    }

    /// The next id, waiting until one is queued; None once stopped.
    fn next(&self) -> Option<u64> {
        loop {
            let due = self.retry.lock().values().min().copied();
            let Some(due) = due else {
                return select_biased! {
                    recv(self.stop_recv) -> _ => None,
                    recv(self.recv) -> id => id.ok().map(|id| self.received(id)),
                };
            };
            let wait = due.saturating_duration_since(Instant::now());
            select_biased! {
                recv(self.stop_recv) -> _ => return None,
                recv(self.recv) -> id => return id.ok().map(|id| self.received(id)),
                default(wait) => {
                    let now = Instant::now();
                    let ids: Vec<u64> = {
                        let mut r = self.retry.lock();
                        let ids: Vec<u64> =
                            r.iter().filter(|(_, &t)| t <= now).map(|(&id, _)| id).collect();
                        for id in &ids {
                            r.remove(id);
                        }
                        ids
                    };
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
    pub(crate) fn schedule(&self, id: u64) {
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

    /// With a sink: one line per staged file not uploaded (its remote name
    /// and its last upload error, or that it was not tried), sorted; they
    /// stay staged, and the next mount uploads them. Empty without a sink.
    pub fn not_uploaded(&self) -> Vec<String> {
        let (Some(sink), Some(spool)) = (&self.sink, &self.spool) else {
            return Vec::new();
        };
        let mut v: Vec<String> = spool
            .ids_under(Path::new(""))
            .into_iter()
            .filter_map(|id| {
                let e = spool.entry(id)?;
                let why = match self.writeback.failure(id) {
                    Some(f) => format!("upload failed ({} tries): {}", f.count, f.error),
                    None => "not uploaded yet".to_string(),
                };
                Some(format!("{}: {why}", sink.describe(&e.target)))
            })
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_commits_back_off_exponentially_up_to_a_limit() {
        assert_eq!(backoff(1), RETRY_AFTER);
        assert_eq!(backoff(2), RETRY_AFTER * 2);
        assert_eq!(backoff(3), RETRY_AFTER * 4);
        assert_eq!(backoff(10), RETRY_MAX);
        assert_eq!(backoff(u32::MAX), RETRY_MAX);
        let q = WritebackQueue::new();
        assert_eq!(q.retry_later(7, "first".into()), RETRY_AFTER);
        assert_eq!(q.retry_later(7, "second".into()), RETRY_AFTER * 2);
        let f = q.failure(7).unwrap();
        assert_eq!((f.count, f.error.as_str()), (2, "second"));
        q.succeeded(7);
        assert!(q.failure(7).is_none());
        assert!(q.retry.lock().is_empty());
    }
}
