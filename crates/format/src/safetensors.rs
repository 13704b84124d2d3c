//! The safetensors file format: an 8-byte little-endian header length, a JSON
//! header, then the data buffer.
//!
//! Parsing is pure, over `&[u8]`; the caller does the I/O. It comes in two
//! strengths:
//! - [`Header::parse_entries`] only reads names, dtype strings, shapes and
//!   offsets, as z4ai does. It is what the ZSTN reader uses, so files that z4ai
//!   accepted (spans that are not whole elements, unknown dtypes) still open.
//! - [`Header::parse`] adds every check the safetensors crate makes: known
//!   dtypes, `shape × dtype size == span` with checked arithmetic, spans inside
//!   the data buffer, no overlaps. The packer uses it before writing anything.
//!
//! The header bytes are never re-rendered: round trips keep them verbatim.

use serde_json::Value;
use thiserror::Error;

/// safetensors refuses headers larger than this; so do we.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Every dtype the safetensors format defines (safetensors 0.6+).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    F4,
    F6E2M3,
    F6E3M2,
    U8,
    I8,
    F8E5M2,
    F8E4M3,
    F8E8M0,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
}

impl Dtype {
    pub const ALL: [Dtype; 20] = [
        Dtype::Bool,
        Dtype::F4,
        Dtype::F6E2M3,
        Dtype::F6E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8E5M2,
        Dtype::F8E4M3,
        Dtype::F8E8M0,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    pub fn parse(s: &str) -> Option<Dtype> {
        Dtype::ALL.iter().copied().find(|d| d.name() == s)
    }

    /// The name used in safetensors headers.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::F4 => "F4",
            Dtype::F6E2M3 => "F6_E2M3",
            Dtype::F6E3M2 => "F6_E3M2",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::C64 => "C64",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    /// Size of one element in bits (sub-byte types pack several per byte).
    pub fn bits(self) -> u64 {
        match self {
            Dtype::F4 => 4,
            Dtype::F6E2M3 | Dtype::F6E3M2 => 6,
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 8,
            Dtype::F8E5M2 | Dtype::F8E4M3 | Dtype::F8E8M0 => 8,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::C64 | Dtype::F64 | Dtype::I64 | Dtype::U64 => 64,
        }
    }
}

/// One tensor entry as the header states it, before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    /// The dtype string exactly as written (z4ai accepts unknown ones).
    pub dtype: String,
    pub shape: Vec<u64>,
    /// `[begin, end)` relative to the start of the data buffer.
    pub begin: u64,
    pub end: u64,
}

impl TensorEntry {
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.begin)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn known_dtype(&self) -> Option<Dtype> {
        Dtype::parse(&self.dtype)
    }

    /// The checks safetensors makes of one entry against a data buffer of
    /// `data_len` bytes: a known dtype, a forward span inside the buffer,
    /// `shape × dtype size == span` with checked arithmetic. (Overlaps
    /// between entries are [`Header::validate`]'s.)
    pub fn validate(&self, data_len: u64) -> Result<(), HeaderError> {
        let t = self;
        let dtype = t.known_dtype().ok_or_else(|| HeaderError::UnknownDtype {
            name: t.name.clone(),
            dtype: t.dtype.clone(),
        })?;
        if t.end < t.begin {
            return Err(HeaderError::Reversed {
                name: t.name.clone(),
                begin: t.begin,
                end: t.end,
            });
        }
        if t.end > data_len {
            return Err(HeaderError::OutOfBounds {
                name: t.name.clone(),
                begin: t.begin,
                end: t.end,
                data_len,
            });
        }
        let overflow = || HeaderError::ShapeOverflow {
            name: t.name.clone(),
            shape: t.shape.clone(),
        };
        let mut numel: u64 = 1;
        for &d in &t.shape {
            numel = numel.checked_mul(d).ok_or_else(overflow)?;
        }
        let bits = numel.checked_mul(dtype.bits()).ok_or_else(overflow)?;
        if bits % 8 != 0 || bits / 8 != t.len() {
            return Err(HeaderError::SpanMismatch {
                name: t.name.clone(),
                shape: t.shape.clone(),
                dtype: dtype.name(),
                expected: bits.div_ceil(8),
                actual: t.len(),
            });
        }
        Ok(())
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HeaderError {
    #[error("file too short for a safetensors header length ({0} bytes)")]
    TooShort(u64),
    #[error("header length {0} exceeds the 100,000,000-byte limit")]
    HeaderTooLarge(u64),
    /// The first 8 bytes are not a header length at all.
    #[error("not a safetensors file: it looks like {0} (a safetensors file starts with an 8-byte header length, then a JSON header)")]
    NotSafetensors(String),
    #[error("header length {len} runs past the end of the file ({file} bytes)")]
    HeaderPastEnd { len: u64, file: u64 },
    #[error("header is not valid UTF-8 JSON: {0}")]
    InvalidJson(String),
    #[error("header is not a JSON object")]
    NotAnObject,
    #[error("__metadata__ must map strings to strings: {0}")]
    InvalidMetadata(String),
    #[error("tensor {name:?}: {what}")]
    InvalidEntry { name: String, what: String },
    #[error("tensor {name:?}: unknown dtype {dtype:?}")]
    UnknownDtype { name: String, dtype: String },
    #[error("tensor {name:?}: shape {shape:?} overflows")]
    ShapeOverflow { name: String, shape: Vec<u64> },
    #[error("tensor {name:?}: shape {shape:?} of {dtype} is {expected} bytes but data_offsets span {actual}")]
    SpanMismatch {
        name: String,
        shape: Vec<u64>,
        dtype: &'static str,
        expected: u64,
        actual: u64,
    },
    #[error(
        "tensor {name:?}: data_offsets [{begin}, {end}) outside the {data_len}-byte data buffer"
    )]
    OutOfBounds {
        name: String,
        begin: u64,
        end: u64,
        data_len: u64,
    },
    #[error("tensor {name:?}: data_offsets [{begin}, {end}) are reversed")]
    Reversed { name: String, begin: u64, end: u64 },
    #[error("tensors {a:?} and {b:?} overlap")]
    Overlap { a: String, b: String },
    #[error("tensor name {0:?} appears twice")]
    DuplicateName(String),
}

