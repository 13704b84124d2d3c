//! z4ai's name-aligned model delta, `Z4DM` version 1
//! (`z4ai.model_delta.compress`, doc/FORMAT.md "z4ai deltas (read)"):
//!
//! ```text
//! [4] "Z4DM" ; u8 version = 1 ; u64 hlen ; [hlen] target JSON header ;
//! u64 data_len ; [8] BLAKE2b-8 of the base's data buffer ; u32 n_records ;
//! n_records × ( u16 name_len ; [name] ; u64 begin ; u64 end ; u8 kind ;
//!               kind != COPY: u64 frame_len ; [frame_len] frame )
//! ```
//!
//! The output is `u64le(hlen) ‖ header ‖ data`, where `data` is `data_len`
//! zero bytes with each record's span `[begin, end)` filled: COPY (2) with
//! the base tensor of the same name, DELTA (1) with a `Z4DL` against it,
//! FULL (0) with a plain codec frame.
//!
//! [`Z4dm::parse`] reads the fixed header; [`Z4dm::records`] walks the
//! records once, in file order, checking each against the bytes that hold
//! it and against `data_len`, and never allocating by a length from the
//! file. Beyond what z4ai itself checks, records must come in data-buffer
//! order without overlapping (z4ai writes them so), so that a reader can
//! stream the output, and no bytes may follow the last record.
//!
//! This is the one parser of `Z4DM` in ckptfs: ckptfs's own delta archive
//! (`format::delta`, a `Z4DM` followed by a `CKD1` trailer) reads its head
//! with [`Z4dm::parse_head`] and each record where its trailer says with
//! [`Record::at`], and writes them with [`render_head`] and
//! [`render_record_head`].

use crate::cursor::Cursor;
use crate::error::CodecError;
use crate::z4digest::BASE_DIGEST_LEN;
use std::ops::Range;
use thiserror::Error;

pub const MAGIC: &[u8; 4] = b"Z4DM";
/// The only version z4ai 0.2.0 writes and reads.
pub const VERSION: u8 = 1;
/// The fewest bytes one record takes (an empty-named COPY).
pub const MIN_RECORD_LEN: u64 = 2 + 8 + 8 + 1;
/// Where the header JSON's length (a u64) is: after the magic and version.
pub const JSON_LEN_AT: usize = 5;
/// Bytes before the header JSON: magic, version and the JSON's length.
pub const FIXED_LEN: usize = JSON_LEN_AT + 8;

/// The length of a head (everything before the first record) whose header
/// JSON is `json_len` bytes: the fixed fields, the JSON, `data_len`, the
/// base digest and the record count (saturating).
pub fn head_len(json_len: u64) -> u64 {
    json_len.saturating_add((FIXED_LEN + 8 + BASE_DIGEST_LEN + 4) as u64)
}

/// The header JSON's length from a file's first [`FIXED_LEN`] bytes, for a
/// reader that reads the head piece by piece (the data length follows the
/// JSON, at `FIXED_LEN + json_len`); None unless they open a `Z4DM`
/// version 1.
pub fn json_len(fixed: &[u8; FIXED_LEN]) -> Option<u64> {
    if &fixed[..4] != MAGIC || fixed[4] != VERSION {
        return None;
    }
    Some(u64::from_le_bytes(fixed[JSON_LEN_AT..].try_into().ok()?))
}

/// Why a `Z4DM` cannot be read.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Z4dmError {
    #[error("not a z4ai model delta (magic {0:?}, expected \"Z4DM\")")]
    Magic(String),
    #[error("unsupported Z4DM version {0} (ckptfs reads version 1)")]
    Version(u8),
    #[error("Z4DM header: {0}")]
    Header(CodecError),
    #[error("Z4DM claims {records} records but only {have} bytes follow (each takes at least 19)")]
    TooManyRecords { records: u32, have: u64 },
    #[error("record {index} at offset {offset}: {source}")]
    Record {
        index: u32,
        offset: u64,
        source: CodecError,
    },
    #[error("record {index} at offset {offset}: tensor name is not UTF-8")]
    Name { index: u32, offset: u64 },
    #[error("record {index} ({name:?}) at offset {offset}: unknown kind {kind} (0 FULL, 1 DELTA, 2 COPY)")]
    Kind {
        index: u32,
        name: String,
        offset: u64,
        kind: u8,
    },
    #[error("record {index} ({name:?}) at offset {offset}: span [{begin}, {end}) outside the {data_len}-byte data buffer")]
    Span {
        index: u32,
        name: String,
        offset: u64,
        begin: u64,
        end: u64,
        data_len: u64,
    },
    #[error("record {index} ({name:?}) at offset {offset}: span [{begin}, {end}) starts before the previous record's end {prev_end} (records must be in data order, not overlapping)")]
    Order {
        index: u32,
        name: String,
        offset: u64,
        begin: u64,
        end: u64,
        prev_end: u64,
    },
    #[error("{extra} bytes follow the last record (at offset {offset})")]
    Trailing { offset: u64, extra: u64 },
}

