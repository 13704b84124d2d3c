//! The order-1 rANS decoder, plane method 5 (spec §4.4, decode only: ckptfs
//! never writes it). A payload holds one zstd-packed model (a 12-bit table
//! per context byte) and `k` chunks of 4 segments each.
//!
//! Invariants: the model is checked (rows sum to 4096, context 0 present)
//! before decoding; a context without a row decodes through a row of zero
//! entries (every index stays inside the fixed 256-row table) and is
//! reported as an error afterwards, so a bad payload gives an error,
//! never a panic or an out-of-bounds read. Output is exactly `out.len()`.

use super::{
    careful_read, chunk_offsets, length_mismatch, out_len_is_large, rans_err, split_chunks,
    zstd_decode_first_frame, O1_PROB_BITS, O1_SCALE, RANS_L,
};
use crate::{CodecError, Result};
use ckptfs_format::cursor::Cursor;
use rayon::prelude::*;

/// Segments per order-1 chunk; z4ai ignores the header byte and assumes 4.
const O1_NSEG: usize = 4;
/// Largest valid order-1 model blob: 256 rows of `u8 c; u16 nsym; 256 × 3`.
const O1_MODEL_MAX: usize = 256 * (3 + 256 * 3);

// ---------------------------------------------------------------------------
// Method 5: order-1
// ---------------------------------------------------------------------------

/// Order-1 decode tables: 256 rows of 4096 packed entries
/// `sym | (freq-1) << 8 | (slot-cum) << 20`, the row of context `c` at
/// `c << 12`, so that the next row's offset is the decoded symbol shifted
/// (no lookup between one step and the next). Rows of absent contexts are
/// left zero and never written (the allocation is zeroed lazily, so they
/// cost address space, not memory): an entry of zero decodes symbol 0 with
/// frequency 1, which keeps the state in range, and a payload that reaches
/// such a row is reported as an error after decoding.
struct O1Model {
    tab: Box<[u32; 1 << 20]>,
    present: [bool; 256],
    /// Some present row gives non-zero probability to a symbol without a row
    /// (legal only if that symbol only ends segments): check after decoding.
    missing_reachable: bool,
}

/// Offset in [`O1Model::tab`] of the row of the context `sym`.
#[inline(always)]
fn row_of(sym: u32) -> u32 {
    (sym & 0xFF) << O1_PROB_BITS
}

impl O1Model {
    fn from_blob(blob: &[u8]) -> Result<Self> {
        use ::zstd::zstd_safe;
        // z4ai decodes the blob without a size hint: the content size is
        // mandatory. It also bounds our decode.
        let size = match zstd_safe::get_frame_content_size(blob) {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(CodecError::Zstd(
                    "order-1 model blob: frame has no content size".into(),
                ))
            }
            Err(_) => {
                return Err(CodecError::Zstd(
                    "order-1 model blob: bad frame header".into(),
                ))
            }
        };
        if size > O1_MODEL_MAX as u64 {
            return Err(CodecError::invalid(
                "order-1 model",
                format!("content size {size} exceeds {O1_MODEL_MAX}"),
            ));
        }
        let raw = zstd_decode_first_frame(blob, size as usize, "order-1 model blob")?;
        if raw.len() as u64 != size {
            return Err(length_mismatch(
                "order-1 model blob",
                raw.len() as u64,
                size as usize,
            ));
        }
        Self::from_raw(&raw)
    }

    fn from_raw(raw: &[u8]) -> Result<Self> {
        let mut freq = vec![[0u16; 256]; 256];
        let mut c = Cursor::new(raw);
        while c.remaining() > 0 {
            let ctx = usize::from(c.u8("order-1 model row")?);
            let nsym = c.u16("order-1 model row")?;
            let entries = c.take(3 * u64::from(nsym), "order-1 model row entries")?;
            for e in entries.chunks_exact(3) {
                freq[ctx][usize::from(e[0])] = u16::from_le_bytes([e[1], e[2]]);
            }
        }
        let mut present = [false; 256];
        for (ctx, row) in freq.iter().enumerate() {
            let sum: u32 = row.iter().map(|&v| u32::from(v)).sum();
            if sum == 0 {
                continue;
            }
            if sum != O1_SCALE {
                return Err(rans_err(format!(
                    "order-1 row {ctx} sums to {sum}, not {O1_SCALE}"
                )));
            }
            present[ctx] = true;
        }
        let rs = O1_SCALE as usize;
        // 4 MiB whatever the payload says, asked for zeroed (`alloc_zeroed`).
        let mut tab: Box<[u32; 1 << 20]> = vec![0u32; 256 * rs]
            .into_boxed_slice()
            .try_into()
            .expect("256 rows of 4096");
        let mut missing_reachable = false;
        for ctx in 0..256 {
            if !present[ctx] {
                continue;
            }
            let row = &mut tab[ctx * rs..(ctx + 1) * rs];
            let mut cum = 0usize;
            for (s, &f) in freq[ctx].iter().enumerate() {
                if f == 0 {
                    continue;
                }
                missing_reachable |= !present[s];
                let f = usize::from(f);
                let hi = (s as u32) | ((f as u32 - 1) << 8);
                for (j, e) in row[cum..cum + f].iter_mut().enumerate() {
                    *e = hi | ((j as u32) << 20);
                }
                cum += f;
            }
        }
        Ok(O1Model {
            tab,
            present,
            missing_reachable,
        })
    }
}

