//! Small libc helpers: C paths, return codes, the owner of new entries,
//! `utimensat` times.

use super::beneath::Beneath;
use super::spool::SPOOL_DIR;
use super::{Caller, FsError, Result, SetTime};
use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub(super) fn check(rc: libc::c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(FsError::Io(io::Error::last_os_error()))
    }
}

pub(super) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Gives a new entry the caller's ownership, as a local filesystem does
/// (the group of a set-group-ID parent directory wins).
/// Nothing to do when the entry was made as the caller (`--allow-other`):
/// the kernel gave it the caller's ownership already.
pub(super) fn set_owner(
    store: &Beneath,
    rel: &Path,
    caller: Caller,
    parent: &Metadata,
) -> Result<()> {
    if !is_root() || super::beneath::acting_for_caller() && !rel.starts_with(SPOOL_DIR) {
        return Ok(());
    }
    let gid = if parent.mode() & libc::S_ISGID != 0 {
        parent.gid()
    } else {
        caller.gid
    };
    Ok(store.lchown(rel, caller.uid, gid)?)
}

pub(super) fn timespec(t: Option<SetTime>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(SetTime::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(SetTime::At(t)) => match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
            Err(e) => {
                let d = e.duration();
                let mut sec = -(d.as_secs() as i64);
                let mut nsec = d.subsec_nanos() as i64;
                if nsec > 0 {
                    sec -= 1;
                    nsec = 1_000_000_000 - nsec;
                }
                libc::timespec {
                    tv_sec: sec as libc::time_t,
                    tv_nsec: nsec as libc::c_long,
                }
            }
        },
    }
}