/// How a record's tensor is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// A plain codec frame (Z4AI / ZSP1 / ZPL1).
    Full,
    /// A `Z4DL` against the base tensor of the same name.
    Delta,
    /// The base tensor of the same name, as it is.
    Copy,
}

impl RecordKind {
    pub fn from_byte(b: u8) -> Option<RecordKind> {
        match b {
            0 => Some(RecordKind::Full),
            1 => Some(RecordKind::Delta),
            2 => Some(RecordKind::Copy),
            _ => None,
        }
    }
    /// The byte that stores it (the inverse of [`RecordKind::from_byte`]).
    pub fn code(self) -> u8 {
        match self {
            RecordKind::Full => 0,
            RecordKind::Delta => 1,
            RecordKind::Copy => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            RecordKind::Full => "FULL",
            RecordKind::Delta => "DELTA",
            RecordKind::Copy => "COPY",
        }
    }
}

/// One record: a target tensor's span and how it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Position among the records, from 0.
    pub index: u32,
    pub name: &'a str,
    /// Span in the target's data buffer (`begin <= end <= data_len`).
    pub begin: u64,
    pub end: u64,
    pub kind: RecordKind,
    /// The stored frame (empty for COPY) and where it lies in the file.
    pub frame: &'a [u8],
    pub frame_range: Range<u64>,
    /// Offset of the record in the file (for messages).
    pub offset: u64,
    /// Where the record ends (and the next one starts) in the file.
    pub end_offset: u64,
}

impl<'a> Record<'a> {
    /// Reads the record at `offset` of `bytes`, `index` naming it in
    /// errors, with none of the checks of its span against the data buffer
    /// and the previous record that [`Z4dm::records`] makes: for a reader
    /// that finds the records through an index of its own (ckptfs's `CKD1`
    /// trailer) and checks their spans itself.
    pub fn at(bytes: &'a [u8], offset: usize, index: u32) -> Result<Record<'a>, Z4dmError> {
        read_record(bytes, offset, index, None)
    }

    pub fn len(&self) -> u64 {
        self.end - self.begin
    }
    pub fn is_empty(&self) -> bool {
        self.begin == self.end
    }
}

/// A parsed `Z4DM` header; the records are walked by [`Z4dm::records`].
#[derive(Debug, Clone)]
pub struct Z4dm<'a> {
    pub version: u8,
    /// The target's safetensors JSON header, verbatim.
    pub header_json: &'a [u8],
    /// Length of the target's data buffer.
    pub data_len: u64,
    /// BLAKE2b-8 of the base file's data buffer.
    pub base_digest: [u8; BASE_DIGEST_LEN],
    pub n_records: u32,
    bytes: &'a [u8],
    records_at: usize,
}