/// One order-1 step: `base` is the current context's row offset
/// ([`row_of`]).
#[inline(always)]
fn o1_step(
    x: &mut u32,
    base: &mut u32,
    m: &O1Model,
    p: &mut usize,
    read2: impl Fn(usize) -> u32,
) -> u8 {
    let v = *x;
    let e = m.entry(*base, v);
    let f = ((e >> 8) & 0xFFF) + 1;
    let v = f * (v >> O1_PROB_BITS) + (e >> 20);
    let nb = u32::from(v < RANS_L) + u32::from(v < (RANS_L >> 8));
    let sh = nb * 8;
    let two = read2(*p);
    *x = (v << sh) | (two >> (16 - sh));
    *p += nb as usize;
    *base = row_of(e);
    e as u8
}

impl O1Model {
    /// The entry for state `x` in the row at `base`.
    #[inline(always)]
    fn entry(&self, base: u32, x: u32) -> u32 {
        self.tab[((base | (x & (O1_SCALE - 1))) & 0xF_FFFF) as usize]
    }
}

/// One segment being decoded: its state, context row, position in its
/// substream, and its output.
struct Segment<'a> {
    x: u32,
    base: u32,
    pos: usize,
    sub: &'a [u8],
    out: &'a mut [u8],
}

/// The 4 segments of one chunk (`payload`, decoding to `out`), checked and
/// ready to decode.
fn o1_segments<'a>(payload: &'a [u8], out: &'a mut [u8]) -> Result<[Segment<'a>; O1_NSEG]> {
    let cn = out.len() as u64;
    let mut c = Cursor::new(payload);
    let mut sublens = [0u64; O1_NSEG];
    for s in &mut sublens {
        *s = u64::from(c.u32("order-1 substream lengths")?);
    }
    let mut subs: [&[u8]; O1_NSEG] = [&[]; O1_NSEG];
    for (s, &l) in subs.iter_mut().zip(&sublens) {
        *s = c.take(l, "order-1 substream")?;
    }
    // Segment l covers [cn*l/4, cn*(l+1)/4).
    let b: [usize; O1_NSEG + 1] =
        std::array::from_fn(|l| (cn * l as u64 / O1_NSEG as u64) as usize);
    let mut x = [0u32; O1_NSEG];
    for l in 0..O1_NSEG {
        if b[l + 1] > b[l] {
            if subs[l].len() < 4 {
                return Err(CodecError::Truncated {
                    what: "order-1 substream state",
                    need: 4,
                    have: subs[l].len() as u64,
                });
            }
            x[l] = u32::from_le_bytes(subs[l][..4].try_into().unwrap());
            if x[l] < RANS_L {
                return Err(rans_err(format!(
                    "order-1 segment {l} state {:#x} is below RANS_L",
                    x[l]
                )));
            }
        }
    }
    let (o0, rest) = out.split_at_mut(b[1]);
    let (o1, rest) = rest.split_at_mut(b[2] - b[1]);
    let (o2, o3) = rest.split_at_mut(b[3] - b[2]);
    let mut outs = [o0, o1, o2, o3].into_iter();
    Ok(std::array::from_fn(|l| Segment {
        x: x[l],
        base: row_of(0),
        pos: 4,
        sub: subs[l],
        out: outs.next().expect("4 segments"),
    }))
}

