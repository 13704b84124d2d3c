//! Composing two deltas: `A` a delta against `B`, `B` a delta against
//! `C`, in; `A` as a delta against `C` out, record by record, without
//! decoding `A` whole or packing it again (a middle checkpoint of a
//! family released, doc/SEMANTICS.md "Checkpoint families").
//!
//! Tensors are matched by name, as the reader does (it checks dtype and
//! byte length against the base at open, so an `A` record that takes from
//! `B` and a `B` record that takes from `C` chain to a `C` tensor of the
//! same name, dtype and length). Per record of `A` (the name, span and
//! header of `A` stay as they are):
//!
//! | `A`        | `B`         | `A` against `C`                              |
//! |------------|-------------|----------------------------------------------|
//! | FULL       | any         | `A`'s frame, reused                          |
//! | COPY       | COPY        | COPY                                         |
//! | COPY       | DELTA `rB`  | `B`'s `Z4DL` frame, reused                   |
//! | DELTA `rA` | COPY        | `A`'s `Z4DL` frame, reused                   |
//! | DELTA `rA` | DELTA `rB`  | `rA ⊕ rB` (= `A ⊕ C`) encoded again as DELTA |
//! | COPY/DELTA | FULL        | `A`'s tensor computed, then DELTA against `C`'s match or FULL, the smaller (as [`super::delta::pack_delta`]); COPY over a FULL with no match in `C` reuses `B`'s frame |
//!
//! The `Z4DM` head keeps `A`'s header and takes `B`'s BLAKE2b-8 of `C`'s
//! data buffer; the `CKD1` trailer takes `B`'s base length, digest,
//! fingerprint and depth (`A` sits where `B` sat). Block digests are of
//! `A`'s bytes: a reused frame keeps its unit; a new XOR frame keeps
//! `A`'s data digests where its block grid is `A`'s old one, else `A`'s
//! tensor is rebuilt from `C`'s for them. `C`'s bytes are read only for
//! those and for the FULL-in-`B` rows, a tensor at a time, through
//! [`TensorSource`]. No I/O beyond the inputs and `out`.

use super::delta::encode;
use super::tensor::{encode_xor, xor_digests, xor_grid};
use super::{PackError, PackOptions};
use ckptfs_codec::frame::DecodeFrame;
use ckptfs_format::ckx::{self, UnitDigests};
use ckptfs_format::delta::{
    self, render_head, render_record_head, DeltaKind, Trailer, UnitEntry, Z4DL_HEADER, Z4DL_MAGIC,
    Z4DL_VERSION,
};
use ckptfs_format::digest::xxh3_64;
use ckptfs_format::frame::Frame;
use ckptfs_format::safetensors::{header_len, Header, TensorEntry};
use ckptfs_format::z4digest::reference_digest;
use ckptfs_format::z4dm::{Record, RecordKind, Z4dm};
use rayon::prelude::*;
use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::OnceLock;

/// The presented bytes of `C`, read on demand.
pub trait TensorSource: Sync {
    /// Length of the whole presented file.
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Fills `buf` from `offset`.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
}

fn read_slice(s: &[u8], offset: u64, buf: &mut [u8]) -> io::Result<()> {
    let s = usize::try_from(offset)
        .ok()
        .and_then(|o| s.get(o..o.checked_add(buf.len())?))
        .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
    buf.copy_from_slice(s);
    Ok(())
}

impl TensorSource for &[u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        read_slice(self, offset, buf)
    }
}

impl TensorSource for Vec<u8> {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        read_slice(self, offset, buf)
    }
}

/// What [`compose`] wrote, by how each record was made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComposeStats {
    /// Frames (or COPY records) taken over from `A` or `B` as they were.
    pub reused: usize,
    /// DELTA frames of `rA ⊕ rB`.
    pub xored: usize,
    /// Tensors computed and encoded again (FULL in `B`).
    pub recoded: usize,
    /// `C`'s tensors read.
    pub base_reads: usize,
    pub stored_bytes: u64,
}

/// One delta file, parsed.
struct Parsed<'a> {
    trailer: Trailer,
    z4dm: Z4dm<'a>,
    records: Vec<Record<'a>>,
}

fn bad(which: &str, e: impl std::fmt::Display) -> PackError {
    PackError::Internal(format!("{which}: {e}"))
}

