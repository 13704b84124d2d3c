//! The S3 client: `s3://BUCKET/PREFIX` URLs and the few blocking calls the
//! mirror, the CLI and the mount need (list, ranged and conditional GET,
//! PUT with multipart for large files, create-if-absent), over the
//! `object_store` crate and a small tokio runtime owned by the client.
//!
//! Endpoint, region and credentials come from the standard AWS
//! environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION`/`AWS_DEFAULT_REGION`,
//! `AWS_ENDPOINT_URL`), then from the shared files of the profile
//! `AWS_PROFILE` (`aws_config`) for what the environment leaves unset, as
//! the AWS CLI does; `--endpoint-url` overrides both.
//!
//! Bounded waits: every request has a timeout, failed requests are retried
//! a bounded number of times with exponential backoff, and each call as a
//! whole is cut off after `timeout × (retries + 2)`, or sooner when the
//! calling thread's request has a deadline (`deadline`, `--read-timeout`);
//! an error names the object and why. A FUSE thread waiting on a call is
//! therefore never hung.
//!
//! Uploads: a multipart upload runs wholly on the runtime (object_store
//! spawns its tasks there) and is aborted on every failure, panics below
//! included; with a journal its id is recorded until it ends, so that an
//! upload a crash interrupted is aborted later ([`S3Client::put_file`]).

use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, PutMode, PutOptions,
    PutPayload, RetryConfig,
};
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

mod upload;

/// Where a store lives: `s3://BUCKET/PREFIX` (the prefix may be empty).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct S3Url {
    pub bucket: String,
    /// Without leading or trailing `/`.
    pub prefix: String,
}

impl S3Url {
    /// Parses `s3://BUCKET[/PREFIX]`; None when `s` is not an `s3://` URL.
    pub fn parse(s: &str) -> Option<Result<S3Url, String>> {
        let rest = s.strip_prefix("s3://")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Some(Err(format!("{s}: no bucket name (s3://BUCKET/PREFIX)")));
        }
        let prefix = prefix.trim_matches('/').to_string();
        if prefix.split('/').any(|c| c == "." || c == "..") {
            return Some(Err(format!(
                "{s}: `.` and `..` are not allowed in the prefix"
            )));
        }
        Some(Ok(S3Url {
            bucket: bucket.to_string(),
            prefix,
        }))
    }

    /// The object key of `rel` (a `/`-separated path below the prefix).
    pub fn key(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// `s3://bucket/key` of `rel`, for messages.
    pub fn display(&self, rel: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(rel))
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// Client settings beyond the environment.
#[derive(Debug, Clone)]
pub struct S3Options {
    pub endpoint: Option<String>,
    /// Per request (connect and whole response).
    pub timeout: Duration,
    pub retries: usize,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            endpoint: None,
            timeout: Duration::from_secs(30),
            retries: 3,
        }
    }
}

/// One object of a listing, relative to the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub rel: String,
    pub size: u64,
    pub etag: String,
    /// Seconds since the epoch.
    pub mtime: i64,
}

impl Listed {
    /// The version a read of this object must see.
    pub fn version(&self) -> Version<'_> {
        Version {
            etag: &self.etag,
            mtime: self.mtime,
        }
    }

    /// Whether `self` and `other` (of one object) are the same version:
    /// same size, and same ETag when both have one, else same
    /// modification time (a server that lists no ETag, such as s3s-fs,
    /// still gives one on GET and HEAD, so a version known from an upload
    /// or a HEAD has one and a listed one does not).
    pub fn same_version(&self, other: &Listed) -> bool {
        self.size == other.size
            && if !self.etag.is_empty() && !other.etag.is_empty() {
                self.etag == other.etag
            } else {
                self.mtime == other.mtime
            }
    }

    /// A name for this version, unique among the object's versions.
    pub fn version_key(&self) -> String {
        if self.etag.is_empty() {
            format!("mtime {} size {}", self.mtime, self.size)
        } else {
            self.etag.clone()
        }
    }
}

/// The version of an object a ranged read must see: its ETag, or, when
/// the server gave none, its modification time (whole seconds, as HTTP
/// dates carry it). The GET is conditional on it (`If-Match`, else
/// `If-Unmodified-Since`), and the response's own ETag or `Last-Modified`
/// is checked as well, so a server that ignores conditions (s3s-fs does)
/// still never hands over bytes of another version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version<'a> {
    pub etag: &'a str,
    pub mtime: i64,
}

