//! `ckptfs mount` and `ckptfs umount`.
//!
//! By default `mount` daemonizes: it re-executes itself with `--foreground`
//! in a new session (`setsid`), stdio to a log file, waits until the mount
//! shows up in `/proc/self/mountinfo`, prints where the daemon logs and
//! exits 0. If the daemon exits first, or the mount does not appear within
//! 30 s, it prints the end of the log and exits 1. Re-executing (rather
//! than `fork` after threads exist) keeps the daemon a clean process.
//!
//! In the foreground the process mounts with fuser (multi-threaded, one
//! cloned `/dev/fuse` fd per thread), raises the connection's readahead,
//! and serves until unmounted. SIGINT/SIGTERM/SIGHUP unmount it (lazily if
//! files are still open) and the process exits 0, or 1 when files written
//! to an `s3://` store could not be uploaded (they stay staged): the
//! daemon then records them for `ckptfs umount`, which prints them and
//! exits 1 (`daemon_state`).
//!
//! Here: the command line checked, and the daemon started in the
//! background. Beside it: `foreground`, the daemon itself (mount, serve,
//! finish the write-back, exit); `logger`, its log (a file or syslog);
//! `table`, the mount table of `/proc/self/mountinfo`; `umount`.

use super::daemon_state::WriterLock;
use super::{Global, Result};
use crate::cli::MountArgs;
use anyhow::Context as _;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod foreground;
mod logger;
mod table;
mod umount;

pub(super) use foreground::{foreground, MoreMetric, StoreParts};
pub(super) use logger::{init_logger, SYSLOG};
use table::mountinfo_has;
pub(super) use table::{ckptfs_mount_of, in_ckptfs_mount};
pub use umount::umount;

/// Parses a size like `2G`, `512M`, `1.5GiB`, `1048576`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: not a size (try 2G or 512M)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use K, M, G or T)")),
    };
    Ok((n * mult as f64) as u64)
}

/// The default cache budget. Decoded blocks live in the cache only between
/// the kernel's requests for them (the kernel's page cache keeps the file's
/// pages after that), so more than the read-ahead in flight mostly
/// duplicates the page cache; and a cache smaller than the model recycles
/// its memory, where a large one takes fresh pages from the kernel for
/// every block of a cold load (measured: 12% less daemon CPU per GB served
/// with 128 MiB than with 1 GiB).
pub(super) const DEFAULT_CACHE_BYTES: u64 = 256 << 20;

pub(super) fn log_path(mountpoint: &Path) -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("ckptfs");
    let name: String = mountpoint
        .to_string_lossy()
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    base.join(format!("mount-{name}.log"))
}

pub fn run(_g: Global, a: MountArgs, threads: Option<usize>) -> Result<ExitCode> {
    // The write-back's commits take `PackOptions::default()`.
    crate::pack::set_default_compat(a.compat.into());
    if let Some(url) = a.store.to_str().and_then(crate::store::s3::S3Url::parse) {
        let url = url.map_err(anyhow::Error::msg)?;
        if a.gguf.is_some() {
            return Err(anyhow::anyhow!(
                "{}: --gguf is not supported for s3:// stores (only local STORE directories)",
                a.store.display()
            ));
        }
        if a.delta.is_some() {
            // Deltas keep their bases by rewriting dependents in STORE,
            // which a writable S3 mount would not upload.
            return Err(anyhow::anyhow!(
                "{}: --delta is not supported for s3:// stores (only local STORE directories)",
                a.store.display()
            ));
        }
        return super::mount_s3::run(a, url, threads);
    }
    if a.family_depth.is_some() && a.delta.is_none() {
        return Err(anyhow::anyhow!(
            "--family-depth (family_depth) needs --delta auto (delta=auto)"
        ));
    }
    let store = a
        .store
        .canonicalize()
        .with_context(|| a.store.display().to_string())?;
    if !store.is_dir() {
        return Err(anyhow::anyhow!("{}: not a directory", store.display()));
    }
    let mountpoint = a
        .mountpoint
        .canonicalize()
        .with_context(|| a.mountpoint.display().to_string())?;
    if !mountpoint.is_dir() {
        return Err(anyhow::anyhow!("{}: not a directory", mountpoint.display()));
    }
    if in_ckptfs_mount(&store) {
        return Err(anyhow::anyhow!(
            "{}: a ckptfs mount, not a store (the arguments are STORE MOUNTPOINT)",
            store.display()
        ));
    }
    if store.starts_with(&mountpoint) {
        return Err(anyhow::anyhow!(
            "{}: the store must not be inside the mountpoint {}",
            store.display(),
            mountpoint.display()
        ));
    }
    let cache_bytes = match &a.cache_size {
        Some(s) => parse_size(s).map_err(anyhow::Error::msg)?,
        None => DEFAULT_CACHE_BYTES,
    };
    if a.foreground {
        foreground(
            &a,
            store,
            mountpoint,
            cache_bytes,
            threads,
            StoreParts::default(),
        )
    } else {
        background(&a, &mountpoint, threads)
    }
}

