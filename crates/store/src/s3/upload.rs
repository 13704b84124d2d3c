//! Uploads: a file put whole, or in parts when large ([`MULTIPART_AT`]),
//! each upload aborted on every failure, and the journal of multipart
//! uploads in progress through which one a crash interrupted is aborted
//! later.

use super::{etag_of, map_result, other, S3Client};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjPath;
use object_store::{MultipartId, ObjectStore, PutPayload};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Objects at or above this size are uploaded in parts.
const MULTIPART_AT: u64 = 64 << 20;
/// The size of an upload's parts, unless the object has more than
/// [`MAX_PARTS`] of them.
const PART: usize = 16 << 20;
/// S3 takes at most 10,000 parts per upload.
const MAX_PARTS: u64 = 10_000;
/// Parts of one upload sent at once (memory: this many parts).
const PARTS_IN_FLIGHT: usize = 4;

/// The part size of an upload of `len` bytes: [`PART`], or larger (whole
/// MiB) so that the parts are at most [`MAX_PARTS`].
fn part_size(len: u64) -> usize {
    let need = len.div_ceil(MAX_PARTS).div_ceil(1 << 20) << 20;
    (PART as u64).max(need) as usize
}

/// A multipart upload in progress, as its journal entry records it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Journaled {
    /// The object's whole key.
    key: String,
    upload_id: String,
}

