//! The `.blz` writer: a model directory in, one archive out.
//!
//! Every regular file under the directory is stored under its relative
//! path. Symlinks are followed to regular files (a Hugging Face cache
//! snapshot is all symlinks) and their content stored; a symlink to a
//! directory, a dangling one or any other special file is refused, as are
//! names that are not UTF-8. The output file itself is skipped.
//!
//! `*.safetensors` files are validated (every check the safetensors crate
//! makes) before anything is written; each tensor becomes a blob, deduplicated
//! by content across all shards. Shards whose tensors do not tile the data
//! buffer store the buffer as one blob. Plain files up to [`EMBED_MAX`] are
//! embedded in the header (UTF-8 as text, anything else base64); larger ones
//! are a blob.
//!
//! Blobs are encoded in parallel in windows of ~256 MiB of input and spooled
//! to an unnamed temporary file next to the output, since the header (which
//! lists their offsets and digests) precedes them. The archive is then
//! written atomically: prelude, header, the spool copied.

use super::tensor::{digests, encode_tensor};
use super::{BlzOptions, BlzStats};
use base64::Engine as _;
use ckptfs_format::blz::{
    self, BlobEntry, BlockEntry, Content as FileContent, Digest, Encoding, FileEntry, Header,
    Shard, Stored, TensorEntry,
};
use ckptfs_format::digest::xxh3_64;
use ckptfs_format::frame::BLOCK_BYTES;
use ckptfs_format::fsutil::{parent_dir, write_atomic};
use ckptfs_format::safetensors::{self, Dtype};
use memmap2::Mmap;
use rayon::prelude::*;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::fs;
use std::io::{self, Seek, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Plain files up to this size are embedded in the header.
pub const EMBED_MAX: u64 = 16 << 20;

#[derive(Debug, Error)]
pub enum BlzPackError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: {what}")]
    Input { path: String, what: String },
    #[error("internal check failed: {0}")]
    Internal(String),
    /// Reading an input archive (patches read BLAZE-X archives).
    #[error("{0}")]
    Archive(#[from] ckptfs_archive::ArchiveError),
}

enum Content {
    Shard {
        map: Option<Mmap>,
        header: safetensors::Header,
        data_start: usize,
    },
    Small(Vec<u8>),
    Large(Mmap),
}

struct Input {
    rel: String,
    content: Content,
}

impl Input {
    fn bytes(&self) -> &[u8] {
        match &self.content {
            Content::Shard { map, .. } => map.as_deref().unwrap_or(&[]),
            Content::Small(v) => v,
            Content::Large(m) => m,
        }
    }
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> BlzPackError + '_ {
    move |source| BlzPackError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Relative paths of every regular file under `src` (symlinks followed to
/// files), sorted, with their absolute paths.
pub fn walk(src: &Path, skip: Option<&Path>) -> Result<Vec<(String, PathBuf)>, BlzPackError> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), src.to_path_buf())];
    while let Some((rel, dir)) = stack.pop() {
        for e in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let e = e.map_err(io_err(&dir))?;
            let p = e.path();
            let name = e
                .file_name()
                .into_string()
                .map_err(|n| BlzPackError::Input {
                    path: dir.join(&n).display().to_string(),
                    what: "name is not UTF-8".into(),
                })?;
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let ft = e.file_type().map_err(io_err(&p))?;
            if ft.is_dir() {
                stack.push((r, p));
                continue;
            }
            if skip.is_some_and(|s| fs::canonicalize(&p).ok().as_deref() == Some(s)) {
                continue;
            }
            let meta = fs::metadata(&p).map_err(|e| BlzPackError::Input {
                path: p.display().to_string(),
                what: format!("cannot follow: {e}"),
            })?;
            if !meta.is_file() {
                return Err(BlzPackError::Input {
                    path: p.display().to_string(),
                    what: if ft.is_symlink() {
                        "symlink to a directory or special file (only links to regular files are followed)".into()
                    } else {
                        "not a regular file".into()
                    },
                });
            }
            blz::check_path(&r).map_err(|e| BlzPackError::Input {
                path: p.display().to_string(),
                what: e.to_string(),
            })?;
            out.push((r, p));
        }
    }
    out.sort();
    Ok(out)
}

