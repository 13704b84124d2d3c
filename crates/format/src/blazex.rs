//! BLAZE-X's own `.blz` archive, version 1, as the `blazex` tool
//! (`blaze-x-pack` 0.1.0) writes it: parsing and rendering. doc/FORMAT.md
//! §5 is the description ckptfs keeps.
//!
//! ```text
//! [8] "BLAZXPK\n"  [u32 version = 1]  [u64 header_len]  [header JSON]  [DATA]
//! ```
//!
//! The header (pretty-printed JSON) holds `model_config` (config.json
//! parsed), `tokenizer` (tokenizer.json verbatim, or null), `sidecar_files`
//! (`filename` and standard base64 `content_b64`), `tensors` (name, dtype,
//! shape, `data_offset` in DATA, `data_len`, `xxh3` as a JSON integer that
//! may exceed 2^53) and `data_sha256` (DATA from its start to the end of
//! the last listed tensor). Tensors are raw little-endian bytes, back to
//! back, no padding and no length prefix.
//!
//! Pure, over `&[u8]`: [`parse`] checks the prelude and every field before
//! anything is allocated from a length — header length against the file,
//! every tensor inside DATA, no two tensors overlapping, dtype and shape
//! agreeing with the length, names unique and free of NUL, sidecar names
//! single safe path components distinct from the files the archive
//! presents. Content (tensor xxh3, base64, data SHA-256) is checked by the
//! reader on use and by `verify`.

use super::blz_prelude::{self, PreludeError};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use thiserror::Error;

pub const MAGIC: &[u8; 8] = b"BLAZXPK\n";
pub const VERSION: u32 = 1;
/// Magic, version, header length (`format::blz_prelude`).
pub const PRELUDE_LEN: u64 = blz_prelude::LEN;
/// Headers larger than this are refused before they are parsed.
pub const MAX_HEADER_LEN: u64 = 1 << 30;
/// The files every archive presents besides its sidecars.
pub const MODEL_FILE: &str = "model.safetensors";
pub const CONFIG_FILE: &str = "config.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The sidecars `blazex pack` embeds when present (it keeps nothing else).
pub const SIDECARS: &[&str] = &[
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
];

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BlazexError {
    #[error("file too short for a BLAZE-X prelude ({0} bytes, need 20)")]
    TooShort(u64),
    #[error("not a BLAZE-X archive (magic {0:?})")]
    BadMagic(String),
    #[error("BLAZE-X version {0} is not supported (this build reads version 1)")]
    UnsupportedVersion(u32),
    #[error("header length {len} runs past the end of the file ({file} bytes)")]
    HeaderPastEnd { len: u64, file: u64 },
    #[error("header length {len} exceeds the {max}-byte limit")]
    HeaderTooLarge { len: u64, max: u64 },
    #[error("header is not valid BLAZE-X JSON: {0}")]
    InvalidJson(String),
    #[error("tensor {name:?}: {what}")]
    Tensor { name: String, what: String },
    #[error("tensors {a:?} and {b:?} overlap in the data section")]
    Overlap { a: String, b: String },
    #[error("sidecar {name:?}: {what}")]
    Sidecar { name: String, what: String },
    #[error("header digest ({DIGEST_KEY}): {0}")]
    HeaderDigest(&'static str),
    #[error("header of {header_len} bytes: {source}")]
    OutOfMemory {
        header_len: u64,
        source: crate::memory::OutOfMemory,
    },
}

/// Address space the parsed header and what the reader builds from it
/// (the synthesised safetensors header, segments, per-tensor state) may
/// take per byte of header JSON at most, asked for before parsing. A
/// tensor's ~200 pretty-printed JSON bytes become ~250 bytes in all.
const PARSED_BYTES_PER_JSON_BYTE: u64 = 4;

pub type Result<T> = std::result::Result<T, BlazexError>;

/// The dtypes BLAZE-X names (lowercase in the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    I8,
    I32,
    I64,
    U8,
    U16,
    U32,
    Bool,
}