/// A parsed safetensors header. `raw` is kept verbatim.
#[derive(Debug, Clone)]
pub struct Header {
    /// The JSON header bytes exactly as they were in the file (with padding).
    pub raw: Vec<u8>,
    /// `__metadata__`, if present, in file order.
    pub metadata: Option<Vec<(String, String)>>,
    /// Tensors in header order.
    pub tensors: Vec<TensorEntry>,
}

/// Reads the 8-byte header length prefix and checks it against the limit and
/// the file size. Returns the header length.
pub fn header_len(prefix: &[u8], file_len: u64) -> Result<u64, HeaderError> {
    if prefix.len() < 8 || file_len < 8 {
        return Err(HeaderError::TooShort(file_len.min(prefix.len() as u64)));
    }
    let n = u64::from_le_bytes(prefix[..8].try_into().unwrap());
    if n > MAX_HEADER_LEN {
        return Err(match looks_like(prefix) {
            Some(kind) => HeaderError::NotSafetensors(kind),
            None => HeaderError::HeaderTooLarge(n),
        });
    }
    if n > file_len - 8 {
        return Err(HeaderError::HeaderPastEnd {
            len: n,
            file: file_len,
        });
    }
    Ok(n)
}

/// What a file whose first 8 bytes are no plausible header length looks
/// like, from the bytes it starts with, if that says anything: JSON, text,
/// or a format people mistake for safetensors. A real length below the
/// limit has zero high bytes, which text never has.
fn looks_like(head: &[u8]) -> Option<String> {
    let head = &head[..head.len().min(64)];
    if head.starts_with(b"PK\x03\x04") {
        return Some("a zip archive (a PyTorch .bin/.pt checkpoint?)".into());
    }
    if head.first() == Some(&0x80) && head.get(1).is_some_and(|v| (2..=5).contains(v)) {
        return Some("a Python pickle (a PyTorch checkpoint?)".into());
    }
    if head.starts_with(b"GGUF") {
        return Some("a GGUF file".into());
    }
    // Text: valid UTF-8 (a character cut at the end of the window aside)
    // without control characters but whitespace.
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).ok()?,
        Err(_) => return None,
    };
    if text.chars().any(|c| c.is_control() && !c.is_whitespace()) {
        return None;
    }
    let body = text.trim_start_matches('\u{feff}').trim_start();
    let start: String = body.chars().take(24).collect();
    let kind = if body.starts_with('{') || body.starts_with('[') {
        "JSON"
    } else {
        "text"
    };
    Some(format!("{kind} (it starts {start:?})"))
}

