//! The write-back queue: staged files waiting to be compressed, and the
//! thread that compresses them one at a time (`commit`).

use crate::fs::CheckpointFs;
use std::path::Path;

impl CheckpointFs {
    /// Queues staged file `id` for compression.
    pub(in crate::fs) fn schedule(&self, id: u64) {
        let mut q = self.queue.lock();
        if !q.contains(&id) {
            q.push_back(id);
        }
        self.queue_cv.notify_one();
    }

    /// The write-back thread: compresses queued files until `stop`.
    pub fn writeback_loop(&self, stop: &std::sync::atomic::AtomicBool) {
        use std::sync::atomic::Ordering;
        loop {
            let id = {
                let mut q = self.queue.lock();
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Some(id) = q.pop_front() {
                        break id;
                    }
                    self.queue_cv
                        .wait_for(&mut q, std::time::Duration::from_millis(500));
                }
            };
            self.commit(id);
        }
    }

    /// Wakes the write-back thread (to notice `stop`).
    pub fn wake_writeback(&self) {
        self.queue_cv.notify_all();
    }

    /// Compresses every queued file now, on this thread (tests, unmount).
    pub fn run_writeback(&self) {
        loop {
            let id = self.queue.lock().pop_front();
            match id {
                Some(id) => self.commit(id),
                None => return,
            }
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
