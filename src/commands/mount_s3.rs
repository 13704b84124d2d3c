//! `ckptfs mount s3://BUCKET/PREFIX MNT --read-only`: the daemon keeps a
//! local mirror of the prefix (`store::mirror`) under the cache directory
//! and serves it as its STORE with the unchanged mount; archive bytes are
//! fetched on demand with ranged GETs and kept across restarts.
//!
//! One daemon per cache directory (an exclusive `flock` on `DIR/lock`):
//! two daemons filling one mirror would race on its files.

use super::mount::{background, foreground, init_logger, parse_size};
use super::Result;
use crate::cli::MountArgs;
use crate::store::mirror::Mirror;
use crate::store::s3::{S3Client, S3Options, S3Url};
use anyhow::Context as _;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
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
        xxhash_rust::xxh3::xxh3_64(id.as_bytes())
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
    if !a.read_only {
        anyhow::bail!("{url}: writable S3 mounts are not supported yet; mount it with --read-only");
    }
    if !(a.metadata_ttl.is_finite() && a.metadata_ttl > 0.0) {
        anyhow::bail!(
            "--metadata-ttl {}: must be a positive number of seconds",
            a.metadata_ttl
        );
    }
    let opts = options(a.endpoint_url.clone(), a.request_timeout)?;
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
    init_logger(a.log_level.clone());
    let cache_dir = a
        .cache_dir
        .clone()
        .unwrap_or_else(|| default_cache_dir(&url, opts.endpoint.as_deref()));
    std::fs::create_dir_all(&cache_dir).with_context(|| cache_dir.display().to_string())?;
    let lock_path = cache_dir.join("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| lock_path.display().to_string())?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        anyhow::bail!(
            "{}: the cache directory is in use by another ckptfs daemon (give this mount its own --cache-dir)",
            cache_dir.display()
        );
    }
    let client = Arc::new(S3Client::new(url.clone(), &opts).with_context(|| url.to_string())?);
    let mirror = Arc::new(
        Mirror::open(client, &cache_dir).with_context(|| cache_dir.display().to_string())?,
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
    let r = foreground(
        &a,
        mirror.root().to_path_buf(),
        mountpoint,
        cache_bytes,
        threads,
    );
    drop(lock);
    r
}
