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
//! and the `CKD1` trailer (in `trailer.rs`; unit tests in `tests.rs`).

use super::z4dl::{self, Z4dl};
use super::z4dm::{self, Record, Z4dm, Z4dmError};
use std::ops::Range;

#[cfg(test)]
mod tests;
mod trailer;

pub use trailer::{records_digest, Trailer, UnitEntry};

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