impl Version<'_> {
    fn options(&self, range: Range<u64>) -> GetOptions {
        let etag = (!self.etag.is_empty()).then(|| self.etag.to_string());
        let since = if etag.is_none() {
            chrono::DateTime::from_timestamp(self.mtime, 0)
        } else {
            None
        };
        GetOptions {
            range: Some(GetRange::Bounded(range)),
            if_match: etag,
            if_unmodified_since: since,
            ..Default::default()
        }
    }

    /// Whether the response described by `meta` is of this version.
    fn check(&self, what: &str, meta: &object_store::ObjectMeta) -> io::Result<()> {
        let same = match meta.e_tag.as_deref() {
            Some(got) if !self.etag.is_empty() => got == self.etag,
            _ => meta.last_modified.timestamp() == self.mtime,
        };
        if same {
            Ok(())
        } else {
            Err(other(format!(
                "{what}: the object changed on the server (it is now ETag {}, modified {})",
                meta.e_tag.as_deref().unwrap_or("none"),
                meta.last_modified.to_rfc3339()
            )))
        }
    }
}

/// Writes fetched bytes: the offset in the object of the first, and the
/// bytes.
pub type WriteAt<'a> = dyn Fn(u64, &[u8]) -> io::Result<()> + 'a;

pub struct S3Client {
    url: S3Url,
    store: Arc<AmazonS3>,
    rt: tokio::runtime::Runtime,
    deadline: Duration,
    /// Where multipart uploads in progress are recorded, if anywhere.
    journal: Option<PathBuf>,
}

impl std::fmt::Debug for S3Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3Client({})", self.url)
    }
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