impl Dtype {
    pub const ALL: [Dtype; 10] = [
        Dtype::F32,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::I8,
        Dtype::I32,
        Dtype::I64,
        Dtype::U8,
        Dtype::U16,
        Dtype::U32,
        Dtype::Bool,
    ];

    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 | Dtype::I32 | Dtype::U32 => 4,
            Dtype::F16 | Dtype::Bf16 | Dtype::U16 => 2,
            Dtype::I8 | Dtype::U8 | Dtype::Bool => 1,
            Dtype::I64 => 8,
        }
    }

    /// The safetensors name (`F32`, `BF16`, `BOOL`...).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::I8 => "I8",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
            Dtype::U8 => "U8",
            Dtype::U16 => "U16",
            Dtype::U32 => "U32",
            Dtype::Bool => "BOOL",
        }
    }

    /// The BLAZE-X dtype of a safetensors dtype name, if it has one.
    pub fn from_safetensors(name: &str) -> Option<Dtype> {
        Dtype::ALL
            .into_iter()
            .find(|d| d.safetensors_name() == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Offset in DATA.
    pub data_offset: u64,
    pub data_len: u64,
    /// xxh3-64 (seed 0) of the raw bytes, a JSON integer.
    pub xxh3: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sidecar {
    pub filename: String,
    /// Standard base64 with padding.
    pub content_b64: String,
}

/// The header, in BLAZE-X's member order (the rendering order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub version: u32,
    pub created_at: String,
    pub model_config: serde_json::Value,
    pub tokenizer: Option<String>,
    #[serde(default)]
    pub sidecar_files: Vec<Sidecar>,
    pub tensors: Vec<TensorEntry>,
    pub data_sha256: String,
    /// Whether the JSON had a [`DIGEST_KEY`] member (anywhere): read only
    /// to refuse one that is not where ckptfs writes it (a damaged
    /// header). Never rendered: [`seal_header`] appends the member.
    #[serde(default, skip_serializing, rename = "ckptfs_header_xxh3")]
    pub digest_member: Option<serde::de::IgnoredAny>,
}

impl Header {
    /// End of the last listed tensor in DATA: the extent `data_sha256`
    /// covers.
    pub fn digest_end(&self) -> u64 {
        self.tensors
            .last()
            .map_or(0, |t| t.data_offset.saturating_add(t.data_len))
    }
}

/// Whether a header digest covers the header (see [`seal_header`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderCover {
    /// The header ends with ckptfs's [`DIGEST_KEY`] member, and it matched.
    Sealed,
    /// No digest: what `blazex` writes. Nothing covers the header.
    Uncovered,
}

/// A parsed and structurally validated archive.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub header: Header,
    /// Whether a header digest covered the prelude and the header.
    pub cover: HeaderCover,
    pub data_start: u64,
    /// Length of DATA (the file after the header).
    pub data_len: u64,
}

