//! What a running mount daemon holds outside the filesystem, so that other
//! `ckptfs` processes can find it and never run beside it unsafely:
//!
//! - the store's *writer lock*: `STORE/.ckptfs-spool/writer.lock`, held
//!   with `flock(LOCK_EX)` by the one writable daemon of a store from before
//!   spool recovery until it exits, with its pid written inside. A second
//!   writable mount of the store fails with a one-line error naming that
//!   pid. The kernel drops a flock when its holder dies, so the lock of a
//!   killed daemon is taken over by the next mount, which then recovers the
//!   spool (the file's pid is only a message, never trusted). Read-only
//!   mounts never touch the spool and take no lock. `ckptfs repack` holds
//!   it too, while it rewrites the store (the pid followed by `repack`), so
//!   neither runs beside the other.
//! - the *outcome file* (`$XDG_STATE_HOME/ckptfs/mount-NAME.outcome`, beside
//!   the daemon's log): written by a daemon that exits with files not
//!   uploaded (an `s3://` store), its pid on the first line and one line
//!   per file after; `ckptfs umount` prints them and exits 1. A daemon that
//!   starts, or exits with nothing left, removes it.
//!
//! and how `ckptfs umount` finds the daemon of a mount to wait for it
//! ([`daemon_pids`]): from the mount itself, with no pid file.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Name of the writer lock inside the spool directory.
pub const WRITER_LOCK: &str = "writer.lock";

/// The store's writer lock, held until dropped (or the process dies).
#[derive(Debug)]
pub struct WriterLock {
    _file: File,
}

/// Who takes the writer lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taker {
    Mount,
    Repack,
}

impl WriterLock {
    /// Takes the writer lock of `store` for a writable mount, or says
    /// which process holds it.
    pub fn acquire(store: &Path) -> anyhow::Result<WriterLock> {
        Self::take(store, Taker::Mount)
    }

    /// Takes the writer lock of `store` for `ckptfs repack`, or says which
    /// process holds it.
    pub fn acquire_for_repack(store: &Path) -> anyhow::Result<WriterLock> {
        Self::take(store, Taker::Repack)
    }

    fn take(store: &Path, me: Taker) -> anyhow::Result<WriterLock> {
        let dir = store.join(crate::fs::spool::SPOOL_DIR);
        // The spool is private (0700), as `Spool::open` makes it; taken
        // first, the lock is what creates it.
        crate::fsutil::create_dirs(&dir, 0o700, 0o755)
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        let path = dir.join(WRITER_LOCK);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        // std's File::try_lock: flock(LOCK_EX | LOCK_NB) on Linux.
        if let Err(e) = file.try_lock() {
            if let std::fs::TryLockError::Error(e) = e {
                anyhow::bail!("{}: cannot lock: {e}", path.display());
            }
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let mut words = text.split_whitespace();
            let holder = match words.next().map(str::parse::<u32>) {
                Some(Ok(pid)) => format!("pid {pid}"),
                _ => "another process".to_string(),
            };
            let store = store.display();
            match (words.next() == Some("repack"), me) {
                (true, Taker::Mount) => anyhow::bail!(
                    "{store}: `ckptfs repack` ({holder}) is rewriting the store; \
                     mount it when that is done, or mount with --read-only"
                ),
                (true, Taker::Repack) => anyhow::bail!(
                    "{store}: another `ckptfs repack` ({holder}) is rewriting the store"
                ),
                (false, Taker::Mount) => anyhow::bail!(
                    "{store}: the store is in use by a writable ckptfs daemon ({holder}); \
                     unmount it first (`ckptfs umount` waits for it), or mount with --read-only"
                ),
                (false, Taker::Repack) => anyhow::bail!(
                    "{store}: mounted by a writable ckptfs daemon ({holder}); \
                     repack rewrites an unmounted store only: unmount it first \
                     (`ckptfs umount` waits for it)"
                ),
            }
        }
        let mine = match me {
            Taker::Mount => format!("{}\n", std::process::id()),
            Taker::Repack => format!("{} repack\n", std::process::id()),
        };
        file.set_len(0)
            .and_then(|_| file.rewind())
            .and_then(|_| file.write_all(mine.as_bytes()))
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok(WriterLock { _file: file })
    }
}