impl S3Client {
    /// Uploads the file at `src` as object `rel` (in parts when large).
    /// The object appears only once the whole upload has completed.
    /// Returns its ETag.
    ///
    /// A multipart upload runs wholly on the runtime, [`PARTS_IN_FLIGHT`]
    /// parts at once, each cut off at the call's deadline. On any failure
    /// (an error, a timeout, a panic below) the upload is aborted on the
    /// server, so that no incomplete upload keeps its parts stored. With
    /// an upload journal ([`Self::with_upload_journal`]) the upload's id is
    /// written there, synced, before the first part is sent and removed
    /// once it completed or was aborted: an upload a crash (`kill -9`)
    /// interrupted is aborted by [`Self::abort_journaled_uploads`].
    pub fn put_file(&self, src: &Path, rel: &str) -> io::Result<String> {
        let what = self.url.display(rel);
        let path = ObjPath::from(self.url.key(rel));
        let local = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", src.display()));
        let mut f = std::fs::File::open(src).map_err(local)?;
        let len = f.metadata().map_err(local)?.len();
        if len < MULTIPART_AT {
            let mut buf = Vec::with_capacity(len as usize);
            f.read_to_end(&mut buf).map_err(local)?;
            return self
                .run(&what, async {
                    self.store.put(&path, PutPayload::from(buf)).await
                })
                .map(etag_of);
        }
        let id = self.run(&what, self.store.create_multipart(&path))?;
        let entry = match self.journal_add(&path, &id) {
            Ok(e) => e,
            Err(e) => {
                let e = other(format!(
                    "{what}: cannot record the upload in the journal: {e}"
                ));
                return Err(self.abort_upload(&what, &path, &id, None, e));
            }
        };
        log::info!("{what}: uploading {len} bytes in parts (upload {id})");
        let part = part_size(len);
        // A panic anywhere below (object_store, the runtime) must not
        // leave the upload behind, nor unwind into the caller's thread
        // (the mount's write-back thread).
        let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.rt
                .block_on(self.send_parts(&what, &path, &id, &mut f, part))
        }))
        .unwrap_or_else(|p| {
            Err(other(format!(
                "{what}: the upload failed: {}",
                panic_text(&*p)
            )))
        });
        let done = sent
            .and_then(|parts| self.run(&what, self.store.complete_multipart(&path, &id, parts)));
        match done {
            Ok(put) => {
                if let Some(e) = entry {
                    let _ = std::fs::remove_file(e);
                }
                Ok(etag_of(put))
            }
            Err(e) => Err(self.abort_upload(&what, &path, &id, entry, e)),
        }
    }

    /// Sends the parts of `f` (of `part` bytes, the last one shorter) of
    /// upload `id`; their ids in order.
    async fn send_parts(
        &self,
        what: &str,
        path: &ObjPath,
        id: &MultipartId,
        f: &mut std::fs::File,
        part: usize,
    ) -> io::Result<Vec<PartId>> {
        use futures::stream::{FuturesUnordered, StreamExt};
        let deadline = self.deadline;
        let mut inflight = FuturesUnordered::new();
        let mut parts: Vec<Option<PartId>> = Vec::new();
        let finished = |parts: &mut Vec<Option<PartId>>, (i, r)| -> io::Result<()> {
            let got = map_result(&format!("{what} part {}", i + 1), r, deadline)?;
            parts[i] = Some(got);
            Ok(())
        };
        loop {
            // Read on this thread (the caller's, in `block_on`): the
            // runtime's workers carry the requests meanwhile.
            let mut buf = vec![0u8; part];
            let n = read_full(f, &mut buf)?;
            if n == 0 {
                break;
            }
            buf.truncate(n);
            let i = parts.len();
            parts.push(None);
            let (store, path, id) = (self.store.clone(), path.clone(), id.clone());
            inflight.push(async move {
                let r = tokio::time::timeout(
                    deadline,
                    store.put_part(&path, &id, i, PutPayload::from(buf)),
                )
                .await;
                (i, r)
            });
            // Memory stays at PARTS_IN_FLIGHT parts.
            while inflight.len() >= PARTS_IN_FLIGHT {
                if let Some(x) = inflight.next().await {
                    finished(&mut parts, x)?;
                }
            }
        }
        while let Some(x) = inflight.next().await {
            finished(&mut parts, x)?;
        }
        parts
            .into_iter()
            .enumerate()
            .map(|(i, p)| p.ok_or_else(|| other(format!("{what}: part {} was not sent", i + 1))))
            .collect()
    }

    /// Aborts upload `id` after `cause`, and removes its journal entry once
    /// the server has dropped it (kept when the abort fails: the next
    /// [`Self::abort_journaled_uploads`] tries again). Returns `cause`,
    /// with the abort's failure if it failed.
    fn abort_upload(
        &self,
        what: &str,
        path: &ObjPath,
        id: &MultipartId,
        entry: Option<PathBuf>,
        cause: io::Error,
    ) -> io::Error {
        match self.run(what, self.store.abort_multipart(path, id)) {
            Ok(()) => {
                if let Some(e) = entry {
                    let _ = std::fs::remove_file(e);
                }
                cause
            }
            Err(e) => io::Error::new(
                cause.kind(),
                format!("{cause} (the incomplete upload {id} could not be aborted: {e})"),
            ),
        }
    }

    /// Records multipart uploads in `dir` (created if needed), so that an
    /// upload a crash interrupted can be aborted later.
    pub fn with_upload_journal(mut self, dir: PathBuf) -> io::Result<S3Client> {
        ckptfs_format::fsutil::create_dirs(&dir, 0o700, 0o700)?;
        self.journal = Some(dir);
        Ok(self)
    }

    /// Writes the journal entry of upload `id` (None: no journal).
    fn journal_add(&self, path: &ObjPath, id: &MultipartId) -> io::Result<Option<PathBuf>> {
        let Some(dir) = &self.journal else {
            return Ok(None);
        };
        let name = format!(
            "{:016x}-{:016x}.json",
            ckptfs_format::digest::xxh3_64(path.as_ref().as_bytes()),
            ckptfs_format::digest::xxh3_64(id.as_bytes())
        );
        let entry = dir.join(name);
        let j = Journaled {
            key: path.to_string(),
            upload_id: id.clone(),
        };
        ckptfs_format::fsutil::write_private(&entry, |w| {
            serde_json::to_writer(w, &j).map_err(io::Error::other)
        })?;
        Ok(Some(entry))
    }

    /// Aborts every multipart upload the journal lists (left by a process
    /// that died during them). Returns how many were dropped; an entry
    /// whose abort fails is kept for the next call, and logged.
    pub fn abort_journaled_uploads(&self) -> io::Result<usize> {
        let Some(dir) = &self.journal else {
            return Ok(0);
        };
        let mut n = 0;
        for e in std::fs::read_dir(dir)? {
            let entry = e?.path();
            if entry.extension().is_none_or(|x| x != "json") {
                let _ = std::fs::remove_file(&entry); // a temporary file
                continue;
            }
            let j: Journaled = match std::fs::read(&entry)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(j) => j,
                Err(e) => {
                    log::warn!(
                        "{}: not an upload journal entry ({e}); removed",
                        entry.display()
                    );
                    let _ = std::fs::remove_file(&entry);
                    continue;
                }
            };
            let what = format!("s3://{}/{}", self.url.bucket, j.key);
            let path = ObjPath::from(j.key.as_str());
            match self.run(&what, self.store.abort_multipart(&path, &j.upload_id)) {
                Ok(()) => {}
                // Completed, or aborted already.
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        || e.to_string().contains("NoSuchUpload") => {}
                Err(e) => {
                    log::warn!("{e}: cannot abort the interrupted upload {}", j.upload_id);
                    continue;
                }
            }
            log::info!(
                "{what}: aborted the upload {} a crash interrupted",
                j.upload_id
            );
            let _ = std::fs::remove_file(&entry);
            n += 1;
        }
        Ok(n)
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// The message of a caught panic.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}
