//! `ckptfs mount s3://BUCKET/PREFIX MNT`: the daemon keeps a local mirror
//! of the prefix (`store::mirror`) under the cache directory and serves it
//! as its STORE with the unchanged mount; archive bytes are fetched on
//! demand with ranged GETs and kept across restarts.
//!
//! Without `--read-only` the mount writes into the bucket: the mirror is
//! the mount's [`Sink`] (see `crate::fs::sink`), files written are staged
//! in the spool under the cache directory (`mirror/.ckptfs-spool`) and
//! uploaded after their last close (`.safetensors` compressed to `.zstn`
//! first); a staged file left by a crash is uploaded by the next mount
//! with the same cache directory, after it aborted the multipart uploads
//! the crash interrupted (recorded in `DIR/uploads`). One writable daemon
//! per prefix (`store::lease`).
//!
//! `--read-timeout` bounds each request's waits for the server in all
//! (`store::deadline`).
//!
//! The cache directory holds at most `--disk-cache-size` bytes
//! (`store::budget`); the limit given is saved there for later mounts.
//!
//! One daemon per cache directory (an exclusive `flock` on `DIR/lock`):
//! two daemons filling one mirror would race on its files, and the spool
//! is the daemon's own.

use super::mount::{background, foreground, init_logger, parse_size, StoreParts, SYSLOG};
use super::Result;
use crate::cli::MountArgs;
use crate::fs::sink::Sink;
use crate::store::budget::Budget;
use crate::store::lease::WriterLease;
use crate::store::mirror::Mirror;
use crate::store::s3::{S3Client, S3Options, S3Url};
use anyhow::Context as _;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The default cache directory of a store: one per endpoint, bucket and
/// prefix.
pub fn default_cache_dir(url: &S3Url, endpoint: Option<&str>) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let id = format!("{}\n{}\n{}", endpoint.unwrap_or(""), url.bucket, url.prefix);
    base.join("ckptfs/s3").join(format!(
        "{}-{:016x}",
        url.bucket,
        crate::format::digest::xxh3_64(id.as_bytes())
    ))
}

/// The client options of the command line.
pub fn options(endpoint: Option<String>, timeout: f64) -> Result<S3Options> {
    if !(timeout.is_finite() && timeout > 0.0) {
        anyhow::bail!("--request-timeout {timeout}: must be a positive number of seconds");
    }
    Ok(S3Options {
        endpoint,
        timeout: Duration::from_secs_f64(timeout),
        ..S3Options::default()
    })
}

