//! BLAZE-X `.blzdiff` patches (the `blazex diff` output), file formats 1
//! and 2: parsing and rendering of the container and manifest. The BLXD
//! blob encodings are `codec::blxd`'s; applying and writing is
//! `pack::blzdiff`'s. doc/FORMAT.md §4 describes the layout.
//!
//! ```text
//! [8] "BZXPTCH\n"  [u32 file format: 1 raw blobs, 2 BLXD blobs]
//! [u64 manifest_len]  [manifest JSON]  [blob section]
//! ```
//!
//! [`parse`] checks the prelude, the manifest JSON, the target header (as
//! [`blazex::validate`] does for an archive, offsets aside), one entry per
//! name, every Modified/Added entry naming a target tensor and a blob
//! inside the blob section, and every target tensor having an entry.

use crate::blazex::{self, Header};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use thiserror::Error;

pub const MAGIC: &[u8; 8] = b"BZXPTCH\n";
/// Manifest `version` blazex writes.
pub const MANIFEST_VERSION: u32 = 2;
pub const PRELUDE_LEN: u64 = 20;
pub const MAX_MANIFEST_LEN: u64 = 1 << 30;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PatchError {
    #[error("file too short for a .blzdiff prelude ({0} bytes, need 20)")]
    TooShort(u64),
    #[error("not a BLAZE-X patch (magic {0:?})")]
    BadMagic(String),
    #[error(".blzdiff file format {0} is not supported (1 and 2 are)")]
    UnsupportedVersion(u32),
    #[error("manifest length {len} runs past the end of the file ({file} bytes) or exceeds 1 GiB")]
    ManifestLength { len: u64, file: u64 },
    #[error("manifest is not valid .blzdiff JSON: {0}")]
    InvalidJson(String),
    #[error("target header: {0}")]
    Target(blazex::BlazexError),
    #[error("entry {name:?}: {what}")]
    Entry { name: String, what: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Unchanged,
    Modified,
    Added,
    Removed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub op: Op,
    /// In the blob section (Modified and Added only).
    pub blob_offset: u64,
    pub blob_len: u64,
    /// xxh3 of the target tensor's bytes.
    pub xxh3_new: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub created_at: String,
    pub target_header: Header,
    pub entries: Vec<Entry>,
}

/// A parsed, checked patch.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// 1: blobs are raw tensor bytes; 2: BLXD blobs.
    pub file_format: u32,
    pub manifest: Manifest,
    pub blob_start: u64,
    /// For each target tensor (header order), its entry.
    pub entry_of: Vec<usize>,
}

pub fn parse(bytes: &[u8]) -> Result<Parsed, PatchError> {
    let len = bytes.len() as u64;
    if len < PRELUDE_LEN {
        return Err(PatchError::TooShort(len));
    }
    if &bytes[..8] != MAGIC {
        return Err(PatchError::BadMagic(
            String::from_utf8_lossy(&bytes[..8]).into_owned(),
        ));
    }
    let file_format = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if !(1..=2).contains(&file_format) {
        return Err(PatchError::UnsupportedVersion(file_format));
    }
    let ml = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
    if ml > len - PRELUDE_LEN || ml > MAX_MANIFEST_LEN {
        return Err(PatchError::ManifestLength { len: ml, file: len });
    }
    let blob_start = PRELUDE_LEN + ml;
    let manifest: Manifest = serde_json::from_slice(&bytes[20..blob_start as usize])
        .map_err(|e| PatchError::InvalidJson(e.to_string()))?;
    blazex::validate(&manifest.target_header, u64::MAX).map_err(PatchError::Target)?;
    let blobs = len - blob_start;
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(manifest.entries.len());
    for (i, e) in manifest.entries.iter().enumerate() {
        let bad = |what: &str| PatchError::Entry {
            name: e.name.clone(),
            what: what.into(),
        };
        if by_name.insert(e.name.as_str(), i).is_some() {
            return Err(bad("appears twice"));
        }
        if matches!(e.op, Op::Modified | Op::Added) {
            match e.blob_offset.checked_add(e.blob_len) {
                Some(end) if end <= blobs => {}
                _ => return Err(bad("blob runs past the end of the patch")),
            }
        }
    }
    let mut entry_of = Vec::with_capacity(manifest.target_header.tensors.len());
    for t in &manifest.target_header.tensors {
        let Some(&i) = by_name.get(t.name.as_str()) else {
            return Err(PatchError::Entry {
                name: t.name.clone(),
                what: "target tensor without an entry".into(),
            });
        };
        if manifest.entries[i].op == Op::Removed {
            return Err(PatchError::Entry {
                name: t.name.clone(),
                what: "target tensor marked Removed".into(),
            });
        }
        entry_of.push(i);
    }
    Ok(Parsed {
        file_format,
        manifest,
        blob_start,
        entry_of,
    })
}

/// The 20-byte prelude of a patch.
pub fn render_prelude(file_format: u32, manifest_len: u64) -> [u8; 20] {
    let mut p = [0u8; 20];
    p[..8].copy_from_slice(MAGIC);
    p[8..12].copy_from_slice(&file_format.to_le_bytes());
    p[12..20].copy_from_slice(&manifest_len.to_le_bytes());
    p
}

/// The manifest as blazex writes it (pretty-printed).
pub fn render_manifest(m: &Manifest) -> Vec<u8> {
    serde_json::to_vec_pretty(m).expect("manifest serialises")
}
