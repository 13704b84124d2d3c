//! An opened `.zstn` archive (z4ai's ZSTN container): one presented file,
//! the reconstructed `.safetensors`, made of the header (the prefix) and
//! the data buffer, whose records are the segments.
//!
//! Opening maps the file and parses the head, the index and the footer only.
//! Frames are parsed lazily, on first use, into a [`Grid`] of independently
//! decodable blocks: sub-tensor blocks when every plane is block-structured
//! (what ckptfs writes), otherwise the whole frame as one block (the fallback
//! for most z4ai frames). A unit is one unique frame; a REF record reads the
//! unit of the record it names.
//!
//! With a CKX1 checksum block (every file ckptfs writes), each block's
//! compressed bytes are checked before decoding and its decoded bytes after.

use super::frame_block::{block_index, decode_unit_block, frame_grid, shared_grid, GridError};
use super::{ArchiveError, ArchiveView, Backing, BlockKey, Grid, Kind, Result, Segment};
use crate::codec::CodecError;
use crate::format::ckx::{self, Extension};
use crate::format::frame::Frame;
use crate::format::safetensors::{Header, TensorEntry};
use crate::format::zstn::{Layout, Record, RecordKind, Zstn};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// A unique frame: the bytes it stores and the data-buffer span of the
/// record that owns it.
#[derive(Debug)]
struct Unit {
    name: String,
    frame: Range<u64>,
    decoded_len: u64,
    grid: OnceLock<std::result::Result<Arc<Grid>, GridError>>,
}

pub struct ZstnArchive {
    path: PathBuf,
    map: Backing,
    zstn: Zstn,
    header: Option<Header>,
    header_error: Option<String>,
    /// `u64le(hlen) ‖ header`: the first bytes of the reconstructed file.
    prefix: Vec<u8>,
    units: Vec<Unit>,
    /// For each record, the unit that holds its bytes.
    record_unit: Vec<u32>,
    ext: Option<Extension>,
    segments: Vec<Segment>,
}

impl std::fmt::Debug for ZstnArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZstnArchive")
            .field("path", &self.path)
            .finish()
    }
}

/// The data buffer as segments: the non-empty records in order (REFs
/// reading their target's unit), or one segment for an opaque layout.
fn segments_of(zstn: &Zstn, record_unit: &[u32]) -> Vec<Segment> {
    let start = zstn.data_start();
    let mut segments: Vec<Segment> = match &zstn.layout {
        Layout::Opaque { .. } => vec![Segment {
            start,
            len: zstn.data_len,
            unit: 0,
        }],
        Layout::Indexed { records, .. } => records
            .iter()
            .zip(record_unit)
            .map(|(r, &unit)| Segment {
                start: start + r.begin,
                len: r.len(),
                unit,
            })
            .collect(),
    };
    segments.retain(|s| s.len > 0);
    segments.sort_by_key(|s| s.start);
    segments
}

impl ZstnArchive {
    /// Opens a `.zstn` file (any kind of archive: [`super::open`]).
    pub fn open(path: &Path) -> Result<ZstnArchive> {
        let io = |source| ArchiveError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        ZstnArchive::from_backing(Backing::map(&file).map_err(io)?, path)
    }

    /// A `.zstn` held in memory; `name` is used in messages.
    pub fn from_bytes(bytes: Vec<u8>, name: &Path) -> Result<ZstnArchive> {
        ZstnArchive::from_backing(Backing::Owned(bytes), name)
    }