pub fn run(a: MountArgs, url: S3Url, threads: Option<usize>) -> Result<ExitCode> {
    if !(a.metadata_ttl.is_finite() && a.metadata_ttl > 0.0) {
        anyhow::bail!(
            "--metadata-ttl {}: must be a positive number of seconds",
            a.metadata_ttl
        );
    }
    let opts = options(a.endpoint_url.clone(), a.request_timeout)?;
    let read_timeout = a.read_timeout.unwrap_or(a.request_timeout * 5.0);
    if !(read_timeout.is_finite() && read_timeout > 0.0) {
        anyhow::bail!("--read-timeout {read_timeout}: must be a positive number of seconds");
    }
    let mountpoint = a
        .mountpoint
        .canonicalize()
        .with_context(|| a.mountpoint.display().to_string())?;
    if !mountpoint.is_dir() {
        anyhow::bail!("{}: not a directory", mountpoint.display());
    }
    let cache_bytes = match &a.cache_size {
        Some(s) => parse_size(s).map_err(anyhow::Error::msg)?,
        None => super::mount::DEFAULT_CACHE_BYTES,
    };
    if !a.foreground {
        return background(&a, &mountpoint, threads);
    }
    init_logger(
        a.log_level.clone(),
        a.log_file.as_deref() == Some(std::path::Path::new(SYSLOG)),
    );
    crate::store::deadline::set_read_timeout(Duration::from_secs_f64(read_timeout));
    let cache_dir = a
        .cache_dir
        .clone()
        .unwrap_or_else(|| default_cache_dir(&url, opts.endpoint.as_deref()));
    // Copies of the bucket's objects: the daemon's own (0700), whatever
    // parents it has to make (0755).
    crate::fsutil::create_dirs(&cache_dir, 0o700, 0o755)
        .with_context(|| cache_dir.display().to_string())?;
    let lock_path = cache_dir.join("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .with_context(|| lock_path.display().to_string())?;
    // std's File::try_lock: flock(LOCK_EX | LOCK_NB) on Linux.
    if lock.try_lock().is_err() {
        anyhow::bail!(
            "{}: the cache directory is in use by another ckptfs daemon (give this mount its own --cache-dir)",
            cache_dir.display()
        );
    }
    let mut client = S3Client::new(url.clone(), &opts).with_context(|| url.to_string())?;
    if !a.read_only {
        // Multipart uploads in progress are recorded there: one a crash
        // interrupted is aborted by the next writable mount.
        let journal = cache_dir.join(UPLOADS_DIR);
        client = client
            .with_upload_journal(journal.clone())
            .with_context(|| journal.display().to_string())?;
    }
    let client = Arc::new(client);
    // The single writer of the prefix, taken before the spool is recovered.
    let lease = if a.read_only {
        None
    } else {
        let owner = owner_token(&cache_dir).with_context(|| cache_dir.display().to_string())?;
        let l = WriterLease::acquire(client.clone(), &owner).map_err(anyhow::Error::msg)?;
        l.spawn_heartbeat()?;
        // The writer's uploads that a crash interrupted (their files are
        // still staged: uploaded again from the spool).
        match client.abort_journaled_uploads() {
            Ok(0) => {}
            Ok(n) => log::info!("{url}: aborted {n} interrupted multipart upload(s)"),
            Err(e) => log::warn!("{}: {e}", cache_dir.join(UPLOADS_DIR).display()),
        }
        Some(l)
    };
    let budget = Budget::new(
        disk_limit(&cache_dir, a.disk_cache_size.as_deref())?,
        page_size(&cache_dir),
    );
    let disk = budget.clone();
    let mirror = Arc::new(
        Mirror::open(client, &cache_dir, budget)
            .with_context(|| cache_dir.display().to_string())?,
    );
    if let Err(e) = mirror.refresh() {
        // Without the server, what the cache holds is still served.
        log::warn!("listing {url}: {e}; serving the cached listing until the server answers");
    }
    mirror.spawn_refresher(Duration::from_secs_f64(a.metadata_ttl))?;
    log::info!(
        "{url}: mirror {} (cache {})",
        mirror.root().display(),
        cache_dir.display()
    );
    let sink: Option<Arc<dyn Sink>> = lease
        .as_ref()
        .map(|_| Arc::new(S3Sink(mirror.clone())) as Arc<dyn Sink>);
    let r = foreground(
        &a,
        mirror.root().to_path_buf(),
        mountpoint,
        cache_bytes,
        threads,
        StoreParts {
            sources: Some(mirror.clone()),
            sink,
            more_metrics: s3_metrics(disk),
        },
    );
    // The range sets fetched since the last background save: the next
    // mount serves those bytes without the server.
    mirror.save_all();
    if let Some(l) = lease {
        l.release();
    }
    drop(lock);
    r
}

/// The S3 store's counters for `ckptfs stats` (`store::traffic`).
fn s3_metrics(disk: Arc<Budget>) -> Vec<super::mount::MoreMetric> {
    use crate::fs::stats::Metric;
    use crate::store::traffic::{REQUESTS, RETRIES, SENT_BYTES};
    use std::sync::atomic::Ordering::Relaxed;
    vec![
        Box::new(|| {
            Metric::counter(
                "s3_requests",
                "Requests sent to the S3 server, retries included",
                REQUESTS.load(Relaxed),
            )
        }),
        Box::new(|| {
            let fetched = crate::store::remote::FETCHED_BYTES.load(Relaxed);
            Metric::counter(
                "s3_bytes",
                "Bytes of objects fetched from and uploaded to the S3 server",
                fetched + SENT_BYTES.load(Relaxed),
            )
        }),
        Box::new(|| {
            Metric::counter(
                "s3_retries",
                "S3 requests that failed and were retried (or ran out of retries)",
                RETRIES.load(Relaxed),
            )
        }),
        Box::new(move || {
            Metric::gauge(
                "disk_cache_bytes",
                "Bytes the local cache of the S3 store holds",
                disk.used(),
            )
        }),
    ]
}

/// Where the cache directory records multipart uploads in progress.
const UPLOADS_DIR: &str = "uploads";

/// The default disk cache limit: 32 GiB...
const DEFAULT_DISK_BYTES: u64 = 32 << 30;
/// ...or this fraction of the cache's file system, if smaller.
const DEFAULT_DISK_SHARE: f64 = 0.5;
/// Where the limit given last for a cache directory is kept.
const LIMIT_FILE: &str = "disk-cache-size";

/// The disk cache limit of `cache_dir`: `given` (then saved in the cache
/// directory, so that later mounts of it keep it), else the one saved,
/// else the default.
fn disk_limit(cache_dir: &Path, given: Option<&str>) -> Result<u64> {
    let path = cache_dir.join(LIMIT_FILE);
    if let Some(s) = given {
        let n = parse_size(s).map_err(|e| anyhow::anyhow!("--disk-cache-size {e}"))?;
        crate::fsutil::write_private(&path, |w| {
            use std::io::Write;
            writeln!(w, "{n}")
        })
        .with_context(|| path.display().to_string())?;
        return Ok(n);
    }
    match std::fs::read_to_string(&path) {
        Ok(s) => match s.trim().parse::<u64>() {
            Ok(n) => return Ok(n),
            Err(_) => log::warn!(
                "{}: not a byte count; using the default limit",
                path.display()
            ),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("{}: {e}; using the default limit", path.display()),
    }
    Ok(default_disk_limit(cache_dir))
}

fn default_disk_limit(cache_dir: &Path) -> u64 {
    let Ok(c) = std::ffi::CString::new(cache_dir.as_os_str().as_encoded_bytes()) else {
        return DEFAULT_DISK_BYTES;
    };
    // SAFETY: statvfs writes into the zeroed struct it is given; the path
    // is a NUL-terminated string that outlives the call.
    let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut v) } != 0 {
        return DEFAULT_DISK_BYTES;
    }
    let total = (v.f_blocks as u64).saturating_mul(v.f_frsize as u64);
    DEFAULT_DISK_BYTES.min((total as f64 * DEFAULT_DISK_SHARE) as u64)
}