impl S3Client {
    pub fn new(url: S3Url, opts: &S3Options) -> io::Result<S3Client> {
        let mut b = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
        // The shared files fill what the environment leaves unset.
        let files = super::aws_config::resolve_env().map_err(other)?;
        let env = super::credentials::env;
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| files.region.clone());
        if let Some(r) = &region {
            b = b.with_region(r);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ckptfs-s3")
            .enable_all()
            .build()?;
        // Keys in the environment win (object_store read them). Then, as
        // in the AWS CLI: a role the profile assumes, a web identity the
        // environment names (object_store reads it), then SSO, keys and
        // processes from the files.
        if env("AWS_ACCESS_KEY_ID").is_none()
            && (files.role.is_some() || env("AWS_WEB_IDENTITY_TOKEN_FILE").is_none())
        {
            let region = region.as_deref().unwrap_or("us-east-1");
            if let Some(p) = super::credentials::provider(&files, region).map_err(other)? {
                // Ask once now: a broken broker, role or login is one
                // clear error at start, not an EIO at the first read.
                rt.block_on(p.get_credential())
                    .map_err(|e| other(one_line(&e.to_string())))?;
                b = b.with_credentials(p);
            }
        }
        let endpoint = opts
            .endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or(files.endpoint_url);
        let mut client = ClientOptions::new()
            .with_timeout(opts.timeout)
            .with_connect_timeout(opts.timeout);
        if let Some(e) = &endpoint {
            b = b.with_endpoint(e);
            if e.starts_with("http://") {
                client = client.with_allow_http(true);
            }
        }
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: opts.retries,
            retry_timeout: opts.timeout * (opts.retries as u32 + 1),
        };
        let store = b
            .with_client_options(client)
            .with_http_connector(super::traffic::CountingConnector)
            .with_retry(retry)
            .build()
            .map_err(|e| other(format!("{url}: {e}")))?;
        Ok(S3Client {
            url,
            store: Arc::new(store),
            rt,
            deadline: opts.timeout * (opts.retries as u32 + 2),
            journal: None,
        })
    }

    pub fn url(&self) -> &S3Url {
        &self.url
    }

    /// Runs `f` on the runtime, cut off at the call's deadline (or the
    /// thread's read deadline, `deadline`, if sooner); errors name `what`
    /// (an object).
    fn run<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> io::Result<T> {
        let (limit, by_read) = self.limit(what)?;
        // The timer is created inside the runtime (it needs its context).
        let r = self
            .rt
            .block_on(async { tokio::time::timeout(limit, f).await });
        match r {
            Err(_) if by_read => Err(super::deadline::expired(what)),
            r => map_result(what, r, limit),
        }
    }

    /// How long a call may take: its own deadline, or what is left of the
    /// thread's read deadline if that is sooner (then true).
    fn limit(&self, what: &str) -> io::Result<(Duration, bool)> {
        Ok(match super::deadline::remaining(what)? {
            Some(left) if left < self.deadline => (left, true),
            _ => (self.deadline, false),
        })
    }

    /// Fetches the ranges `parts` of object `rel` (version `version`), up to
    /// `in_flight` at once. Each response body is handed to `write` as it
    /// arrives, chunk by chunk, with the offset in the object of the
    /// chunk's first byte (never beyond its part): no part is gathered in
    /// memory first, so memory stays at a few chunks per request and the
    /// bytes are copied once. `done` is told of each part once all its
    /// bytes were written, in the order the parts complete. A part whose
    /// body is shorter or longer than asked is an error (what it wrote is
    /// then not to be trusted: the caller is not told of that part).
    pub fn get_ranges(
        &self,
        rel: &str,
        parts: &[Range<u64>],
        version: Version<'_>,
        in_flight: usize,
        write: &WriteAt<'_>,
        done: &mut dyn FnMut(&Range<u64>),
    ) -> io::Result<()> {
        let path = ObjPath::from(self.url.key(rel));
        let name = self.url.display(rel);
        let (first, last) = match (parts.first(), parts.last()) {
            (Some(a), Some(z)) => (a.start, z.end),
            _ => return Ok(()),
        };
        let all = format!("{name} bytes {first}..{last}");
        // Every part, however many wait their turn, ends by the thread's
        // read deadline.
        let (limit, by_read) = self.limit(&all)?;
        // The timer is created inside the runtime (it needs its context).
        let r = self.rt.block_on(async {
            tokio::time::timeout(
                limit,
                self.get_parts(&path, &name, parts, version, in_flight, write, done),
            )
            .await
        });
        match r {
            Ok(r) => r,
            Err(_) if by_read => Err(super::deadline::expired(&all)),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{all}: no answer within {limit:?}"),
            )),
        }
    }

    /// The body of [`Self::get_ranges`], on the runtime.
    #[allow(clippy::too_many_arguments)]
    async fn get_parts(
        &self,
        path: &ObjPath,
        name: &str,
        parts: &[Range<u64>],
        version: Version<'_>,
        in_flight: usize,
        write: &WriteAt<'_>,
        done: &mut dyn FnMut(&Range<u64>),
    ) -> io::Result<()> {
        use futures::StreamExt;
        let deadline = self.deadline;
        {
            let mut s = futures::stream::iter(parts.iter().cloned())
                .map(|r| {
                    let (path, name) = (&path, &name);
                    async move {
                        let what = format!("{name} bytes {}..{}", r.start, r.end);
                        let opts = version.options(r.clone());
                        let got = tokio::time::timeout(deadline, async {
                            let got = self
                                .store
                                .get_opts(path, opts)
                                .await
                                .map_err(|e| store_error(&what, e))?;
                            version.check(&what, &got.meta)?;
                            let mut body = got.into_stream();
                            let mut at = r.start;
                            while let Some(chunk) =
                                body.try_next().await.map_err(|e| store_error(&what, e))?
                            {
                                let n = chunk.len() as u64;
                                if n > r.end - at {
                                    return Err(other(format!(
                                        "{what}: the server sent more than {} bytes",
                                        r.end - r.start
                                    )));
                                }
                                write(at, &chunk)?;
                                at += n;
                            }
                            if at != r.end {
                                return Err(other(format!(
                                    "{what}: the server sent {} bytes",
                                    at - r.start
                                )));
                            }
                            Ok(r)
                        })
                        .await;
                        map_result(&what, got.map(Ok), deadline)?
                    }
                })
                .buffer_unordered(in_flight.max(1));
            while let Some(r) = s.try_next().await? {
                done(&r);
            }
            Ok(())
        }
    }

    /// Every object under the prefix (keys relative to it).
    pub fn list(&self) -> io::Result<Vec<Listed>> {
        let prefix = (!self.url.prefix.is_empty()).then(|| ObjPath::from(self.url.prefix.as_str()));
        let metas: Vec<object_store::ObjectMeta> = self.run(&self.url.to_string(), async {
            self.store.list(prefix.as_ref()).try_collect().await
        })?;
        let cut = if self.url.prefix.is_empty() {
            0
        } else {
            self.url.prefix.len() + 1
        };
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let key = m.location.to_string();
                let rel = key.get(cut..)?.to_string();
                Some(Listed {
                    rel,
                    size: m.size,
                    etag: m.e_tag.unwrap_or_default(),
                    mtime: m.last_modified.timestamp(),
                })
            })
            .collect())
    }

    /// The size and ETag of object `rel`.
    pub fn head(&self, rel: &str) -> io::Result<Listed> {
        let path = ObjPath::from(self.url.key(rel));
        let m = self.run(&self.url.display(rel), async {
            self.store.head(&path).await
        })?;
        Ok(Listed {
            rel: rel.to_string(),
            size: m.size,
            etag: m.e_tag.unwrap_or_default(),
            mtime: m.last_modified.timestamp(),
        })
    }

    /// Creates object `rel` holding `bytes` only if no object has that
    /// name (`AlreadyExists` otherwise). Returns its ETag.
    pub fn put_new(&self, rel: &str, bytes: Vec<u8>) -> io::Result<String> {
        self.put_mode(rel, bytes, PutMode::Create)
    }

    /// Replaces object `rel` by `bytes` only if its ETag is still `etag`
    /// (an error saying it changed otherwise). Returns the new ETag.
    pub fn put_if(&self, rel: &str, bytes: Vec<u8>, etag: &str) -> io::Result<String> {
        let v = object_store::UpdateVersion {
            e_tag: Some(etag.to_string()),
            version: None,
        };
        self.put_mode(rel, bytes, PutMode::Update(v))
    }

    fn put_mode(&self, rel: &str, bytes: Vec<u8>, mode: PutMode) -> io::Result<String> {
        let what = self.url.display(rel);
        let path = ObjPath::from(self.url.key(rel));
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        self.run(&what, async {
            self.store
                .put_opts(&path, PutPayload::from(bytes), opts)
                .await
        })
        .map(etag_of)
    }

    /// The whole of small object `rel` and its ETag; an object larger
    /// than `max` bytes is an error (nothing is read past `max`).
    pub fn get_small(&self, rel: &str, max: u64) -> io::Result<(Vec<u8>, String)> {
        let what = self.url.display(rel);
        let path = ObjPath::from(self.url.key(rel));
        let got = self.run(&what, async {
            let r = self.store.get_opts(&path, GetOptions::default()).await?;
            if r.meta.size > max {
                return Ok(None);
            }
            let etag = r.meta.e_tag.clone().unwrap_or_default();
            Ok(Some((r.bytes().await?, etag)))
        })?;
        match got {
            Some((bytes, etag)) if bytes.len() as u64 <= max => Ok((bytes.to_vec(), etag)),
            _ => Err(other(format!("{what}: larger than {max} bytes"))),
        }
    }

    /// Server-side copy of object `from` to `to` (replacing `to`).
    pub fn copy(&self, from: &str, to: &str) -> io::Result<()> {
        let what = format!(
            "copying {} to {}",
            self.url.display(from),
            self.url.display(to)
        );
        let (f, t) = (
            ObjPath::from(self.url.key(from)),
            ObjPath::from(self.url.key(to)),
        );
        self.run(&what, async { self.store.copy(&f, &t).await })
    }

    pub fn delete(&self, rel: &str) -> io::Result<()> {
        let path = ObjPath::from(self.url.key(rel));
        self.run(&self.url.display(rel), async {
            self.store.delete(&path).await
        })
    }
}

fn map_result<T>(
    what: &str,
    r: std::result::Result<object_store::Result<T>, tokio::time::error::Elapsed>,
    deadline: Duration,
) -> io::Result<T> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(store_error(what, e)),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what}: no answer within {deadline:?}"),
        )),
    }
}

/// An error of object_store for `what`, in one line.
fn store_error(what: &str, e: object_store::Error) -> io::Error {
    match e {
        object_store::Error::NotFound { .. } => {
            io::Error::new(io::ErrorKind::NotFound, format!("{what}: no such object"))
        }
        object_store::Error::Precondition { .. } => other(format!(
            "{what}: the object changed on the server (its ETag no longer matches)"
        )),
        object_store::Error::AlreadyExists { .. } => io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{what}: already exists"),
        ),
        e => other(format!("{what}: {}", one_line(&e.to_string()))),
    }
}

fn etag_of(r: object_store::PutResult) -> String {
    r.e_tag.unwrap_or_default()
}

/// object_store's messages span lines (a source chain); the log and the
/// CLI want one.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests;
