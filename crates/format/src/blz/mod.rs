//! The `.blz` model archive, version 1: a whole model directory (safetensors
//! shards, index json, config, tokenizer files, anything else) in one file.
//!
//! ```text
//! [8] "CKPTBLZ\0"  [u32 version = 1]  [u64 header_len]  [header JSON]  [DATA]
//! ```
//!
//! The JSON header lists every file by relative path and every *blob* (a
//! range of DATA). A shard keeps its original safetensors header verbatim
//! and lists its tensors, each pointing at a blob; identical tensors (in any
//! shard) point at the same blob. Small plain files are embedded in the
//! header (UTF-8 as a JSON string, anything else base64), large ones are a
//! blob. A blob is `raw` (the bytes themselves) or a `z4ai-frame` (the ckptfs
//! codec, with sub-tensor blocks). Every blob carries per-block digests, so
//! any byte range can be read and checked without touching the rest.
//! doc/FORMAT.md §3 is the normative description.
//!
//! Everything here is pure, over `&[u8]`. [`parse`] checks the whole
//! structure before anything is allocated from a length field: lengths
//! against the file size, blobs tiling DATA, paths, references, sizes.
//! Content digests (per block, per file) are checked by the reader on use;
//! the header digest and the DATA SHA-256 by `verify`.

use crate::blz_prelude::{self, PreludeError};
use crate::digest::xxh3_64;
use crate::frame::MAX_EXPANSION;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::HashSet;
use thiserror::Error;

pub const MAGIC: &[u8; 8] = b"CKPTBLZ\0";
pub const VERSION: u32 = 1;
/// Magic, version, header length (`format::blz_prelude`).
pub const PRELUDE_LEN: u64 = blz_prelude::LEN;
/// Headers larger than this are refused (they would embed absurd sidecars).
pub const MAX_HEADER_LEN: u64 = 1 << 30;
/// The largest raw block a reader accepts (the writer uses 1 MiB).
pub const MAX_RAW_BLOCK: u64 = 64 << 20;
/// The JSON header ends with this member, then the 16 hex digits, then `"}`.
const DIGEST_MEMBER: &[u8] = b",\"header_xxh3\":\"";
const DIGEST_TAIL_LEN: usize = DIGEST_MEMBER.len() + 16 + 2;

#[derive(Debug, Error)]
pub enum BlzError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("file too short for a .blz prelude ({0} bytes, need 20)")]
    TooShort(u64),
    #[error("not a .blz archive (magic {0:?})")]
    BadMagic(String),
    #[error(".blz version {found} is not supported (this build reads version {supported})")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("header length {len} exceeds the {max}-byte limit")]
    HeaderTooLarge { len: u64, max: u64 },
    #[error("header length {len} runs past the end of the file ({file} bytes)")]
    HeaderPastEnd { len: u64, file: u64 },
    #[error("header is not valid .blz JSON: {0}")]
    InvalidJson(String),
    #[error("header checksum mismatch (header_xxh3)")]
    HeaderDigest,
    #[error("header declares {declared} data bytes but the file holds {actual}")]
    DataLength { declared: u64, actual: u64 },
    #[error("data section SHA-256 mismatch")]
    DataDigest,
    #[error("blob {blob}: {what}")]
    Blob { blob: usize, what: String },
    #[error("blobs {a} and {b} overlap in the data section")]
    BlobOverlap { a: usize, b: usize },
    #[error("path {path:?}: {what}")]
    Path { path: String, what: String },
    #[error("path {0:?} appears twice")]
    DuplicatePath(String),
    #[error("{path}: {what}")]
    File { path: String, what: String },
    #[error("{path}: tensor {tensor:?}: {what}")]
    Tensor {
        path: String,
        tensor: String,
        what: String,
    },
    #[error("while reading the header: {0}")]
    OutOfMemory(crate::memory::OutOfMemory),
}

