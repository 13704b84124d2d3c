//! `s3://` URLs for the CLI: `info`, `verify` and `unpack` of an object
//! (downloaded whole into a private temporary directory first: these read
//! every byte anyway, except `info`), and `pack -o s3://...` (packed into a
//! temporary directory, then uploaded: each object appears only when its
//! upload completes, in parts for large files). Endpoint, region and
//! credentials come from the AWS environment variables
//! (`AWS_ENDPOINT_URL` for S3-compatible servers).

use super::Result;
use crate::store::s3::{S3Client, S3Options, S3Url};
use anyhow::Context as _;
use parking_lot::Mutex;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// Local copies of objects (and local outputs to upload), each with the
/// URL that messages must name instead.
static SHOWN: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

fn register(local: &Path, url: String) {
    SHOWN.lock().push((local.display().to_string(), url));
}

/// How messages name `path`: its URL when it is (or lies below) the local
/// copy of an object, else the path itself.
pub fn shown(path: &Path) -> String {
    named(&path.display().to_string())
}

/// `text` with every local copy's path replaced by its URL.
pub fn named(text: &str) -> String {
    let mut t = text.to_string();
    for (local, url) in SHOWN.lock().iter() {
        t = t.replace(local.as_str(), url);
    }
    t
}

/// An error whose message names URLs instead of local copies (one line,
/// as `main` prints it).
pub fn named_error(e: anyhow::Error) -> anyhow::Error {
    if SHOWN.lock().is_empty() {
        return e;
    }
    anyhow::anyhow!(named(&super::one_line(&*e)))
}

fn client_for(url: &S3Url) -> Result<S3Client> {
    let root = S3Url {
        bucket: url.bucket.clone(),
        prefix: String::new(),
    };
    S3Client::new(root, &S3Options::default()).with_context(|| url.to_string())
}

fn url_of(p: &Path) -> Option<Result<S3Url>> {
    p.to_str()
        .and_then(S3Url::parse)
        .map(|r| r.map_err(anyhow::Error::msg))
}

/// Replaces every `s3://` path of `paths` by a local copy of the object;
/// the copies live as long as the returned directory.
pub fn localize(paths: &mut [PathBuf]) -> Result<Option<TempDir>> {
    let mut dir = None;
    for (i, p) in paths.iter_mut().enumerate() {
        let Some(url) = url_of(p) else { continue };
        let url = url?;
        if url.prefix.is_empty() {
            anyhow::bail!("{}: names a bucket, not an object", p.display());
        }
        let d: &TempDir = match &mut dir {
            Some(d) => d,
            None => dir.insert(tempfile::Builder::new().prefix("ckptfs-s3-").tempdir()?),
        };
        let name = url.prefix.rsplit('/').next().unwrap_or("object");
        let sub = d.path().join(i.to_string());
        std::fs::create_dir(&sub)?;
        let local = sub.join(name);
        let shown = format!("s3://{}/{}", url.bucket, url.prefix);
        download(&url, &local).with_context(|| shown.clone())?;
        register(&local, shown);
        *p = local;
    }
    Ok(dir)
}

/// Downloads object `url` (its prefix is the key) to `dest`.
fn download(url: &S3Url, dest: &Path) -> Result<()> {
    let client = client_for(url)?;
    let key = url.prefix.as_str();
    let head = client.head(key)?;
    let f = std::fs::File::create(dest).with_context(|| dest.display().to_string())?;
    f.set_len(head.size)?;
    let parts: Vec<Range<u64>> = (0..head.size.div_ceil(8 << 20))
        .map(|i| i * (8 << 20)..((i + 1) * (8 << 20)).min(head.size))
        .collect();
    client.get_ranges(
        key,
        &parts,
        head.version(),
        4,
        &|at, b| f.write_all_at(b, at),
        &mut |_| {},
    )?;
    Ok(())
}

/// `pack` with an `s3://` output: the output path to pack into (in a
/// temporary directory) and what to upload afterwards.
pub struct Upload {
    url: S3Url,
    _dir: TempDir,
    pub local: PathBuf,
}

pub fn upload_target(out: Option<&Path>) -> Result<Option<Upload>> {
    let Some(url) = out.and_then(url_of) else {
        return Ok(None);
    };
    let url = url?;
    let dir = tempfile::Builder::new().prefix("ckptfs-s3-").tempdir()?;
    let name = url
        .prefix
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("store");
    let local = dir.path().join(name);
    register(&local, format!("s3://{}/{}", url.bucket, url.prefix));
    Ok(Some(Upload {
        url,
        _dir: dir,
        local,
    }))
}

impl Upload {
    /// Uploads what was packed: a file as the object the URL names, a
    /// directory as objects under the URL's prefix.
    pub fn finish(self) -> Result<()> {
        let client = client_for(&self.url)?;
        if self.local.is_file() {
            client.put_file(&self.local, &self.url.prefix)?;
            eprintln!("uploaded {}", self.url);
            return Ok(());
        }
        let mut files = Vec::new();
        walk(&self.local, &self.local, &mut files)?;
        files.sort();
        for rel in &files {
            let key = self.url.key(rel);
            client.put_file(&self.local.join(rel), &key)?;
        }
        eprintln!("uploaded {} objects to {}", files.len(), self.url);
        Ok(())
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let e = e?;
        let p = e.path();
        if e.file_type()?.is_dir() {
            walk(root, &p, out)?;
        } else if e.file_type()?.is_file() {
            let rel = p.strip_prefix(root).unwrap_or(&p);
            out.push(rel.to_string_lossy().into_owned());
        }
    }
    Ok(())
}