fn parse<'a>(bytes: &'a [u8], which: &str) -> Result<Parsed<'a>, PackError> {
    let trailer = Trailer::find(bytes)
        .map_err(|e| bad(which, e))?
        .ok_or_else(|| bad(which, "no CKD1 trailer (not a ckptfs delta)"))?;
    let body = usize::try_from(trailer.z4dm_len)
        .ok()
        .and_then(|n| bytes.get(..n))
        .ok_or_else(|| bad(which, "Z4DM body longer than the file"))?;
    let z4dm = Z4dm::parse(body).map_err(|e| bad(which, e))?;
    let records: Vec<Record> = z4dm
        .records()
        .collect::<Result<_, _>>()
        .map_err(|e| bad(which, e))?;
    if trailer.units.len() != records.len() {
        return Err(bad(
            which,
            format!(
                "{} trailer units for {} records",
                trailer.units.len(),
                records.len()
            ),
        ));
    }
    Ok(Parsed {
        trailer,
        z4dm,
        records,
    })
}

/// A `Z4DL` frame split: (reference length, reference digest, inner frame).
fn split_z4dl<'a>(r: &Record<'a>, which: &str) -> Result<(u64, [u8; 16], &'a [u8]), PackError> {
    let f = r.frame;
    if f.len() < Z4DL_HEADER || &f[..4] != Z4DL_MAGIC || f[4] != Z4DL_VERSION {
        return Err(bad(
            which,
            format!("record {:?}: not a Z4DL v2 delta frame", r.name),
        ));
    }
    let len = u64::from_le_bytes(f[8..16].try_into().expect("8 bytes"));
    let digest = f[16..32].try_into().expect("16 bytes");
    Ok((len, digest, &f[Z4DL_HEADER..]))
}

/// Decodes a plain frame of `len` bytes.
fn decode(frame: &[u8], len: u64, what: &str) -> Result<Vec<u8>, PackError> {
    let f = Frame::parse(frame).map_err(|e| bad(what, e))?;
    if f.decoded_len() != len {
        return Err(bad(
            what,
            format!(
                "frame decodes to {} bytes, the span is {len}",
                f.decoded_len()
            ),
        ));
    }
    let mut out = vec![0u8; len as usize];
    f.decode(&mut out).map_err(|e| bad(what, e))?;
    Ok(out)
}

/// One record of the output.
struct Out {
    kind: DeltaKind,
    /// The stored frame (for DELTA, after the `Z4DL` header).
    frame: Vec<u8>,
    reference: Option<(u64, [u8; 16])>,
    unit: UnitDigests,
    how: How,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    Reused,
    Xored,
    Recoded,
}

fn unit_of(u: &UnitEntry) -> UnitDigests {
    UnitDigests {
        frame: u.frame_digest,
        meta: u.meta_digest,
        blocks: u.blocks.clone(),
    }
}

/// `C`'s tensors by name and where its data starts.
type Tensors = (HashMap<String, TensorEntry>, u64);

/// `C`'s safetensors header, read once.
struct BaseHeader<'s> {
    source: &'s dyn TensorSource,
    header: OnceLock<Result<Tensors, String>>,
}

impl BaseHeader<'_> {
    fn get(&self) -> Result<&Tensors, PackError> {
        self.header
            .get_or_init(|| {
                let len = self.source.len();
                let mut prefix = [0u8; 8];
                self.source
                    .read_exact_at(0, &mut prefix)
                    .map_err(|e| e.to_string())?;
                let n = header_len(&prefix, len).map_err(|e| e.to_string())?;
                let mut raw = vec![0u8; n as usize];
                self.source
                    .read_exact_at(8, &mut raw)
                    .map_err(|e| e.to_string())?;
                let h = Header::parse(&raw, len - 8 - n).map_err(|e| e.to_string())?;
                let by_name = h.tensors.into_iter().map(|t| (t.name.clone(), t)).collect();
                Ok((by_name, 8 + n))
            })
            .as_ref()
            .map_err(|e| bad("base", e))
    }

    /// `C`'s tensor matching `t` (name, dtype, byte length), if any.
    fn matching(&self, t: &TensorEntry) -> Result<Option<Vec<u8>>, PackError> {
        let (by_name, start) = self.get()?;
        let Some(c) = by_name.get(&t.name) else {
            return Ok(None);
        };
        if c.dtype != t.dtype || c.len() != t.len() {
            return Ok(None);
        }
        let mut buf = vec![0u8; c.len() as usize];
        self.source
            .read_exact_at(start + c.begin, &mut buf)
            .map_err(|e| bad("base", format!("tensor {:?}: {e}", t.name)))?;
        Ok(Some(buf))
    }
}