pub(super) fn background(
    a: &MountArgs,
    mountpoint: &Path,
    threads: Option<usize>,
) -> Result<ExitCode> {
    if mountinfo_has(mountpoint) {
        return Err(anyhow::anyhow!(
            "{}: already a ckptfs mount",
            mountpoint.display()
        ));
    }
    check_mountpoint(mountpoint, a.allow_nonempty)?;
    check_dev_fuse()?;
    let s3 = a
        .store
        .to_str()
        .is_some_and(|s| crate::store::s3::S3Url::parse(s).is_some());
    if !a.read_only && !s3 {
        // The daemon takes the lock itself; trying here first gives the
        // clean one-line refusal instead of "the mount did not come up".
        // (An S3 store's lock object is taken by the daemon only.)
        let store = a
            .store
            .canonicalize()
            .with_context(|| a.store.display().to_string())?;
        drop(WriterLock::acquire(&store)?);
    }
    // The log goes to the system log with `--log-file syslog`, and by
    // default when mount(8) runs ckptfs (an fstab line); the daemon's
    // stdio (a panic, an error before it logs) still goes to the file.
    // Without a syslog daemon (no /dev/log: a container, say) the file
    // keeps the lines that would be lost.
    let syslog = match a.log_file.as_deref() {
        Some(f) => f == Path::new(SYSLOG),
        None => a.mount_helper,
    } && Path::new("/dev/log").exists();
    let log = match &a.log_file {
        Some(f) if !syslog => f.clone(),
        _ => log_path(mountpoint),
    };
    let shown = if syslog {
        format!("syslog (journalctl -t ckptfs); stdio: {}", log.display())
    } else {
        log.display().to_string()
    };
    if let Some(dir) = log.parent().filter(|d| !d.as_os_str().is_empty()) {
        // The state directory (ckptfs's own: 0700) or the directory of
        // --log-file (0755), and the usual 0755 for parents made on the way.
        let own = a.log_file.is_none() || syslog;
        crate::fsutil::create_dirs(dir, if own { 0o700 } else { 0o755 }, 0o755)
            .with_context(|| dir.display().to_string())?;
    }
    // Logs name the store's files: readable by the owner only.
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log)
        .with_context(|| log.display().to_string())?;
    let start_len = out.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().context("cannot find own executable")?;
    let mut cmd = std::process::Command::new(exe);
    if let Some(n) = threads {
        cmd.arg("--threads").arg(n.to_string());
    }
    cmd.arg("mount")
        .arg(&a.store)
        .arg(mountpoint)
        .arg("--foreground");
    if let Some(s) = &a.cache_size {
        cmd.arg("--cache-size").arg(s);
    }
    if a.read_only {
        cmd.arg("--read-only");
    }
    if a.compat == crate::cli::CompatArg::Z4ai {
        cmd.arg("--compat").arg("z4ai");
    }
    if a.require_checksums {
        cmd.arg("--require-checksums");
    }
    if a.allow_nonempty {
        cmd.arg("--allow-nonempty");
    }
    if a.allow_other {
        cmd.arg("--allow-other");
    }
    if let Some(l) = &a.log_level {
        cmd.arg("--log-level").arg(l);
    }
    if syslog {
        cmd.arg("--log-file").arg(SYSLOG);
    }
    if let Some(c) = a.gguf {
        cmd.arg("--gguf").arg(super::export::cast_of(c).name());
    }
    if a.delta.is_some() {
        cmd.arg("--delta").arg("auto");
    }
    if let Some(d) = a.family_depth {
        cmd.arg("--family-depth").arg(d.to_string());
    }
    if let Some(e) = &a.endpoint_url {
        cmd.arg("--endpoint-url").arg(e);
    }
    if let Some(d) = &a.cache_dir {
        cmd.arg("--cache-dir").arg(d);
    }
    if let Some(s) = &a.disk_cache_size {
        cmd.arg("--disk-cache-size").arg(s);
    }
    cmd.arg("--metadata-ttl")
        .arg(a.metadata_ttl.to_string())
        .arg("--request-timeout")
        .arg(a.request_timeout.to_string());
    if let Some(t) = a.read_timeout {
        cmd.arg("--read-timeout").arg(t.to_string());
    }
    if let Some(m) = &a.metrics_addr {
        cmd.arg("--metrics-addr").arg(m);
    }
    // The kernel flags left of `-o` (mount_options).
    for o in &a.options {
        cmd.arg("-o").arg(o);
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: setsid is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the mount daemon")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if mountinfo_has(mountpoint) {
            // mount(8) says nothing when a mount succeeds: neither does
            // its helper.
            if !a.mount_helper {
                println!(
                    "ckptfs: mounted {} at {} (pid {}); log: {shown}",
                    a.store.display(),
                    mountpoint.display(),
                    child.id(),
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        let exited = child.try_wait()?;
        if exited.is_some() || Instant::now() > deadline {
            if exited.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let text = std::fs::read(&log).unwrap_or_default();
            let tail = String::from_utf8_lossy(&text[(start_len as usize).min(text.len())..]);
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            let mut msg = format!("{}: the mount did not come up", mountpoint.display());
            for l in tail.into_iter().rev() {
                msg.push_str("\n  ");
                msg.push_str(l);
            }
            msg.push_str(&format!("\n  (log: {shown})"));
            anyhow::bail!(msg);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Refuses a mountpoint whose contents the mount would hide (unless
/// `allow_nonempty`, FUSE's `-o nonempty`), and one that is a store (it
/// holds a spool: STORE and MOUNTPOINT were given the wrong way round).
fn check_mountpoint(mountpoint: &Path, allow_nonempty: bool) -> Result<()> {
    let spool = crate::fs::spool::SPOOL_DIR;
    if mountpoint.join(spool).symlink_metadata().is_ok() {
        anyhow::bail!(
            "{}: holds {spool}, so it is a ckptfs store, not a mountpoint \
             (the arguments are STORE MOUNTPOINT)",
            mountpoint.display()
        );
    }
    if allow_nonempty {
        return Ok(());
    }
    let first = std::fs::read_dir(mountpoint)
        .with_context(|| mountpoint.display().to_string())?
        .next()
        .transpose()
        .with_context(|| mountpoint.display().to_string())?;
    if let Some(e) = first {
        anyhow::bail!(
            "{}: not empty (it holds {:?}, among others); the mount would hide what is \
             there: mount on an empty directory, or pass --allow-nonempty \
             (the arguments are STORE MOUNTPOINT)",
            mountpoint.display(),
            e.file_name()
        );
    }
    Ok(())
}

/// Opens `/dev/fuse` as fuser will, so that a user who may not gets one
/// line naming the device and what to do, not fuser's bare EACCES.
fn check_dev_fuse() -> Result<()> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => Ok(()),
        Err(e) => Err(anyhow::anyhow!(dev_fuse_error(&e))),
    }
}

/// What to say when `/dev/fuse` cannot be opened.
fn dev_fuse_error(e: &std::io::Error) -> String {
    let what = match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            "this user may not open it: ask an administrator to make it \
             crw-rw-rw- (mode 0666, the usual default: chmod 0666 /dev/fuse), or to add \
             you to the group that owns it (ls -l /dev/fuse); in a container, start it \
             with --device /dev/fuse"
        }
        Some(libc::ENOENT) | Some(libc::ENXIO) | Some(libc::ENODEV) => {
            "no FUSE device: load the module (modprobe fuse) and install fuse3; \
             in a container, start it with --device /dev/fuse --cap-add SYS_ADMIN"
        }
        _ => "FUSE needs read and write access to it",
    };
    format!("cannot open /dev/fuse ({e}): {what}")
}

#[cfg(test)]
mod tests;
