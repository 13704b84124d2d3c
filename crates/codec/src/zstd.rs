//! zstd glue: bounded single-frame decoding and per-thread contexts.
//!
//! Every zstd payload in the formats we read is exactly one zstd frame whose
//! output size the caller already knows. Decoding writes into a caller-sized
//! buffer, limits the window to 2^27 (z4ai's limit), and requires the frame to
//! fill the buffer exactly and to end exactly at the end of the payload.
//! Contexts are reused per thread (creating one costs more than a small frame).

use super::{CodecError, Result};
use std::cell::RefCell;
use zstd::zstd_safe::{self, CCtx, CParameter, DCtx, DParameter};

/// z4ai's `_MAX_WINDOW_LOG`.
pub const MAX_WINDOW_LOG: u32 = 27;

thread_local! {
    static DCTX: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
    static CCTX: RefCell<Option<CCtx<'static>>> = const { RefCell::new(None) };
}

fn zerr(code: usize) -> CodecError {
    CodecError::Zstd(zstd_safe::get_error_name(code).to_string())
}

/// Decodes one zstd frame that must produce exactly `out.len()` bytes.
pub fn decompress_exact(src: &[u8], out: &mut [u8], what: &'static str) -> Result<()> {
    let frame_len = zstd_safe::find_frame_compressed_size(src).map_err(zerr)?;
    if frame_len != src.len() {
        return Err(CodecError::invalid(
            what,
            format!(
                "zstd payload holds {} bytes after its first frame",
                src.len() - frame_len
            ),
        ));
    }
    // One-shot decoding ignores the window limit, so check the descriptor
    // the way a streaming decoder with a 2^27 limit (z4ai's) would.
    if let Some(log) = window_log(src) {
        let wd = src[5];
        let base = 1u64 << log;
        let size = base + (base / 8) * (wd & 7) as u64;
        if size > 1 << MAX_WINDOW_LOG {
            return Err(CodecError::WindowTooLarge { log });
        }
    }
    if let Ok(Some(size)) = zstd_safe::get_frame_content_size(src) {
        if size != out.len() as u64 {
            return Err(CodecError::LengthMismatch {
                what,
                got: size,
                expected: out.len() as u64,
            });
        }
    }
    DCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let dctx = slot.get_or_insert_with(|| {
            let mut d = DCtx::create();
            let _ = d.set_parameter(DParameter::WindowLogMax(MAX_WINDOW_LOG));
            d
        });
        match dctx.decompress(out, src) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(CodecError::LengthMismatch {
                what,
                got: n as u64,
                expected: out.len() as u64,
            }),
            Err(code) => {
                // A failed frame can leave the context mid-stream.
                let _ = dctx.reset(zstd_safe::ResetDirective::SessionOnly);
                let name = zstd_safe::get_error_name(code);
                if name.contains("Frame requires too much memory") {
                    Err(CodecError::WindowTooLarge {
                        log: window_log(src).unwrap_or(0),
                    })
                } else if name.contains("Destination buffer is too small") {
                    Err(CodecError::invalid(
                        what,
                        "zstd frame decodes to more than its declared length",
                    ))
                } else {
                    Err(CodecError::Zstd(format!("{what}: {name}")))
                }
            }
        }
    })
}

/// Decodes one zstd frame of at most `max` bytes into a new vector. Used for
/// small side blobs (frequency tables, models) whose exact size is bounded.
pub fn decompress_bounded(src: &[u8], max: usize, what: &'static str) -> Result<Vec<u8>> {
    let size = match zstd_safe::get_frame_content_size(src) {
        Ok(Some(s)) => s,
        _ => {
            return Err(CodecError::invalid(what, "zstd frame has no content size"));
        }
    };
    if size > max as u64 {
        return Err(CodecError::invalid(
            what,
            format!("zstd frame claims {size} bytes, at most {max} allowed"),
        ));
    }
    let mut out = vec![0u8; size as usize];
    decompress_exact(src, &mut out, what)?;
    Ok(out)
}

fn window_log(src: &[u8]) -> Option<u32> {
    // Frame header: magic(4), FHD(1), [window descriptor(1) unless single-segment].
    if src.len() < 6 {
        return None;
    }
    let fhd = src[4];
    if fhd & 0x20 != 0 {
        return None;
    }
    let wd = src[5];
    Some(10 + (wd >> 3) as u32)
}

/// Compression parameters for one frame.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub level: i32,
    /// Window log; `None` keeps the level default. Capped at [`MAX_WINDOW_LOG`].
    pub window_log: Option<u32>,
    pub long_distance: bool,
    /// Near-random bytes (the low bytes of a sparse XOR's moved elements):
    /// the optimal parser (btultra) with the least search (window 2^18,
    /// hash and chain logs 12, search log 1, minimum match 7, target length
    /// 8). Its literal pricing is what wins on such data, where level 1's
    /// short matches cost more than the literals they replace; it runs at a
    /// small fraction of level 19's time and matched or beat it on the XOR
    /// planes measured (`scripts/bench-delta.sh`). Overrides `level`'s
    /// parameters except the window, which `window_log` may still set.
    pub literal_heavy: bool,
}

