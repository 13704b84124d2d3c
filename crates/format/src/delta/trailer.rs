//! The `CKD1` trailer (see the module doc of `format::delta` for its
//! layout): [`Trailer::render`] writes version 2 (or keeps version 1), and
//! [`Trailer::find`] reads either from the end of a file, checking its
//! digest and every count against the bytes that hold it before allocating.

use super::{COPY_BLOCK, TRAILER_MAGIC, TRAILER_VERSION};
use crate::ckx::BlockDigest;
use crate::cursor::{put_varint, Cursor};
use crate::digest::xxh3_64;
use crate::error::CodecError;

const TRAILER_END: usize = 20;

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
        let e = |e: CodecError| format!("CKD1 trailer: {e}");
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

fn trailer_err(e: CodecError) -> String {
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