    pub(crate) fn from_backing(map: Backing, path: &Path) -> Result<ZstnArchive> {
        let bytes = map.bytes();
        let zstn = Zstn::parse(bytes).map_err(|source| ArchiveError::Container {
            path: path.to_path_buf(),
            source,
        })?;
        let raw = &bytes[zstn.header.start as usize..zstn.header.end as usize];
        let (header, header_error) = match Header::parse_entries(raw) {
            Ok(h) => (Some(h), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let mut prefix = Vec::with_capacity(raw.len() + 8);
        prefix.extend_from_slice(&(raw.len() as u64).to_le_bytes());
        prefix.extend_from_slice(raw);

        let mut units = Vec::new();
        let mut record_unit = Vec::new();
        match &zstn.layout {
            Layout::Opaque {
                frame_offset,
                frame_len,
            } => units.push(Unit {
                name: "<data buffer>".into(),
                frame: *frame_offset..frame_offset + frame_len,
                decoded_len: zstn.data_len,
                grid: OnceLock::new(),
            }),
            Layout::Indexed { records, .. } => {
                let mut unit_of_record = vec![u32::MAX; records.len()];
                for (i, r) in records.iter().enumerate() {
                    match r.kind {
                        RecordKind::Frame { offset, len } => {
                            unit_of_record[i] = units.len() as u32;
                            units.push(Unit {
                                name: r.name.clone(),
                                frame: offset..offset + len,
                                decoded_len: r.len(),
                                grid: OnceLock::new(),
                            });
                        }
                        RecordKind::Ref(t) => unit_of_record[i] = unit_of_record[t as usize],
                    }
                }
                record_unit = unit_of_record;
            }
        }
        let ext = ckx::find(bytes, &zstn).map_err(|what| ArchiveError::Integrity {
            path: path.to_path_buf(),
            what,
        })?;
        let segments = segments_of(&zstn, &record_unit);
        let archive = ZstnArchive {
            path: path.to_path_buf(),
            map,
            zstn,
            header,
            header_error,
            prefix,
            units,
            record_unit,
            ext,
            segments,
        };
        if let Some(ext) = &archive.ext {
            ext.verify_structure(archive.bytes(), &archive.zstn, archive.units.len())
                .map_err(|what| archive.integrity(what))?;
        }
        Ok(archive)
    }

    fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }

    /// Size of the reconstructed `.safetensors` file.
    pub fn len(&self) -> u64 {
        self.zstn.logical_len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn container(&self) -> &Zstn {
        &self.zstn
    }
    pub fn records(&self) -> &[Record] {
        self.zstn.records()
    }
    /// The header entries, if the header JSON parses (z4ai does not require it).
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }
    pub fn header_error(&self) -> Option<&str> {
        self.header_error.as_deref()
    }
    pub fn header_bytes(&self) -> &[u8] {
        &self.prefix[8..]
    }
    pub fn extension(&self) -> Option<&Extension> {
        self.ext.as_ref()
    }
    /// The header entry of a record, by name.
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.header
            .as_ref()?
            .tensors
            .iter()
            .find(|t| t.name == name)
    }
    /// Compressed bytes of a unit's frame.
    pub fn frame_bytes(&self, unit: u32) -> &[u8] {
        let r = &self.units[unit as usize].frame;
        &self.bytes()[r.start as usize..r.end as usize]
    }
    pub fn unit_of_record(&self, record: usize) -> u32 {
        self.record_unit.get(record).copied().unwrap_or(0)
    }
    /// The decoded bytes of record `i` (a tensor), following REFs.
    pub fn decode_record(&self, i: usize) -> Result<Vec<u8>> {
        self.decode_unit(self.unit_of_record(i))
    }

    /// Parses a unit's frame structure.
    pub fn frame(&self, unit: u32) -> Result<Frame<'_>> {
        let u = &self.units[unit as usize];
        let f = Frame::parse(self.frame_bytes(unit)).map_err(|e| self.frame_error(unit, e))?;
        if f.decoded_len() != u.decoded_len {
            return Err(self.frame_error(
                unit,
                CodecError::LengthMismatch {
                    what: "frame",
                    got: f.decoded_len(),
                    expected: u.decoded_len,
                },
            ));
        }
        Ok(f)
    }

    fn build_grid(&self, unit: u32) -> std::result::Result<Arc<Grid>, GridError> {
        let u = &self.units[unit as usize];
        let (grid, meta) = frame_grid(self.frame_bytes(unit), u.decoded_len)?;
        if let Some(ext) = &self.ext {
            ext.verify_grid(unit as usize, &grid.bounds, meta)
                .map_err(GridError::Integrity)?;
        }
        Ok(Arc::new(grid))
    }

    /// Every header tensor must match a record of the same name and span.
    fn check_header_against_index(&self) -> Result<()> {
        let Layout::Indexed { records, .. } = &self.zstn.layout else {
            return Ok(());
        };
        let h = self.header().ok_or_else(|| {
            self.integrity(format!("header: {}", self.header_error().unwrap_or("")))
        })?;
        let tensors = h.tensors.len();
        if tensors != records.len() {
            return Err(self.integrity(format!(
                "header lists {tensors} tensors, index holds {} records",
                records.len()
            )));
        }
        for t in &h.tensors {
            match records.iter().find(|r| r.name == t.name) {
                Some(r) if r.begin == t.begin && r.end == t.end => {}
                Some(r) => {
                    return Err(self.integrity(format!(
                        "tensor {:?}: header span [{}, {}) but index span [{}, {})",
                        t.name, t.begin, t.end, r.begin, r.end
                    )))
                }
                None => {
                    return Err(self.integrity(format!("tensor {:?} has no index record", t.name)))
                }
            }
        }
        Ok(())
    }
}