/// Writes `upper` (`A`, a ckptfs delta against `middle`) as a delta
/// against `middle`'s base `C` into `out`: see the module doc.
/// `base_path` is `C`'s path relative to the output's directory; `base`
/// reads `C`'s presented bytes. Both deltas are checked before the first
/// byte is written.
pub fn compose(
    upper: &[u8],
    middle: &[u8],
    base: &dyn TensorSource,
    base_path: &str,
    out: &mut dyn Write,
    opts: PackOptions,
) -> Result<ComposeStats, PackError> {
    let a = parse(upper, "upper delta")?;
    let b = parse(middle, "middle delta")?;
    delta::check_base_path(base_path).map_err(PackError::Internal)?;
    let b_len = b
        .z4dm
        .target_len()
        .ok_or_else(|| bad("middle delta", "length overflows"))?;
    if a.trailer.base_len != b_len {
        return Err(bad(
            "upper delta",
            format!(
                "its base is {} bytes, the middle delta presents {b_len}",
                a.trailer.base_len
            ),
        ));
    }
    let header = Header::parse(a.z4dm.header_json, a.z4dm.data_len)?;
    let entries: HashMap<&str, &TensorEntry> = header
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let b_by_name: HashMap<&str, usize> = b
        .records
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name, i))
        .collect();
    let c = BaseHeader {
        source: base,
        header: OnceLock::new(),
    };
    let base_reads = std::sync::atomic::AtomicUsize::new(0);
    let one = |i: usize| -> Result<Out, PackError> {
        let r = &a.records[i];
        let au = &a.trailer.units[i];
        let reuse = |kind, frame: &[u8], reference, unit| Out {
            kind,
            frame: frame.to_vec(),
            reference,
            unit,
            how: How::Reused,
        };
        if r.kind == RecordKind::Full {
            return Ok(reuse(DeltaKind::Full, r.frame, None, unit_of(au)));
        }
        let what = format!("upper delta, record {:?}", r.name);
        let j = *b_by_name
            .get(r.name)
            .ok_or_else(|| bad(&what, "no record of that name in the middle delta"))?;
        let (br, bu) = (&b.records[j], &b.trailer.units[j]);
        if br.len() != r.len() {
            return Err(bad(
                &what,
                format!("{} bytes, {} in the middle delta", r.len(), br.len()),
            ));
        }
        let t = entries
            .get(r.name)
            .ok_or_else(|| bad(&what, "not in its header"))?;
        match (r.kind, br.kind) {
            (RecordKind::Full, _) => Ok(reuse(DeltaKind::Full, r.frame, None, unit_of(au))),
            (RecordKind::Copy, RecordKind::Copy) => {
                Ok(reuse(DeltaKind::Copy, &[], None, unit_of(au)))
            }
            (RecordKind::Copy, RecordKind::Delta) => {
                let (len, digest, inner) = split_z4dl(br, "middle delta")?;
                Ok(reuse(
                    DeltaKind::Delta,
                    inner,
                    Some((len, digest)),
                    unit_of(bu),
                ))
            }
            (RecordKind::Delta, RecordKind::Copy) => {
                let (len, digest, inner) = split_z4dl(r, "upper delta")?;
                Ok(reuse(
                    DeltaKind::Delta,
                    inner,
                    Some((len, digest)),
                    unit_of(au),
                ))
            }
            (RecordKind::Delta, RecordKind::Delta) => {
                let (alen, _, ainner) = split_z4dl(r, "upper delta")?;
                let (blen, bdigest, binner) = split_z4dl(br, "middle delta")?;
                if alen != r.len() || blen != r.len() {
                    return Err(bad(&what, "reference length differs from the span"));
                }
                let ra = decode(ainner, r.len(), &what)?;
                let mut x = decode(binner, r.len(), "middle delta")?;
                ckptfs_codec::xor_delta::xor_into(&mut x, &ra);
                drop(ra);
                let frame = encode_xor(t.known_dtype(), &x, opts);
                let f = Frame::parse(&frame).map_err(|e| bad(&what, e))?;
                let (bounds, eb, access) = xor_grid(&f, r.len())?;
                let ends: Vec<u64> = au.blocks.iter().map(|b| b.end).collect();
                let unit = if bounds[1..] == ends[..] {
                    // The same grid as A's frame: A's digests of its bytes.
                    let data: Vec<u64> = au.blocks.iter().map(|b| b.data).collect();
                    ckx::unit_digests_from(&frame, access.as_ref(), &bounds, eb, &data)
                } else {
                    base_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let cb = c.matching(t)?.ok_or_else(|| {
                        bad(
                            &what,
                            "no tensor of that name, dtype and length in the base",
                        )
                    })?;
                    ckptfs_codec::xor_delta::xor_into(&mut x, &cb);
                    xor_digests(&frame, &x)?
                };
                drop(f);
                Ok(Out {
                    kind: DeltaKind::Delta,
                    frame,
                    reference: Some((blen, bdigest)),
                    unit,
                    how: How::Xored,
                })
            }
            (_, RecordKind::Full) => {
                let rb = decode(br.frame, r.len(), "middle delta")?;
                let raw = match r.kind {
                    RecordKind::Copy => rb,
                    _ => {
                        let (alen, _, ainner) = split_z4dl(r, "upper delta")?;
                        if alen != r.len() {
                            return Err(bad(&what, "reference length differs from the span"));
                        }
                        let mut ra = decode(ainner, r.len(), &what)?;
                        ckptfs_codec::xor_delta::xor_into(&mut ra, &rb);
                        ra
                    }
                };
                base_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let cb = c.matching(t)?;
                if cb.is_none() && r.kind == RecordKind::Copy {
                    return Ok(reuse(DeltaKind::Full, br.frame, None, unit_of(bu)));
                }
                let e = encode(t, &raw, cb.as_deref(), opts)?;
                let reference = match (e.kind, &cb) {
                    (DeltaKind::Delta, Some(cb)) => Some((cb.len() as u64, reference_digest(cb))),
                    _ => None,
                };
                Ok(Out {
                    kind: e.kind,
                    frame: e.frame,
                    reference,
                    unit: e.unit,
                    how: How::Recoded,
                })
            }
        }
    };
    let outs: Vec<Out> = (0..a.records.len())
        .into_par_iter()
        .map(one)
        .collect::<Result<_, _>>()?;

    let head = render_head(
        a.z4dm.header_json,
        a.z4dm.data_len,
        b.z4dm.base_digest,
        a.records.len() as u32,
    );
    out.write_all(&head)?;
    let mut offset = head.len() as u64;
    let mut stats = ComposeStats {
        base_reads: base_reads.into_inner(),
        ..Default::default()
    };
    let mut heads = Vec::with_capacity(outs.len());
    let mut units = Vec::with_capacity(outs.len());
    for (r, o) in a.records.iter().zip(outs) {
        let rh = render_record_head(
            r.name,
            r.begin,
            r.end,
            o.kind,
            o.frame.len() as u64,
            o.reference,
        );
        out.write_all(&rh)?;
        out.write_all(&o.frame)?;
        heads.push(xxh3_64(&rh));
        let len = (rh.len() + o.frame.len()) as u64;
        units.push(UnitEntry {
            record_offset: offset,
            record_len: len,
            record_digest: 0,
            frame_digest: o.unit.frame,
            meta_digest: o.unit.meta,
            blocks: o.unit.blocks,
        });
        offset += len;
        match o.how {
            How::Reused => stats.reused += 1,
            How::Xored => stats.xored += 1,
            How::Recoded => stats.recoded += 1,
        }
    }
    let trailer = Trailer {
        flags: 0,
        depth: b.trailer.depth,
        z4dm_len: offset,
        head_digest: xxh3_64(&head),
        base_len: b.trailer.base_len,
        base_digest: b.trailer.base_digest,
        base_fingerprint: b.trailer.base_fingerprint,
        base_path: base_path.to_string(),
        records_digest: Some(delta::records_digest(heads)),
        units,
    }
    .render();
    out.write_all(&trailer)?;
    stats.stored_bytes = offset + trailer.len() as u64;
    Ok(stats)
}

#[cfg(test)]
mod tests;
