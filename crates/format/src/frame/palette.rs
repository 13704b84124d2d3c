//! `ZPL1` palette frames: a codebook of distinct values and an index.

use super::{check_zstd_size, ensure_plausible, PaletteFrame};
use crate::cursor::Cursor;
use crate::error::{CodecError, Result};

pub(super) fn parse_palette(bytes: &[u8]) -> Result<PaletteFrame<'_>> {
    let mut c = Cursor::new(bytes);
    c.take(4, "ZPL1 header")?;
    let version = c.u8("ZPL1 header")?;
    if version != 1 {
        return Err(CodecError::invalid(
            "ZPL1 frame",
            format!("unsupported version {version}"),
        ));
    }
    let width = c.u8("ZPL1 header")?;
    let _flags = c.u8("ZPL1 header")?;
    let index_width = c.u8("ZPL1 header")?;
    if !matches!(width, 1 | 2 | 4 | 8) || !matches!(index_width, 1 | 2 | 4) {
        return Err(CodecError::invalid(
            "ZPL1 frame",
            format!("width {width}, index width {index_width}"),
        ));
    }
    let count = c.u64("ZPL1 header")?;
    let k = c.u32("ZPL1 header")?;
    let tail_len = c.u32("ZPL1 header")?;
    let dtype_len = c.u8("ZPL1 header")?;
    let ndim = c.u8("ZPL1 header")?;
    c.take(dtype_len as u64 + ndim as u64 * 8, "ZPL1 numpy metadata")?;
    let tail = c.take(tail_len as u64, "ZPL1 tail")?;
    let cb_len = c.u32("ZPL1 header")?;
    let (codebook, index) = if count == 0 {
        (&[][..], &[][..])
    } else {
        let cb = c.take(cb_len as u64, "ZPL1 codebook")?;
        (cb, c.rest())
    };
    if count > 0 {
        // z4ai writes the distinct values (so k <= count) with the
        // narrowest index that holds k (so no wider than the elements):
        // anything else would let a small frame claim a codebook or an
        // index larger than its output.
        if k == 0
            || u64::from(k) > count
            || (index_width == 1 && k > 256)
            || (index_width == 2 && k > 65536)
        {
            return Err(CodecError::invalid(
                "ZPL1 frame",
                format!("{k} codebook entries for {count} elements"),
            ));
        }
        if index_width > width {
            return Err(CodecError::invalid(
                "ZPL1 frame",
                format!("{index_width}-byte indices for {width}-byte elements"),
            ));
        }
        check_zstd_size(codebook, k as u64 * width as u64, "ZPL1 codebook")?;
        check_zstd_size(
            index,
            count.saturating_mul(index_width as u64),
            "ZPL1 index",
        )?;
        ensure_plausible(
            count.saturating_mul(width as u64),
            bytes.len(),
            "ZPL1 frame",
        )?;
    }
    Ok(PaletteFrame {
        width,
        index_width,
        count,
        k,
        tail,
        codebook,
        index,
    })
}