/// Decodes `segs` to the end: their common length in lock-step (each
/// segment is an independent chain of table loads, so the four keep four
/// loads in flight), then each one's remaining symbols. A segment that
/// used a context without a row is an error.
fn o1_decode_segments(m: &O1Model, segs: &mut [Segment<'_>; O1_NSEG]) -> Result<()> {
    let common = segs.iter().map(|s| s.out.len()).min().unwrap_or(0);
    let mut i = 0usize;
    while i < common {
        let safe = segs
            .iter()
            .map(|s| s.sub.len().saturating_sub(s.pos) / 2)
            .min()
            .unwrap_or(0);
        let batch = safe.min(common - i);
        if batch >= 8 {
            let mut x: [u32; O1_NSEG] = std::array::from_fn(|l| segs[l].x);
            let mut base: [u32; O1_NSEG] = std::array::from_fn(|l| segs[l].base);
            // Stream positions as pointers and the outputs as pointers, so
            // that the loop state stays in registers (slice positions and
            // output slices spilled, and a state kept on the stack puts a
            // store-to-load delay on every step).
            // SAFETY: pos <= sub.len() (checked by `safe` above).
            let mut q: [*const u8; O1_NSEG] =
                std::array::from_fn(|l| unsafe { segs[l].sub.as_ptr().add(segs[l].pos) });
            let w: [*mut u8; O1_NSEG] =
                std::array::from_fn(|l| segs[l].out[i..i + batch].as_mut_ptr());
            for t in 0..batch {
                for l in 0..O1_NSEG {
                    let v = x[l];
                    let e = m.entry(base[l], v);
                    let f = ((e >> 8) & 0xFFF) + 1;
                    let v = f * (v >> O1_PROB_BITS) + (e >> 20);
                    let nb = u32::from(v < RANS_L) + u32::from(v < (RANS_L >> 8));
                    let sh = nb * 8;
                    // SAFETY: `batch` <= (sub.len() - pos at batch start) / 2
                    // and each step advances by at most 2, so the 2 bytes
                    // read here lie inside the substream.
                    let two = u32::from(u16::from_be_bytes(unsafe {
                        q[l].cast::<[u8; 2]>().read_unaligned()
                    }));
                    x[l] = (v << sh) | (two >> (16 - sh));
                    // SAFETY: as above, the new position stays inside.
                    q[l] = unsafe { q[l].add(nb as usize) };
                    base[l] = row_of(e);
                    // SAFETY: t < batch, the length of each output window.
                    unsafe { *w[l].add(t) = e as u8 };
                }
            }
            for (l, s) in segs.iter_mut().enumerate() {
                s.x = x[l];
                s.base = base[l];
                // SAFETY: q[l] was derived from s.sub and stays inside it.
                s.pos = unsafe { q[l].offset_from(s.sub.as_ptr()) } as usize;
            }
            i += batch;
        } else {
            for s in segs.iter_mut() {
                let sub = s.sub;
                s.out[i] = o1_step(&mut s.x, &mut s.base, m, &mut s.pos, |p| {
                    careful_read(sub, p)
                });
            }
            i += 1;
        }
    }
    for s in segs.iter_mut() {
        let sub = s.sub;
        for o in s.out[common..].iter_mut() {
            *o = o1_step(&mut s.x, &mut s.base, m, &mut s.pos, |p| {
                careful_read(sub, p)
            });
        }
        if m.missing_reachable && s.out.len() > 1 {
            // A symbol with no row was used as a context (its zero row
            // decoded garbage from then on): the payload is invalid.
            if let Some(&c) = s.out[..s.out.len() - 1]
                .iter()
                .find(|&&c| !m.present[usize::from(c)])
            {
                return Err(rans_err(format!("order-1 context {c} has no model row")));
            }
        }
    }
    Ok(())
}

/// Decodes one order-1 chunk (4 segments in lock-step) into `out`. (Two
/// chunks' eight segments in lock-step measured no faster on a Zen 3:
/// their loop state no longer fits in registers.)
fn o1_decode_chunk(m: &O1Model, payload: &[u8], out: &mut [u8]) -> Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    o1_decode_segments(m, &mut o1_segments(payload, out)?)
}

