//! The daemon (`mount --foreground`, which the background `mount`
//! starts): mounts with fuser, serves until unmounted or signalled,
//! finishes the write-back and the family thread, and exits 0, or 1 when
//! files could not be uploaded. Tells systemd when it is ready and when
//! it stops.

use super::logger::{init_logger, SYSLOG};
use super::{check_dev_fuse, check_mountpoint};
use crate::cli::MountArgs;
use crate::commands::daemon_state::{self, WriterLock};
use crate::commands::Result;
use crate::fs::{CheckpointFs, FsConfig};
use crate::fuse::CheckpointFuse;
use anyhow::Context as _;
use fuser::{Config, MountOption, Session, SessionACL};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// A counter the fs does not keep (an S3 store's), read at each ask.
pub(in crate::commands) type MoreMetric = Box<dyn Fn() -> crate::fs::stats::Metric + Send + Sync>;

/// What a store that is not a local directory (`s3://`) adds to a mount.
#[derive(Default)]
pub(in crate::commands) struct StoreParts {
    /// What STORE's files are read as (the mirror: remote copies); None:
    /// local files.
    pub sources: Option<std::sync::Arc<dyn crate::store::source::Sources>>,
    /// Where commits go beyond STORE (a writable `s3://` mount).
    pub sink: Option<std::sync::Arc<dyn crate::fs::sink::Sink>>,
    /// The store's own counters.
    pub more_metrics: Vec<MoreMetric>,
}

pub(in crate::commands) fn foreground(
    a: &MountArgs,
    store: PathBuf,
    mountpoint: PathBuf,
    cache_bytes: u64,
    threads: Option<usize>,
    parts: StoreParts,
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
        Some(c) => fs.with_gguf(crate::commands::export::cast_of(c)),
        None => fs,
    };
    let fs = match parts.sink {
        Some(s) => fs.with_sink(s),
        None => fs,
    };
    let fs = match parts.sources {
        Some(s) => fs.with_sources(s),
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
    let fs = parts
        .more_metrics
        .into_iter()
        .fold(fs, |fs, m| fs.with_metric(m));
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
        .extend(crate::commands::mount_options::kernel_flags(&a.options));
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

fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 2).clamp(4, 16)
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
