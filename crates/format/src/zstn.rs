//! The ZSTN v3 container (z4ai `safetensors.py`): the original safetensors
//! header verbatim, then either one opaque frame of the whole data buffer
//! (`contiguous = 0`) or per-tensor frames, an index of FRAME/REF records and
//! a 20-byte footer (`contiguous = 1`).
//!
//! Parsing works on the bytes of the whole file but touches only the head,
//! the footer and the index; frames are located, never read, here. After
//! [`Zstn::parse`] succeeds every record is known to be in bounds: spans tile
//! the data buffer, frames lie inside the frames section, REFs point one hop
//! back to a FRAME of the same length.

use crate::cursor::Cursor;
use crate::error::CodecError;
use crate::frame::Frame;
use crate::safetensors::MAX_HEADER_LEN;
use std::ops::Range;
use thiserror::Error;

pub const MAGIC: &[u8; 4] = b"ZSTN";
pub const VERSION: u8 = 3;
pub const FOOTER_LEN: u64 = 20;
/// Bytes before the header JSON: magic, version, contiguous, hlen.
pub const HEAD_FIXED: u64 = 14;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ZstnError {
    #[error("not a ZSTN file (magic {0:?})")]
    BadMagic(Vec<u8>),
    #[error("unsupported ZSTN version {0} (this reader supports 3)")]
    Version(u8),
    #[error("invalid contiguous flag {0}")]
    Contiguous(u8),
    #[error("truncated at offset {offset}: {what}")]
    Truncated { offset: u64, what: &'static str },
    #[error("header length {0} exceeds the 100,000,000-byte limit")]
    HeaderTooLarge(u64),
    #[error("footer: {0}")]
    Footer(String),
    #[error("index: {0}")]
    Index(String),
    /// Lengths that cannot all be true: the reconstructed file's size
    /// overflows, or the opaque frame decodes to another length.
    #[error("sizes do not add up: {0}")]
    Sizes(String),
    #[error("record {index} ({name:?}): {what}")]
    Record {
        index: usize,
        name: String,
        what: String,
    },
}

impl From<CodecError> for ZstnError {
    fn from(e: CodecError) -> Self {
        ZstnError::Index(e.to_string())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A frame at an absolute file offset.
    Frame { offset: u64, len: u64 },
    /// Same bytes as the FRAME record with this index.
    Ref(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    pub begin: u64,
    pub end: u64,
    pub kind: RecordKind,
}

impl Record {
    pub fn span(&self) -> Range<u64> {
        self.begin..self.end
    }
    pub fn len(&self) -> u64 {
        self.end - self.begin
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.begin
    }
}

/// A record as the parser keeps it: its name stays in the file (where
/// [`IndexRecord::name`] reads it), so an index of 10^6 tensors costs
/// 56 bytes a record and no allocation per record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexRecord {
    /// Offset of the name's bytes in the file (checked UTF-8).
    pub name_at: u64,
    pub name_len: u16,
    pub begin: u64,
    pub end: u64,
    pub kind: RecordKind,
}

impl IndexRecord {
    /// The record's name; `file` is the whole file the index was parsed
    /// from.
    pub fn name<'a>(&self, file: &'a [u8]) -> &'a str {
        let at = self.name_at as usize;
        file.get(at..at + self.name_len as usize)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }
    /// The owned record (what the writer renders).
    pub fn to_record(&self, file: &[u8]) -> Record {
        Record {
            name: self.name(file).to_string(),
            begin: self.begin,
            end: self.end,
            kind: self.kind,
        }
    }
    pub fn span(&self) -> Range<u64> {
        self.begin..self.end
    }
    pub fn len(&self) -> u64 {
        self.end - self.begin
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.begin
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    Indexed {
        records: Vec<IndexRecord>,
        /// Offset where the frames section starts (right after `data_len`).
        frames_start: u64,
        index_offset: u64,
        index_len: u64,
    },
    Opaque {
        frame_offset: u64,
        frame_len: u64,
    },
}

/// A parsed ZSTN container.
#[derive(Debug, Clone)]
pub struct Zstn {
    pub header: Range<u64>,
    pub data_len: u64,
    pub layout: Layout,
    pub file_len: u64,
}

fn trunc(offset: u64, what: &'static str) -> ZstnError {
    ZstnError::Truncated { offset, what }
}

fn read_u64(b: &[u8], off: u64, what: &'static str) -> Result<u64, ZstnError> {
    let s = b
        .get(off as usize..(off as usize).saturating_add(8))
        .filter(|s| s.len() == 8)
        .ok_or_else(|| trunc(off, what))?;
    Ok(u64::from_le_bytes(s.try_into().unwrap()))
}

impl Zstn {
    /// Parses the container structure of a whole file.
    pub fn parse(file: &[u8]) -> Result<Zstn, ZstnError> {
        let file_len = file.len() as u64;
        if file.len() < 4 || &file[..4] != MAGIC {
            return Err(ZstnError::BadMagic(file[..file.len().min(4)].to_vec()));
        }
        if file.len() < HEAD_FIXED as usize {
            return Err(trunc(file_len, "container head"));
        }
        let version = file[4];
        if version != VERSION {
            return Err(ZstnError::Version(version));
        }
        let contiguous = file[5];
        let hlen = read_u64(file, 6, "header length")?;
        if hlen > MAX_HEADER_LEN {
            return Err(ZstnError::HeaderTooLarge(hlen));
        }
        let header = HEAD_FIXED..HEAD_FIXED + hlen;
        if header.end > file_len {
            return Err(trunc(file_len, "safetensors header"));
        }
        let data_len = read_u64(file, header.end, "data length")?;
        let body = header.end + 8;
        let layout = match contiguous {
            0 => {
                let frame_len = read_u64(file, body, "frame length")?;
                let frame_offset = body + 8;
                // Bytes after the frame are allowed (z4ai ignores them): that
                // is where ckptfs puts its checksum block.
                if frame_len > file_len.saturating_sub(frame_offset) {
                    return Err(ZstnError::Record {
                        index: 0,
                        name: "<whole data buffer>".into(),
                        what: format!(
                            "frame length {frame_len} but {} bytes follow",
                            file_len.saturating_sub(frame_offset)
                        ),
                    });
                }
                Layout::Opaque {
                    frame_offset,
                    frame_len,
                }
            }
            1 => parse_indexed(file, body, data_len)?,
            c => return Err(ZstnError::Contiguous(c)),
        };
        check_sizes(file, hlen, data_len, &layout)?;
        Ok(Zstn {
            header,
            data_len,
            layout,
            file_len,
        })
    }

    /// Length of the reconstructed safetensors file.
    pub fn logical_len(&self) -> u64 {
        8 + (self.header.end - self.header.start) + self.data_len
    }

    /// Offset of the data buffer in the reconstructed file.
    pub fn data_start(&self) -> u64 {
        8 + (self.header.end - self.header.start)
    }

    pub fn records(&self) -> &[IndexRecord] {
        match &self.layout {
            Layout::Indexed { records, .. } => records,
            Layout::Opaque { .. } => &[],
        }
    }
}

/// The one check that the sizes a container states add up, made at parse
/// (so by every reader: the mount's open, `verify`, `unpack`): the
/// reconstructed file, `8 + hlen + data_len` bytes, has a size a file can
/// have (at most 2^63 - 1, what `st_size` holds), and the opaque frame of a
/// `contiguous = 0` file decodes to exactly `data_len` bytes (its header
/// says so without decoding). Indexed records were checked to tile
/// `data_len`; each frame's own decoded length is checked when its grid is
/// built, before any of its bytes are served.
fn check_sizes(file: &[u8], hlen: u64, data_len: u64, layout: &Layout) -> Result<(), ZstnError> {
    let total = 8u64
        .checked_add(hlen)
        .and_then(|n| n.checked_add(data_len))
        .filter(|&n| n <= i64::MAX as u64);
    if total.is_none() {
        return Err(ZstnError::Sizes(format!(
            "a {hlen}-byte header and a {data_len}-byte data buffer make a file larger than 2^63 - 1 bytes"
        )));
    }
    if let Layout::Opaque {
        frame_offset,
        frame_len,
    } = *layout
    {
        let bytes = &file[frame_offset as usize..(frame_offset + frame_len) as usize];
        let frame = Frame::parse(bytes).map_err(|e| ZstnError::Record {
            index: 0,
            name: "<whole data buffer>".into(),
            what: e.to_string(),
        })?;
        if frame.decoded_len() != data_len {
            return Err(ZstnError::Sizes(format!(
                "the data buffer's frame decodes to {} bytes, the header says {data_len}",
                frame.decoded_len()
            )));
        }
    }
    Ok(())
}

fn parse_indexed(file: &[u8], frames_start: u64, data_len: u64) -> Result<Layout, ZstnError> {
    let file_len = file.len() as u64;
    if file_len < frames_start + FOOTER_LEN {
        return Err(trunc(file_len, "footer"));
    }
    let foot = &file[(file_len - FOOTER_LEN) as usize..];
    if &foot[16..20] != MAGIC {
        return Err(ZstnError::Footer("missing ZSTN sentinel".into()));
    }
    let index_offset = u64::from_le_bytes(foot[..8].try_into().unwrap());
    let index_len = u64::from_le_bytes(foot[8..16].try_into().unwrap());
    let limit = file_len - FOOTER_LEN;
    if index_offset < frames_start || index_offset > limit || index_len > limit - index_offset {
        return Err(ZstnError::Footer(format!(
            "index [{index_offset}, +{index_len}) outside [{frames_start}, {limit})"
        )));
    }
    let index = &file[index_offset as usize..(index_offset + index_len) as usize];
    let mut c = Cursor::new(index);
    let n = c.u32("record count")? as u64;
    // Each record takes at least 2 + 16 + 1 + 4 bytes.
    if n > index_len / 23 + 1 {
        return Err(ZstnError::Index(format!(
            "{n} records cannot fit in {index_len} bytes"
        )));
    }
    let mut records: Vec<IndexRecord> = Vec::with_capacity(n as usize);
    let mut cursor = 0u64;
    for i in 0..n as usize {
        let nl = c.u16("record name length")?;
        let name_at = index_offset + c.pos() as u64;
        let name_b = c.take(nl as u64, "record name")?;
        let name = std::str::from_utf8(name_b)
            .map_err(|_| ZstnError::Index(format!("record {i}: name is not UTF-8")))?;
        let begin = c.u64("record span")?;
        let end = c.u64("record span")?;
        let kind_b = c.u8("record kind")?;
        let bad = |what: String| ZstnError::Record {
            index: i,
            name: name.to_string(),
            what,
        };
        let kind = match kind_b {
            0 => {
                let offset = c.u64("frame offset")?;
                let len = c.u64("frame length")?;
                if offset < frames_start || offset > index_offset || len > index_offset - offset {
                    return Err(bad(format!(
                        "frame [{offset}, +{len}) outside the frames section [{frames_start}, {index_offset})"
                    )));
                }
                RecordKind::Frame { offset, len }
            }
            1 => RecordKind::Ref(c.u32("ref index")?),
            k => return Err(bad(format!("unknown record kind {k}"))),
        };
        if begin != cursor || end < begin {
            return Err(bad(format!(
                "span [{begin}, {end}) does not continue the data buffer at {cursor}"
            )));
        }
        cursor = end;
        if end > data_len {
            return Err(bad(format!(
                "span end {end} past the {data_len}-byte data buffer"
            )));
        }
        if let RecordKind::Ref(t) = kind {
            let target: &IndexRecord = match records.get(t as usize) {
                Some(r) => r,
                None => return Err(bad(format!("REF to record {t}, which does not precede it"))),
            };
            if !matches!(target.kind, RecordKind::Frame { .. }) {
                return Err(bad(format!("REF to record {t}, which is itself a REF")));
            }
            if target.len() != end - begin {
                return Err(bad(format!(
                    "REF to record {t} of {} bytes for a {}-byte span",
                    target.len(),
                    end - begin
                )));
            }
        }
        records.push(IndexRecord {
            name_at,
            name_len: nl,
            begin,
            end,
            kind,
        });
    }
    if c.remaining() != 0 {
        return Err(ZstnError::Index(format!(
            "{} bytes after the last record",
            c.remaining()
        )));
    }
    if cursor != data_len {
        return Err(ZstnError::Index(format!(
            "records cover {cursor} of the {data_len}-byte data buffer"
        )));
    }
    Ok(Layout::Indexed {
        records,
        frames_start,
        index_offset,
        index_len,
    })
}

/// Serialises an index (records in data order) as ZSTN v3 writes it.
pub fn render_index(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + records.len() * 48);
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for r in records {
        out.extend_from_slice(&(r.name.len() as u16).to_le_bytes());
        out.extend_from_slice(r.name.as_bytes());
        out.extend_from_slice(&r.begin.to_le_bytes());
        out.extend_from_slice(&r.end.to_le_bytes());
        match r.kind {
            RecordKind::Frame { offset, len } => {
                out.push(0);
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
            }
            RecordKind::Ref(t) => {
                out.push(1);
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
    }
    out
}

/// The container head: magic, version, contiguous flag, header, data_len.
pub fn render_head(header: &[u8], data_len: u64, contiguous: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(header.len() + 22);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(contiguous as u8);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header);
    out.extend_from_slice(&data_len.to_le_bytes());
    out
}

pub fn render_footer(index_offset: u64, index_len: u64) -> [u8; 20] {
    let mut f = [0u8; 20];
    f[..8].copy_from_slice(&index_offset.to_le_bytes());
    f[8..16].copy_from_slice(&index_len.to_le_bytes());
    f[16..].copy_from_slice(MAGIC);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_example_from_the_spec() {
        let mut f = render_head(b"{}      ", 0, true);
        let idx = render_index(&[]);
        let off = f.len() as u64;
        f.extend_from_slice(&idx);
        f.extend_from_slice(&render_footer(off, idx.len() as u64));
        assert_eq!(f.len(), 54);
        let z = Zstn::parse(&f).unwrap();
        assert_eq!(z.logical_len(), 16);
        assert!(z.records().is_empty());
    }

    /// An opaque (`contiguous = 0`) file of one stored frame of `frame_len`
    /// bytes, stating `data_len`.
    fn opaque_file(data_len: u64, frame_len: u64) -> Vec<u8> {
        let mut f = render_head(b"{}      ", data_len, false);
        let frame =
            crate::test_support::z4ai_opaque_frame(0, frame_len, &vec![7; frame_len as usize]);
        f.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        f.extend_from_slice(&frame);
        f
    }

    #[test]
    fn a_data_len_that_overflows_the_file_size_is_refused() {
        assert_eq!(Zstn::parse(&opaque_file(40, 40)).unwrap().logical_len(), 56);
        for data_len in [u64::MAX, u64::MAX - 15, 1 << 63] {
            let e = Zstn::parse(&opaque_file(data_len, 40)).unwrap_err();
            assert!(matches!(e, ZstnError::Sizes(_)), "{data_len}: {e}");
        }
    }

    #[test]
    fn an_opaque_frame_of_another_length_is_refused() {
        let e = Zstn::parse(&opaque_file(41, 40)).unwrap_err().to_string();
        assert!(e.contains("decodes to 40 bytes"), "{e}");
    }

    #[test]
    fn an_indexed_span_that_overflows_the_file_size_is_refused() {
        let frame = crate::test_support::z4ai_opaque_frame(0, 4, b"abcd");
        let mut f = crate::test_support::zstn_of_frames(&[("w", 4, frame)]);
        // Make record 0 span [0, 2^64 - 1) and data_len agree with it.
        let hlen = u64::from_le_bytes(f[6..14].try_into().unwrap()) as usize;
        f[14 + hlen..22 + hlen].copy_from_slice(&u64::MAX.to_le_bytes());
        let index = u64::from_le_bytes(f[f.len() - 20..f.len() - 12].try_into().unwrap()) as usize;
        let end_at = index + 4 + 2 + 1 + 8;
        f[end_at..end_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = Zstn::parse(&f).unwrap_err();
        assert!(matches!(e, ZstnError::Sizes(_)), "{e}");
    }
}