/// Plane method 5 (order-1): decode the whole payload into `out`
/// (`out.len()` = the plane's `orig_len`). The `nseg` header byte is ignored
/// and 4 segments are assumed, as z4ai does; the context resets to 0 at every
/// segment start. Parallel over chunks for planes of at least 1 MiB.
pub fn decode_method5(payload: &[u8], out: &mut [u8]) -> Result<()> {
    let mut c = Cursor::new(payload);
    let magic = c.take(2, "order-1 header")?;
    if magic != b"R1" {
        return Err(CodecError::invalid(
            "order-1 payload",
            "bad magic (expected \"R1\")",
        ));
    }
    let _nseg = c.u8("order-1 header")?;
    let _pad = c.u8("order-1 header")?;
    let n = u64::from(c.u32("order-1 header")?);
    let blob_len = c.u32("order-1 header")?;
    let k = usize::from(c.u16("order-1 header")?);
    if n != out.len() as u64 {
        return Err(length_mismatch("order-1 plane", n, out.len()));
    }
    if n == 0 {
        return Ok(());
    }
    let blob = c.take(u64::from(blob_len), "order-1 model blob")?;
    if k == 0 {
        return Err(CodecError::invalid(
            "order-1 payload",
            format!("0 chunks for {n} symbols"),
        ));
    }
    let clens = c.take(4 * k as u64, "order-1 chunk lengths")?;
    let body = c.rest();
    let starts = chunk_offsets(clens, body.len(), "order-1 chunk payloads")?;
    let model = O1Model::from_blob(blob)?;
    if !model.present[0] {
        return Err(rans_err("order-1 model has no row for context 0"));
    }
    let parts = split_chunks(out, k);
    let job =
        |(j, o): (usize, &mut [u8])| o1_decode_chunk(&model, &body[starts[j]..starts[j + 1]], o);
    if out_len_is_large(n) && k > 1 {
        parts.into_par_iter().enumerate().try_for_each(job)
    } else {
        parts.into_iter().enumerate().try_for_each(job)
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::rans::test_util::Rng;
    use crate::rans::test_util::*;
    use crate::rans::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn method5_roundtrip(data in data_strategy(), k in prop_oneof![Just(1usize), 1usize..6, 1usize..200]) {
            let p = o1_encode(&data, k);
            let mut out = vec![0u8; data.len()];
            decode_method5(&p, &mut out).unwrap();
            prop_assert_eq!(&out, &data);
        }
    }

    #[test]
    fn method5_edge_cases() {
        // segments with 0 or 1 symbols, chunk sizes not multiple of 4
        for n in 0..30usize {
            let d: Vec<u8> = (0..n).map(|i| (i * 7 % 3) as u8 + 10).collect();
            for k in [1usize, 2, 3, 9] {
                let p = o1_encode(&d, k);
                let mut out = vec![0u8; n];
                decode_method5(&p, &mut out).unwrap();
                assert_eq!(out, d, "n={n} k={k}");
            }
        }
        // symbol 99 only at segment ends: it has no row (legal).
        let mut d = vec![1u8; 400];
        for l in 1..=4 {
            d[100 * l - 1] = 99;
        }
        let p = o1_encode(&d, 1);
        let mut out = vec![0u8; d.len()];
        decode_method5(&p, &mut out).unwrap();
        assert_eq!(out, d);
        // large, parallel path, 256 symbols
        let mut r = Rng(8);
        let d: Vec<u8> = (0..2_500_000)
            .map(|i| {
                if i % 3 == 0 {
                    r.next() as u8
                } else {
                    (r.next() % 4) as u8
                }
            })
            .collect();
        let p = o1_encode(&d, 3);
        let mut out = vec![0u8; d.len()];
        decode_method5(&p, &mut out).unwrap();
        assert_eq!(out, d);
    }

    // ----- malformed input -----

    #[test]
    fn rejects_bad_order1_payloads() {
        let d = exponent_data(20_000, 3);
        let p = o1_encode(&d, 2);
        let mut out = vec![0u8; d.len()];
        decode_method5(&p, &mut out).unwrap();
        for cut in (0..p.len()).step_by(97) {
            assert!(decode_method5(&p[..cut], &mut out).is_err(), "cut {cut}");
        }
        let mut q = p.clone();
        q[0] = b'X';
        assert!(decode_method5(&q, &mut out).is_err());
        // nseg byte is ignored (z4ai assumes 4)
        let mut q = p.clone();
        q[2] = 2;
        decode_method5(&q, &mut out).unwrap();
        // lying n, k = 0, huge k
        let mut q = p.clone();
        q[4..8].copy_from_slice(&(d.len() as u32 + 1).to_le_bytes());
        assert!(matches!(
            decode_method5(&q, &mut out),
            Err(CodecError::LengthMismatch { .. })
        ));
        let mut q = p.clone();
        q[12..14].copy_from_slice(&0u16.to_le_bytes());
        assert!(decode_method5(&q, &mut out).is_err());
        let mut q = p.clone();
        q[12..14].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(decode_method5(&q, &mut out).is_err());
        // model rows: wrong sum, context 0 missing, used row missing
        let freq = o1_model(&d, 1);
        let mut bad = freq.clone();
        let s = (0..256).find(|&s| bad[0][s] > 1).unwrap();
        bad[0][s] -= 1;
        let q = o1_payload_with(&d, 1, &freq, &o1_serialize(&bad));
        assert!(matches!(
            decode_method5(&q, &mut out),
            Err(CodecError::Rans(_))
        ));
        let mut bad = freq.clone();
        bad[0] = [0; 256];
        let q = o1_payload_with(&d, 1, &freq, &o1_serialize(&bad));
        assert!(decode_method5(&q, &mut out).is_err());
        let mut bad = freq.clone();
        let used = usize::from(d[5]);
        bad[used] = [0; 256];
        let q = o1_payload_with(&d, 1, &freq, &o1_serialize(&bad));
        assert!(matches!(
            decode_method5(&q, &mut out),
            Err(CodecError::Rans(_))
        ));
        // model blob without content size, and one claiming too much
        let raw = o1_serialize(&freq);
        let mut c = ::zstd::bulk::Compressor::new(19).unwrap();
        c.include_contentsize(false).unwrap();
        let blob = c.compress(&raw).unwrap();
        assert_eq!(
            ::zstd::zstd_safe::get_frame_content_size(&blob).unwrap(),
            None
        );
        let q = replace_o1_blob(&p, &blob);
        assert!(matches!(
            decode_method5(&q, &mut out),
            Err(CodecError::Zstd(_))
        ));
        let big = vec![0u8; O1_MODEL_MAX + 1];
        let q = replace_o1_blob(&p, &::zstd::bulk::compress(&big, 1).unwrap());
        assert!(decode_method5(&q, &mut out).is_err());
        // truncated model row
        let mut raw2 = raw.clone();
        raw2.pop();
        let q = replace_o1_blob(&p, &::zstd::bulk::compress(&raw2, 3).unwrap());
        assert!(decode_method5(&q, &mut out).is_err());
        // segment state below RANS_L
        let chunk0 = 14 + u32::from_le_bytes(p[8..12].try_into().unwrap()) as usize + 8;
        let mut q = p.clone();
        q[chunk0 + 16..chunk0 + 20].copy_from_slice(&5u32.to_le_bytes());
        assert!(decode_method5(&q, &mut out).is_err());
    }

    fn replace_o1_blob(p: &[u8], blob: &[u8]) -> Vec<u8> {
        let old = u32::from_le_bytes(p[8..12].try_into().unwrap()) as usize;
        let mut q = p[..14].to_vec();
        q[8..12].copy_from_slice(&(blob.len() as u32).to_le_bytes());
        q.extend_from_slice(blob);
        q.extend_from_slice(&p[14 + old..]);
        q
    }
}
