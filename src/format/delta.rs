//! ckptfs's delta archive (`NAME.z4dm`, doc/FORMAT.md §6): a z4ai `Z4DM`
//! model delta (z4ai's `model_delta.decompress(blob, base)` reads it)
//! followed by ckptfs's `CKD1` trailer, which z4ai never reads (its decoder
//! stops after the last record).
//!
//! ```text
//! Z4DM body (z4ai 0.2.0, spec §7.2):
//!   "Z4DM" u8 1 ; u64 hlen ; [hlen] target header JSON, verbatim ; u64 data_len
//!   [8] BLAKE2b-8 of the base's data buffer ; u32 n_records
//!   n_records × { u16 name_len ; [name] ; u64 begin ; u64 end ; u8 kind
//!                 kind != COPY: u64 frame_len ; [frame_len] frame }
//!   kind 0 FULL: a Z4AI frame of the tensor
//!   kind 1 DELTA: "Z4DL" u8 2 u8 0 u16 0 u64 ref_len [16] BLAKE2b-16(ref)
//!                 then a Z4AI frame of (target XOR base tensor)
//!   kind 2 COPY: the base tensor of the same name
//! CKD1 trailer (ckptfs), version 2 (written):
//!   "CKD1" u16 version=2 u16 flags=0 u32 depth u64 z4dm_len u64 head_digest
//!   u64 base_len u64 base_digest u64 base_fingerprint
//!   u16 base_path_len [base_path] u64 records_digest
//!   varint n_units ; varint first record_offset
//!   n_units × { varint record_len + 1  (or 0, varint record_offset,
//!                                        varint record_len)
//!               u8 form
//!               form 0 (COPY): varint tensor_len ;
//!                      max(1, ⌈tensor_len / 1 MiB⌉) × u64 data_digest
//!               form 1: u64 frame_digest u64 meta_digest varint n_blocks
//!                      n_blocks × { varint (end - previous end)
//!                                   u64 payload_digest u64 data_digest } }
//!   u64 body_digest (xxh3 of the trailer from "CKD1" to here)
//!   u64 trailer_len "CKD1"
//! version 1 (read, and kept when rewritten): after the base path,
//!   u32 n_units
//!   n_units × { u64 record_offset u64 record_len u64 record_digest
//!               u64 frame_digest u64 meta_digest u32 n_blocks
//!               n_blocks × { u64 end u64 payload_digest u64 data_digest } }
//! ```
//!
//! Varints are unsigned LEB128 in their shortest form. Version 2 holds
//! what version 1 does, less what follows from elsewhere: record offsets
//! from their lengths, a COPY unit's block ends from the 1 MiB grid, and
//! one `records_digest` (of every record's head) for the per-record
//! digests: on MiniLM's 104 records, 1.9-2.9 KB where most tensors are
//! COPY and 4.3-5.3 KB for a dense training step, against 7.5-8.8 KB in
//! version 1, which alone made ckptfs's deltas larger than z4ai's
//! `model_delta` (no checksums at all) on some pairs.
//!
//! One unit per record, in record order. A block's `data_digest` is the
//! xxh3 of the *target* bytes it serves (for DELTA: after the XOR with the
//! base), so a wrong or damaged base fails the block, never serves wrong
//! bytes. Pure parsing and rendering; no I/O, no codec.
//!
//! The `Z4DM` body is parsed and rendered by `format::z4dm`, a DELTA
//! record's `Z4DL` header by `format::z4dl`: this module adds what ckptfs
//! keeps of them ([`Head`], [`RecordHead`], read where the trailer says)
//! and the `CKD1` trailer.

use super::ckx::BlockDigest;
use super::cursor::{put_varint, Cursor};
use super::z4dl::{self, Z4dl};
use super::z4dm::{self, Record, Z4dm, Z4dmError};
use crate::format::digest::xxh3_64;
use std::ops::Range;

