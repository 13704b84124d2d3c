//! One deadline for everything a request of the mount waits for from the
//! server (`--read-timeout`).
//!
//! A FUSE read of an `s3://` store may need several fetches in a row (an
//! archive's metadata, a frame's structure, then the block's payload), may
//! wait for a fetch another thread started, and each fetch retries failed
//! requests. Bounding each of them separately bounds the read only by
//! their sum (60 s for one read with `--request-timeout 5` was seen).
//! Instead a [`Scope`] opened where a request of the mount starts sets a
//! deadline for its thread, `--read-timeout` from then; every fetch and
//! every wait for another thread's fetch made on that thread ends by it
//! ([`remaining`]), whatever the retries. A scope opened inside another
//! keeps the outer deadline. Threads without a scope (the write-back
//! thread's uploads, the listing) keep only each call's own deadline.
//!
//! Background fetches started for a reader (read-ahead) open a scope of
//! their own, so that a reader waiting for them is not held past its
//! deadline either.

use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The read timeout in milliseconds; 0: none set (no scope has a deadline).
static READ_TIMEOUT_MS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Sets the read timeout of this process (`--read-timeout`).
pub fn set_read_timeout(d: Duration) {
    READ_TIMEOUT_MS.store((d.as_millis() as u64).max(1), Ordering::Relaxed);
}

/// The read timeout of this process, if one was set.
pub fn read_timeout() -> Option<Duration> {
    match READ_TIMEOUT_MS.load(Ordering::Relaxed) {
        0 => None,
        ms => Some(Duration::from_millis(ms)),
    }
}

/// The deadline of this thread's request while it lives.
pub struct Scope {
    outer: bool,
}

impl Scope {
    /// Starts the deadline of a request on this thread (nothing when no
    /// read timeout is set, or when a scope is open already).
    pub fn begin() -> Scope {
        Scope::with(read_timeout())
    }

    /// [`Self::begin`] with the timeout `timeout`.
    pub fn with(timeout: Option<Duration>) -> Scope {
        let outer = DEADLINE.with(|d| {
            if d.get().is_some() {
                return false;
            }
            match timeout {
                Some(t) => {
                    d.set(Some(Instant::now() + t));
                    true
                }
                None => false,
            }
        });
        Scope { outer }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.outer {
            DEADLINE.with(|d| d.set(None));
        }
    }
}

/// This thread's deadline, if it is in a scope.
pub fn current() -> Option<Instant> {
    DEADLINE.with(|d| d.get())
}

/// Time left before this thread's deadline (None: no deadline); an error
/// naming `what` once it has passed.
pub fn remaining(what: &str) -> io::Result<Option<Duration>> {
    let Some(at) = current() else {
        return Ok(None);
    };
    let left = at.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(expired(what));
    }
    Ok(Some(left))
}

/// The error of a request whose deadline passed while it waited for `what`.
pub fn expired(what: &str) -> io::Error {
    let secs = read_timeout().map_or(0.0, |t| t.as_secs_f64());
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{what}: no answer within the read timeout ({secs} s, --read-timeout)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_sets_one_deadline_for_its_thread_and_nested_scopes_keep_it() {
        // Without a timeout, a scope sets nothing.
        {
            let _s = Scope::with(None);
            assert!(current().is_none());
        }
        {
            let _s = Scope::with(Some(Duration::from_millis(200)));
            let first = current().expect("a deadline");
            {
                let _inner = Scope::with(Some(Duration::from_secs(60)));
                assert_eq!(current(), Some(first), "the outer deadline is kept");
            }
            assert_eq!(current(), Some(first), "an inner scope does not end it");
            assert!(remaining("x").unwrap().is_some());
            std::thread::sleep(Duration::from_millis(250));
            let e = remaining("s3://b/k bytes 0..4").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
            assert!(e.to_string().contains("s3://b/k bytes 0..4"), "{e}");
            assert!(e.to_string().contains("read timeout"), "{e}");
        }
        assert!(current().is_none(), "the scope ended");
        assert!(remaining("x").unwrap().is_none());
        // Another thread has no deadline of this one.
        std::thread::spawn(|| assert!(current().is_none()))
            .join()
            .unwrap();
    }
}