/// Parses and validates the prelude and header of a whole archive.
pub fn parse(bytes: &[u8]) -> Result<Parsed> {
    let file_len = bytes.len() as u64;
    let prelude = blz_prelude::parse(bytes, MAGIC, VERSION).map_err(|e| match e {
        PreludeError::TooShort(n) => BlazexError::TooShort(n),
        PreludeError::BadMagic(m) => BlazexError::BadMagic(m),
        PreludeError::Version(v) => BlazexError::UnsupportedVersion(v),
    })?;
    let hlen = prelude.header_len;
    if prelude.past_end(file_len) {
        return Err(BlazexError::HeaderPastEnd {
            len: hlen,
            file: file_len,
        });
    }
    if hlen > MAX_HEADER_LEN {
        return Err(BlazexError::HeaderTooLarge {
            len: hlen,
            max: MAX_HEADER_LEN,
        });
    }
    let data_start = prelude.data_start();
    let json = &bytes[PRELUDE_LEN as usize..data_start as usize];
    // The digest first: a damaged header is named as such, whatever else
    // the damage makes of its JSON.
    let tail = digest_tail(json);
    if let Some(t) = &tail {
        check_digest(&bytes[..data_start as usize], t)?;
    }
    // serde allocates as it goes, infallibly: make sure its worst case fits
    // first (the caches give memory back if it does not).
    crate::memory::ensure_headroom(hlen.saturating_mul(PARSED_BYTES_PER_JSON_BYTE)).map_err(
        |source| BlazexError::OutOfMemory {
            header_len: hlen,
            source,
        },
    )?;
    let mut header: Header =
        serde_json::from_slice(json).map_err(|e| BlazexError::InvalidJson(e.to_string()))?;
    // Only read to be checked here: a parsed header is the same whether
    // sealed or not (`cover` says which).
    if tail.is_none() && header.digest_member.take().is_some() {
        return Err(BlazexError::HeaderDigest(
            "the member is not at the end of the header, where ckptfs writes it (damaged header)",
        ));
    }
    header.digest_member = None;
    let cover = match tail {
        Some(_) => HeaderCover::Sealed,
        None => HeaderCover::Uncovered,
    };
    let data_len = file_len - data_start;
    validate(&header, data_len)?;
    Ok(Parsed {
        header,
        cover,
        data_start,
        data_len,
    })
}

/// Checks a header against a data section of `data_len` bytes.
pub fn validate(h: &Header, data_len: u64) -> Result<()> {
    let mut names = HashSet::with_capacity(h.tensors.len());
    for t in &h.tensors {
        let bad = |what: String| BlazexError::Tensor {
            name: t.name.clone(),
            what,
        };
        check_tensor_name(&t.name).map_err(|w| bad(w.into()))?;
        if !names.insert(t.name.as_str()) {
            return Err(bad("appears twice".into()));
        }
        let elems = t
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(t.dtype.size()));
        if elems != Some(t.data_len) {
            return Err(bad(format!(
                "data_len {} does not match dtype {} and shape {:?}",
                t.data_len,
                t.dtype.safetensors_name(),
                t.shape
            )));
        }
        match t.data_offset.checked_add(t.data_len) {
            Some(end) if end <= data_len => {}
            _ => {
                return Err(bad(format!(
                    "bytes {}+{} run past the end of the data section ({data_len} bytes)",
                    t.data_offset, t.data_len
                )))
            }
        }
    }
    let mut spans: Vec<(u64, u64, &str)> = h
        .tensors
        .iter()
        .filter(|t| t.data_len > 0)
        .map(|t| (t.data_offset, t.data_offset + t.data_len, t.name.as_str()))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(BlazexError::Overlap {
                a: w[0].2.to_string(),
                b: w[1].2.to_string(),
            });
        }
    }
    let mut files: HashSet<&str> = [MODEL_FILE, CONFIG_FILE].into_iter().collect();
    if h.tokenizer.is_some() {
        files.insert(TOKENIZER_FILE);
    }
    for s in &h.sidecar_files {
        let bad = |what: &str| BlazexError::Sidecar {
            name: s.filename.clone(),
            what: what.into(),
        };
        check_sidecar_name(&s.filename).map_err(bad)?;
        if !files.insert(s.filename.as_str()) {
            return Err(bad("names a file the archive already presents"));
        }
        if crate::blz::base64_decoded_len(&s.content_b64).is_none() {
            return Err(bad("content_b64 is not padded standard base64"));
        }
    }
    Ok(())
}

/// A tensor name: non-empty, at most 64 KiB, no NUL or other control
/// character, not `__metadata__` (which safetensors reserves).
pub fn check_tensor_name(n: &str) -> std::result::Result<(), &'static str> {
    if n.is_empty() {
        return Err("empty name");
    }
    if n.len() > 65536 {
        return Err("name longer than 65536 bytes");
    }
    if n.chars().any(char::is_control) {
        return Err("name contains NUL or another control character");
    }
    if n == "__metadata__" {
        return Err("name is reserved by safetensors");
    }
    Ok(())
}