pub use super::z4dl::{HEADER_LEN as Z4DL_HEADER, MAGIC as Z4DL_MAGIC, VERSION as Z4DL_VERSION};
/// A record's kind, as `format::z4dm` reads it.
pub use super::z4dm::RecordKind as DeltaKind;
pub use super::z4dm::{render_head, MAGIC as Z4DM_MAGIC, VERSION as Z4DM_VERSION};
pub const TRAILER_MAGIC: &[u8; 4] = b"CKD1";
/// The version written; version 1 is still read (and kept when a
/// version-1 trailer is rewritten).
pub const TRAILER_VERSION: u16 = 2;
/// The longest chain: a delta whose base is a delta ... at most this many
/// deltas above one standalone archive. Every level costs one more base
/// read per block served, so reads of a depth-4 delta decode up to five
/// blocks; `pack --base` re-bases past it.
pub const MAX_CHAIN: u32 = 4;
/// Blocks of a COPY record (plain byte ranges of the base tensor).
pub const COPY_BLOCK: u64 = 1 << 20;
/// The base path is at most this long.
pub const MAX_BASE_PATH: usize = 4096;

const TRAILER_END: usize = 20;

/// The `Z4DM` head: what precedes the records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// File bytes of the presented prefix (`u64 hlen ‖ header`), verbatim.
    pub prefix: Range<usize>,
    pub data_len: u64,
    pub base_data_digest: [u8; 8],
    pub n_records: u32,
    /// Where the first record starts.
    pub records_start: usize,
}

/// Parses the `Z4DM` head of `bytes` (the body, up to the trailer), with
/// [`Z4dm::parse_head`]: the trailer lists the records, which the caller
/// checks against it.
pub fn parse_head(bytes: &[u8]) -> Result<Head, String> {
    let d = Z4dm::parse_head(bytes).map_err(|e| e.to_string())?;
    Ok(Head {
        prefix: d.prefix_range(),
        data_len: d.data_len,
        base_data_digest: d.base_digest,
        n_records: d.n_records,
        records_start: d.records_start(),
    })
}

/// A record's fields, parsed in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHead {
    pub name: String,
    pub begin: u64,
    pub end: u64,
    pub kind: DeltaKind,
    /// File bytes of the Z4AI frame (after the Z4DL header for DELTA);
    /// empty for COPY.
    pub frame: Range<usize>,
    /// For DELTA: the Z4DL header's reference length and digest.
    pub reference: Option<(u64, [u8; 16])>,
    /// Where the record ends.
    pub end_offset: usize,
}

/// Renders a record's bytes before its frame (for DELTA, the Z4DL header
/// included: `reference` is the base tensor's length and BLAKE2b-16).
pub fn render_record_head(
    name: &str,
    begin: u64,
    end: u64,
    kind: DeltaKind,
    frame_len: u64,
    reference: Option<(u64, [u8; 16])>,
) -> Vec<u8> {
    if kind != DeltaKind::Delta {
        return z4dm::render_record_head(name, begin, end, kind, frame_len);
    }
    let stored = frame_len + Z4DL_HEADER as u64;
    let mut v = z4dm::render_record_head(name, begin, end, kind, stored);
    let (ref_len, digest) = reference.unwrap_or_default();
    v.extend(z4dl::render_header(ref_len, &digest));
    v
}

/// Parses the record at `offset` of `bytes` (the body) with
/// [`Record::at`], and a DELTA record's `Z4DL` header with
/// [`Z4dl::parse_header`] (its frame is not read: over a remote copy it is
/// fetched when used).
pub fn parse_record(bytes: &[u8], offset: usize) -> Result<RecordHead, String> {
    if offset > bytes.len() {
        return Err("record offset outside the file".into());
    }
    // The index is unknown here: messages name the record by its offset.
    let r = Record::at(bytes, offset, 0).map_err(|e| match e {
        Z4dmError::Record { source, .. } => format!("record at {offset}: {source}"),
        Z4dmError::Name { .. } => format!("record at {offset}: name is not UTF-8"),
        Z4dmError::Kind { name, kind, .. } => format!("record {name:?}: unknown kind {kind}"),
        e => e.to_string(),
    })?;
    let frame = r.frame_range.start as usize..r.frame_range.end as usize;
    let (frame, reference) = if r.kind == DeltaKind::Delta {
        let d = Z4dl::parse_header(r.frame).map_err(|e| format!("record {:?}: {e}", r.name))?;
        let frame = frame.start + Z4DL_HEADER..frame.end;
        (frame, Some((d.ref_len, d.ref_digest)))
    } else if r.kind == DeltaKind::Copy {
        (r.end_offset as usize..r.end_offset as usize, None)
    } else {
        (frame, None)
    };
    Ok(RecordHead {
        name: r.name.to_string(),
        begin: r.begin,
        end: r.end,
        kind: r.kind,
        frame,
        reference,
        end_offset: r.end_offset as usize,
    })
}