fn map_file(path: &Path) -> Result<Option<Mmap>, BlzPackError> {
    let f = fs::File::open(path).map_err(io_err(path))?;
    if f.metadata().map_err(io_err(path))?.len() == 0 {
        return Ok(None);
    }
    // SAFETY: read-only private map; the input must not change while
    // packing (the digests are computed from the same bytes that are
    // written, so a concurrent writer could only make the archive describe
    // a file that never existed, and `verify` would still pass).
    Ok(Some(unsafe { Mmap::map(&f) }.map_err(io_err(path))?))
}

fn load(rel: String, abs: &Path) -> Result<Input, BlzPackError> {
    let size = fs::metadata(abs).map_err(io_err(abs))?.len();
    let content = if rel.ends_with(".safetensors") {
        let map = map_file(abs)?;
        let bytes = map.as_deref().unwrap_or(&[]);
        let (header, data) = safetensors::split_file(bytes).map_err(|e| BlzPackError::Input {
            path: abs.display().to_string(),
            what: e.to_string(),
        })?;
        let data_start = bytes.len() - data.len();
        Content::Shard {
            map,
            header,
            data_start,
        }
    } else if size <= EMBED_MAX {
        Content::Small(fs::read(abs).map_err(io_err(abs))?)
    } else {
        match map_file(abs)? {
            Some(m) => Content::Large(m),
            None => Content::Small(Vec::new()),
        }
    };
    Ok(Input { rel, content })
}

/// Bytes to store as one blob.
struct Job<'a> {
    bytes: &'a [u8],
    dtype: Option<Dtype>,
}

/// Content-addressed blob table: identical bytes get one blob.
struct Blobs<'a> {
    jobs: Vec<Job<'a>>,
    by_hash: HashMap<(u64, u64), Vec<u32>>,
    hashes: Vec<u64>,
    dedup_hits: usize,
}

impl<'a> Blobs<'a> {
    fn add(&mut self, bytes: &'a [u8], hash: u64, dtype: Option<Dtype>) -> u32 {
        let cands = self.by_hash.entry((hash, bytes.len() as u64)).or_default();
        if let Some(&j) = cands
            .iter()
            .find(|&&j| self.jobs[j as usize].bytes == bytes)
        {
            self.dedup_hits += 1;
            return j;
        }
        let id = self.jobs.len() as u32;
        cands.push(id);
        self.jobs.push(Job { bytes, dtype });
        self.hashes.push(hash);
        id
    }
}

