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

use super::daemon_state::{self, WriterLock};
use super::{Global, Result};
use crate::cli::{MountArgs, UmountArgs};
use crate::fs::{CheckpointFs, FsConfig};
use crate::fuse::CheckpointFuse;
use anyhow::Context as _;
use fuser::{Config, MountOption, Session, SessionACL};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::io::{BufRead, IsTerminal, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

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

fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 2).clamp(4, 16)
}

fn mountinfo_has(mountpoint: &Path) -> bool {
    let want = mountpoint
        .as_os_str()
        .to_string_lossy()
        .replace(' ', "\\040");
    mounts().iter().any(|(m, ckptfs)| *ckptfs && *m == want)
}

/// The mount points of `/proc/self/mountinfo` (escaped as it writes them),
/// each with whether it is a ckptfs mount.
fn mounts() -> Vec<(String, bool)> {
    mount_table()
        .into_iter()
        .map(|m| {
            let ckptfs = m.is_ckptfs();
            (m.point, ckptfs)
        })
        .collect()
}

/// One line of `/proc/self/mountinfo`: "ID PARENT MAJ:MIN ROOT POINT OPTS
/// ... - FSTYPE SOURCE SUPEROPTS" (POINT and SOURCE escaped, `\040` for a
/// space).
struct MountEntry {
    point: String,
    opts: String,
    fstype: String,
    source: String,
}

impl MountEntry {
    /// fuser mounts with fstype "fuse" (or "fuse.ckptfs" via fusermount)
    /// and the source "ckptfs:STORE".
    fn is_ckptfs(&self) -> bool {
        self.fstype.starts_with("fuse") && self.source.starts_with("ckptfs:")
    }
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn mount_table() -> Vec<MountEntry> {
    let Ok(f) = std::fs::File::open("/proc/self/mountinfo") else {
        return Vec::new();
    };
    std::io::BufReader::new(f)
        .lines()
        .map_while(|l| l.ok())
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            Some(MountEntry {
                point: fields.get(4)?.to_string(),
                opts: fields.get(5)?.to_string(),
                fstype: fields.get(dash + 1)?.to_string(),
                source: fields.get(dash + 2)?.to_string(),
            })
        })
        .collect()
}

/// The topmost mount whose mount point is `path` (absolute), if any.
fn mount_at(path: &Path) -> Option<MountEntry> {
    let want = path.to_string_lossy().replace(' ', "\\040");
    mount_table().into_iter().rev().find(|m| m.point == want)
}

/// Whether `path` (which must exist) lies inside a ckptfs mount: the
/// mount point that is its longest prefix is one.
pub(super) fn in_ckptfs_mount(path: &Path) -> bool {
    let Ok(p) = path.canonicalize() else {
        return false;
    };
    mounts()
        .into_iter()
        .filter(|(m, _)| p.starts_with(m.replace("\\040", " ")))
        .max_by_key(|(m, _)| m.len())
        .is_some_and(|(_, ckptfs)| ckptfs)
}

/// The root of the ckptfs mount that `path` (canonical) lies in: the
/// longest mount point that is its prefix, if that is a ckptfs mount.
pub(super) fn ckptfs_mount_of(path: &Path) -> Option<PathBuf> {
    mounts()
        .into_iter()
        .map(|(m, ckptfs)| (PathBuf::from(unescape(&m)), ckptfs))
        .filter(|(m, _)| path.starts_with(m))
        .max_by_key(|(m, _)| m.as_os_str().len())
        .and_then(|(m, ckptfs)| ckptfs.then_some(m))
}

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
            None,
            Vec::new(),
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

/// Detaches the mount even while files are open (the daemon keeps serving
/// them until they close).
fn lazy_unmount(mountpoint: &Path) {
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: `c` is a valid NUL-terminated path.
    let ok = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0;
    if !ok {
        let _ = std::process::Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(mountpoint)
            .status();
    }
}

/// The daemon holds a descriptor for every plain or staged file open
/// through the mount (and for every file a rename replaced while the
/// kernel may still open it): its soft limit on open files is raised to
/// the hard one, as the limit is per process and the daemon answers for
/// every client. systemd's default soft limit (1024) would otherwise fail
/// a client's open with EMFILE well before the clients run out.
fn raise_open_file_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `l`.
    let raised = unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max && {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l) == 0
        }
    };
    if raised {
        log::debug!("open file limit raised to {}", l.rlim_cur);
    }
}

/// Raises the kernel readahead of the mount's backing device (bdi); the
/// default 128 KiB starves a decoder that works in 1 MiB blocks.
fn raise_read_ahead(mountpoint: &Path, kib: u32) {
    let Ok(m) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = m.dev();
    let p = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    match std::fs::write(&p, kib.to_string()) {
        Ok(()) => log::info!("{p} = {kib}"),
        Err(e) => log::info!("cannot raise readahead ({p}: {e}); using the kernel default"),
    }
}

/// The daemon's logger (stderr, which is the log file in the background);
/// a second call does nothing.
/// `--log-file syslog`: the daemon logs to the system log (journald
/// reads it), as a mount from /etc/fstab does by default.
pub(super) const SYSLOG: &str = "syslog";