/// One unit's entry in the trailer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitEntry {
    pub record_offset: u64,
    pub record_len: u64,
    /// xxh3 of the record's bytes before its Z4AI frame (version 1; 0 in
    /// version 2, where [`Trailer::records_digest`] covers every record).
    pub record_digest: u64,
    /// xxh3 of the Z4AI frame (0 for COPY).
    pub frame_digest: u64,
    /// CKX1's meta digest of the frame (0 for COPY).
    pub meta_digest: u64,
    pub blocks: Vec<BlockDigest>,
}

impl UnitEntry {
    /// The tensor length of a unit in COPY form (no frame, blocks of
    /// [`COPY_BLOCK`] carrying only their data digests), else `None`.
    fn copy_form(&self) -> Option<u64> {
        let total = self.blocks.last()?.end;
        let grid = total.div_ceil(COPY_BLOCK).max(1);
        let on_grid =
            self.blocks.len() as u64 == grid
                && self.blocks.iter().enumerate().all(|(k, b)| {
                    b.payload == 0 && b.end == ((k as u64 + 1) * COPY_BLOCK).min(total)
                });
        (self.frame_digest == 0 && self.meta_digest == 0 && on_grid).then_some(total)
    }
}

/// The digest of every record's head in version 2: the xxh3 of their
/// xxh3s (of each record's bytes before its frame), little-endian, in
/// record order.
pub fn records_digest(heads: impl IntoIterator<Item = u64>) -> u64 {
    let all: Vec<u8> = heads.into_iter().flat_map(u64::to_le_bytes).collect();
    xxh3_64(&all)
}

/// The `CKD1` trailer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trailer {
    pub flags: u16,
    /// At least the base's depth + 1 (written as exactly that; a base
    /// made shallower later, by a rewrite, leaves it an upper bound).
    pub depth: u32,
    /// Bytes `[0, z4dm_len)` are the Z4DM body; the trailer follows.
    pub z4dm_len: u64,
    /// xxh3 of body bytes `[0, records_start)`.
    pub head_digest: u64,
    /// Length of the base's presented content.
    pub base_len: u64,
    /// xxh3-64 of the base's presented content.
    pub base_digest: u64,
    /// The base archive's own checksum identity when packed (0: none);
    /// see `archive::ArchiveView::fingerprint`.
    pub base_fingerprint: u64,
    /// The base's stored path, relative to this archive's directory,
    /// `/`-separated.
    pub base_path: String,
    /// Version 2: [`records_digest`] of every record's head (the units'
    /// `record_digest` are then 0). `None`: version 1, a digest per unit.
    pub records_digest: Option<u64>,
    pub units: Vec<UnitEntry>,
}

/// Version 2's unit forms.
const FORM_COPY: u8 = 0;
const FORM_FRAME: u8 = 1;

impl Trailer {
    /// Renders the trailer: version 2 when it has [`Self::records_digest`],
    /// else version 1 (a trailer read from a version-1 file keeps its form).
    pub fn render(&self) -> Vec<u8> {
        let version = if self.records_digest.is_some() {
            TRAILER_VERSION
        } else {
            1
        };
        let mut v = Vec::new();
        v.extend_from_slice(TRAILER_MAGIC);
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&self.flags.to_le_bytes());
        v.extend_from_slice(&self.depth.to_le_bytes());
        for x in [
            self.z4dm_len,
            self.head_digest,
            self.base_len,
            self.base_digest,
            self.base_fingerprint,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(&(self.base_path.len() as u16).to_le_bytes());
        v.extend_from_slice(self.base_path.as_bytes());
        match self.records_digest {
            Some(d) => self.render_units_v2(d, &mut v),
            None => self.render_units_v1(&mut v),
        }
        let body = xxh3_64(&v);
        v.extend_from_slice(&body.to_le_bytes());
        let len = v.len() as u64 + 12;
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(TRAILER_MAGIC);
        v
    }