/// Address space a parsed header may take per byte of its JSON, asked for
/// before parsing ([`crate::memory::ensure_headroom`]). Measured: a header
/// of 10^6 small text files (91 MB of JSON) peaks at about 4x while it is
/// parsed and the reader's per-file state is built.
const PARSED_BYTES_PER_JSON_BYTE: u64 = 5;

pub type Result<T> = std::result::Result<T, BlzError>;

/// An xxh3-64 digest, written as 16 lowercase hex digits (JSON numbers lose
/// precision above 2^53 in jq and JavaScript).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Digest(pub u64);

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:016x}", self.0))
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        parse_hex64(&s).map(Digest).ok_or_else(|| {
            serde::de::Error::custom(format!("{s:?} is not 16 lowercase hex digits"))
        })
    }
}

fn parse_hex64(s: &str) -> Option<u64> {
    if s.len() != 16 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// The whole header, checked. Field order is the rendering order;
/// `header_xxh3` must stay last (see [`render_header`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Header {
    /// Length of DATA: the file length minus prelude and header.
    pub data_length: u64,
    /// SHA-256 of DATA, 64 lowercase hex digits.
    pub data_sha256: String,
    pub files: Vec<FileEntry>,
    pub blobs: Vec<BlobEntry>,
    /// xxh3 of the header JSON bytes before `,"header_xxh3":"`.
    pub header_xxh3: Digest,
}

/// The header as it is written: files as [`FileRecord`]s, whose fields
/// are checked and turned into [`FileEntry`]s by [`parse`].
#[derive(Deserialize)]
struct WireHeader {
    data_length: u64,
    data_sha256: String,
    files: Vec<FileRecord>,
    blobs: Vec<BlobEntry>,
    header_xxh3: Digest,
}

mod files;
pub use files::{Content, FileEntry, FileRecord, Shard, Stored};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    Safetensors,
    File,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    /// `[begin, end)` in the shard's data buffer, as in its header.
    pub data_offsets: [u64; 2],
    /// xxh3 of the tensor's raw bytes.
    pub xxh3: Digest,
    /// The blob holding exactly these bytes (absent with `data_blob`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<u32>,
}

