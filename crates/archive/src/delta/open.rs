//! Opening a delta: its head alone (the presented size, for a delta whose
//! base is missing), the metadata fetched ahead over a remote copy, and
//! [`DeltaArchive::from_backing`], which checks the trailer, the head and
//! every record against each other and opens the base.

use super::base::{open_base, BaseFs};
use super::{DeltaArchive, Unit};
use crate::frame_block::GridCell;
use crate::{sparse_cache, ArchiveError, Result, Segment};
use ckptfs_format::delta::{self, DeltaKind, Trailer, MAX_CHAIN};
use ckptfs_format::digest::xxh3_64;
use ckptfs_format::safetensors::{Header, TensorEntry};
use ckptfs_format::z4dm;
use ckptfs_store::source::ByteSource;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

/// The size of the file a `Z4DM` delta presents, from its head alone (no
/// base needed): `8 + hlen + data_len`. None when `file` is no `Z4DM` or
/// its head cannot be read; for listing a delta whose base is missing with
/// the size it would have.
pub fn presented_len_of_head(file: &File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut fixed = [0u8; z4dm::FIXED_LEN];
    file.read_exact_at(&mut fixed, 0).ok()?;
    let hlen = z4dm::json_len(&fixed)?;
    if hlen > ckptfs_format::safetensors::MAX_HEADER_LEN {
        return None;
    }
    let mut data_len = [0u8; 8];
    file.read_exact_at(&mut data_len, z4dm::FIXED_LEN as u64 + hlen)
        .ok()?;
    (8 + hlen).checked_add(u64::from_le_bytes(data_len))
}

/// The most a record's bytes before its frame take besides its name:
/// name length, begin, end, kind, frame length and a DELTA's Z4DL header.
const RECORD_HEAD_FIXED: u64 = z4dm::MIN_RECORD_LEN + 8 + delta::Z4DL_HEADER as u64;

/// Bytes of each record read ahead when a local delta is opened: its
/// fixed part and a name of up to a few KiB.
const RECORD_HEAD_AHEAD: u64 = 8 << 10;

/// Over a remote copy: fetches what [`DeltaArchive::from_backing`] reads
/// (`archive::fetch_metadata`): the CKD1 trailer, the Z4DM head (header
/// JSON, lengths, digest) and each record's bytes before its frame, where
/// the trailer says the records are (all together: about one request per
/// run of records whose frames are small, and a second round only for
/// names longer than a page). Frames are fetched when used. Offsets here
/// only choose what to fetch (clamped to the object); a trailer that does
/// not parse fetches nothing more (the open reports it).
pub(crate) fn fetch_metadata(b: &dyn ByteSource) -> io::Result<()> {
    let len = b.bytes().len() as u64;
    let u64_at = |at| crate::u64_at(b, at);
    // The trailer ends with its own length and "CKD1"; the head starts
    // with "Z4DM", a version byte and the header JSON's length.
    let fixed = z4dm::FIXED_LEN as u64;
    b.ensure_all(&[0..fixed.min(len), len.saturating_sub(12)..len])?;
    let trailer_len = u64_at(len.saturating_sub(12)).unwrap_or(0).min(len);
    let head_end = u64_at(z4dm::JSON_LEN_AT as u64).map_or(len, |h| z4dm::head_len(h).min(len));
    b.ensure_all(&[0..head_end, len - trailer_len..len])?;
    let Ok(Some(trailer)) = Trailer::find(b.bytes()) else {
        return Ok(());
    };
    let head = |u: &delta::UnitEntry, most: u64| {
        let at = u.record_offset.min(len);
        at..at.saturating_add(u.record_len.min(most)).min(len)
    };
    let page = ckptfs_store::remote::ALIGN;
    let first: Vec<Range<u64>> = trailer.units.iter().map(|u| head(u, page)).collect();
    b.ensure_all(&first)?;
    let name_len = |at: u64| {
        let at = at.min(len) as usize;
        let s = b.bytes().get(at..at.checked_add(2)?)?;
        Some(u16::from_le_bytes(s.try_into().ok()?) as u64)
    };
    let rest: Vec<Range<u64>> = trailer
        .units
        .iter()
        .filter_map(|u| {
            let need = RECORD_HEAD_FIXED + name_len(u.record_offset)?;
            (need > page).then(|| head(u, need))
        })
        .collect();
    b.ensure_all(&rest)
}