impl Header {
    /// Parses header JSON leniently: names, dtype strings, shapes and offsets,
    /// with no cross-checks. Entries whose fields are missing or of the wrong
    /// JSON type are still errors (nothing sensible could be served).
    ///
    /// Like a JSON object, a name given twice keeps its first place and its
    /// last value.
    pub fn parse_entries(raw: &[u8]) -> Result<Header, HeaderError> {
        let mut tensors = Vec::new();
        let metadata = for_each_entry(raw, |t| {
            tensors.push(t);
            Ok(())
        })?;
        // Duplicate names (rare: safetensors never writes them) found by
        // sorting positions, not with a map of every name.
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name).then(a.cmp(&b)));
        let mut dropped = vec![false; tensors.len()];
        let mut moves = Vec::new();
        for run in order.chunk_by(|&a, &b| tensors[a].name == tensors[b].name) {
            if let [first, .., last] = *run {
                moves.push((first, last));
                for &later in &run[1..] {
                    dropped[later] = true;
                }
            }
        }
        for &(first, last) in &moves {
            tensors[first] = tensors[last].clone();
        }
        if !moves.is_empty() {
            let mut i = 0;
            tensors.retain(|_| {
                i += 1;
                !dropped[i - 1]
            });
        }
        Ok(Header {
            raw: raw.to_vec(),
            metadata,
            tensors,
        })
    }

    /// Parses and fully validates a header against a data buffer of
    /// `data_len` bytes, as the safetensors crate does.
    pub fn parse(raw: &[u8], data_len: u64) -> Result<Header, HeaderError> {
        let h = Header::parse_entries(raw)?;
        h.validate(data_len)?;
        Ok(h)
    }

    /// Every check safetensors makes. Gaps between tensors are allowed here
    /// (they round-trip through an opaque frame), overlaps are not.
    pub fn validate(&self, data_len: u64) -> Result<(), HeaderError> {
        for t in &self.tensors {
            t.validate(data_len)?;
        }
        let mut order: Vec<&TensorEntry> = self.tensors.iter().collect();
        order.sort_by_key(|t| (t.begin, t.end));
        for w in order.windows(2) {
            if w[1].begin < w[0].end {
                return Err(HeaderError::Overlap {
                    a: w[0].name.clone(),
                    b: w[1].name.clone(),
                });
            }
        }
        Ok(())
    }

    /// Tensors in data-buffer order (stable by begin offset), as z4ai sorts them.
    pub fn data_order(&self) -> Vec<&TensorEntry> {
        let mut v: Vec<&TensorEntry> = self.tensors.iter().collect();
        v.sort_by_key(|t| t.begin);
        v
    }

    /// True when the tensors, in data order, tile `[0, data_len)` exactly:
    /// the condition for an indexed (contiguous) ZSTN.
    pub fn tiles(&self, data_len: u64) -> bool {
        let mut cursor = 0u64;
        for t in self.data_order() {
            if t.begin != cursor || t.end < t.begin {
                return false;
            }
            cursor = t.end;
        }
        cursor == data_len
    }
}

/// Reads header JSON `raw` one entry at a time, without building the JSON
/// tree of the whole header (a tree of 10^6 entries takes gigabytes): `f`
/// gets every tensor entry in file order, as written (a name given twice
/// comes twice). Returns `__metadata__`, which must map strings to strings.
/// An error of `f` stops the walk and is returned as it is.
pub fn for_each_entry(
    raw: &[u8],
    mut f: impl FnMut(TensorEntry) -> Result<(), HeaderError>,
) -> Result<Option<Vec<(String, String)>>, HeaderError> {
    use serde::de::{Deserializer as _, Error as _, MapAccess, Visitor};

    struct Entries<'f> {
        f: &'f mut dyn FnMut(TensorEntry) -> Result<(), HeaderError>,
        metadata: &'f mut Option<Vec<(String, String)>>,
        failed: &'f mut Option<HeaderError>,
    }
    impl<'de> Visitor<'de> for Entries<'_> {
        type Value = ();
        fn expecting(&self, out: &mut std::fmt::Formatter) -> std::fmt::Result {
            out.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut stop = |e: HeaderError| {
                let msg = e.to_string();
                *self.failed = Some(e);
                A::Error::custom(msg)
            };
            while let Some(name) = map.next_key::<String>()? {
                let v: Value = map.next_value()?;
                if name == "__metadata__" {
                    *self.metadata = Some(parse_metadata(&v).map_err(&mut stop)?);
                    continue;
                }
                let entry = parse_entry(&name, &v).map_err(&mut stop)?;
                (self.f)(entry).map_err(&mut stop)?;
            }
            Ok(())
        }
    }

    let text = std::str::from_utf8(raw).map_err(|e| HeaderError::InvalidJson(e.to_string()))?;
    if !text.trim_start().starts_with('{') {
        // Valid JSON of another type is "not an object", as before.
        return match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) => Err(HeaderError::NotAnObject),
            Err(e) => Err(HeaderError::InvalidJson(e.to_string())),
        };
    }
    let mut metadata = None;
    let mut failed = None;
    let mut de = serde_json::Deserializer::from_str(text);
    let walked = de
        .deserialize_map(Entries {
            f: &mut f,
            metadata: &mut metadata,
            failed: &mut failed,
        })
        .and_then(|()| de.end());
    if let Some(e) = failed {
        return Err(e);
    }
    walked.map_err(|e| HeaderError::InvalidJson(e.to_string()))?;
    Ok(metadata)
}

