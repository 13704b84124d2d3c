//! Fetching the structure of a `Z4AI` frame whose bytes come on demand
//! ([`fetch_structure`]): its headers and tables, without the payloads.

use crate::plane;
use std::ops::Range;

/// Bytes read ahead by each step of [`fetch_structure`] (one request
/// usually covers a frame header, or a plane header with its table).
const STRUCTURE_LOOKAHEAD: usize = 16 << 10;

/// Makes valid, through `have`, the bytes of a `Z4AI` frame that parsing
/// its structure reads (the frame header, each plane's header, the zstd
/// block tables and the rANS headers, chunk tables and frequency blobs),
/// without the block payloads, for a frame whose bytes are fetched on
/// demand. `frame` is the whole frame, valid only where `have` was called;
/// each field is read only after `have` covered it, and every offset is
/// checked against `frame.len()` before use.
///
/// Returns false when the frame cannot be read block by block (another
/// magic, a plane of method 1, 3 or 5, or a structure that does not add
/// up): then the caller fetches the whole frame, and parsing it reports
/// any error as usual. `have` may make more bytes valid than asked (it
/// reads ahead [`STRUCTURE_LOOKAHEAD`]); errors of `have` are returned.
pub fn fetch_structure(
    frame: &[u8],
    have: &mut dyn FnMut(Range<usize>) -> std::io::Result<()>,
) -> std::io::Result<bool> {
    let len = frame.len();
    let mut pos = 0usize;
    // Where `n` bytes from `at` end; None past the frame's end.
    let end_of = |at: usize, n: u64| {
        usize::try_from(n)
            .ok()
            .and_then(|n| at.checked_add(n))
            .filter(|&e| e <= len)
    };
    // The next `n` bytes, made valid first; None past the frame's end.
    let mut take = |pos: &mut usize, n: u64| -> std::io::Result<Option<&[u8]>> {
        let Some(end) = end_of(*pos, n) else {
            return Ok(None);
        };
        if end > *pos {
            have(*pos..end.max(*pos + STRUCTURE_LOOKAHEAD).min(len))?;
        }
        let s = &frame[*pos..end];
        *pos = end;
        Ok(Some(s))
    };
    let le = |s: &[u8]| s.iter().rev().fold(0u64, |a, &b| a << 8 | b as u64);
    macro_rules! field {
        ($n:expr) => {
            match take(&mut pos, $n)? {
                Some(s) => s,
                None => return Ok(false),
            }
        };
    }
    let head = field!(10);
    if &head[..4] != b"Z4AI" {
        return Ok(false);
    }
    let n_planes = head[8];
    let np_len = head[9];
    field!(np_len as u64);
    let dlen = field!(1)[0];
    field!(dlen as u64);
    let ndim = field!(1)[0];
    field!(ndim as u64 * 8);
    let tail_len = le(field!(4));
    field!(tail_len);
    for _ in 0..n_planes {
        let h = field!(17);
        let (method, comp_len) = (h[0], le(&h[9..17]));
        let Some(end) = end_of(pos, comp_len) else {
            return Ok(false);
        };
        match method {
            plane::STORE => {}
            plane::ZSTD_BLOCKS | plane::RANS32 => {
                let n = le(&field!(8)[4..8]);
                field!(n.saturating_mul(4));
            }
            plane::RANS_ADAPT => {
                if le(field!(8)) != 0 {
                    let kf = field!(8);
                    let (k, fbl) = (le(&kf[..4]), le(&kf[4..8]));
                    field!((k * 4).saturating_add(fbl));
                }
            }
            _ => return Ok(false),
        }
        if pos > end {
            return Ok(false);
        }
        pos = end;
    }
    Ok(pos == len)
}