/// The pids of the ckptfs daemons serving the mount at `mountpoint`
/// (canonical), found from the mount itself rather than from a state file
/// (whose place depends on the environment of whoever started it): a
/// process is one when it holds the FUSE device `/dev/fuse` open, is
/// `ckptfs mount` (its `argv[0]` is named `ckptfs`), and one of its
/// arguments after `mount`, resolved against its working directory, is
/// this mountpoint. A pid reused by another program fails the first two
/// tests, so nothing stale is ever waited for. Usually one pid; two when a
/// lazily detached daemon still serves open files at the same path (both
/// have work to finish). Processes whose `/proc` entries cannot be read
/// (another user's) are skipped: they cannot be this user's daemon.
pub fn daemon_pids(mountpoint: &Path) -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && serves(pid, mountpoint))
        .collect();
    pids.sort_unstable();
    pids
}

/// Where the daemon serving `mountpoint` leaves what it could not finish.
pub fn outcome_path(mountpoint: &Path) -> PathBuf {
    super::mount::log_path(mountpoint).with_extension("outcome")
}

/// Records, for `ckptfs umount`, the lines `left` (what this daemon could
/// not finish); none: removes the record.
pub fn write_outcome(mountpoint: &Path, left: &[String]) -> std::io::Result<()> {
    let path = outcome_path(mountpoint);
    if left.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    crate::fsutil::write_private(&path, |w| {
        writeln!(w, "{}", std::process::id())?;
        for l in left {
            writeln!(w, "{}", l.replace('\n', " "))?;
        }
        Ok(())
    })
}

/// The lines daemon `pid` recorded at its exit, if it recorded any (the
/// record is then removed).
pub fn take_outcome(mountpoint: &Path, pid: u32) -> Option<Vec<String>> {
    let path = outcome_path(mountpoint);
    let text = std::fs::read_to_string(&path).ok()?;
    let mut lines = text.lines();
    if lines.next()?.trim().parse::<u32>().ok()? != pid {
        return None;
    }
    let left: Vec<String> = lines.map(str::to_string).collect();
    let _ = std::fs::remove_file(&path);
    Some(left)
}

fn serves(pid: u32, mountpoint: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let is_ckptfs = args.first().is_some_and(|a| {
        Path::new(std::ffi::OsStr::from_bytes(a)).file_name() == Some("ckptfs".as_ref())
    });
    let Some(at) = args.iter().position(|a| *a == b"mount") else {
        return false;
    };
    if !is_ckptfs || !holds_dev_fuse(pid) {
        return false;
    }
    let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
        return false;
    };
    args[at + 1..].iter().any(|a| {
        !a.is_empty()
            && cwd
                .join(std::ffi::OsStr::from_bytes(a))
                .canonicalize()
                .is_ok_and(|p| p == mountpoint)
    })
}

fn holds_dev_fuse(pid: u32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|e| e.ok())
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == Path::new("/dev/fuse")))
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                // Field 3 (after the parenthesised comm) is the state; a
                // zombie has exited.
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    != Some("Z")
            })
            .unwrap_or(false)
}

/// Waits until `pid` has exited, or `timeout` passes (returns false).
/// `tick` is called about every 100 ms with the time waited so far.
pub fn wait_exit(pid: u32, timeout: Option<Duration>, tick: &dyn Fn(Duration)) -> bool {
    let start = Instant::now();
    while alive(pid) {
        let waited = start.elapsed();
        if timeout.is_some_and(|t| waited >= t) {
            return false;
        }
        tick(waited);
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}
