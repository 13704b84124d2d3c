//! Test hooks: named points where the daemon (or `ckptfs repack`) can be
//! made to stop for good or to wait, so that an integration test can kill
//! it, or race it, at exactly that point of a multi-step change.
//!
//! A test sets `CKPTFS_TEST_PAUSE=POINT[@N]` or `CKPTFS_TEST_DELAY=POINT:MS`
//! in the environment of the `ckptfs` process it starts. The points are
//! listed with [`pause`] and [`delay`].
//!
//! The variables are read only in builds with debug assertions, not under
//! `cfg(test)`: the integration tests (tests/*.rs) drive the `ckptfs`
//! binary, which cargo builds for them without `cfg(test)` (that is set
//! only for a crate's own unit tests), but with the dev profile, which
//! has debug assertions. Release builds (`cargo install`, `cargo build
//! --release`) have none: there both hooks are empty, inlined away, and
//! the variables' names are not even in the binary.
//!
//! Depends on nothing but `std` and `log`.

/// Test hook: with `CKPTFS_TEST_PAUSE=POINT` in its environment, the
/// daemon (or `ckptfs repack`) logs and stops for good at POINT (a test
/// then kills it with SIGKILL there): `standalone` (a delta's `.zstn`
/// installed by `make_standalone`, its `.z4dm` not yet removed),
/// `release` (a dependent of a released base rewritten, the released
/// file not yet removed), `rename` (a rename done, trailers not yet
/// rewritten), `delta-commit` (a delta committed, the staged copy and the
/// old version not yet removed), `family` (a predecessor's `.z4dm`
/// installed, its `.zstn` not yet removed). `POINT@N` stops at the Nth
/// pass instead of the first. Nothing in release builds.
#[inline(always)]
pub(crate) fn pause(point: &str) {
    #[cfg(debug_assertions)]
    from_env::pause(point);
    #[cfg(not(debug_assertions))]
    let _ = point;
}

/// Test hook: with `CKPTFS_TEST_DELAY=POINT:MS` in its environment, the
/// daemon waits MS milliseconds each time it passes POINT (at most 10 s):
/// `open-staged` (an open of a staged file, between its look at the inode's
/// kind and its choice of io mode), to let a commit run in that window;
/// `archive-parse` (before an archive version not seen yet is opened and
/// parsed), to let the file be replaced or removed in that window;
/// `settle` (before the family thread settles a committed file's family),
/// to unmount or kill the daemon with families queued; `release` (before
/// the family thread rebases the dependents of a released base).
/// Nothing in release builds.
#[inline(always)]
pub(crate) fn delay(point: &str) {
    #[cfg(debug_assertions)]
    from_env::delay(point);
    #[cfg(not(debug_assertions))]
    let _ = point;
}

/// The hooks as the environment asks for them (debug builds only).
#[cfg(debug_assertions)]
mod from_env {
    use std::sync::atomic::{AtomicU64, Ordering};

    pub(super) fn pause(point: &str) {
        static PASSED: AtomicU64 = AtomicU64::new(0);
        let Some(v) = std::env::var_os("CKPTFS_TEST_PAUSE") else {
            return;
        };
        let v = v.to_string_lossy();
        let (at, nth) = match v.split_once('@') {
            Some((at, n)) => (at, n.parse::<u64>().unwrap_or(1)),
            None => (&*v, 1),
        };
        if at == point && PASSED.fetch_add(1, Ordering::Relaxed) + 1 >= nth {
            log::warn!("test hook: paused at {point}");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }

    pub(super) fn delay(point: &str) {
        let Some(v) = std::env::var_os("CKPTFS_TEST_DELAY") else {
            return;
        };
        let v = v.to_string_lossy();
        if let Some(ms) = v
            .strip_prefix(point)
            .and_then(|r| r.strip_prefix(':'))
            .and_then(|ms| ms.parse::<u64>().ok())
        {
            std::thread::sleep(std::time::Duration::from_millis(ms.min(10_000)));
        }
    }
}