fn parse_metadata(v: &Value) -> Result<Vec<(String, String)>, HeaderError> {
    let m = v
        .as_object()
        .ok_or_else(|| HeaderError::InvalidMetadata("not an object".into()))?;
    let mut pairs = Vec::with_capacity(m.len());
    for (k, val) in m {
        let s = val.as_str().ok_or_else(|| {
            HeaderError::InvalidMetadata(format!("value of {k:?} is not a string"))
        })?;
        pairs.push((k.clone(), s.to_string()));
    }
    Ok(pairs)
}

fn parse_entry(name: &str, v: &Value) -> Result<TensorEntry, HeaderError> {
    let bad = |what: &str| HeaderError::InvalidEntry {
        name: name.to_string(),
        what: what.to_string(),
    };
    let o = v.as_object().ok_or_else(|| bad("entry is not an object"))?;
    let dtype = o
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing or non-string \"dtype\""))?
        .to_string();
    let shape_v = o
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing or non-array \"shape\""))?;
    let mut shape = Vec::with_capacity(shape_v.len().min(64));
    for d in shape_v {
        shape.push(d.as_u64().ok_or_else(|| bad("shape holds a non-integer"))?);
    }
    let offs = o
        .get("data_offsets")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing or non-array \"data_offsets\""))?;
    if offs.len() != 2 {
        return Err(bad("\"data_offsets\" must have two entries"));
    }
    let begin = offs[0]
        .as_u64()
        .ok_or_else(|| bad("data_offsets holds a non-integer"))?;
    let end = offs[1]
        .as_u64()
        .ok_or_else(|| bad("data_offsets holds a non-integer"))?;
    Ok(TensorEntry {
        name: name.to_string(),
        dtype,
        shape,
        begin,
        end,
    })
}

