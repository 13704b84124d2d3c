//! `.blzdiff` patches between BLAZE-X archives: [`diff`] writes a file
//! format 2 patch that blazex's `apply` accepts (open BLXD encodings only),
//! [`apply`] rebuilds the target from a base and a format 1 or 2 patch.
//!
//! Apply is two passes over the target's tensors, in target header order:
//! the first decodes every tensor (Unchanged from the base, Modified from
//! its blob and the base tensor, Added from its blob alone), checks it
//! against `xxh3_new` and feeds the data SHA-256, holding one tensor at a
//! time; only when every tensor passed is the output created, and the
//! second pass decodes again and writes, through [`write_atomic`]. A patch
//! that fails anywhere writes nothing. Base tensors are read through
//! [`BlazexArchive::tensor_bytes`], so a damaged base is named too.

use super::BlzPackError;
use crate::blxd;
use ckptfs_archive::BlazexArchive;
use ckptfs_format::blazex::{self, Header, TensorEntry};
use ckptfs_format::blzdiff::{self, Entry, Manifest, Op};
use ckptfs_format::digest::xxh3_64;
use ckptfs_format::fsutil::write_atomic;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

#[derive(Debug, Default, Clone, Copy)]
pub struct DiffStats {
    pub unchanged: usize,
    pub modified: usize,
    pub added: usize,
    pub removed: usize,
    /// Bytes of the patch file.
    pub patch_bytes: u64,
    /// Bytes of the target's tensors (the full model).
    pub target_data_bytes: u64,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct ApplyStats {
    pub from_base: usize,
    pub from_patch: usize,
    pub output_bytes: u64,
}

fn fail(path: &Path, what: String) -> BlzPackError {
    BlzPackError::Input {
        path: path.display().to_string(),
        what,
    }
}

fn archive_err(e: ckptfs_archive::ArchiveError) -> BlzPackError {
    BlzPackError::Archive(e)
}

/// The checked bytes of every base tensor, by name.
fn base_index(base: &BlazexArchive) -> HashMap<&str, usize> {
    base.tensors()
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect()
}

/// Writes the patch turning `base` into `target` to `out`.
pub fn diff(
    base: &BlazexArchive,
    target: &BlazexArchive,
    out: &Path,
    force: bool,
    allowed: blxd::Encodings,
) -> Result<DiffStats, BlzPackError> {
    let by_name = base_index(base);
    let mut stats = DiffStats::default();
    let mut entries = Vec::new();
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    let mut at = 0u64;
    let mut target_names = std::collections::HashSet::new();
    for (i, t) in target.tensors().iter().enumerate() {
        target_names.insert(t.name.as_str());
        stats.target_data_bytes += t.data_len;
        let new = target.tensor_bytes(i).map_err(archive_err)?;
        let old = by_name
            .get(t.name.as_str())
            .map(|&j| (j, &base.tensors()[j]));
        let (op, blob) = match old {
            Some((_, b)) if b.xxh3 == t.xxh3 && b.data_len == t.data_len && b.dtype == t.dtype => {
                stats.unchanged += 1;
                (Op::Unchanged, None)
            }
            Some((j, b)) => {
                stats.modified += 1;
                let old = base.tensor_bytes(j).map_err(archive_err)?;
                let blob = if b.dtype == t.dtype {
                    blxd::encode_modified(old, new, t.dtype, allowed)
                } else {
                    blxd::encode_added(new, t.dtype, allowed)
                };
                (Op::Modified, Some(blob))
            }
            None => {
                stats.added += 1;
                (Op::Added, Some(blxd::encode_added(new, t.dtype, allowed)))
            }
        };
        let (off, len) = match blob {
            Some(b) => {
                let n = b.len() as u64;
                blobs.push(b);
                at += n;
                (at - n, n)
            }
            None => (0, 0),
        };
        entries.push(Entry {
            name: t.name.clone(),
            op,
            blob_offset: off,
            blob_len: len,
            xxh3_new: t.xxh3,
        });
    }
    for b in base.tensors() {
        if !target_names.contains(b.name.as_str()) {
            stats.removed += 1;
            entries.push(Entry {
                name: b.name.clone(),
                op: Op::Removed,
                blob_offset: 0,
                blob_len: 0,
                xxh3_new: 0,
            });
        }
    }
    let manifest = Manifest {
        version: blzdiff::MANIFEST_VERSION,
        created_at: now(),
        target_header: target.header().clone(),
        entries,
    };
    let json = blzdiff::render_manifest(&manifest);
    write_atomic(out, force, |w| {
        w.write_all(&blzdiff::render_prelude(2, json.len() as u64))?;
        w.write_all(&json)?;
        for b in &blobs {
            w.write_all(b)?;
        }
        Ok(())
    })
    .map_err(|source| BlzPackError::Io {
        path: out.display().to_string(),
        source,
    })?;
    stats.patch_bytes = blzdiff::PRELUDE_LEN + json.len() as u64 + at;
    Ok(stats)
}

fn now() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        .to_string()
}

