//! A model directory in, one BLAZE-X `.blz` v1 out (the `blazex` tool's
//! layout, doc/FORMAT.md §5), for exchanging archives with `blazex`.
//!
//! What goes in is what `blazex pack` takes: the shards named by
//! `model.safetensors.index.json` (sorted, deduplicated), else
//! `model.safetensors`, else every top-level `*.safetensors` (sorted by
//! name); within a shard, tensors in sorted name order (`__metadata__`
//! dropped); `config.json` parsed into `model_config` (keys sorted, as
//! blazex's serde_json keeps them); `tokenizer.json` verbatim; the six
//! sidecars blazex embeds. Everything is read and checked before the output
//! is created (a dtype BLAZE-X cannot name is refused, naming the tensor);
//! the digests come from one pass over the mapped shards, then the archive
//! is written through [`write_atomic`] (temporary file, fsync, rename,
//! directory fsync). Tensor bytes are copied as they are.

use super::BlzPackError;
use base64::Engine as _;
use ckptfs_format::blazex::{self, Dtype, Header, Sidecar, TensorEntry};
use ckptfs_format::digest::xxh3_64;
use ckptfs_format::fsutil::{self, write_atomic};
use ckptfs_format::safetensors;
use memmap2::Mmap;
use rayon::prelude::*;
use sha2::{Digest as _, Sha256};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// What [`pack_blazex`] wrote.
#[derive(Debug, Clone, Copy)]
pub struct BlazexPackStats {
    pub shards: usize,
    pub tensors: usize,
    pub sidecars: usize,
    pub data_bytes: u64,
    pub stored_bytes: u64,
}

fn input(path: &Path, what: impl Into<String>) -> BlzPackError {
    BlzPackError::Input {
        path: path.display().to_string(),
        what: what.into(),
    }
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> BlzPackError + '_ {
    move |source| BlzPackError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The shards `blazex pack` reads from `src`.
fn shard_paths(src: &Path) -> Result<Vec<PathBuf>, BlzPackError> {
    let index = src.join("model.safetensors.index.json");
    if index.is_file() {
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(&index).map_err(io_err(&index))?)
                .map_err(|e| input(&index, format!("not JSON: {e}")))?;
        let map = v["weight_map"]
            .as_object()
            .ok_or_else(|| input(&index, "no weight_map object"))?;
        let mut names: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let mut out = Vec::new();
        for n in names {
            ckptfs_format::blz::check_path(n).map_err(|e| input(&index, e.to_string()))?;
            out.push(src.join(n));
        }
        return Ok(out);
    }
    if src.join("model.safetensors").is_file() {
        return Ok(vec![src.join("model.safetensors")]);
    }
    let mut v: Vec<PathBuf> = fs::read_dir(src)
        .map_err(io_err(src))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.to_string_lossy().ends_with(".safetensors"))
        .collect();
    v.sort();
    Ok(v)
}

struct Shard {
    map: Option<Mmap>,
    data_start: usize,
    /// (entry in the archive, begin in the shard's data)
    tensors: Vec<(TensorEntry, u64)>,
}

impl Shard {
    fn bytes(&self, t: &(TensorEntry, u64)) -> &[u8] {
        let b = self.map.as_deref().unwrap_or(&[]);
        let s = self.data_start + t.1 as usize;
        &b[s..s + t.0.data_len as usize]
    }
}