    fn render_units_v1(&self, v: &mut Vec<u8>) {
        v.extend_from_slice(&(self.units.len() as u32).to_le_bytes());
        for u in &self.units {
            for x in [
                u.record_offset,
                u.record_len,
                u.record_digest,
                u.frame_digest,
                u.meta_digest,
            ] {
                v.extend_from_slice(&x.to_le_bytes());
            }
            v.extend_from_slice(&(u.blocks.len() as u32).to_le_bytes());
            for b in &u.blocks {
                for x in [b.end, b.payload, b.data] {
                    v.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }

    /// Version 2: the records' offsets follow from their lengths, a COPY
    /// unit's block ends from its length, and other block ends are
    /// varints of the step from the previous end (wrapping, so any list
    /// renders and reads back as it was; readers check the ends).
    fn render_units_v2(&self, records_digest: u64, v: &mut Vec<u8>) {
        v.extend_from_slice(&records_digest.to_le_bytes());
        put_varint(v, self.units.len() as u64);
        let first = self.units.first().map_or(0, |u| u.record_offset);
        put_varint(v, first);
        let mut at = first;
        for u in &self.units {
            // Offsets are contiguous in every file ckptfs writes; one that
            // is not keeps its own (a 0 length, then the offset).
            // A 0 escapes a record whose offset does not follow (never in
            // what ckptfs writes) or whose length has no `+ 1`.
            if u.record_offset != at || u.record_len == u64::MAX {
                put_varint(v, 0);
                put_varint(v, u.record_offset);
                put_varint(v, u.record_len);
            } else {
                put_varint(v, u.record_len + 1);
            }
            at = u.record_offset.wrapping_add(u.record_len);
            match u.copy_form() {
                Some(total) => {
                    v.push(FORM_COPY);
                    put_varint(v, total);
                    for b in &u.blocks {
                        v.extend_from_slice(&b.data.to_le_bytes());
                    }
                }
                None => {
                    v.push(FORM_FRAME);
                    for x in [u.frame_digest, u.meta_digest] {
                        v.extend_from_slice(&x.to_le_bytes());
                    }
                    put_varint(v, u.blocks.len() as u64);
                    let mut prev = 0u64;
                    for b in &u.blocks {
                        put_varint(v, b.end.wrapping_sub(prev));
                        prev = b.end;
                        v.extend_from_slice(&b.payload.to_le_bytes());
                        v.extend_from_slice(&b.data.to_le_bytes());
                    }
                }
            }
        }
    }

    /// Finds and parses the trailer at the end of `bytes`. `Ok(None)`: the
    /// file does not end with one (a z4ai-written `.z4dm`).
    pub fn find(bytes: &[u8]) -> Result<Option<Trailer>, String> {
        if bytes.len() < TRAILER_END || &bytes[bytes.len() - 4..] != TRAILER_MAGIC {
            return Ok(None);
        }
        let n = bytes.len();
        let len = u64::from_le_bytes(bytes[n - 12..n - 4].try_into().unwrap());
        if len > n as u64 || len < TRAILER_END as u64 {
            return Err(format!(
                "CKD1 trailer length {len} does not fit a {n}-byte file"
            ));
        }
        let start = n - len as usize;
        let t = &bytes[start..n - 12];
        let body = u64::from_le_bytes(t[t.len() - 8..].try_into().unwrap());
        let t = &t[..t.len() - 8];
        if xxh3_64(t) != body {
            return Err("checksum mismatch in the CKD1 trailer".into());
        }
        let mut c = Cursor::new(t);
        let e = |e: super::error::CodecError| format!("CKD1 trailer: {e}");
        c.take(4, "magic").map_err(e)?;
        let version = c.u16("version").map_err(e)?;
        if version != 1 && version != TRAILER_VERSION {
            return Err(format!(
                "CKD1 trailer version {version} (only 1 and {TRAILER_VERSION} are read)"
            ));
        }
        let flags = c.u16("flags").map_err(e)?;
        let depth = c.u32("depth").map_err(e)?;
        let z4dm_len = c.u64("body length").map_err(e)?;
        let head_digest = c.u64("head digest").map_err(e)?;
        let base_len = c.u64("base length").map_err(e)?;
        let base_digest = c.u64("base digest").map_err(e)?;
        let base_fingerprint = c.u64("base fingerprint").map_err(e)?;
        let pl = c.u16("base path length").map_err(e)?;
        let base_path = std::str::from_utf8(c.take(pl as u64, "base path").map_err(e)?)
            .map_err(|_| "CKD1 trailer: base path is not UTF-8".to_string())?
            .to_string();
        let (records_digest, units) = if version == 1 {
            (None, parse_units_v1(&mut c)?)
        } else {
            let d = c.u64("records digest").map_err(e)?;
            (Some(d), parse_units_v2(&mut c)?)
        };
        if c.remaining() != 0 {
            return Err("CKD1 trailer: bytes left over".into());
        }
        if z4dm_len != start as u64 {
            return Err(format!(
                "CKD1 trailer: the Z4DM body is {z4dm_len} bytes, the trailer starts at {start}"
            ));
        }
        Ok(Some(Trailer {
            flags,
            depth,
            z4dm_len,
            head_digest,
            base_len,
            base_digest,
            base_fingerprint,
            base_path,
            records_digest,
            units,
        }))
    }
}

fn trailer_err(e: super::error::CodecError) -> String {
    format!("CKD1 trailer: {e}")
}

fn parse_units_v1(c: &mut Cursor) -> Result<Vec<UnitEntry>, String> {
    let e = trailer_err;
    let n_units = c.u32("unit count").map_err(e)?;
    // Each unit takes at least 44 bytes: no allocation beyond the file.
    if n_units as u64 * 44 > c.remaining() as u64 {
        return Err(format!("CKD1 trailer: {n_units} units do not fit"));
    }
    let mut units = Vec::with_capacity(n_units as usize);
    for _ in 0..n_units {
        let record_offset = c.u64("record offset").map_err(e)?;
        let record_len = c.u64("record length").map_err(e)?;
        let record_digest = c.u64("record digest").map_err(e)?;
        let frame_digest = c.u64("frame digest").map_err(e)?;
        let meta_digest = c.u64("meta digest").map_err(e)?;
        let nb = c.u32("block count").map_err(e)?;
        if nb as u64 * 24 > c.remaining() as u64 {
            return Err(format!("CKD1 trailer: {nb} blocks do not fit"));
        }
        let mut blocks = Vec::with_capacity(nb as usize);
        for _ in 0..nb {
            blocks.push(BlockDigest {
                end: c.u64("block end").map_err(e)?,
                payload: c.u64("payload digest").map_err(e)?,
                data: c.u64("data digest").map_err(e)?,
            });
        }
        units.push(UnitEntry {
            record_offset,
            record_len,
            record_digest,
            frame_digest,
            meta_digest,
            blocks,
        });
    }
    Ok(units)
}

fn parse_units_v2(c: &mut Cursor) -> Result<Vec<UnitEntry>, String> {
    let e = trailer_err;
    let n_units = c.varint("unit count").map_err(e)?;
    // Each unit takes at least 10 bytes: no allocation beyond the file.
    if n_units.saturating_mul(10) > c.remaining() as u64 {
        return Err(format!("CKD1 trailer: {n_units} units do not fit"));
    }
    let mut units = Vec::with_capacity(n_units as usize);
    let mut at = c.varint("first record offset").map_err(e)?;
    for _ in 0..n_units {
        let record_len = match c.varint("record length").map_err(e)? {
            0 => {
                at = c.varint("record offset").map_err(e)?;
                c.varint("record length").map_err(e)?
            }
            n => n - 1,
        };
        let record_offset = at;
        at = at.wrapping_add(record_len);
        let unit = match c.u8("unit form").map_err(e)? {
            FORM_COPY => {
                let total = c.varint("tensor length").map_err(e)?;
                let nb = total.div_ceil(COPY_BLOCK).max(1);
                if nb.saturating_mul(8) > c.remaining() as u64 {
                    return Err(format!("CKD1 trailer: {nb} blocks do not fit"));
                }
                let blocks = (0..nb)
                    .map(|k| {
                        Ok(BlockDigest {
                            end: ((k + 1) * COPY_BLOCK).min(total),
                            payload: 0,
                            data: c.u64("data digest").map_err(e)?,
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                UnitEntry {
                    record_offset,
                    record_len,
                    record_digest: 0,
                    frame_digest: 0,
                    meta_digest: 0,
                    blocks,
                }
            }
            FORM_FRAME => {
                let frame_digest = c.u64("frame digest").map_err(e)?;
                let meta_digest = c.u64("meta digest").map_err(e)?;
                let nb = c.varint("block count").map_err(e)?;
                if nb.saturating_mul(17) > c.remaining() as u64 {
                    return Err(format!("CKD1 trailer: {nb} blocks do not fit"));
                }
                let mut blocks = Vec::with_capacity(nb as usize);
                let mut end = 0u64;
                for _ in 0..nb {
                    end = end.wrapping_add(c.varint("block end").map_err(e)?);
                    blocks.push(BlockDigest {
                        end,
                        payload: c.u64("payload digest").map_err(e)?,
                        data: c.u64("data digest").map_err(e)?,
                    });
                }
                UnitEntry {
                    record_offset,
                    record_len,
                    record_digest: 0,
                    frame_digest,
                    meta_digest,
                    blocks,
                }
            }
            f => return Err(format!("CKD1 trailer: unknown unit form {f}")),
        };
        units.push(unit);
    }
    Ok(units)
}

/// Checks a recorded base path: relative, `/`-separated, not empty, no
/// empty or `.` component, no NUL, at most [`MAX_BASE_PATH`] bytes (`..`
/// components are allowed: a sibling directory's checkpoint; whoever opens
/// it keeps it inside its store).
pub fn check_base_path(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > MAX_BASE_PATH || p.starts_with('/') || p.contains('\0') {
        return Err(format!("base path {p:?} is not a relative path"));
    }
    if p.split('/').any(|c| c.is_empty() || c == ".") {
        return Err(format!("base path {p:?} has an empty or '.' component"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trailer(records_digest: Option<u64>) -> Trailer {
        let copy = |n: u64| UnitEntry {
            record_offset: 0,
            record_len: 0,
            record_digest: 0,
            frame_digest: 0,
            meta_digest: 0,
            blocks: (0..n.div_ceil(COPY_BLOCK).max(1))
                .map(|k| BlockDigest {
                    end: ((k + 1) * COPY_BLOCK).min(n),
                    payload: 0,
                    data: 100 + k,
                })
                .collect(),
        };
        let frame = UnitEntry {
            record_offset: 0,
            record_len: 0,
            record_digest: if records_digest.is_some() { 0 } else { 7 },
            frame_digest: 8,
            meta_digest: 9,
            blocks: vec![
                BlockDigest {
                    end: 10,
                    payload: 11,
                    data: 12,
                },
                // Ends that go back still read back as they were.
                BlockDigest {
                    end: 3,
                    payload: 0,
                    data: 0,
                },
            ],
        };
        let mut units = vec![
            copy(0),
            frame.clone(),
            copy(3 * COPY_BLOCK + 5),
            copy(2 * COPY_BLOCK),
        ];
        // A COPY-like unit off the 1 MiB grid keeps its ends.
        let mut off_grid = copy(2 * COPY_BLOCK);
        off_grid.blocks[0].end -= 1;
        units.push(off_grid);
        let mut at = 40;
        for (i, u) in units.iter_mut().enumerate() {
            u.record_offset = at;
            u.record_len = 30 + i as u64 * 1000;
            at += u.record_len;
        }
        // Offsets that do not follow, and the largest length.
        units.push(UnitEntry {
            record_offset: 5,
            record_len: u64::MAX,
            ..frame
        });
        Trailer {
            flags: 0,
            depth: 2,
            z4dm_len: 0,
            head_digest: 1,
            base_len: 2,
            base_digest: 3,
            base_fingerprint: 4,
            base_path: "../a/b.zstn".into(),
            records_digest,
            units,
        }
    }

    #[test]
    fn trailer_round_trips_and_detects_damage() {
        for t in [trailer(None), trailer(Some(77))] {
            let b = t.render();
            let version = u16::from_le_bytes([b[4], b[5]]);
            assert_eq!(version, if t.records_digest.is_some() { 2 } else { 1 });
            assert_eq!(Trailer::find(&b).unwrap(), Some(t));
            for i in 0..b.len() - 4 {
                let mut d = b.clone();
                d[i] ^= 1;
                assert!(Trailer::find(&d).is_err(), "flip at {i} accepted");
            }
        }
        assert_eq!(Trailer::find(b"Z4DM").unwrap(), None);
    }

    #[test]
    fn version_2_is_smaller() {
        let (v1, v2) = (trailer(None).render(), trailer(Some(77)).render());
        // Per COPY block 8 bytes instead of 24; per unit no offset or
        // per-record digest (here 362 bytes against 665).
        assert!(
            v2.len() * 10 < v1.len() * 6,
            "{} against {}",
            v2.len(),
            v1.len()
        );
    }

    #[test]
    fn hostile_counts_are_refused_without_allocating() {
        let mut t = trailer(Some(1));
        t.units.truncate(1);
        let b = t.render();
        // The unit count sits after the fixed fields, the path and the
        // records digest; make it claim 2^62 units.
        let at = 4 + 2 + 2 + 4 + 5 * 8 + 2 + t.base_path.len() + 8;
        let mut d = b[..at].to_vec();
        put_varint(&mut d, 1 << 62);
        d.extend_from_slice(&b[at + 1..b.len() - 20]);
        let e = Trailer::find(&reframe(&d)).unwrap_err();
        assert!(e.contains("do not fit"), "{e}");
    }

    /// Re-frames `inner` (a trailer from "CKD1" up to its body digest) with
    /// a valid body digest and length, so a parse gets past the checksum.
    fn reframe(inner: &[u8]) -> Vec<u8> {
        let mut d = inner.to_vec();
        let body = xxh3_64(&d);
        d.extend_from_slice(&body.to_le_bytes());
        d.extend_from_slice(&(d.len() as u64 + 12).to_le_bytes());
        d.extend_from_slice(TRAILER_MAGIC);
        d
    }

    proptest::proptest! {
        /// Any bytes behind a valid checksum: a trailer or an error, never
        /// a panic or an allocation beyond the input.
        #[test]
        fn damaged_fields_behind_a_valid_checksum_never_panic(
            edits in proptest::collection::vec((0usize..4096, proptest::num::u8::ANY), 1..8),
            cut in 0usize..64,
            v2 in proptest::bool::ANY,
        ) {
            let b = trailer(v2.then_some(5)).render();
            let mut inner = b[..b.len() - 20].to_vec();
            for (at, x) in edits {
                let n = inner.len();
                inner[at % n] = x;
            }
            inner.truncate(inner.len() - cut.min(inner.len() - 1));
            let _ = Trailer::find(&reframe(&inner));
        }
    }

    #[test]
    fn records_round_trip() {
        let mut f = render_head(b"{}", 10, [7; 8], 3);
        let start = f.len();
        let mut ends = vec![];
        for (k, n) in [
            (DeltaKind::Copy, 0),
            (DeltaKind::Full, 3),
            (DeltaKind::Delta, 4),
        ] {
            let r = Some((4u64, [9u8; 16])).filter(|_| k == DeltaKind::Delta);
            f.extend(render_record_head("t", 0, 4, k, n, r));
            f.extend(std::iter::repeat_n(0xAA, n as usize));
            ends.push(f.len());
        }
        let h = parse_head(&f).unwrap();
        assert_eq!((h.records_start, h.data_len, h.n_records), (start, 10, 3));
        let mut at = start;
        for (i, k) in [DeltaKind::Copy, DeltaKind::Full, DeltaKind::Delta]
            .into_iter()
            .enumerate()
        {
            let r = parse_record(&f, at).unwrap();
            assert_eq!(r.kind, k);
            assert_eq!(r.end_offset, ends[i]);
            assert!(f[r.frame.clone()].iter().all(|&b| b == 0xAA));
            at = r.end_offset;
        }
        assert!(parse_record(&f, f.len() - 3).is_err());
    }

    #[test]
    fn base_paths() {
        assert!(check_base_path("../step-900/model.zstn").is_ok());
        for bad in ["", "/abs", "a//b", "./a", "a\0b"] {
            assert!(check_base_path(bad).is_err(), "{bad:?}");
        }
    }
}