impl<'a> Z4dm<'a> {
    /// Parses the fixed header, checking every length against the file.
    pub fn parse(bytes: &'a [u8]) -> Result<Z4dm<'a>, Z4dmError> {
        let d = Z4dm::parse_head(bytes)?;
        let have = (bytes.len() - d.records_at) as u64;
        if d.n_records as u64 * MIN_RECORD_LEN > have {
            return Err(Z4dmError::TooManyRecords {
                records: d.n_records,
                have,
            });
        }
        Ok(d)
    }

    /// [`Z4dm::parse`] without checking the record count against the bytes
    /// after the head: for a reader that knows where the records end (a
    /// `CKD1` trailer lists them) and checks them itself.
    pub fn parse_head(bytes: &'a [u8]) -> Result<Z4dm<'a>, Z4dmError> {
        if bytes.len() < 4 || &bytes[..4] != MAGIC {
            return Err(Z4dmError::Magic(
                String::from_utf8_lossy(&bytes[..bytes.len().min(4)]).into_owned(),
            ));
        }
        let mut c = Cursor::new(&bytes[4..]);
        let h = Z4dmError::Header;
        let version = c.u8("version").map_err(h)?;
        if version != VERSION {
            return Err(Z4dmError::Version(version));
        }
        let hlen = c.u64("header length").map_err(h)?;
        let header_json = c.take(hlen, "target header").map_err(h)?;
        let data_len = c.u64("data length").map_err(h)?;
        let base_digest = c
            .take(BASE_DIGEST_LEN as u64, "base digest")
            .map_err(h)?
            .try_into()
            .expect("8 bytes");
        let n_records = c.u32("record count").map_err(h)?;
        Ok(Z4dm {
            version,
            header_json,
            data_len,
            base_digest,
            n_records,
            bytes,
            records_at: 4 + c.pos(),
        })
    }

    /// Length of the target file: `8 + hlen + data_len` (None if it
    /// overflows, which [`Z4dm::records`] does not check).
    pub fn target_len(&self) -> Option<u64> {
        (8 + self.header_json.len() as u64).checked_add(self.data_len)
    }

    /// The first bytes of the output: `u64le(hlen) ‖ header`.
    pub fn prefix(&self) -> Vec<u8> {
        let mut v = (self.header_json.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(self.header_json);
        v
    }

    /// Where [`Z4dm::prefix`]'s bytes are in the file, verbatim.
    pub fn prefix_range(&self) -> Range<usize> {
        JSON_LEN_AT..FIXED_LEN + self.header_json.len()
    }

    /// Where the first record starts.
    pub fn records_start(&self) -> usize {
        self.records_at
    }

    /// Walks the records once, in file order. After the last record (or
    /// the first error) the iterator ends.
    pub fn records(&self) -> Records<'a> {
        Records {
            bytes: self.bytes,
            pos: self.records_at,
            index: 0,
            n: self.n_records,
            data_len: self.data_len,
            prev_end: 0,
            done: false,
        }
    }
}

/// The iterator of [`Z4dm::records`].
#[derive(Debug, Clone)]
pub struct Records<'a> {
    bytes: &'a [u8],
    pos: usize,
    index: u32,
    n: u32,
    data_len: u64,
    prev_end: u64,
    done: bool,
}

impl<'a> Records<'a> {
    fn next_record(&mut self) -> Result<Record<'a>, Z4dmError> {
        let order = Some((self.data_len, self.prev_end));
        let r = read_record(self.bytes, self.pos, self.index, order)?;
        self.pos = r.end_offset as usize;
        self.prev_end = r.end;
        Ok(r)
    }
}

/// Reads the record at `offset` of `bytes`. With `order` (the data
/// buffer's length and the previous record's end), its span must lie in
/// the data buffer and start at or after the previous record's end.
fn read_record(
    bytes: &[u8],
    offset: usize,
    index: u32,
    order: Option<(u64, u64)>,
) -> Result<Record<'_>, Z4dmError> {
    let at = bytes.get(offset..).unwrap_or_default();
    let offset = offset as u64;
    let mut c = Cursor::new(at);
    let rec = |source| Z4dmError::Record {
        index,
        offset,
        source,
    };
    let name_len = c.u16("tensor name length").map_err(rec)?;
    let name = c.take(name_len as u64, "tensor name").map_err(rec)?;
    let name = std::str::from_utf8(name).map_err(|_| Z4dmError::Name { index, offset })?;
    let begin = c.u64("begin").map_err(rec)?;
    let end = c.u64("end").map_err(rec)?;
    let kind_byte = c.u8("kind").map_err(rec)?;
    let kind = RecordKind::from_byte(kind_byte).ok_or_else(|| Z4dmError::Kind {
        index,
        name: name.to_string(),
        offset,
        kind: kind_byte,
    })?;
    if let Some((data_len, prev_end)) = order {
        if begin > end || end > data_len {
            return Err(Z4dmError::Span {
                index,
                name: name.to_string(),
                offset,
                begin,
                end,
                data_len,
            });
        }
        if begin < prev_end {
            return Err(Z4dmError::Order {
                index,
                name: name.to_string(),
                offset,
                begin,
                end,
                prev_end,
            });
        }
    }
    let (frame, frame_range) = if kind == RecordKind::Copy {
        (&[][..], 0..0)
    } else {
        let len = c.u64("frame length").map_err(rec)?;
        let at = offset + c.pos() as u64;
        let f = c.take(len, "frame").map_err(rec)?;
        (f, at..at + len)
    };
    Ok(Record {
        index,
        name,
        begin,
        end,
        kind,
        frame,
        frame_range,
        offset,
        end_offset: offset + c.pos() as u64,
    })
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, Z4dmError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.index == self.n {
            self.done = true;
            let extra = (self.bytes.len() - self.pos) as u64;
            return (extra > 0).then_some(Err(Z4dmError::Trailing {
                offset: self.pos as u64,
                extra,
            }));
        }
        let r = self.next_record();
        self.index += 1;
        if r.is_err() {
            self.done = true;
        }
        Some(r)
    }
}