/// The daemon's logger: stderr (the log file in the background), or the
/// system log.
pub(super) fn init_logger(level: Option<String>, syslog: bool) {
    // fuser logs a warning when the session, ended by an unmount, tries to
    // unmount again on exit (EINVAL): noise on every umount.
    let mut b = env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("info,fuser::session=error"),
    );
    if let Some(l) = level {
        b.parse_filters(&l);
    }
    let inner = b.build();
    let max = inner.filter();
    if syslog {
        // SAFETY: the identity is a static NUL-terminated string, which
        // openlog keeps a pointer to.
        unsafe { libc::openlog(c"ckptfs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    }
    if log::set_boxed_logger(Box::new(QuietGoneRequests { inner, syslog })).is_ok() {
        log::set_max_level(max);
    }
}

/// A counter the fs does not keep (an S3 store's), read at each ask.
pub(super) type MoreMetric = Box<dyn Fn() -> crate::fs::stats::Metric + Send + Sync>;

pub(super) fn foreground(
    a: &MountArgs,
    store: PathBuf,
    mountpoint: PathBuf,
    cache_bytes: u64,
    threads: Option<usize>,
    sink: Option<std::sync::Arc<dyn crate::fs::sink::Sink>>,
    more_metrics: Vec<MoreMetric>,
) -> Result<ExitCode> {
    init_logger(
        a.log_level.clone(),
        a.log_file.as_deref() == Some(Path::new(SYSLOG)),
    );
    // Decoded blocks are ~1 MiB and are allocated and freed constantly.
    // Served by mmap, each one cost an mmap, 256 page faults with zeroing
    // and a munmap (45% of the daemon's time in a cold read was kernel page
    // faulting). Keep them in the heap, where freed blocks are reused, but
    // cap the arenas and return free heap tops above 32 MiB, so the resident
    // size still tracks the cache budget.
    // SAFETY: mallopt only tunes the allocator.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 8 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    check_mountpoint(&mountpoint, a.allow_nonempty)?;
    raise_open_file_limit();
    let n_threads = threads.unwrap_or_else(default_threads);
    // One writable daemon per store, taken before the spool is recovered
    // and held until this process exits.
    let _writer_lock = if a.read_only {
        None
    } else {
        Some(WriterLock::acquire(&store)?)
    };
    let fs = CheckpointFs::new(FsConfig {
        store: store.clone(),
        cache_bytes,
        ttl: Duration::from_secs(1),
        read_only: a.read_only,
        require_checksums: a.require_checksums,
        allow_other: a.allow_other,
    })
    .with_context(|| store.display().to_string())?;
    let fs = match a.gguf {
        Some(c) => fs.with_gguf(super::export::cast_of(c)),
        None => fs,
    };
    let fs = match sink {
        Some(s) => fs.with_sink(s),
        None => fs,
    };
    let fs = match a.delta {
        Some(crate::cli::DeltaMode::Auto) => fs.with_delta_auto(),
        None => fs,
    };
    let fs = match a.family_depth {
        Some(d) => fs.with_family_depth(d),
        None => fs,
    };
    let fs = more_metrics.into_iter().fold(fs, |fs, m| fs.with_metric(m));
    let fs = std::sync::Arc::new(fs);
    if let Some(addr) = &a.metrics_addr {
        let addr: std::net::SocketAddr = addr.parse().map_err(|_| {
            anyhow::anyhow!("--metrics-addr {addr}: not an address like 127.0.0.1:9100")
        })?;
        let src = fs.clone();
        let bound = crate::metrics::serve(addr, std::sync::Arc::new(move || src.counters()))
            .with_context(|| format!("--metrics-addr {addr}"))?;
        log::info!("metrics at http://{bound}/metrics");
    }
    // Modes of created files arrive with the caller's umask applied; the
    // daemon's own must not apply twice.
    // SAFETY: umask only changes this process's file creation mask.
    unsafe { libc::umask(0) };
    let writeback = {
        let fs = fs.clone();
        std::thread::Builder::new()
            .name("ckptfs-writeback".into())
            .spawn(move || fs.writeback_loop())?
    };
    let family = {
        let fs = fs.clone();
        std::thread::Builder::new()
            .name("ckptfs-family".into())
            .spawn(move || fs.family_loop())?
    };
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("ckptfs:{}", store.display())),
        MountOption::Subtype("ckptfs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    if a.read_only {
        config.mount_options.push(MountOption::RO);
    }
    config
        .mount_options
        .extend(super::mount_options::kernel_flags(&a.options));
    config.acl = if a.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(n_threads);
    config.clone_fd = true;
    // Registered before mounting, so a signal that arrives while the mount
    // comes up still unmounts it.
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    // No outcome of an earlier daemon at this mountpoint is reported for
    // this one (`ckptfs umount`).
    if let Err(e) = daemon_state::write_outcome(&mountpoint, &[]) {
        log::warn!("{}: {e}", daemon_state::outcome_path(&mountpoint).display());
    }
    check_dev_fuse()?;
    let mut session = Session::new(CheckpointFuse::new(fs.clone()), &mountpoint, &config)
        .with_context(|| format!("{}: cannot mount", mountpoint.display()))?;
    // stat() of the mountpoint needs the session running: not on this thread.
    let mp = mountpoint.clone();
    std::thread::spawn(move || raise_read_ahead(&mp, 16 << 10));
    // A unit of `Type=notify` is started once the mount is up.
    sd_notify("READY=1");
    log::info!(
        "mounted {} at {} ({} threads, cache {} MiB)",
        store.display(),
        mountpoint.display(),
        n_threads,
        cache_bytes >> 20
    );
    let mut unmounter = session.unmount_callable();
    let mp = mountpoint.clone();
    std::thread::Builder::new()
        .name("ckptfs-signals".into())
        .spawn(move || {
            // The first signal unmounts. The handlers stay installed after
            // this thread ends (dropping `signals` only detaches it), so
            // later signals are ignored while the daemon finishes.
            if signals.forever().next().is_some() {
                sd_notify("STOPPING=1");
                log::info!("signal received; unmounting {}", mp.display());
                if let Err(e) = unmounter.unmount() {
                    log::info!("unmount: {e}; detaching lazily");
                    lazy_unmount(&mp);
                }
            }
        })?;
    session
        .run()
        .with_context(|| mountpoint.display().to_string())?;
    sd_notify("STOPPING=1");
    fs.stop_writeback();
    fs.stop_family();
    let _ = writeback.join();
    let _ = family.join();
    // Files closed just before the unmount: compress them now rather than
    // at the next mount (they are durable in the spool either way).
    fs.release_all();
    if fs.staged_count() > 0 {
        log::info!(
            "compressing {} staged file(s) before exiting",
            fs.staged_count()
        );
        fs.requeue_all();
        fs.run_writeback();
    }
    // Uploads that failed even now stay staged (the next mount uploads
    // them): said in the log, to `ckptfs umount`, and by the exit code.
    let left = fs.not_uploaded();
    for l in &left {
        log::error!("not uploaded, kept staged for the next mount: {l}");
    }
    if let Err(e) = daemon_state::write_outcome(&mountpoint, &left) {
        log::error!("{}: {e}", daemon_state::outcome_path(&mountpoint).display());
    }
    log::info!(
        "unmounted {}: {}",
        mountpoint.display(),
        fs.counters().summary()
    );
    let _ = std::io::stderr().flush();
    Ok(if left.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The daemon's logger: env_logger, without fuser's error for a reply to a
/// request the kernel no longer has (ENOENT from /dev/fuse: the request was
/// interrupted, or the connection ended during an unmount). Nothing was
/// lost: whoever asked is gone. Every other reply failure is still logged.
struct QuietGoneRequests {
    inner: env_logger::Logger,
    /// To the system log (env_logger still filters).
    syslog: bool,
}

impl log::Log for QuietGoneRequests {
    fn enabled(&self, m: &log::Metadata) -> bool {
        self.inner.enabled(m)
    }
    fn log(&self, r: &log::Record) {
        let gone = r.target() == "fuser::reply"
            && r.args().to_string().contains("No such file or directory");
        if gone || !self.inner.matches(r) {
            return;
        }
        if !self.syslog {
            self.inner.log(r);
            return;
        }
        let prio = match r.level() {
            log::Level::Error => libc::LOG_ERR,
            log::Level::Warn => libc::LOG_WARNING,
            log::Level::Info => libc::LOG_INFO,
            log::Level::Debug | log::Level::Trace => libc::LOG_DEBUG,
        };
        // One line per record: a NUL (never in a message worth keeping)
        // would end it early, so it is dropped.
        let line = format!("{}: {}", r.target(), r.args()).replace('\0', "");
        if let Ok(c) = std::ffi::CString::new(line) {
            // SAFETY: a constant format and one NUL-terminated argument.
            unsafe { libc::syslog(prio, c"%s".as_ptr(), c.as_ptr()) };
        }
    }
    fn flush(&self) {
        self.inner.flush();
    }
}

/// Tells systemd (a unit of `Type=notify`, which sets `NOTIFY_SOCKET`)
/// how the daemon is doing: `READY=1` once mounted, `STOPPING=1` when it
/// unmounts. Nothing without `NOTIFY_SOCKET`.
fn sd_notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = std::os::unix::net::UnixDatagram::unbound().and_then(|s| {
        let b = path.as_encoded_bytes();
        match b.strip_prefix(b"@") {
            // An abstract socket address.
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                s.send_to_addr(state.as_bytes(), &addr)
            }
            None => s.send_to(state.as_bytes(), &path),
        }
    });
    if let Err(e) = sent {
        log::warn!("cannot notify systemd ({state}): {e}");
    }
}

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
                super::plural(left.len(), "file was", "files were"),
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
                super::plural(left, "staged file", "staged files"),
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

#[cfg(test)]
mod tests;
