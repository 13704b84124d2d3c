//! `ZSP1` sparse frames and the `ZRT1` frame of their values.

use super::{check_zstd_size, ensure_plausible, parse_plane, SparseFrame, Zrt1Frame};
use crate::cursor::Cursor;
use crate::error::{CodecError, Result};
use crate::plane;

fn parse_zrt1(bytes: &[u8]) -> Result<Zrt1Frame<'_>> {
    let mut c = Cursor::new(bytes);
    if c.take(4, "ZRT1 header")? != b"ZRT1" {
        return Err(CodecError::invalid("ZSP1 values", "missing ZRT1 magic"));
    }
    let version = c.u8("ZRT1 header")?;
    if version != 2 {
        return Err(CodecError::invalid(
            "ZRT1 frame",
            format!("unsupported version {version}"),
        ));
    }
    let width = c.u8("ZRT1 header")?;
    let orig_len = c.u64("ZRT1 header")?;
    let transform = c.u8("ZRT1 header")?;
    let n = c.u8("ZRT1 header")?;
    let mut streams = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let p = parse_plane(&mut c)?;
        if p.method > plane::ZSTD {
            return Err(CodecError::invalid(
                "ZRT1 frame",
                format!("stream method {}", p.method),
            ));
        }
        streams.push(p);
    }
    if c.remaining() != 0 {
        return Err(CodecError::invalid("ZRT1 frame", "trailing bytes"));
    }
    let byteplane = match transform {
        0 => {
            if n != 1 || streams[0].orig_len != orig_len {
                return Err(CodecError::invalid(
                    "ZRT1 frame",
                    "opaque stream length mismatch",
                ));
            }
            false
        }
        1 => {
            if width == 0
                || n != width
                || streams
                    .iter()
                    .any(|s| s.orig_len.checked_mul(width as u64) != Some(orig_len))
            {
                return Err(CodecError::invalid(
                    "ZRT1 frame",
                    "byte-plane streams do not fit",
                ));
            }
            true
        }
        t => {
            return Err(CodecError::invalid(
                "ZRT1 frame",
                format!("unknown transform {t}"),
            ))
        }
    };
    Ok(Zrt1Frame {
        width,
        orig_len,
        byteplane,
        streams,
    })
}

pub(super) fn parse_sparse(bytes: &[u8]) -> Result<SparseFrame<'_>> {
    let mut c = Cursor::new(bytes);
    c.take(4, "ZSP1 header")?;
    let version = c.u8("ZSP1 header")?;
    if version != 1 {
        return Err(CodecError::invalid(
            "ZSP1 frame",
            format!("unsupported version {version}"),
        ));
    }
    let width = c.u8("ZSP1 header")?;
    if !matches!(width, 1 | 2 | 4 | 8) {
        return Err(CodecError::invalid("ZSP1 frame", format!("width {width}")));
    }
    let _flags = c.u8("ZSP1 header")?;
    c.u8("ZSP1 header")?;
    let count = c.u64("ZSP1 header")?;
    let nnz = c.u64("ZSP1 header")?;
    let tail_len = c.u32("ZSP1 header")?;
    let dtype_len = c.u8("ZSP1 header")?;
    let ndim = c.u8("ZSP1 header")?;
    c.take(dtype_len as u64 + ndim as u64 * 8, "ZSP1 numpy metadata")?;
    let tail = c.take(tail_len as u64, "ZSP1 tail")?;
    let bitmap_len = c.u64("ZSP1 header")?;
    let bitmap = c.take(bitmap_len, "ZSP1 bitmap")?;
    let values_bytes = c.rest();
    if nnz > count {
        return Err(CodecError::invalid(
            "ZSP1 frame",
            format!("{nnz} non-zeros in {count} elements"),
        ));
    }
    if count > 0 {
        if bitmap_len == 0 {
            return Err(CodecError::invalid("ZSP1 frame", "empty bitmap"));
        }
        check_zstd_size(bitmap, count.div_ceil(8), "ZSP1 bitmap")?;
        ensure_plausible(
            count.saturating_mul(width as u64),
            bytes.len(),
            "ZSP1 frame",
        )?;
    }
    let values = if nnz > 0 && count > 0 {
        let v = parse_zrt1(values_bytes)?;
        if v.orig_len != nnz * width as u64 || (v.byteplane && v.width != width) {
            return Err(CodecError::invalid(
                "ZSP1 frame",
                "values do not match nnz × width",
            ));
        }
        Some(v)
    } else {
        None
    };
    Ok(SparseFrame {
        width,
        count,
        nnz,
        tail,
        bitmap,
        values,
    })
}