impl DeltaArchive {
    /// Opens a delta held in `map`; its base through `fs`. `depth_left`
    /// bounds the chain still allowed below this archive.
    pub fn from_source(
        map: Box<dyn ByteSource>,
        path: &Path,
        fs: &dyn BaseFs,
        depth_left: u32,
    ) -> Result<DeltaArchive> {
        let bad = |what: String| ArchiveError::Integrity {
            path: path.to_path_buf(),
            what,
        };
        let bytes = map.bytes();
        let trailer = match Trailer::find(bytes).map_err(bad)? {
            Some(t) => t,
            None => {
                return Err(ArchiveError::Unrecognised {
                    path: path.to_path_buf(),
                    what: "a z4ai model delta (Z4DM) without ckptfs's CKD1 trailer, so no base \
                           path or checksums: decode it with `ckptfs unpack FILE --base BASE` or \
                           z4ai"
                        .into(),
                })
            }
        };
        if trailer.depth == 0 || trailer.depth > MAX_CHAIN {
            return Err(bad(format!(
                "chain depth {} outside 1..={MAX_CHAIN}",
                trailer.depth
            )));
        }
        if trailer.depth > depth_left {
            return Err(bad(format!(
                "a chain of deltas deeper than {MAX_CHAIN} (or a cycle) below it"
            )));
        }
        delta::check_base_path(&trailer.base_path).map_err(bad)?;
        let body = &bytes[..trailer.z4dm_len as usize];
        let head = delta::parse_head(body).map_err(bad)?;
        if xxh3_64(&body[..head.records_start]) != trailer.head_digest {
            return Err(bad(
                "checksum mismatch in the Z4DM head (header JSON or lengths)".into(),
            ));
        }
        if head.n_records as usize != trailer.units.len() {
            return Err(bad(format!(
                "{} records, the CKD1 trailer lists {}",
                head.n_records,
                trailer.units.len()
            )));
        }
        // The records are read one after another below, each where its
        // frame begins: ask for all their heads at once, so that a cold
        // open waits for one round of reads, not one per record.
        // Heads closer than RECORD_HEAD_AHEAD go in one request, so that
        // an archive of many small tensors takes few calls.
        let mut ahead: Option<Range<u64>> = None;
        for u in &trailer.units {
            let at = u.record_offset;
            let head = at..at.saturating_add(u.record_len.min(RECORD_HEAD_AHEAD));
            ahead = match ahead {
                Some(r) if head.start <= r.end.saturating_add(RECORD_HEAD_AHEAD) => {
                    Some(r.start..r.end.max(head.end))
                }
                r => {
                    if let Some(r) = r {
                        map.will_need(r);
                    }
                    Some(head)
                }
            };
        }
        if let Some(r) = ahead {
            map.will_need(r);
        }
        let mut records = Vec::with_capacity(trailer.units.len());
        let mut heads = Vec::with_capacity(trailer.units.len());
        let mut at = head.records_start as u64;
        let mut data_pos = 0u64;
        for (i, u) in trailer.units.iter().enumerate() {
            if u.record_offset != at {
                return Err(bad(format!("record {i} is not where the trailer says")));
            }
            let r = delta::parse_record(body, at as usize).map_err(bad)?;
            if r.end_offset as u64 != at + u.record_len {
                return Err(bad(format!(
                    "record {:?}: length differs from the trailer",
                    r.name
                )));
            }
            let meta_end = if r.kind == DeltaKind::Copy {
                r.end_offset
            } else {
                r.frame.start
            };
            let digest = xxh3_64(&body[at as usize..meta_end]);
            if trailer.records_digest.is_none() && digest != u.record_digest {
                return Err(bad(format!("record {:?}: checksum mismatch", r.name)));
            }
            heads.push(digest);
            if r.begin != data_pos || r.end < r.begin || r.end > head.data_len {
                return Err(bad(format!(
                    "record {:?}: bytes [{}, {}) do not continue the data buffer at {data_pos}",
                    r.name, r.begin, r.end
                )));
            }
            data_pos = r.end;
            at = r.end_offset as u64;
            records.push(r);
        }
        if trailer
            .records_digest
            .is_some_and(|d| d != delta::records_digest(heads))
        {
            return Err(bad(
                "checksum mismatch in the Z4DM records (names, spans, kinds or lengths)".into(),
            ));
        }
        if at != trailer.z4dm_len || data_pos != head.data_len {
            return Err(bad(
                "records do not fill the Z4DM body and data buffer".into()
            ));
        }
        let prefix = &bytes[head.prefix.clone()];
        let header = Header::parse(&prefix[8..], head.data_len)
            .map_err(|e| bad(format!("safetensors header: {e}")))?;
        let order = header.data_order();
        if order.len() != records.len()
            || order
                .iter()
                .zip(&records)
                .any(|(t, r)| t.name != r.name || t.begin != r.begin || t.end != r.end)
        {
            return Err(bad("the header's tensors differ from the records".into()));
        }
        let base = open_base(fs, path, &trailer.base_path, trailer.depth - 1).map_err(|e| {
            // An I/O error names the base already; others name its file.
            let why = match &e {
                ArchiveError::Io { .. } => e.reason(),
                _ => e.to_string(),
            };
            bad(format!(
                "base {}: {why}",
                path.parent()
                    .unwrap_or(Path::new(""))
                    .join(&trailer.base_path)
                    .display(),
            ))
        })?;
        let wrong_base = |what: String| bad(format!("base {}: {what}", base.path().display()));
        // The recorded depth bounds the chain: a base made shallower since
        // (a delta below it rewritten standalone) keeps it valid.
        if base.depth() + 1 > trailer.depth {
            return Err(wrong_base(format!(
                "chain depth {} where this delta allows at most {}",
                base.depth(),
                trailer.depth - 1
            )));
        }
        if base.len() != trailer.base_len {
            return Err(wrong_base(format!(
                "{} bytes, this delta was packed against {} bytes (a different base)",
                base.len(),
                trailer.base_len
            )));
        }
        let needs_base = records.iter().any(|r| r.kind != DeltaKind::Full);
        let (base_start, base_header) = if needs_base {
            let (s, h) = base.header()?;
            (s, Some(h))
        } else {
            (0, None)
        };
        let by_name: HashMap<&str, &TensorEntry> = base_header
            .iter()
            .flat_map(|h| &h.tensors)
            .map(|t| (t.name.as_str(), t))
            .collect();
        let mut units = Vec::with_capacity(records.len());
        let mut segments = Vec::new();
        let prefix_len = prefix.len() as u64;
        for (i, (r, t)) in records.iter().zip(&order).enumerate() {
            let len = r.end - r.begin;
            let base_offset = match r.kind {
                DeltaKind::Full => 0,
                DeltaKind::Copy | DeltaKind::Delta => {
                    let b = by_name
                        .get(r.name.as_str())
                        .filter(|b| b.dtype == t.dtype && b.len() == len)
                        .ok_or_else(|| {
                            wrong_base(format!(
                                "no tensor {:?} of dtype {} and {len} bytes (a different base)",
                                r.name, t.dtype
                            ))
                        })?;
                    if r.kind == DeltaKind::Delta && r.reference.map(|x| x.0) != Some(len) {
                        return Err(bad(format!("record {:?}: Z4DL reference length", r.name)));
                    }
                    base_start + b.begin
                }
            };
            units.push(Unit {
                kind: r.kind,
                frame: r.frame.clone(),
                base_offset,
                len,
                grid: GridCell::new(),
            });
            if len > 0 {
                segments.push(Segment {
                    start: prefix_len + r.begin,
                    len,
                    unit: i as u32,
                });
            }
        }
        let fingerprint = xxh3_64(&bytes[trailer.z4dm_len as usize..]);
        Ok(DeltaArchive {
            path: path.to_path_buf(),
            map,
            head,
            trailer,
            records,
            units,
            segments,
            base,
            base_ok: OnceLock::new(),
            base_check_started: AtomicBool::new(false),
            fingerprint,
            owner: sparse_cache::new_owner(),
        })
    }
}