fn load_shard(path: &Path) -> Result<Shard, BlzPackError> {
    let f = fs::File::open(path).map_err(io_err(path))?;
    let map = if f.metadata().map_err(io_err(path))?.len() == 0 {
        None
    } else {
        // SAFETY: read-only private map; the input must not change while
        // packing (digests and bytes come from the same map).
        Some(unsafe { Mmap::map(&f) }.map_err(io_err(path))?)
    };
    let bytes = map.as_deref().unwrap_or(&[]);
    let (header, data) = safetensors::split_file(bytes).map_err(|e| input(path, e.to_string()))?;
    let data_start = bytes.len() - data.len();
    let mut tensors = Vec::with_capacity(header.tensors.len());
    for t in &header.tensors {
        let dtype = Dtype::from_safetensors(&t.dtype).ok_or_else(|| {
            input(
                path,
                format!(
                    "tensor {:?}: dtype {} has no BLAZE-X name (BLAZE-X stores F32, F16, BF16, I8, I32, I64, U8, U16, U32, BOOL); pack it as a ckptfs .blz (without --format blazex)",
                    t.name, t.dtype
                ),
            )
        })?;
        blazex::check_tensor_name(&t.name)
            .map_err(|w| input(path, format!("tensor {:?}: {w}", t.name)))?;
        tensors.push((
            TensorEntry {
                name: t.name.clone(),
                dtype,
                shape: t.shape.clone(),
                data_offset: 0,
                data_len: t.len(),
                xxh3: 0,
            },
            t.begin,
        ));
    }
    tensors.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    Ok(Shard {
        map,
        data_start,
        tensors,
    })
}

/// Packs model directory `src` into the BLAZE-X archive `out`.
pub fn pack_blazex(
    src: &Path,
    out: &Path,
    force: bool,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<BlazexPackStats, BlzPackError> {
    if !src.is_dir() {
        return Err(input(src, "not a directory"));
    }
    let paths = shard_paths(src)?;
    if paths.is_empty() {
        return Err(input(src, "no .safetensors files"));
    }
    let mut shards: Vec<Shard> = paths
        .iter()
        .map(|p| load_shard(p))
        .collect::<Result<_, _>>()?;
    // Offsets and digests: tensors back to back in shard then name order.
    let mut seen = std::collections::HashSet::new();
    let mut at = 0u64;
    for (s, p) in shards.iter_mut().zip(&paths) {
        for t in &mut s.tensors {
            if !seen.insert(t.0.name.clone()) {
                return Err(input(
                    p,
                    format!("tensor {:?}: appears in two shards", t.0.name),
                ));
            }
            t.0.data_offset = at;
            at += t.0.data_len;
        }
    }
    let mut sha = Sha256::new();
    for s in &mut shards {
        let digests: Vec<u64> = s.tensors.par_iter().map(|t| xxh3_64(s.bytes(t))).collect();
        for t in &s.tensors {
            sha.update(s.bytes(t));
            progress(t.0.data_len / 2);
        }
        for (t, d) in s.tensors.iter_mut().zip(digests) {
            t.0.xxh3 = d;
        }
    }
    let read = |name: &str| -> Result<Option<Vec<u8>>, BlzPackError> {
        let p = src.join(name);
        if !p.is_file() {
            return Ok(None);
        }
        fs::read(&p).map(Some).map_err(io_err(&p))
    };
    let cfg_path = src.join(blazex::CONFIG_FILE);
    let model_config = match read(blazex::CONFIG_FILE)? {
        Some(b) => blazex::sorted(
            &serde_json::from_slice(&b).map_err(|e| input(&cfg_path, format!("not JSON: {e}")))?,
        ),
        None => serde_json::Value::Null,
    };
    let tok_path = src.join(blazex::TOKENIZER_FILE);
    let tokenizer = read(blazex::TOKENIZER_FILE)?
        .map(|b| String::from_utf8(b).map_err(|_| input(&tok_path, "not UTF-8")))
        .transpose()?;
    let mut sidecar_files = Vec::new();
    for name in blazex::SIDECARS {
        if let Some(b) = read(name)? {
            sidecar_files.push(Sidecar {
                filename: name.to_string(),
                content_b64: base64::engine::general_purpose::STANDARD.encode(b),
            });
        }
    }
    let tensors: Vec<TensorEntry> = shards
        .iter()
        .flat_map(|s| s.tensors.iter().map(|t| t.0.clone()))
        .collect();
    let header = Header {
        version: blazex::VERSION,
        created_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
            .to_string(),
        model_config,
        tokenizer,
        sidecar_files,
        tensors,
        data_sha256: sha.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        digest_member: None,
    };
    blazex::validate(&header, at).map_err(|e| BlzPackError::Internal(e.to_string()))?;
    // blazex's bytes, plus ckptfs's header digest as the last member
    // (blazex skips it; ckptfs checks it, so the header is covered too).
    let (prelude, json) = blazex::seal_header(&blazex::render_header(&header))
        .ok_or_else(|| BlzPackError::Internal("the rendered header cannot be sealed".into()))?;
    write_atomic(out, force, |w| {
        w.write_all(&prelude)?;
        w.write_all(&json)?;
        for s in &shards {
            for t in &s.tensors {
                w.write_all(s.bytes(t))?;
                progress(t.0.data_len - t.0.data_len / 2);
            }
        }
        Ok(())
    })
    .map_err(io_err(out))?;
    Ok(BlazexPackStats {
        shards: shards.len(),
        tensors: header.tensors.len(),
        sidecars: header.sidecar_files.len(),
        data_bytes: at,
        stored_bytes: blazex::PRELUDE_LEN + json.len() as u64 + at,
    })
}

/// What [`seal_blazex`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlazexSealOutcome {
    /// The header already ends with ckptfs's digest; nothing was written.
    AlreadySealed,
    /// The digest was added: `tensors` were checked, `added_bytes` added.
    Sealed { tensors: usize, added_bytes: u64 },
}