/// The block size of the cache directory's file system (what the disk
/// cache charges per page).
fn page_size(cache_dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(cache_dir).map_or(4096, |m| m.blksize().clamp(4096, 1 << 20))
}

/// The token that names this cache directory's daemons in the writer
/// lock: created once, random.
fn owner_token(cache_dir: &Path) -> io::Result<String> {
    let path = cache_dir.join("owner");
    if let Ok(s) = std::fs::read_to_string(&path) {
        if !s.trim().is_empty() {
            return Ok(s.trim().to_string());
        }
    }
    let seed = format!(
        "{}\n{:?}\n{}",
        std::process::id(),
        std::time::SystemTime::now(),
        cache_dir.display()
    );
    let token = format!(
        "{:016x}{:016x}",
        crate::format::digest::xxh3_64(seed.as_bytes()),
        crate::format::digest::xxh3_64_with_seed(seed.as_bytes(), 1)
    );
    crate::fsutil::write_private(&path, |w| {
        use std::io::Write;
        w.write_all(token.as_bytes())
    })?;
    Ok(token)
}

/// The mirror as the mount's commit interface.
struct S3Sink(Arc<Mirror>);

/// An object key is UTF-8.
fn key(rel: &Path) -> io::Result<&str> {
    rel.to_str().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not UTF-8, cannot be an S3 key", rel.display()),
        )
    })
}

fn logged(what: &Path, r: io::Result<()>) {
    if let Err(e) = r {
        log::error!("{}: {e}", what.display());
    }
}

impl Sink for S3Sink {
    fn publish(&self, local: &Path, rel: &Path) -> io::Result<String> {
        self.0.publish(local, key(rel)?)
    }
    fn published(&self, rel: &Path, _local: &Path, tag: &str) {
        logged(rel, key(rel).and_then(|k| self.0.published(k, tag)));
    }
    fn unpublish(&self, rel: &Path) {
        if let Ok(k) = key(rel) {
            self.0.unpublish(k);
        }
    }
    fn remove(&self, rel: &Path) -> io::Result<()> {
        match key(rel) {
            Ok(k) => self.0.remove(k),
            // Never uploaded.
            Err(_) => Ok(()),
        }
    }
    fn copy(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.0.copy(key(from)?, key(to)?)
    }
    fn moved(&self, from: &Path, to: &Path, _local: &Path) {
        logged(
            to,
            key(from).and_then(|f| key(to).and_then(|t| self.0.moved(f, t))),
        );
    }
    fn fill(&self, _rel: &Path, local: &Path) -> io::Result<()> {
        self.0.fill_and_take(&std::fs::File::open(local)?)
    }
    fn describe(&self, rel: &Path) -> String {
        self.0.client().url().display(&rel.to_string_lossy())
    }
}