/// Splits a whole safetensors file into (header, data buffer), validating.
pub fn split_file(bytes: &[u8]) -> Result<(Header, &[u8]), HeaderError> {
    let n = header_len(bytes, bytes.len() as u64)?;
    let raw = &bytes[8..8 + n as usize];
    let data = &bytes[8 + n as usize..];
    let h = Header::parse(raw, data.len() as u64)?;
    Ok((h, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn a_name_given_twice_keeps_its_first_place_and_its_last_value() {
        let h = br#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"I8","shape":[1],"data_offsets":[2,3]}}"#;
        let hdr = Header::parse_entries(h).unwrap();
        let got: Vec<(&str, &str, u64)> = hdr
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.dtype.as_str(), t.begin))
            .collect();
        assert_eq!(got, vec![("a", "I8", 2), ("b", "U8", 1)]);
        // The walk itself passes every entry as written.
        let mut n = 0;
        for_each_entry(h, |_| {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(n, 3);
    }

    #[test]
    fn the_walk_reports_what_parse_reports() {
        assert_eq!(
            Header::parse_entries(b"[1, 2]").unwrap_err(),
            HeaderError::NotAnObject
        );
        assert!(matches!(
            Header::parse_entries(br#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} x"#)
                .unwrap_err(),
            HeaderError::InvalidJson(_)
        ));
        assert!(matches!(
            Header::parse_entries(br#"{"a":{"dtype":"U8"}}"#).unwrap_err(),
            HeaderError::InvalidEntry { .. }
        ));
        assert!(matches!(
            Header::parse_entries(br#"{"__metadata__":{"k":1}}"#).unwrap_err(),
            HeaderError::InvalidMetadata(_)
        ));
        // An error of the callback comes back as it is.
        let h = br#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
        let e = for_each_entry(h, |_| Err(HeaderError::DuplicateName("x".into()))).unwrap_err();
        assert_eq!(e, HeaderError::DuplicateName("x".into()));
    }

    #[test]
    fn parses_with_metadata_and_padding() {
        let h = r#"{"__metadata__":{"a":"b"},"x":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}   "#;
        let f = file(h, &[0u8; 8]);
        let (hdr, data) = split_file(&f).unwrap();
        assert_eq!(data.len(), 8);
        assert_eq!(hdr.raw, h.as_bytes());
        assert_eq!(hdr.metadata.unwrap(), vec![("a".into(), "b".into())]);
        assert_eq!(hdr.tensors[0].shape, vec![2, 2]);
    }

    #[test]
    fn every_dtype_roundtrips_its_name() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::parse(d.name()), Some(d));
        }
        assert_eq!(Dtype::parse("F8_E4M3"), Some(Dtype::F8E4M3));
        assert_eq!(Dtype::parse("X9"), None);
    }

    #[test]
    fn sub_byte_dtypes_need_whole_bytes() {
        let h = r#"{"x":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#;
        let f = file(h, &[0u8; 2]);
        assert!(matches!(
            split_file(&f),
            Err(HeaderError::SpanMismatch { .. })
        ));
        let h = r#"{"x":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}"#;
        assert!(split_file(&file(h, &[0u8; 2])).is_ok());
    }

    #[test]
    fn rejects_each_violation_by_name() {
        let cases: &[(&str, usize, &str)] = &[
            (
                r#"{"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                8,
                "SpanMismatch",
            ),
            (
                r#"{"t":{"dtype":"Q7","shape":[3],"data_offsets":[0,3]}}"#,
                3,
                "UnknownDtype",
            ),
            (
                r#"{"t":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}"#,
                2,
                "OutOfBounds",
            ),
            (
                r#"{"t":{"dtype":"U8","shape":[0],"data_offsets":[3,2]}}"#,
                4,
                "Reversed",
            ),
            (
                r#"{"t":{"dtype":"U8","shape":[18446744073709551615,2],"data_offsets":[0,3]}}"#,
                3,
                "ShapeOverflow",
            ),
            (
                r#"{"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"u":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
                6,
                "Overlap",
            ),
            (r#"{"t":{"dtype":"U8","shape":[4]}}"#, 4, "InvalidEntry"),
            (r#"[1]"#, 0, "NotAnObject"),
            (r#"{"__metadata__":{"a":1}}"#, 0, "InvalidMetadata"),
            ("{\"t\"", 0, "InvalidJson"),
        ];
        for (h, n, want) in cases {
            let err = split_file(&file(h, &vec![0u8; *n])).unwrap_err();
            let dbg = format!("{err:?}");
            assert!(dbg.starts_with(want), "{h}: got {dbg}, want {want}");
            if *want != "NotAnObject" && *want != "InvalidJson" && *want != "InvalidMetadata" {
                assert!(
                    err.to_string().contains('"'),
                    "error names the tensor: {err}"
                );
            }
        }
    }

    #[test]
    fn rejects_bad_lengths() {
        assert!(matches!(
            header_len(&[1, 2], 2),
            Err(HeaderError::TooShort(_))
        ));
        let big = (MAX_HEADER_LEN + 1).to_le_bytes();
        assert!(matches!(
            header_len(&big, u64::MAX),
            Err(HeaderError::HeaderTooLarge(_))
        ));
        // Files mistaken for safetensors are named for what they look like.
        let json = b"{\n  \"architectures\": [\"LlamaForCausalLM\"]";
        match header_len(json, 1000) {
            Err(e @ HeaderError::NotSafetensors(_)) => {
                let m = e.to_string();
                assert!(m.starts_with("not a safetensors file: it looks like JSON (it starts \"{\\n  \\\"architectures"), "{m}");
            }
            r => panic!("{r:?}"),
        }
        match header_len(b"hello, world: not tensors", 1000) {
            Err(HeaderError::NotSafetensors(k)) => assert!(k.starts_with("text"), "{k}"),
            r => panic!("{r:?}"),
        }
        match header_len(b"PK\x03\x04\x14\0\0\0", 1000) {
            Err(HeaderError::NotSafetensors(k)) => assert!(k.contains("zip"), "{k}"),
            r => panic!("{r:?}"),
        }
        let past = 100u64.to_le_bytes();
        assert!(matches!(
            header_len(&past, 50),
            Err(HeaderError::HeaderPastEnd { .. })
        ));
    }

    #[test]
    fn tiling_detects_holes() {
        let h = Header::parse_entries(
            br#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[5,9]}}"#,
        )
        .unwrap();
        assert!(!h.tiles(9));
        let h = Header::parse_entries(
            br#"{"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
        )
        .unwrap();
        assert!(h.tiles(8));
        assert!(!h.tiles(9));
        assert_eq!(h.data_order()[0].name, "a");
    }
}