/// A sidecar filename: one path component (no `/` or `\`, not `.` or
/// `..`), not absolute, no NUL or control character, at most 255 bytes.
pub fn check_sidecar_name(n: &str) -> std::result::Result<(), &'static str> {
    if n.is_empty() {
        return Err("empty filename");
    }
    if n.starts_with('/') {
        return Err("absolute filename");
    }
    if n.contains('/') || n.contains('\\') {
        return Err("filename has a directory part (it would escape the directory)");
    }
    if n == "." || n == ".." {
        return Err("filename names a directory (. or ..)");
    }
    if n.chars().any(char::is_control) {
        return Err("filename contains NUL or another control character");
    }
    if n.len() > 255 {
        return Err("filename longer than 255 bytes");
    }
    Ok(())
}

/// The header digest ckptfs adds (`pack --format blazex`, `seal`): the
/// header JSON's last member, which blazex's reader skips (its header
/// struct ignores unknown members). Its value is 16 lowercase hex digits,
/// the xxh3-64 of the file from its first byte (prelude included, so the
/// header length is covered) up to the `,` that opens the member.
pub const DIGEST_KEY: &str = "ckptfs_header_xxh3";
const TAIL_OPEN: &[u8] = b",\n  \"ckptfs_header_xxh3\": \"";
const TAIL_CLOSE: &[u8] = b"\"\n}";
/// Length of the member at the end of a sealed header.
const TAIL_LEN: usize = TAIL_OPEN.len() + 16 + TAIL_CLOSE.len();

/// Where a digest member ends the header: the 16 digit bytes, or None when
/// the header does not end with something shaped like it. The shape is
/// checked with the key's bytes left free, so that a damaged key is caught
/// by [`check_digest`] rather than read as a header without a digest.
struct Tail<'a> {
    /// Offset of the member's `,` in the header JSON.
    at: usize,
    key: &'a [u8],
    digits: &'a [u8],
}

fn digest_tail(json: &[u8]) -> Option<Tail<'_>> {
    let n = json.len();
    if n < TAIL_LEN + 2 {
        return None;
    }
    let t = &json[n - TAIL_LEN..];
    let key_at = 5; // `,\n  "`
    let key_end = key_at + DIGEST_KEY.len();
    let shaped = t[..key_at] == TAIL_OPEN[..key_at]
        && t[key_end..TAIL_OPEN.len()] == TAIL_OPEN[key_end..]
        && t[TAIL_LEN - TAIL_CLOSE.len()..] == *TAIL_CLOSE;
    shaped.then(|| Tail {
        at: n - TAIL_LEN,
        key: &t[key_at..key_end],
        digits: &t[TAIL_OPEN.len()..TAIL_OPEN.len() + 16],
    })
}