impl TensorEntry {
    pub fn len(&self) -> u64 {
        self.data_offsets[1].saturating_sub(self.data_offsets[0])
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Encoding {
    #[serde(rename = "raw")]
    Raw,
    #[serde(rename = "z4ai-frame")]
    Z4aiFrame,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BlobEntry {
    /// Offset in DATA.
    pub offset: u64,
    /// Stored bytes.
    pub length: u64,
    pub encoding: Encoding,
    /// Bytes once decoded (equals `length` for raw).
    pub decoded_length: u64,
    /// xxh3 of the decoded bytes.
    pub xxh3: Digest,
    /// Frames: xxh3 of the frame bytes outside every block payload (CKX1's
    /// meta digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Digest>,
    pub blocks: Vec<BlockEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BlockEntry {
    /// Decoded bytes of the blob up to the end of this block.
    pub end: u64,
    /// Frames: xxh3 of the block's payload ranges (CKX1's payload digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Digest>,
    /// xxh3 of the block's decoded bytes.
    pub data: Digest,
}

/// A parsed and structurally validated archive.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub header: Header,
    /// `[PRELUDE_LEN, data_start)`: the header JSON in the file.
    pub header_json: std::ops::Range<u64>,
    pub data_start: u64,
}

/// The 20-byte prelude for a header of `len` bytes.
pub fn render_prelude(header_len: u64) -> [u8; 20] {
    blz_prelude::render(MAGIC, VERSION, header_len)
}

/// Renders the header JSON (compact), with `header_xxh3` computed over the
/// bytes before its member.
pub fn render_header(h: &Header) -> Vec<u8> {
    let mut v = serde_json::to_vec(h).expect("header serialises");
    let n = v.len();
    debug_assert_eq!(
        &v[n - DIGEST_TAIL_LEN..n - DIGEST_TAIL_LEN + DIGEST_MEMBER.len()],
        DIGEST_MEMBER
    );
    let d = xxh3_64(&v[..n - DIGEST_TAIL_LEN]);
    let hex = format!("{d:016x}");
    v[n - 18..n - 2].copy_from_slice(hex.as_bytes());
    v
}

/// Checks `header_xxh3` against the header JSON bytes.
pub fn check_header_digest(json: &[u8]) -> Result<()> {
    let n = json.len();
    let ok = n >= DIGEST_TAIL_LEN
        && &json[n - DIGEST_TAIL_LEN..n - DIGEST_TAIL_LEN + DIGEST_MEMBER.len()] == DIGEST_MEMBER
        && &json[n - 2..] == b"\"}"
        && std::str::from_utf8(&json[n - 18..n - 2])
            .ok()
            .and_then(parse_hex64)
            == Some(xxh3_64(&json[..n - DIGEST_TAIL_LEN]));
    if ok {
        Ok(())
    } else {
        Err(BlzError::HeaderDigest)
    }
}

/// Checks a relative path: non-empty, `/`-separated, not absolute, no NUL,
/// no empty, `.` or `..` components, components of at most 255 bytes.
pub fn check_path(p: &str) -> Result<()> {
    let bad = |what: &str| {
        Err(BlzError::Path {
            path: p.to_string(),
            what: what.to_string(),
        })
    };
    if p.is_empty() {
        return bad("is empty");
    }
    if p.len() > 4096 {
        return bad("is longer than 4096 bytes");
    }
    if p.contains('\0') {
        return bad("contains NUL");
    }
    if p.starts_with('/') {
        return bad("is absolute");
    }
    for c in p.split('/') {
        match c {
            "" => return bad("has an empty component"),
            "." | ".." => return bad("escapes or names the directory itself (. or ..)"),
            c if c.len() > 255 => return bad("has a component longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

/// Decoded length of a padded standard base64 string, or None if its length
/// or padding is not valid base64.
pub fn base64_decoded_len(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() & 3 != 0 {
        return None;
    }
    let pad = b.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return None;
    }
    Some((b.len() / 4 * 3 - pad) as u64)
}

/// Parses and validates the prelude and header of a whole archive.
pub fn parse(bytes: &[u8]) -> Result<Parsed> {
    let file_len = bytes.len() as u64;
    let prelude = blz_prelude::parse(bytes, MAGIC, VERSION).map_err(|e| match e {
        PreludeError::TooShort(n) => BlzError::TooShort(n),
        PreludeError::BadMagic(m) => BlzError::BadMagic(m),
        PreludeError::Version(found) => BlzError::UnsupportedVersion {
            found,
            supported: VERSION,
        },
    })?;
    let hlen = prelude.header_len;
    if hlen > MAX_HEADER_LEN {
        return Err(BlzError::HeaderTooLarge {
            len: hlen,
            max: MAX_HEADER_LEN,
        });
    }
    if prelude.past_end(file_len) {
        return Err(BlzError::HeaderPastEnd {
            len: hlen,
            file: file_len,
        });
    }
    let data_start = prelude.data_start();
    let json = &bytes[PRELUDE_LEN as usize..data_start as usize];
    // serde allocates as it goes, infallibly: make sure its worst case fits
    // first (the caches give memory back if it does not).
    let oom = BlzError::OutOfMemory;
    crate::memory::ensure_headroom(hlen.saturating_mul(PARSED_BYTES_PER_JSON_BYTE)).map_err(oom)?;
    let wire: WireHeader =
        serde_json::from_slice(json).map_err(|e| BlzError::InvalidJson(e.to_string()))?;
    let mut files = crate::memory::try_vec(wire.files.len()).map_err(oom)?;
    for r in wire.files {
        files.push(FileEntry::try_from(r)?);
    }
    let header = Header {
        data_length: wire.data_length,
        data_sha256: wire.data_sha256,
        files,
        blobs: wire.blobs,
        header_xxh3: wire.header_xxh3,
    };
    validate(&header, file_len - data_start)?;
    Ok(Parsed {
        header,
        header_json: PRELUDE_LEN..data_start,
        data_start,
    })
}

fn validate(h: &Header, data_len: u64) -> Result<()> {
    if h.data_length != data_len {
        return Err(BlzError::DataLength {
            declared: h.data_length,
            actual: data_len,
        });
    }
    if h.data_sha256.len() != 64
        || !h
            .data_sha256
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(BlzError::InvalidJson(
            "data_sha256 is not 64 lowercase hex digits".into(),
        ));
    }
    if h.blobs.len() > u32::MAX as usize {
        return Err(BlzError::InvalidJson("too many blobs".into()));
    }
    // Blobs tile DATA in order: every byte belongs to exactly one blob.
    let mut cursor = 0u64;
    for (i, b) in h.blobs.iter().enumerate() {
        let bad = |what: String| Err(BlzError::Blob { blob: i, what });
        if b.offset < cursor {
            return Err(BlzError::BlobOverlap { a: i - 1, b: i });
        }
        if b.offset > cursor {
            return bad(format!(
                "starts at {} but the previous blob ends at {cursor} (blobs must tile the data section)",
                b.offset
            ));
        }
        let end = match b.offset.checked_add(b.length) {
            Some(e) if e <= data_len => e,
            _ => {
                return bad(format!(
                    "[{}, +{}) runs past the {data_len}-byte data section",
                    b.offset, b.length
                ))
            }
        };
        cursor = end;
        check_blocks(b).or_else(bad)?;
    }
    if cursor != data_len {
        return Err(BlzError::Blob {
            blob: h.blobs.len(),
            what: format!("blobs end at {cursor} but the data section holds {data_len} bytes"),
        });
    }
    check_files(h)
}

/// A blob's own fields: encoding-specific lengths and the block list.
fn check_blocks(b: &BlobEntry) -> std::result::Result<(), String> {
    match b.encoding {
        Encoding::Raw => {
            if b.decoded_length != b.length {
                return Err(format!(
                    "raw blob decodes to {} bytes but stores {}",
                    b.decoded_length, b.length
                ));
            }
        }
        Encoding::Z4aiFrame => {
            if b.meta.is_none() {
                return Err("frame blob has no meta digest".into());
            }
            if b.decoded_length > b.length.saturating_mul(MAX_EXPANSION) {
                return Err(format!(
                    "claims {} decoded bytes from a {}-byte frame",
                    b.decoded_length, b.length
                ));
            }
        }
    }
    if b.blocks.is_empty() {
        return Err("has no blocks".into());
    }
    let mut prev = 0u64;
    for (j, blk) in b.blocks.iter().enumerate() {
        let empty_blob = b.decoded_length == 0 && b.blocks.len() == 1;
        if blk.end <= prev && !empty_blob {
            return Err(format!("block {j} ends at {} (not increasing)", blk.end));
        }
        if b.encoding == Encoding::Raw && blk.end - prev > MAX_RAW_BLOCK {
            return Err(format!("block {j} is larger than {MAX_RAW_BLOCK} bytes"));
        }
        if (b.encoding == Encoding::Z4aiFrame) != blk.payload.is_some() {
            return Err(format!(
                "block {j}: a payload digest is required for frames and only for frames"
            ));
        }
        prev = blk.end;
    }
    if prev != b.decoded_length {
        return Err(format!(
            "blocks end at {prev} but the blob decodes to {} bytes",
            b.decoded_length
        ));
    }
    Ok(())
}

fn check_files(h: &Header) -> Result<()> {
    let bytes = h.files.len() as u64 * 24;
    let mut seen: HashSet<&str> = crate::memory::with_relief(bytes, || {
        let mut seen = HashSet::new();
        seen.try_reserve(h.files.len()).ok().map(|_| seen)
    })
    .ok_or(BlzError::OutOfMemory(crate::memory::OutOfMemory { bytes }))?;
    for f in &h.files {
        check_path(&f.path)?;
        if !seen.insert(&f.path) {
            return Err(BlzError::DuplicatePath(f.path.clone()));
        }
    }
    // A file may not also be a directory of another file.
    for f in &h.files {
        let mut at = 0;
        while let Some(i) = f.path[at..].find('/') {
            let dir = &f.path[..at + i];
            if seen.contains(dir) {
                return Err(BlzError::Path {
                    path: f.path.clone(),
                    what: format!("needs {dir:?} to be a directory, but it is a file"),
                });
            }
            at += i + 1;
        }
    }
    let blob = |path: &str, i: u32| -> Result<&BlobEntry> {
        h.blobs.get(i as usize).ok_or_else(|| BlzError::File {
            path: path.to_string(),
            what: format!("refers to blob {i}, but there are {}", h.blobs.len()),
        })
    };
    for f in &h.files {
        let bad = |what: String| {
            Err(BlzError::File {
                path: f.path.clone(),
                what,
            })
        };
        match &f.content {
            Content::Plain { stored, .. } => {
                let len = match stored {
                    Stored::Text(t) => t.len() as u64,
                    Stored::Base64(b) => match base64_decoded_len(b) {
                        Some(n) => n,
                        None => return bad("base64 content has an invalid length".into()),
                    },
                    Stored::Blob(i) => blob(&f.path, *i)?.decoded_length,
                };
                if len != f.size {
                    return bad(format!(
                        "size is {} but the content holds {len} bytes",
                        f.size
                    ));
                }
            }
            Content::Shard(sh) => {
                let dlen = sh.data_length;
                let size = (sh.header.len() as u64)
                    .checked_add(8)
                    .and_then(|n| n.checked_add(dlen));
                if size != Some(f.size) {
                    return bad(format!(
                        "size is {} but 8 + header {} + data {dlen} differ",
                        f.size,
                        sh.header.len()
                    ));
                }
                check_tensors(f, sh, &blob)?;
            }
        }
    }
    Ok(())
}

fn check_tensors<'h>(
    f: &FileEntry,
    sh: &Shard,
    blob: &dyn Fn(&str, u32) -> Result<&'h BlobEntry>,
) -> Result<()> {
    let (tensors, dlen) = (&sh.tensors, sh.data_length);
    let terr = |t: &TensorEntry, what: String| {
        Err(BlzError::Tensor {
            path: f.path.clone(),
            tensor: t.name.clone(),
            what,
        })
    };
    match sh.data_blob {
        Some(i) => {
            let b = blob(&f.path, i)?;
            if b.decoded_length != dlen {
                return Err(BlzError::File {
                    path: f.path.clone(),
                    what: format!(
                        "data blob {i} decodes to {} bytes, the data buffer is {dlen}",
                        b.decoded_length
                    ),
                });
            }
            for t in tensors {
                let [begin, end] = t.data_offsets;
                if begin > end || end > dlen {
                    return terr(
                        t,
                        format!("data_offsets [{begin}, {end}) outside the {dlen}-byte buffer"),
                    );
                }
                if t.blob.is_some() {
                    return terr(t, "has a blob, but the shard stores one data blob".into());
                }
            }
        }
        None => {
            let mut cursor = 0u64;
            for t in tensors {
                let [begin, end] = t.data_offsets;
                if begin != cursor || end < begin {
                    return terr(
                        t,
                        format!("data_offsets [{begin}, {end}) do not continue at {cursor} (tensors must tile the buffer, or the shard needs a data_blob)"),
                    );
                }
                let Some(i) = t.blob else {
                    return terr(t, "has no blob".into());
                };
                let b = blob(&f.path, i)?;
                if b.decoded_length != end - begin {
                    return terr(
                        t,
                        format!(
                            "blob {i} decodes to {} bytes, the tensor spans {}",
                            b.decoded_length,
                            end - begin
                        ),
                    );
                }
                cursor = end;
            }
            if cursor != dlen {
                return Err(BlzError::File {
                    path: f.path.clone(),
                    what: format!("tensors end at {cursor}, the data buffer is {dlen} bytes"),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