/// Packs directory `src` into the archive `out`, atomically. Every input is
/// read and validated before the output is created.
pub fn pack_dir(
    src: &Path,
    out: &Path,
    opts: BlzOptions,
    force: bool,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<BlzStats, BlzPackError> {
    if !src.is_dir() {
        return Err(BlzPackError::Input {
            path: src.display().to_string(),
            what: "not a directory".into(),
        });
    }
    if !force && out.symlink_metadata().is_ok() {
        return Err(BlzPackError::Input {
            path: out.display().to_string(),
            what: "output exists (use --force to replace it)".into(),
        });
    }
    let skip = fs::canonicalize(out).ok();
    let inputs: Vec<Input> = walk(src, skip.as_deref())?
        .into_iter()
        .map(|(rel, abs)| load(rel, &abs))
        .collect::<Result<_, _>>()?;

    // Hash every tensor (and large file) once: the digests go in the header
    // and key the dedup.
    let mut pieces: Vec<(usize, Option<usize>, &[u8])> = Vec::new();
    for (i, inp) in inputs.iter().enumerate() {
        match &inp.content {
            Content::Shard {
                header, data_start, ..
            } => {
                let data = &inp.bytes()[*data_start..];
                for (t, e) in header.tensors.iter().enumerate() {
                    pieces.push((i, Some(t), &data[e.begin as usize..e.end as usize]));
                }
                if !header.tiles(data.len() as u64) {
                    pieces.push((i, None, data));
                }
            }
            Content::Large(m) => pieces.push((i, None, m)),
            Content::Small(_) => {}
        }
    }
    let hashes: Vec<u64> = pieces.par_iter().map(|(_, _, b)| xxh3_64(b)).collect();
    let hash_of: HashMap<(usize, Option<usize>), u64> = pieces
        .iter()
        .zip(&hashes)
        .map(|((i, t, _), h)| ((*i, *t), *h))
        .collect();

    let mut blobs = Blobs {
        jobs: Vec::new(),
        by_hash: HashMap::new(),
        hashes: Vec::new(),
        dedup_hits: 0,
    };
    let mut stats = BlzStats {
        files: inputs.len(),
        ..Default::default()
    };
    let mut files = Vec::with_capacity(inputs.len());
    for (i, inp) in inputs.iter().enumerate() {
        let size = inp.bytes().len() as u64;
        stats.raw_bytes += size;
        let content = match &inp.content {
            Content::Small(v) => FileContent::Plain {
                xxh3: Digest(xxh3_64(v)),
                stored: match std::str::from_utf8(v) {
                    Ok(s) => Stored::Text(s.to_string()),
                    Err(_) => Stored::Base64(base64::engine::general_purpose::STANDARD.encode(v)),
                },
            },
            Content::Large(m) => {
                let h = hash_of[&(i, None)];
                FileContent::Plain {
                    xxh3: Digest(h),
                    stored: Stored::Blob(blobs.add(m, h, None)),
                }
            }
            Content::Shard {
                header, data_start, ..
            } => {
                stats.shards += 1;
                stats.tensors += header.tensors.len();
                let data = &inp.bytes()[*data_start..];
                let sh = std::str::from_utf8(&header.raw)
                    .map_err(|e| BlzPackError::Internal(e.to_string()))?;
                let tiles = header.tiles(data.len() as u64);
                let data_blob = (!tiles).then(|| blobs.add(data, hash_of[&(i, None)], None));
                // Tensors in data order, as the file lays them out.
                let mut order: Vec<usize> = (0..header.tensors.len()).collect();
                order.sort_by_key(|&t| header.tensors[t].begin);
                let mut ts = Vec::with_capacity(order.len());
                for t in order {
                    let te = &header.tensors[t];
                    let h = hash_of[&(i, Some(t))];
                    let blob = tiles.then(|| {
                        blobs.add(
                            &data[te.begin as usize..te.end as usize],
                            h,
                            te.known_dtype(),
                        )
                    });
                    ts.push(TensorEntry {
                        name: te.name.clone(),
                        dtype: te.dtype.clone(),
                        shape: te.shape.clone(),
                        data_offsets: [te.begin, te.end],
                        xxh3: Digest(h),
                        blob,
                    });
                }
                FileContent::Shard(Shard {
                    header: sh.to_string(),
                    header_xxh3: Digest(xxh3_64(&header.raw)),
                    data_length: data.len() as u64,
                    data_blob,
                    tensors: ts,
                })
            }
        };
        let e = FileEntry {
            path: inp.rel.clone(),
            size,
            content,
        };
        files.push(e);
    }
    stats.deduplicated = blobs.dedup_hits;
    stats.blobs = blobs.jobs.len();

    // Encode and spool the blobs.
    let dir = parent_dir(out);
    let spool = tempfile::tempfile_in(&dir).map_err(io_err(&dir))?;
    let mut w = io::BufWriter::with_capacity(1 << 20, &spool);
    let mut sha = Sha256::new();
    let mut entries: Vec<BlobEntry> = Vec::with_capacity(blobs.jobs.len());
    let mut offset = 0u64;
    let mut k = 0;
    while k < blobs.jobs.len() {
        let mut j = k;
        let mut bytes = 0u64;
        while j < blobs.jobs.len() && (j == k || bytes < 256 << 20) {
            bytes += blobs.jobs[j].bytes.len() as u64;
            j += 1;
        }
        let done: Vec<(Option<Vec<u8>>, BlobEntry)> = (k..j)
            .into_par_iter()
            .map(|b| {
                let r = encode_blob(&blobs.jobs[b], blobs.hashes[b], opts);
                progress(blobs.jobs[b].bytes.len() as u64);
                r
            })
            .collect::<Result<_, _>>()?;
        for (b, (frame, mut entry)) in (k..j).zip(done) {
            let stored: &[u8] = frame.as_deref().unwrap_or(blobs.jobs[b].bytes);
            w.write_all(stored).map_err(io_err(&dir))?;
            sha.update(stored);
            entry.offset = offset;
            offset += stored.len() as u64;
            entries.push(entry);
        }
        k = j;
    }
    w.flush().map_err(io_err(&dir))?;
    drop(w);

    let header = Header {
        data_length: offset,
        data_sha256: ckptfs_archive::blz::hex(&sha.finalize()),
        files,
        blobs: entries,
        header_xxh3: Digest(0),
    };
    let json = blz::render_header(&header);
    if json.len() as u64 > blz::MAX_HEADER_LEN {
        return Err(BlzPackError::Internal(format!(
            "header of {} bytes exceeds the {}-byte limit",
            json.len(),
            blz::MAX_HEADER_LEN
        )));
    }
    let mut spool = spool;
    spool.rewind().map_err(io_err(&dir))?;
    write_atomic(out, force, |w| {
        w.write_all(&blz::render_prelude(json.len() as u64))?;
        w.write_all(&json)?;
        let n = io::copy(&mut spool, w)?;
        if n != offset {
            return Err(io::Error::other(format!(
                "spool holds {n} bytes, expected {offset}"
            )));
        }
        Ok(())
    })
    .map_err(io_err(out))?;
    stats.stored_bytes = blz::PRELUDE_LEN + json.len() as u64 + offset;
    Ok(stats)
}

/// Encodes one blob: `(frame bytes, or None to store the input as is; the
/// entry without its offset)`.
fn encode_blob(
    job: &Job<'_>,
    hash: u64,
    opts: BlzOptions,
) -> Result<(Option<Vec<u8>>, BlobEntry), BlzPackError> {
    let raw = job.bytes;
    if opts.raw {
        let mut blocks: Vec<BlockEntry> = raw
            .chunks(BLOCK_BYTES as usize)
            .enumerate()
            .map(|(j, c)| BlockEntry {
                end: (j as u64) * BLOCK_BYTES + c.len() as u64,
                payload: None,
                data: Digest(xxh3_64(c)),
            })
            .collect();
        if blocks.is_empty() {
            blocks.push(BlockEntry {
                end: 0,
                payload: None,
                data: Digest(xxh3_64(&[])),
            });
        }
        return Ok((
            None,
            BlobEntry {
                offset: 0,
                length: raw.len() as u64,
                encoding: Encoding::Raw,
                decoded_length: raw.len() as u64,
                xxh3: Digest(hash),
                meta: None,
                blocks,
            },
        ));
    }
    let frame = encode_tensor(job.dtype, raw, opts.pack);
    let d = digests(&frame, raw).map_err(|e| BlzPackError::Internal(e.to_string()))?;
    let entry = BlobEntry {
        offset: 0,
        length: frame.len() as u64,
        encoding: Encoding::Z4aiFrame,
        decoded_length: raw.len() as u64,
        xxh3: Digest(hash),
        meta: Some(Digest(d.meta)),
        blocks: d
            .blocks
            .iter()
            .map(|b| BlockEntry {
                end: b.end,
                payload: Some(Digest(b.payload)),
                data: Digest(b.data),
            })
            .collect(),
    };
    Ok((Some(frame), entry))
}