impl Params {
    pub fn level(level: i32) -> Self {
        Params {
            level,
            window_log: None,
            long_distance: false,
            literal_heavy: false,
        }
    }

    /// [`Params::literal_heavy`].
    pub fn literal_heavy() -> Self {
        Params {
            literal_heavy: true,
            ..Params::level(19)
        }
    }
}

/// Compresses `src` into one zstd frame that carries its content size and no
/// checksum, appending to `out`.
pub fn compress_into(src: &[u8], params: Params, out: &mut Vec<u8>) {
    CCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let cctx = slot.get_or_insert_with(CCtx::create);
        let _ = cctx.reset(zstd_safe::ResetDirective::SessionAndParameters);
        let _ = cctx.set_parameter(CParameter::CompressionLevel(params.level));
        let _ = cctx.set_parameter(CParameter::ContentSizeFlag(true));
        let _ = cctx.set_parameter(CParameter::ChecksumFlag(false));
        if params.literal_heavy {
            let _ = cctx.set_parameter(CParameter::Strategy(zstd_safe::Strategy::ZSTD_btultra));
            let _ = cctx.set_parameter(CParameter::WindowLog(18));
            let _ = cctx.set_parameter(CParameter::HashLog(12));
            let _ = cctx.set_parameter(CParameter::ChainLog(12));
            let _ = cctx.set_parameter(CParameter::SearchLog(1));
            let _ = cctx.set_parameter(CParameter::MinMatch(7));
            let _ = cctx.set_parameter(CParameter::TargetLength(8));
        }
        if let Some(w) = params.window_log {
            let _ = cctx.set_parameter(CParameter::WindowLog(w.clamp(10, MAX_WINDOW_LOG)));
        }
        if params.long_distance {
            let _ = cctx.set_parameter(CParameter::EnableLongDistanceMatching(true));
        }
        let _ = cctx.set_pledged_src_size(Some(src.len() as u64));
        let start = out.len();
        let bound = zstd_safe::compress_bound(src.len());
        out.reserve(bound);
        // SAFETY-free path: compress2 writes into the spare capacity through a
        // zstd_safe::WriteBuf implementation for Vec (it tracks the length).
        let mut tmp: Vec<u8> = Vec::with_capacity(bound);
        match cctx.compress2(&mut tmp, src) {
            Ok(_) => out.extend_from_slice(&tmp),
            Err(code) => panic!(
                "zstd compression failed: {}",
                zstd_safe::get_error_name(code)
            ),
        }
        debug_assert!(out.len() >= start);
    })
}

/// Convenience: one frame at `level`.
pub fn compress(src: &[u8], level: i32) -> Vec<u8> {
    let mut out = Vec::new();
    compress_into(src, Params::level(level), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_exact() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let c = compress(&data, 3);
        let mut out = vec![0u8; data.len()];
        decompress_exact(&c, &mut out, "t").unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn wrong_size_is_an_error_not_an_allocation() {
        let data = vec![7u8; 1000];
        let c = compress(&data, 3);
        let mut small = vec![0u8; 999];
        assert!(decompress_exact(&c, &mut small, "t").is_err());
        let mut big = vec![0u8; 1001];
        assert!(decompress_exact(&c, &mut big, "t").is_err());
        assert!(decompress_bounded(&c, 10, "t").is_err());
    }

    #[test]
    fn trailing_bytes_after_frame_are_rejected() {
        let mut c = compress(&[1u8; 100], 3);
        c.extend_from_slice(&compress(&[2u8; 100], 3));
        let mut out = vec![0u8; 100];
        assert!(decompress_exact(&c, &mut out, "t").is_err());
    }

    #[test]
    fn window_above_limit_is_rejected() {
        // A streamed frame without content size keeps its window descriptor
        // of 2^28.
        use std::io::Write;
        let data = vec![3u8; 4096];
        let mut e = ::zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        e.window_log(28).unwrap();
        e.include_contentsize(false).unwrap();
        // Two writes with a flush between: zstd cannot see the input size,
        // so it keeps the requested window.
        e.write_all(&data[..2048]).unwrap();
        e.flush().unwrap();
        e.write_all(&data[2048..]).unwrap();
        let c = e.finish().unwrap();
        assert_eq!(c[4] & 0x20, 0, "frame has a window descriptor");
        assert_eq!(10 + (c[5] >> 3) as u32, 28, "window log in the descriptor");
        let mut out = vec![0u8; data.len()];
        let err = decompress_exact(&c, &mut out, "t").unwrap_err();
        assert!(
            matches!(err, CodecError::WindowTooLarge { log: 28 }),
            "{err:?}"
        );
    }
}
