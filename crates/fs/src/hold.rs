//! Pausing commits for a live backup of STORE (`ckptfs hold`).
//!
//! A commit is the daemon's only change that moves data *out of* the spool
//! into STORE's directories (a compressed `.zstn`/`.zsame` renamed in, the
//! staged copy removed; or an invalid file put back). A copy of STORE taken
//! while one runs can miss the file: rsync passed its directory before the
//! rename and the spool after the staged copy was removed (rsync then also
//! exits 24, "vanished").
//!
//! `ckptfs hold STORE -- CMD` takes `flock(LOCK_EX)` on STORE's directory
//! for as long as CMD runs; every commit takes `flock(LOCK_SH)` on its own
//! descriptor of that directory before it takes `ns` and releases it when
//! done. So the hold waits for the commit in progress, and while it is held
//! commits wait (the write-back thread only: reads, writes, staging and
//! every other call go on, and nothing is held that they need). While
//! held, data only ever moves *into* the spool (a write or rename onto a
//! file staging it), so a copy of everything but the spool, then of the
//! spool, has every file at least once (doc/SEMANTICS.md, "Backing up a
//! live store"). The kernel drops the lock if the holder dies.
//!
//! No file is created: the lock is on the directory itself. Nothing else in
//! ckptfs flocks STORE's directory (the writer lock is a file in the spool).

use std::fs::{File, TryLockError};
use std::io;
use std::path::Path;

/// Which lock: commits share one, `ckptfs hold` excludes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `flock(LOCK_SH)`: a commit.
    Shared,
    /// `flock(LOCK_EX)`: `ckptfs hold`.
    Exclusive,
}

/// A shared or exclusive `flock` on a directory, released on drop.
pub struct DirLock<'a> {
    file: &'a File,
}

impl Drop for DirLock<'_> {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// Opens `dir` for locking.
pub fn open_dir(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
}

/// Takes a `mode` lock on `file` (std's `File` locks, `flock` on Linux):
/// at once if it is free (Ok(Some)), else None when `wait` is false; when
/// `wait` is true, calls `waiting` once and blocks until it is free.
pub fn lock<'a>(
    file: &'a File,
    mode: Mode,
    wait: bool,
    waiting: impl FnOnce(),
) -> io::Result<Option<DirLock<'a>>> {
    let tried = match mode {
        Mode::Shared => file.try_lock_shared(),
        Mode::Exclusive => file.try_lock(),
    };
    match tried {
        Ok(()) => return Ok(Some(DirLock { file })),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(e)) => return Err(e),
    }
    if !wait {
        return Ok(None);
    }
    waiting();
    loop {
        let r = match mode {
            Mode::Shared => file.lock_shared(),
            Mode::Exclusive => file.lock(),
        };
        match r {
            Ok(()) => return Ok(Some(DirLock { file })),
            // A signal woke the wait: std does not retry it.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_excludes_commits_and_waits_for_them() {
        let d = tempfile::tempdir().unwrap();
        let daemon = open_dir(d.path()).unwrap();
        let backup = open_dir(d.path()).unwrap();
        let commit = lock(&daemon, Mode::Shared, false, || {}).unwrap();
        assert!(commit.is_some());
        // A commit in progress: the hold cannot be had yet.
        assert!(lock(&backup, Mode::Exclusive, false, || {})
            .unwrap()
            .is_none());
        drop(commit);
        let hold = lock(&backup, Mode::Exclusive, false, || {}).unwrap();
        assert!(hold.is_some());
        // Held: a commit waits.
        assert!(lock(&daemon, Mode::Shared, false, || {}).unwrap().is_none());
        let t = std::thread::spawn(move || {
            let mut waited = false;
            let g = lock(&daemon, Mode::Shared, true, || waited = true).unwrap();
            assert!(g.is_some());
            waited
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(hold);
        assert!(t.join().unwrap(), "the commit had to wait for the hold");
    }
}
