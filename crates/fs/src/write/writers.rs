//! Who has a file open for writing, and what the last close does.
//!
//! `CheckpointFs::writers` counts the open handles with write access per
//! backing identity (and truncates in progress). When the last writer of a
//! staged file closes and no other handle has it open, the file is queued
//! for compression (see `queue`).

use crate::inode::Identity;
use crate::CheckpointFs;

impl CheckpointFs {
    pub(crate) fn writer_count(&self, id: Identity) -> usize {
        self.writers.lock().get(&id).copied().unwrap_or(0)
    }

    pub(super) fn add_writer(&self, id: Identity) {
        *self.writers.lock().entry(id).or_default() += 1;
    }

    /// Called when a handle with write access to `id` closes.
    pub(crate) fn writer_closed(&self, id: Identity) {
        let last = {
            let mut w = self.writers.lock();
            match w.get_mut(&id) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    w.remove(&id);
                    true
                }
                None => false,
            }
        };
        if last {
            self.handle_closed(id);
        }
    }

    /// Called when a handle of backing file `id` closes: a staged file
    /// nothing has open any more is queued for compression.
    pub(crate) fn handle_closed(&self, id: Identity) {
        if self.writer_count(id) == 0 && !self.is_open(id) {
            if let Some(s) = &self.spool {
                if let Some(sid) = s.find_identity(id) {
                    self.schedule(sid);
                }
            }
        }
    }
}