/// Checks a digest member against the file's first bytes (prelude and
/// header JSON).
fn check_digest(head: &[u8], t: &Tail<'_>) -> Result<()> {
    if t.key != DIGEST_KEY.as_bytes() {
        return Err(BlazexError::HeaderDigest(
            "the last member's name is damaged",
        ));
    }
    let want = std::str::from_utf8(t.digits)
        .ok()
        .filter(|s| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .ok_or(BlazexError::HeaderDigest(
            "value is not 16 lowercase hex digits",
        ))?;
    if crate::digest::xxh3_64(&head[..PRELUDE_LEN as usize + t.at]) != want {
        return Err(BlazexError::HeaderDigest(
            "checksum mismatch: the prelude or the header is damaged",
        ));
    }
    Ok(())
}

/// The prelude and header JSON of `json` sealed: the [`DIGEST_KEY`]
/// member appended as the last member, its digest computed. The JSON's
/// bytes are kept as they are (only whitespace after its last member
/// goes), so every value reads back exactly. None when `json` does not
/// end with a non-empty object's `}` or already has a digest member.
pub fn seal_header(json: &[u8]) -> Option<([u8; 20], Vec<u8>)> {
    if digest_tail(json).is_some() {
        return None;
    }
    let end = json.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if json[end] != b'}' {
        return None;
    }
    let body_end = json[..end].iter().rposition(|b| !b.is_ascii_whitespace())? + 1;
    if json[body_end - 1] == b'{' {
        return None;
    }
    let mut out = Vec::with_capacity(body_end + TAIL_LEN);
    out.extend_from_slice(&json[..body_end]);
    let at = out.len();
    out.extend_from_slice(TAIL_OPEN);
    out.extend_from_slice(&[b'0'; 16]);
    out.extend_from_slice(TAIL_CLOSE);
    let prelude = render_prelude(out.len() as u64);
    let mut h = crate::digest::Xxh3::new();
    h.update(&prelude);
    h.update(&out[..at]);
    let hex = format!("{:016x}", h.digest());
    out[at + TAIL_OPEN.len()..at + TAIL_OPEN.len() + 16].copy_from_slice(hex.as_bytes());
    Some((prelude, out))
}

/// The 20-byte prelude for a header of `len` bytes.
pub fn render_prelude(header_len: u64) -> [u8; 20] {
    blz_prelude::render(MAGIC, VERSION, header_len)
}

/// The header as `blazex` writes it: pretty-printed JSON, 2-space indent,
/// members in [`Header`] order.
pub fn render_header(h: &Header) -> Vec<u8> {
    serde_json::to_vec_pretty(h).expect("header serialises")
}

/// A JSON value with every object's keys sorted (byte order), as
/// `serde_json` without `preserve_order` (what `blazex` is built with)
/// renders it.
pub fn sorted(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut kv: Vec<(&String, &Value)> = m.iter().collect();
            kv.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                kv.into_iter()
                    .map(|(k, v)| (k.clone(), sorted(v)))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        v => v.clone(),
    }
}

/// `config.json` as `blazex export` writes it: `model_config`
/// pretty-printed with sorted keys.
pub fn render_config(model_config: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec_pretty(&sorted(model_config)).expect("JSON value serialises")
}

/// The safetensors header (8-byte length and JSON, space-padded to a
/// multiple of 8) of the `model.safetensors` `blazex export` writes:
/// compact JSON, keys sorted, tensors' data back to back in header order.
/// Returns it and each tensor's offset in the data buffer.
pub fn render_safetensors_header(tensors: &[TensorEntry]) -> (Vec<u8>, Vec<u64>) {
    let mut offsets = Vec::with_capacity(tensors.len());
    let mut at = 0u64;
    for t in tensors {
        offsets.push(at);
        at += t.data_len;
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name));
    let mut json = Vec::with_capacity(tensors.len() * 96 + 2);
    json.push(b'{');
    for (k, &i) in order.iter().enumerate() {
        let t = &tensors[i];
        if k > 0 {
            json.push(b',');
        }
        serde_json::to_writer(&mut json, &t.name).expect("string serialises");
        json.extend_from_slice(b":{\"data_offsets\":[");
        json.extend_from_slice(format!("{},{}", offsets[i], offsets[i] + t.data_len).as_bytes());
        json.extend_from_slice(b"],\"dtype\":\"");
        json.extend_from_slice(t.dtype.safetensors_name().as_bytes());
        json.extend_from_slice(b"\",\"shape\":[");
        for (j, d) in t.shape.iter().enumerate() {
            if j > 0 {
                json.push(b',');
            }
            json.extend_from_slice(d.to_string().as_bytes());
        }
        json.extend_from_slice(b"]}");
    }
    json.push(b'}');
    let padded = json.len().div_ceil(8) * 8;
    json.resize(padded, b' ');
    let mut out = Vec::with_capacity(8 + padded);
    out.extend_from_slice(&(padded as u64).to_le_bytes());
    out.extend_from_slice(&json);
    (out, offsets)
}

pub mod pretty;

#[cfg(test)]
mod tests;
