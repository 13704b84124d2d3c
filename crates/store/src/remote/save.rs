//! Persisting a [`RemoteFile`]'s range set beside its mirror file: the
//! [`State`] format, saves queued for the saver thread at most
//! [`SAVE_DELAY`] after a fetch (one save for all the fetches of that
//! time), `Mirror::save_all` when the daemon exits, and [`load_state`] when a
//! mount starts. A save syncs the mirror file first, so a saved set never
//! claims bytes a crash could lose.

use super::{Fetching, RemoteFile, SAVE_DELAY};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::LazyLock;

/// What is persisted beside each mirror file.
#[derive(Debug, Serialize, Deserialize)]
pub struct State {
    /// Key relative to the store's prefix.
    pub rel: String,
    pub etag: String,
    pub size: u64,
    pub mtime: i64,
    /// Inode of the mirror file this state describes.
    pub ino: u64,
    pub ranges: Vec<(u64, u64)>,
    /// The disk cache's tick when this was saved: the last use of the
    /// file, for the eviction order after a restart (0: unknown).
    #[serde(default)]
    pub used: u64,
}

impl RemoteFile {
    /// Queues a save of the range set for the saver thread (or, when it
    /// cannot run, saves it now).
    pub(super) fn save_later(&self) {
        if self.dirty.swap(true, Ordering::AcqRel) {
            return; // queued already
        }
        if !*SAVER {
            self.save_if_dirty();
            return;
        }
        SAVES.lock().push(self.this.clone());
        SAVES_CV.notify_one();
    }

    /// Saves the range set if fetches changed it since the last save. A
    /// failure only costs refetching after a restart.
    pub(crate) fn save_if_dirty(&self) {
        let _saving = self.saving.lock();
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return;
        }
        if let Err(e) = self.save_locked() {
            log::warn!(
                "{}: cannot save the cache state: {e}",
                self.state_path.display()
            );
        }
    }

    /// Saves the state: the ranges present now, after syncing the mirror
    /// file. Every range in the set was written before it was marked
    /// present (by any thread), so the set taken before the sync never
    /// claims bytes a crash could lose. Saves are serialized (`saving`),
    /// so an older set never replaces a newer one; the sync runs without
    /// the state lock, so readers are not held up by it.
    pub fn persist_now(&self) -> io::Result<()> {
        let _saving = self.saving.lock();
        self.dirty.store(false, Ordering::Release);
        self.save_locked()
    }

    /// [`Self::persist_now`] for a caller that holds `saving`.
    fn save_locked(&self) -> io::Result<()> {
        if self.forgotten.load(Ordering::Acquire) {
            return Ok(());
        }
        let present = self.st.lock().present.pairs();
        self.file.sync_data()?;
        self.write_state(present)
    }

    /// [`Self::persist_now`] for a caller that holds `saving` and the
    /// state lock.
    pub(super) fn persist_locked(&self, st: &Fetching) -> io::Result<()> {
        self.file.sync_data()?;
        self.write_state(st.present.pairs())
    }

    fn write_state(&self, ranges: Vec<(u64, u64)>) -> io::Result<()> {
        let state = State {
            rel: self.rel.clone(),
            etag: self.etag.clone(),
            size: self.size,
            mtime: self.mtime,
            ino: self.ino,
            ranges,
            used: self.budget.now(),
        };
        ckptfs_format::fsutil::write_private(&self.state_path, |w| {
            serde_json::to_writer(w, &state).map_err(io::Error::other)
        })
    }

    /// Removes the persisted state (the version is gone) and stops
    /// accounting the file in the disk cache.
    pub fn forget(&self) {
        let _saving = self.saving.lock();
        self.forgotten.store(true, Ordering::Release);
        let _ = std::fs::remove_file(&self.state_path);
        self.budget.detach(self.id);
    }
}

/// Files whose range set is to be saved by the saver thread.
static SAVES: Mutex<Vec<std::sync::Weak<RemoteFile>>> = Mutex::new(Vec::new());
static SAVES_CV: Condvar = Condvar::new();
/// The saver thread, started at the first save (false: it could not be
/// started; saves are then made by the fetching thread).
static SAVER: LazyLock<bool> = LazyLock::new(|| {
    let spawned = std::thread::Builder::new()
        .name("ckptfs-s3-save".into())
        .spawn(|| loop {
            {
                let mut q = SAVES.lock();
                while q.is_empty() {
                    SAVES_CV.wait(&mut q);
                }
            }
            // Gather the fetches of the next moments into the same save.
            std::thread::sleep(SAVE_DELAY);
            let due = std::mem::take(&mut *SAVES.lock());
            for f in due.iter().filter_map(std::sync::Weak::upgrade) {
                f.save_if_dirty();
            }
        });
    if let Err(e) = &spawned {
        log::warn!("no background saves of the disk cache's state: {e}");
    }
    spawned.is_ok()
});

/// Saves now the range sets queued for the saver thread (the daemon is
/// exiting: `Mirror::save_all`).
pub(crate) fn save_queued() {
    let queued = std::mem::take(&mut *SAVES.lock());
    for f in queued.iter().filter_map(std::sync::Weak::upgrade) {
        f.save_if_dirty();
    }
}

/// Reads a persisted state (None when missing or unreadable).
pub fn load_state(path: &Path) -> Option<State> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}