/// Adds ckptfs's header digest to the BLAZE-X archive at `path` (a
/// symlink: its target), in place, unless it has one. Every tensor's xxh3
/// and the data SHA-256 are checked first (a digest must not bless damaged
/// contents). Only the header changes: its bytes are kept and the digest
/// member appended (blazex still reads the file), then DATA is copied.
/// The file is replaced atomically and keeps its mode; what was written
/// is read back (digest matched, same header) before it replaces the
/// original, and a file that changed meanwhile is left alone.
pub fn seal_blazex(
    path: &Path,
    force: bool,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<BlazexSealOutcome, crate::seal::SealError> {
    use crate::seal::SealError;
    use ckptfs_archive::BlazexArchive;
    use std::os::unix::fs::MetadataExt;
    let io_err = |source| SealError::Io {
        path: path.to_path_buf(),
        source,
    };
    let target = fs::canonicalize(path).map_err(io_err)?;
    let file = fs::File::open(&target).map_err(io_err)?;
    let before = file.metadata().map_err(io_err)?;
    let a = BlazexArchive::from_source(
        ckptfs_archive::source::map_file(&file).map_err(io_err)?,
        path,
    )?;
    if a.cover() == blazex::HeaderCover::Sealed {
        return Ok(BlazexSealOutcome::AlreadySealed);
    }
    if before.nlink() > 1 && !force {
        return Err(SealError::HardLinks {
            path: path.to_path_buf(),
            links: before.nlink(),
        });
    }
    (0..a.tensors().len())
        .into_par_iter()
        .try_for_each(|t| a.tensor_bytes(t).map(|b| progress(b.len() as u64)))?;
    a.verify_data_sha256()?;
    let bytes = a.stored_bytes();
    let start = a.data_start() as usize;
    let json = &bytes[blazex::PRELUDE_LEN as usize..start];
    let (prelude, sealed) = blazex::seal_header(json).ok_or_else(|| SealError::Unsealable {
        path: path.to_path_buf(),
        what: "the header JSON does not end with an object's closing brace".into(),
    })?;
    fsutil::replace_atomic(&target, |w| {
        w.write_all(&prelude)?;
        w.write_all(&sealed)?;
        w.write_all(&bytes[start..])?;
        w.flush()?;
        let back = BlazexArchive::from_source(ckptfs_archive::source::map_file(w.get_ref())?, path)
            .map_err(io::Error::other)?;
        if back.cover() != blazex::HeaderCover::Sealed || back.header() != a.header() {
            return Err(io::Error::other(
                "internal check failed: the sealed file reads back differently",
            ));
        }
        let now = fs::metadata(&target)?;
        let same = |m: &fs::Metadata| (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec());
        if same(&now) != same(&before) {
            return Err(io::Error::other("changed while it was being sealed"));
        }
        Ok(())
    })
    .map_err(io_err)?;
    Ok(BlazexSealOutcome::Sealed {
        tensors: a.tensors().len(),
        added_bytes: (sealed.len() - json.len()) as u64,
    })
}