/// Renders a `Z4DM` head: everything before the first record.
pub fn render_head(
    header_json: &[u8],
    data_len: u64,
    base_digest: [u8; BASE_DIGEST_LEN],
    n_records: u32,
) -> Vec<u8> {
    let mut v = Vec::with_capacity(head_len(header_json.len() as u64) as usize);
    v.extend_from_slice(MAGIC);
    v.push(VERSION);
    v.extend_from_slice(&(header_json.len() as u64).to_le_bytes());
    v.extend_from_slice(header_json);
    v.extend_from_slice(&data_len.to_le_bytes());
    v.extend_from_slice(&base_digest);
    v.extend_from_slice(&n_records.to_le_bytes());
    v
}

/// Renders a record's bytes before its `frame_len`-byte frame (all of a
/// COPY record, which has none).
pub fn render_record_head(
    name: &str,
    begin: u64,
    end: u64,
    kind: RecordKind,
    frame_len: u64,
) -> Vec<u8> {
    let mut v = Vec::with_capacity(MIN_RECORD_LEN as usize + name.len() + 8);
    v.extend_from_slice(&(name.len() as u16).to_le_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&begin.to_le_bytes());
    v.extend_from_slice(&end.to_le_bytes());
    v.push(kind.code());
    if kind != RecordKind::Copy {
        v.extend_from_slice(&frame_len.to_le_bytes());
    }
    v
}