impl ArchiveView for ZstnArchive {
    fn kind(&self) -> Kind {
        Kind::Zstn
    }
    fn path(&self) -> &Path {
        &self.path
    }
    fn stored_len(&self) -> u64 {
        self.zstn.file_len
    }
    fn checksums(&self) -> Option<&'static str> {
        self.ext.as_ref().map(|_| "ckx1")
    }
    fn files(&self) -> usize {
        1
    }
    fn file_path(&self, _file: usize) -> &str {
        ""
    }
    fn logical_len(&self, _file: usize) -> u64 {
        self.zstn.logical_len()
    }
    fn prefix(&self, _file: usize) -> Result<&[u8]> {
        Ok(&self.prefix)
    }
    fn prefix_len(&self, _file: usize) -> u64 {
        self.zstn.data_start()
    }
    fn segments(&self, _file: usize) -> &[Segment] {
        &self.segments
    }
    fn units(&self) -> usize {
        self.units.len()
    }
    fn unit_name(&self, unit: u32) -> &str {
        &self.units[unit as usize].name
    }

    fn unit_label(&self, unit: u32) -> String {
        format!("tensor {:?}", self.unit_name(unit))
    }

    fn grid(&self, unit: u32) -> Result<Arc<Grid>> {
        let cell = self.units.get(unit as usize).map(|u| &u.grid);
        shared_grid(self, unit, cell, || self.build_grid(unit))
    }

    /// Decodes one block: the unit bytes `grid.span(block)`. With a
    /// checksum block, the compressed bytes are checked before decoding and
    /// the decoded bytes after.
    fn decode_block(&self, key: BlockKey) -> Result<Vec<u8>> {
        let b = block_index(self, key, &*self.grid(key.unit)?)?;
        let unit = key.unit as usize;
        let want = self.ext.as_ref().map(|e| e.units[unit].blocks[b].payload);
        let out = decode_unit_block(self, key, self.frame_bytes(key.unit), want)?;
        if let Some(ext) = &self.ext {
            ext.verify_data(unit, b, &out)
                .map_err(|what| self.unit_integrity(key.unit, what))?;
        }
        Ok(out)
    }

    fn verify_structure(&self) -> Result<()> {
        self.check_header_against_index()
    }

    /// The whole-frame checksum of the unit's compressed bytes (a no-op
    /// without a checksum block).
    fn verify_unit(&self, unit: u32, _digest: u64) -> Result<()> {
        match &self.ext {
            Some(ext) => ext
                .verify_frame(unit as usize, self.frame_bytes(unit))
                .map_err(|what| self.unit_integrity(unit, what)),
            None => Ok(()),
        }
    }

    fn verify_finish(&self, _unit_digests: &[u64]) -> Result<String> {
        let strict = self
            .header()
            .and_then(|h| h.validate(self.zstn.data_len).err())
            .map(|e| format!("; note: not strict safetensors: {e}"))
            .unwrap_or_default();
        Ok(format!(
            "{} tensors, {} -> {} bytes, ratio {:.4}, {}{}",
            self.header().map_or(0, |h| h.tensors.len()),
            self.len(),
            self.stored_len(),
            self.len() as f64 / self.stored_len().max(1) as f64,
            if self.ext.is_some() {
                "all checksums verified"
            } else {
                "no checksums (z4ai file): structure and lengths verified"
            },
            strict
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::frame::MAX_BLOCK_BYTES;
    use crate::test_support::{z4ai_opaque_frame, zstd_rle_frame, zstn_of_frames};

    fn archive(tensors: &[(&str, u64, Vec<u8>)]) -> ZstnArchive {
        ZstnArchive::from_bytes(zstn_of_frames(tensors), Path::new("t.zstn")).unwrap()
    }

    #[test]
    fn a_whole_frame_block_within_the_limit_decodes() {
        let frame = z4ai_opaque_frame(1, 3 << 20, &zstd_rle_frame(3 << 20, 7));
        let a = archive(&[("w", 3 << 20, frame)]);
        assert_eq!(
            a.block_len(BlockKey { unit: 0, block: 0 }).unwrap(),
            3 << 20
        );
        let mut buf = vec![0u8; 100];
        let n = a.read_at(0, a.prefix_len(0) + 12345, &mut buf).unwrap();
        assert_eq!(&buf[..n], &[7u8; 100][..]);
    }

    #[test]
    fn a_block_over_the_limit_is_refused_naming_the_tensor_before_allocating() {
        let big = 2 * MAX_BLOCK_BYTES;
        let bomb = z4ai_opaque_frame(1, big, &zstd_rle_frame(big, 0));
        assert!(bomb.len() < 70_000, "{}", bomb.len());
        let ok = z4ai_opaque_frame(0, 5, b"hello");
        let a = archive(&[("ok", 5, ok), ("bomb", big, bomb)]);
        let e = a.grid(1).unwrap_err().to_string();
        assert!(
            e.contains("t.zstn") && e.contains("\"bomb\"") && e.contains("limit"),
            "{e}"
        );
        assert!(a.block_len(BlockKey { unit: 1, block: 0 }).is_err());
        let mut buf = [0u8; 16];
        let start = a.prefix_len(0) + 5;
        assert!(a.read_at(0, start, &mut buf).is_err());
        // The other tensor still reads.
        let mut five = [0u8; 5];
        a.read_at(0, a.prefix_len(0), &mut five).unwrap();
        assert_eq!(&five, b"hello");
    }

    #[test]
    fn sizes_that_do_not_add_up_are_refused_at_open_naming_the_file() {
        use crate::format::zstn::render_head;
        let frame = z4ai_opaque_frame(0, 40, &[7; 40]);
        let mut f = render_head(b"{}      ", u64::MAX, false);
        f.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        f.extend_from_slice(&frame);
        let e = ZstnArchive::from_bytes(f, Path::new("wrap.zstn"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("wrap.zstn: sizes do not add up"), "{e}");
    }
}