/// Applies the patch at `patch_path` (bytes `patch`) to `base`, writing
/// the target archive to `out`.
pub fn apply(
    base: &BlazexArchive,
    patch_path: &Path,
    patch: &[u8],
    out: &Path,
    force: bool,
) -> Result<ApplyStats, BlzPackError> {
    let p = blzdiff::parse(patch).map_err(|e| fail(patch_path, e.to_string()))?;
    let by_name = base_index(base);
    let h = &p.manifest.target_header;
    let blob_of = |e: &Entry| {
        let s = (p.blob_start + e.blob_offset) as usize;
        &patch[s..s + e.blob_len as usize]
    };
    // One target tensor's bytes, decoded and checked against xxh3_new.
    let tensor = |k: usize| -> Result<std::borrow::Cow<'_, [u8]>, BlzPackError> {
        let t = &h.tensors[k];
        let e = &p.manifest.entries[p.entry_of[k]];
        let named = |what: String| fail(patch_path, format!("tensor {:?}: {what}", t.name));
        let base_bytes = |what: &str| -> Result<&[u8], BlzPackError> {
            let j = *by_name
                .get(t.name.as_str())
                .ok_or_else(|| named(format!("{what} but the base has no such tensor")))?;
            base.tensor_bytes(j).map_err(archive_err)
        };
        let bytes: std::borrow::Cow<'_, [u8]> = match e.op {
            Op::Unchanged => std::borrow::Cow::Borrowed(base_bytes("Unchanged")?),
            Op::Modified | Op::Added if p.file_format == 1 => {
                let b = blob_of(e);
                if b.len() as u64 != t.data_len {
                    return Err(named(format!(
                        "raw blob of {} bytes, the tensor has {}",
                        b.len(),
                        t.data_len
                    )));
                }
                std::borrow::Cow::Borrowed(b)
            }
            Op::Modified => {
                let old = base_bytes("Modified")?;
                std::borrow::Cow::Owned(
                    blxd::decode(blob_of(e), Some(old), t.data_len).map_err(named)?,
                )
            }
            Op::Added => {
                std::borrow::Cow::Owned(blxd::decode(blob_of(e), None, t.data_len).map_err(named)?)
            }
            Op::Removed => unreachable!("parse refuses Removed target tensors"),
        };
        if bytes.len() as u64 != t.data_len {
            return Err(named(format!(
                "{} bytes, the tensor has {}",
                bytes.len(),
                t.data_len
            )));
        }
        if xxh3_64(&bytes) != e.xxh3_new {
            return Err(named("result does not match xxh3_new".into()));
        }
        Ok(bytes)
    };
    // Pass 1: everything checked, nothing written.
    let mut sha = Sha256::new();
    let mut tensors: Vec<TensorEntry> = Vec::with_capacity(h.tensors.len());
    let mut at = 0u64;
    let mut stats = ApplyStats::default();
    for k in 0..h.tensors.len() {
        let b = tensor(k)?;
        sha.update(&b);
        let e = &p.manifest.entries[p.entry_of[k]];
        if e.op == Op::Unchanged {
            stats.from_base += 1;
        } else {
            stats.from_patch += 1;
        }
        tensors.push(TensorEntry {
            data_offset: at,
            xxh3: e.xxh3_new,
            ..h.tensors[k].clone()
        });
        at += h.tensors[k].data_len;
    }
    let header = Header {
        version: blazex::VERSION,
        // The target's own time, as the patch carries it (blazex's apply
        // stamps the time it runs; the target archive has this one).
        created_at: h.created_at.clone(),
        model_config: h.model_config.clone(),
        tokenizer: h.tokenizer.clone(),
        sidecar_files: h.sidecar_files.clone(),
        tensors,
        data_sha256: sha.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        digest_member: None,
    };
    blazex::validate(&header, at).map_err(|e| fail(patch_path, e.to_string()))?;
    let json = target_json(
        &patch[blzdiff::PRELUDE_LEN as usize..p.blob_start as usize],
        &header,
    );
    // Pass 2: write.
    write_atomic(out, force, |w| {
        w.write_all(&blazex::render_prelude(json.len() as u64))?;
        w.write_all(&json)?;
        for k in 0..header.tensors.len() {
            let b = tensor(k).map_err(std::io::Error::other)?;
            w.write_all(&b)?;
        }
        Ok(())
    })
    .map_err(|source| BlzPackError::Io {
        path: out.display().to_string(),
        source,
    })?;
    stats.output_bytes = blazex::PRELUDE_LEN + json.len() as u64 + at;
    Ok(stats)
}

/// The target's header JSON: the patch's own `target_header` laid out at
/// the top level, its strings and numbers spelled as the patch spells them
/// (so the archive is the target byte for byte, whatever escaping its
/// writer used), when it holds exactly the values of `header` (offsets,
/// digests and members as recomputed); else `header` rendered as blazex
/// renders it.
fn target_json(manifest: &[u8], header: &Header) -> Vec<u8> {
    use blazex::pretty;
    let ours = blazex::render_header(header);
    pretty::member_span(manifest, "target_header")
        .and_then(|r| pretty::reindent(&manifest[r]))
        .filter(|carried| pretty::same_tokens(carried, &ours))
        .unwrap_or(ours)
}