/// Writes a `Z4DM` (tests and fixtures build deltas with it): header,
/// then records of (name, begin, end, kind, frame).
pub fn render(
    header_json: &[u8],
    data_len: u64,
    base_digest: &[u8; BASE_DIGEST_LEN],
    records: &[(&str, u64, u64, RecordKind, &[u8])],
) -> Vec<u8> {
    let mut v = render_head(header_json, data_len, *base_digest, records.len() as u32);
    for &(name, begin, end, kind, frame) in records {
        v.extend(render_record_head(
            name,
            begin,
            end,
            kind,
            frame.len() as u64,
        ));
        if kind != RecordKind::Copy {
            v.extend_from_slice(frame);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        render(
            br#"{"a":{}}"#,
            12,
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[
                ("a", 0, 4, RecordKind::Copy, &[]),
                ("b", 4, 8, RecordKind::Full, b"FRAME"),
                ("c", 8, 12, RecordKind::Delta, b"Z4DL.."),
            ],
        )
    }

    #[test]
    fn walks_records_in_one_pass() {
        let blob = sample();
        let d = Z4dm::parse(&blob).unwrap();
        assert_eq!(d.header_json, br#"{"a":{}}"#);
        assert_eq!(d.data_len, 12);
        assert_eq!(d.base_digest, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(d.target_len(), Some(8 + 8 + 12));
        let recs: Vec<Record> = d.records().collect::<Result<_, _>>().unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!(
            (recs[0].name, recs[0].kind, recs[0].frame),
            ("a", RecordKind::Copy, &b""[..])
        );
        assert_eq!(recs[1].frame, b"FRAME");
        let r = recs[2].frame_range.clone();
        assert_eq!(&blob[r.start as usize..r.end as usize], b"Z4DL..");
        assert_eq!((recs[2].begin, recs[2].end, recs[2].len()), (8, 12, 4));
    }

    #[test]
    fn reads_a_record_where_an_index_says() {
        let blob = sample();
        let d = Z4dm::parse(&blob).unwrap();
        assert_eq!(&blob[d.prefix_range()], &d.prefix()[..]);
        for r in d.records() {
            let r = r.unwrap();
            assert_eq!(Record::at(&blob, r.offset as usize, r.index), Ok(r));
        }
        // Without the walk's checks: a span past the data buffer reads.
        let blob = render(b"{}", 4, &[0; 8], &[("x", 2, 9, RecordKind::Copy, &[])]);
        let start = Z4dm::parse_head(&blob).unwrap().records_start();
        assert_eq!(Record::at(&blob, start, 0).unwrap().end, 9);
        assert!(Record::at(&blob, blob.len() + 1, 0).is_err());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let blob = sample();
        for n in 0..blob.len() {
            let errs = match Z4dm::parse(&blob[..n]) {
                Err(_) => 1,
                Ok(d) => d.records().filter(|r| r.is_err()).count(),
            };
            assert_eq!(errs, 1, "prefix of {n} bytes");
        }
    }

    #[test]
    fn refuses_hostile_records() {
        let digest = [0u8; 8];
        let one = |rec: (&str, u64, u64, RecordKind, &[u8])| {
            let blob = render(b"{}", 10, &digest, &[rec]);
            let d = Z4dm::parse(&blob).unwrap();
            d.records().next().unwrap().unwrap_err()
        };
        assert!(matches!(
            one(("x", 4, 11, RecordKind::Copy, &[])),
            Z4dmError::Span { end: 11, .. }
        ));
        assert!(matches!(
            one(("x", 5, 4, RecordKind::Copy, &[])),
            Z4dmError::Span { .. }
        ));
        // Overlapping records.
        let blob = render(
            b"{}",
            10,
            &digest,
            &[
                ("a", 0, 6, RecordKind::Copy, &[]),
                ("b", 5, 8, RecordKind::Copy, &[]),
            ],
        );
        let d = Z4dm::parse(&blob).unwrap();
        let errs: Vec<_> = d.records().filter_map(|r| r.err()).collect();
        assert!(matches!(errs[..], [Z4dmError::Order { prev_end: 6, .. }]));
        // A bad kind byte, a frame length past the end, a huge record count,
        // trailing bytes.
        let mut blob = render(b"{}", 10, &digest, &[("a", 0, 6, RecordKind::Copy, &[])]);
        *blob.last_mut().unwrap() = 7;
        let d = Z4dm::parse(&blob).unwrap();
        assert!(matches!(
            d.records().next().unwrap(),
            Err(Z4dmError::Kind { kind: 7, .. })
        ));
        let mut blob = render(b"{}", 10, &digest, &[("a", 0, 6, RecordKind::Full, b"ab")]);
        let n = blob.len();
        blob[n - 10..n - 2].copy_from_slice(&u64::MAX.to_le_bytes());
        let d = Z4dm::parse(&blob).unwrap();
        assert!(matches!(
            d.records().next().unwrap(),
            Err(Z4dmError::Record { .. })
        ));
        let mut blob = render(b"{}", 10, &digest, &[]);
        let n = blob.len();
        blob[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Z4dm::parse(&blob),
            Err(Z4dmError::TooManyRecords { .. })
        ));
        let mut blob = render(b"{}", 10, &digest, &[]);
        blob.push(0);
        let d = Z4dm::parse(&blob).unwrap();
        assert!(matches!(
            d.records().collect::<Vec<_>>()[..],
            [Err(Z4dmError::Trailing { extra: 1, .. })]
        ));
    }

    proptest::proptest! {
        /// Any bytes after the magic: parsing and walking end without a
        /// panic, and the walk yields at most one error, last.
        #[test]
        fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let mut v = MAGIC.to_vec();
            v.push(VERSION);
            v.extend(tail);
            if let Ok(d) = Z4dm::parse(&v) {
                let items: Vec<_> = d.records().collect();
                let errs = items.iter().filter(|r| r.is_err()).count();
                proptest::prop_assert!(errs <= 1);
                if errs == 1 {
                    proptest::prop_assert!(items.last().unwrap().is_err());
                }
            }
        }

        /// Flipping any byte of a valid delta never panics.
        #[test]
        fn mutated_delta_never_panics(at in 0usize..64, byte in proptest::num::u8::ANY) {
            let mut v = sample();
            let at = at % v.len();
            v[at] = byte;
            if let Ok(d) = Z4dm::parse(&v) {
                for r in d.records() { let _ = r; }
            }
        }
    }
}
