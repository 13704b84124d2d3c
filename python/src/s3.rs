//! `s3://` objects: downloaded whole into a private temporary directory
//! before they are opened, as the CLI's `unpack`/`verify` do, with the
//! CLI's client (endpoint, region and credentials from the AWS
//! environment variables and shared files, bounded retries and timeouts).

use crate::errors::{io, NativeError, Result};
use ckptfs::store::s3::{S3Client, S3Options, S3Url};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// Parts fetched at once, and their size.
const IN_FLIGHT: usize = 4;
const PART: u64 = 8 << 20;

/// Downloads the object `url` names; returns the directory holding the
/// copy (removed when dropped) and the copy's path. `shown` names it.
pub fn download(url: &S3Url, shown: &str) -> Result<(tempfile::TempDir, PathBuf)> {
    if url.prefix.is_empty() {
        return Err(NativeError::Format(format!(
            "{shown}: names a bucket, not an object"
        )));
    }
    let root = S3Url {
        bucket: url.bucket.clone(),
        prefix: String::new(),
    };
    let client = S3Client::new(root, &S3Options::default()).map_err(|e| io(shown, e))?;
    let key = url.prefix.as_str();
    let head = client.head(key).map_err(|e| io(shown, e))?;
    let dir = tempfile::Builder::new()
        .prefix("ckptfs-s3-")
        .tempdir()
        .map_err(|e| io("temporary directory", e))?;
    let name = key.rsplit('/').next().unwrap_or("object");
    let local = dir.path().join(name);
    let f = std::fs::File::create(&local).map_err(|e| io(shown, e))?;
    f.set_len(head.size).map_err(|e| io(shown, e))?;
    let parts: Vec<Range<u64>> = (0..head.size.div_ceil(PART))
        .map(|i| i * PART..((i + 1) * PART).min(head.size))
        .collect();
    client
        .get_ranges(
            key,
            &parts,
            head.version(),
            IN_FLIGHT,
            &|at, b| f.write_all_at(b, at),
            &mut |_| {},
        )
        .map_err(|e| io(shown, e))?;
    Ok((dir, local))
}
