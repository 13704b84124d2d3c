//! The single writer of a bucket prefix: a lock object,
//! `PREFIX/.ckptfs-writer.lock`, created with a conditional write
//! (`If-None-Match: *`, S3's atomic create-if-absent) by the one writable
//! daemon, and holding its owner, host, pid and heartbeat.
//!
//! The holder rewrites the object every `LEASE / 4` (conditional on the
//! ETag it last wrote: `If-Match`), and deletes it at a clean unmount. A
//! daemon that finds the object refuses to start, unless
//! - the object names its own owner (the cache directory's owner token: a
//!   daemon that held the lock with this cache directory died, and the
//!   cache directory's `flock` says no other daemon uses it), or
//! - its heartbeat is older than [`LEASE`] (the writer died without
//!   unmounting, or lost the server for that long);
//!
//! then it takes the lock over with a write conditional on the ETag it
//! read, so of two daemons taking over the same expired lock one wins.
//! Heartbeats are compared with this host's clock: hosts whose clocks
//! differ by more than the lease can take over a live writer's lock.
//! A holder whose heartbeat finds the object changed has lost the lock
//! and logs an error.

use super::s3::S3Client;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The lock object's key below the prefix (the mirror never shows names
/// starting with `.ckptfs`).
pub const LOCK_KEY: &str = ".ckptfs-writer.lock";

/// How long a lock without a heartbeat stays held.
pub const LEASE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Holder {
    owner: String,
    host: String,
    pid: u32,
    /// Seconds since the epoch.
    heartbeat: u64,
}

pub struct WriterLease {
    client: Arc<S3Client>,
    me: Holder,
    etag: Mutex<String>,
    stop: Mutex<Option<crossbeam_channel::Sender<()>>>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Checks, with the lock just created, that the server refuses the
/// conditional writes the lock relies on: creating it again
/// (`If-None-Match: *`) and replacing it on an ETag it does not have
/// (`If-Match`). A server that ignores them (s3s-fs 0.14 does) would let a
/// second writer take the lock without a word, so a writable mount is
/// refused there (read-only mounts need no lock).
fn check_conditions(client: &S3Client, body: &[u8]) -> io::Result<()> {
    let ignored = client.put_new(LOCK_KEY, body.to_vec()).is_ok()
        || client
            .put_if(LOCK_KEY, body.to_vec(), "\"ckptfs-no-such-etag\"")
            .is_ok();
    if ignored {
        return Err(io::Error::other(format!(
            "{}: the server ignores conditional writes (If-None-Match, If-Match), so a \
             writable mount could not keep a second writer out; mount with --read-only, or \
             use a server that honours them (AWS S3, MinIO, Ceph RGW)",
            client.url()
        )));
    }
    Ok(())
}

impl WriterLease {
    /// Takes the writer lock of the client's prefix for `owner`, or says
    /// (one line) which daemon holds it.
    pub fn acquire(client: Arc<S3Client>, owner: &str) -> io::Result<Arc<WriterLease>> {
        let mut me = Holder {
            owner: owner.to_string(),
            host: hostname(),
            pid: std::process::id(),
            heartbeat: now(),
        };
        let url = client.url().display(LOCK_KEY);
        // A lock deleted between the create and the read is tried again.
        for _ in 0..3 {
            me.heartbeat = now();
            let body = serde_json::to_vec(&me).map_err(io::Error::other)?;
            let err = match client.put_new(LOCK_KEY, body.clone()) {
                Ok(etag) => {
                    if let Err(e) = check_conditions(&client, &body) {
                        let _ = client.delete(LOCK_KEY);
                        return Err(e);
                    }
                    return Ok(Self::held(client, me, etag));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => e,
                Err(e) => return Err(e),
            };
            let (bytes, etag) = match client.get_small(LOCK_KEY, 64 << 10) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let holder: Option<Holder> = serde_json::from_slice(&bytes).ok();
            let age = holder
                .as_ref()
                .map(|h| now().saturating_sub(h.heartbeat))
                .unwrap_or(u64::MAX);
            let mine = holder.as_ref().is_some_and(|h| h.owner == me.owner);
            if !mine && age <= LEASE.as_secs() {
                let who = match &holder {
                    Some(h) => format!("pid {} on {}, heartbeat {age} s ago", h.pid, h.host),
                    None => "unreadable lock".to_string(),
                };
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{}: the store is in use by a writable ckptfs daemon ({who}); \
                         unmount it first, or mount with --read-only (a dead writer's lock \
                         expires {} s after its last heartbeat)",
                        client.url(),
                        LEASE.as_secs()
                    ),
                ));
            }
            match client.put_if(LOCK_KEY, body, &etag) {
                Ok(etag) => {
                    log::info!(
                        "{url}: took over the writer lock ({})",
                        if mine {
                            "left by a daemon of this cache directory".to_string()
                        } else {
                            format!("expired {age} s after its last heartbeat")
                        }
                    );
                    return Ok(Self::held(client, me, etag));
                }
                Err(e) => log::debug!("{url}: takeover lost: {e}; trying again ({err})"),
            }
        }
        Err(io::Error::other(format!(
            "{url}: the writer lock keeps changing; another daemon is taking it"
        )))
    }

    fn held(client: Arc<S3Client>, me: Holder, etag: String) -> Arc<WriterLease> {
        Arc::new(WriterLease {
            client,
            me,
            etag: Mutex::new(etag),
            stop: Mutex::new(None),
        })
    }

    /// Rewrites the heartbeat every `LEASE / 4` until [`Self::release`].
    pub fn spawn_heartbeat(self: &Arc<Self>) -> io::Result<()> {
        let (send, recv) = crossbeam_channel::bounded::<()>(0);
        *self.stop.lock() = Some(send);
        let l = self.clone();
        std::thread::Builder::new()
            .name("ckptfs-s3-lease".into())
            .spawn(move || {
                while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                    recv.recv_timeout(LEASE / 4)
                {
                    if !l.beat() {
                        break;
                    }
                }
            })?;
        Ok(())
    }

    /// One heartbeat; false once the lock is lost.
    fn beat(&self) -> bool {
        let mut me = self.me.clone();
        me.heartbeat = now();
        let Ok(body) = serde_json::to_vec(&me) else {
            return true;
        };
        let etag = self.etag.lock().clone();
        match self.client.put_if(LOCK_KEY, body, &etag) {
            Ok(e) => {
                *self.etag.lock() = e;
                true
            }
            Err(e) if e.to_string().contains("changed on the server") => {
                log::error!(
                    "{}: the writer lock was taken over by another daemon; \
                     this daemon is no longer the single writer ({e})",
                    self.client.url()
                );
                false
            }
            Err(e) => {
                log::warn!("{}: heartbeat failed: {e}", self.client.url());
                true
            }
        }
    }

    /// Stops the heartbeat and deletes the lock object if it is still the
    /// one this daemon wrote.
    pub fn release(&self) {
        self.stop.lock().take();
        let mine = self.etag.lock().clone();
        match self.client.get_small(LOCK_KEY, 64 << 10) {
            Ok((_, etag)) if etag == mine => {
                if let Err(e) = self.client.delete(LOCK_KEY) {
                    log::warn!("releasing the writer lock: {e}");
                }
            }
            Ok(_) => log::warn!(
                "{}: the writer lock is no longer this daemon's; left alone",
                self.client.url()
            ),
            Err(e) => log::warn!("releasing the writer lock: {e}"),
        }
    }
}
