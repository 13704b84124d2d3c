//! `ckptfs umount`: unmounts, waits for the daemon to finish, and says
//! what it left undone (files not uploaded, staged files not compressed).

use super::log_path;
use super::table::{mount_at, unescape};
use crate::cli::UmountArgs;
use crate::commands::daemon_state;
use crate::commands::{Global, Result};
use anyhow::Context as _;
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// Unmounts, then waits until the daemon has finished (files closed just
/// before are compressed first) and exited, so that a `mount` of the same
/// store right after finds it free; fails if the daemon left staged files
/// uncompressed. The daemon is found from the mount (see
/// [`daemon_state::daemon_pids`]). `--lazy` detaches and returns at once.
pub fn umount(g: Global, a: UmountArgs) -> Result<ExitCode> {
    // A mount whose daemon died answers ENOTCONN to the stat canonicalize
    // needs: then the path as given, made absolute, is the mount point.
    let mp = match a.mountpoint.canonicalize() {
        Ok(p) => p,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => std::path::absolute(&a.mountpoint)
            .with_context(|| a.mountpoint.display().to_string())?,
        Err(e) => return Err(e).with_context(|| a.mountpoint.display().to_string()),
    };
    let Some(entry) = mount_at(&mp) else {
        anyhow::bail!("{}: not a mount point", mp.display());
    };
    if !entry.is_ckptfs() {
        anyhow::bail!(
            "{}: not a ckptfs mount (a {} mount of {}); use umount(8) or fusermount3 -u",
            mp.display(),
            entry.fstype,
            unescape(&entry.source)
        );
    }
    let pids = daemon_state::daemon_pids(&mp);
    unmount_now(&mp, a.lazy)?;
    if a.lazy {
        return Ok(ExitCode::SUCCESS);
    }
    let pb = if g.quiet || !std::io::stderr().is_terminal() {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new_spinner()
    };
    let timeout = a.timeout.map(Duration::from_secs_f64);
    for &pid in &pids {
        pb.set_message(format!(
            "waiting for the daemon (pid {pid}) to finish its work and exit"
        ));
        let done = daemon_state::wait_exit(pid, timeout, &|_| pb.tick());
        if !done {
            pb.finish_and_clear();
            anyhow::bail!(
                "{}: unmounted, but the daemon (pid {pid}) is still finishing after {}s \
                 (compressing staged files; see its log {})",
                mp.display(),
                a.timeout.unwrap_or_default(),
                log_path(&mp).display()
            );
        }
    }
    pb.finish_and_clear();
    // An `s3://` daemon records what it could not upload (its spool is in
    // the cache directory); printed, and the exit is 1.
    for &pid in &pids {
        if let Some(left) = daemon_state::take_outcome(&mp, pid).filter(|l| !l.is_empty()) {
            for l in &left {
                eprintln!("ckptfs: not uploaded: {l}");
            }
            anyhow::bail!(
                "{}: unmounted, but {} not uploaded; they stay staged in the \
                 cache directory and the next mount of the store uploads them (log: {})",
                mp.display(),
                crate::commands::plural(left.len(), "file was", "files were"),
                log_path(&mp).display()
            );
        }
    }
    // A writable daemon compresses every staged file before it exits; what
    // is left in the spool is what it could not (kept there, retried by the
    // next writable mount). A read-only mount has no spool of its own.
    let store = unescape(entry.source.trim_start_matches("ckptfs:"));
    let writable = entry.opts.split(',').any(|o| o == "rw");
    if writable && !store.starts_with("s3://") {
        let left = staged_left(Path::new(&store));
        if left > 0 {
            anyhow::bail!(
                "{}: unmounted, but {} in {}/{} {} not compressed (kept; the next \
                 writable mount retries them); see the daemon's log {}",
                mp.display(),
                crate::commands::plural(left, "staged file", "staged files"),
                store,
                crate::fs::spool::SPOOL_DIR,
                if left == 1 { "was" } else { "were" },
                log_path(&mp).display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The staged files in `store`'s spool (`ID.data`, each beside its
/// `ID.path` record).
fn staged_left(store: &Path) -> usize {
    std::fs::read_dir(store.join(crate::fs::spool::SPOOL_DIR))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".data"))
                .count()
        })
        .unwrap_or(0)
}

fn unmount_now(mp: &Path, lazy: bool) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes())?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: `c` is a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
            let e = std::io::Error::last_os_error();
            let hint = match e.raw_os_error() {
                Some(libc::EBUSY) => {
                    " (files are open; --lazy detaches now and finishes when they close)"
                }
                Some(libc::EINVAL) => " (not a mount point)",
                _ => "",
            };
            anyhow::bail!("{}: {e}{hint}", mp.display());
        }
    } else {
        let mut cmd = std::process::Command::new("fusermount3");
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        let st = cmd.arg(mp).status().context("fusermount3")?;
        if !st.success() {
            anyhow::bail!("{}: fusermount3 -u failed", mp.display());
        }
    }
    Ok(())
}
