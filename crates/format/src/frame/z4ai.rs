//! `Z4AI` v1 frames: parsing the header and planes, and the body's
//! geometry.

use super::blocks::ElementAccess;
use super::{ensure_plausible, parse_plane, BitfieldSpec, Transform, Z4aiFrame};
use crate::cursor::Cursor;
use crate::error::{CodecError, Result};
use crate::plane::PlaneBlocks;

pub(super) fn parse_z4ai(bytes: &[u8]) -> Result<Z4aiFrame<'_>> {
    let mut c = Cursor::new(bytes);
    let magic = c.take(4, "Z4AI frame header")?;
    if magic != b"Z4AI" {
        return Err(CodecError::invalid(
            "frame",
            format!("unknown frame magic {:?}", String::from_utf8_lossy(magic)),
        ));
    }
    let version = c.u8("Z4AI frame header")?;
    if version != 1 {
        return Err(CodecError::invalid(
            "Z4AI frame",
            format!("unsupported version {version}"),
        ));
    }
    let _flags = c.u8("Z4AI frame header")?;
    let transform = c.u8("Z4AI frame header")?;
    let width = c.u8("Z4AI frame header")?;
    let n_planes = c.u8("Z4AI frame header")?;
    let np_len = c.u8("Z4AI frame header")?;
    c.take(np_len as u64, "Z4AI numpy dtype")?;
    let dlen = c.u8("Z4AI frame header")?;
    let dcode = c.take(dlen as u64, "Z4AI bit-field name")?;
    let ndim = c.u8("Z4AI frame header")?;
    c.take(ndim as u64 * 8, "Z4AI shape")?;
    let tail_len = c.u32("Z4AI frame header")?;
    let tail = c.take(tail_len as u64, "Z4AI tail")?;
    let header_len = c.pos();
    let mut planes = Vec::with_capacity(n_planes as usize);
    for _ in 0..n_planes {
        planes.push(parse_plane(&mut c)?);
    }
    if c.remaining() != 0 {
        return Err(CodecError::invalid(
            "Z4AI frame",
            format!("{} bytes after the last plane", c.remaining()),
        ));
    }
    let transform = match transform {
        0 => {
            if n_planes > 1 {
                return Err(CodecError::invalid(
                    "Z4AI frame",
                    "opaque frame with several planes",
                ));
            }
            Transform::Opaque
        }
        1 => {
            if width == 0 || n_planes != width {
                return Err(CodecError::invalid(
                    "Z4AI frame",
                    format!("byte-plane width {width} with {n_planes} planes"),
                ));
            }
            let n = planes[0].orig_len;
            if planes.iter().any(|p| p.orig_len != n) {
                return Err(CodecError::invalid(
                    "Z4AI frame",
                    "byte planes of unequal length",
                ));
            }
            Transform::BytePlane(width)
        }
        2 => {
            let spec = BitfieldSpec::by_name(dcode).ok_or_else(|| {
                CodecError::invalid(
                    "Z4AI frame",
                    format!(
                        "unknown bit-field spec {:?}",
                        String::from_utf8_lossy(dcode)
                    ),
                )
            })?;
            if n_planes != 3 {
                return Err(CodecError::invalid(
                    "Z4AI frame",
                    format!("bit-field with {n_planes} planes"),
                ));
            }
            let count = planes[1].orig_len;
            let want = [
                count.div_ceil(8),
                count,
                count.saturating_mul(spec.mant_planes() as u64),
            ];
            if planes.iter().zip(want).any(|(p, w)| p.orig_len != w) {
                return Err(CodecError::invalid(
                    "Z4AI frame",
                    format!("bit-field plane lengths do not fit {count} elements"),
                ));
            }
            Transform::Bitfield(spec)
        }
        3 => {
            if !(2..=8).contains(&width) || n_planes != 2 {
                return Err(CodecError::invalid(
                    "split-float frame",
                    format!("width {width} with {n_planes} planes"),
                ));
            }
            if planes[0].orig_len.checked_mul(width as u64 - 1) != Some(planes[1].orig_len) {
                return Err(CodecError::invalid(
                    "split-float frame",
                    format!(
                        "a {}-byte low plane for {} elements of {width} bytes",
                        planes[1].orig_len, planes[0].orig_len
                    ),
                ));
            }
            Transform::Split(width)
        }
        t => {
            return Err(CodecError::invalid(
                "Z4AI frame",
                format!("unknown transform {t}"),
            ))
        }
    };
    let f = Z4aiFrame {
        bytes,
        transform,
        tail,
        planes,
        header_len,
    };
    ensure_plausible(f.body_len(), bytes.len(), "Z4AI frame")?;
    Ok(f)
}

impl<'a> Z4aiFrame<'a> {
    /// Decoded bytes excluding the tail.
    pub fn body_len(&self) -> u64 {
        match self.transform {
            Transform::Opaque => self.planes.first().map_or(0, |p| p.orig_len),
            Transform::BytePlane(w) => self.planes[0].orig_len.saturating_mul(w as u64),
            Transform::Bitfield(spec) => self.planes[1]
                .orig_len
                .saturating_mul(spec.elem_bytes() as u64),
            Transform::Split(w) => self.planes[0].orig_len.saturating_mul(w as u64),
        }
    }

    /// Bytes per element of the body (1 for opaque frames).
    pub fn elem_bytes(&self) -> u64 {
        match self.transform {
            Transform::Opaque => 1,
            Transform::BytePlane(w) => w as u64,
            Transform::Bitfield(spec) => spec.elem_bytes() as u64,
            Transform::Split(w) => w as u64,
        }
    }

    pub fn element_access(&self) -> Result<Option<ElementAccess<'a>>> {
        let mut blocks = Vec::with_capacity(self.planes.len());
        for p in &self.planes {
            match PlaneBlocks::parse(p.method, p.payload, p.orig_len)? {
                Some(b) => blocks.push(b),
                None => return Ok(None),
            }
        }
        Ok(Some(ElementAccess {
            frame: self.clone(),
            blocks,
        }))
    }
}
