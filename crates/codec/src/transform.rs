//! Element transforms that turn a tensor into planes and back.
//!
//! - Byte-plane, width w: plane j holds byte j of every little-endian element.
//! - Bit-field: sign bits (packed MSB-first, numpy `packbits` order), the
//!   exponent field one byte per element, and the mantissa field split into
//!   byte planes, low byte first (z4ai's `bitfield.py`).
//!
//! Joins write into a caller-sized output and can start at any element, so a
//! reader can rebuild an element range from partial planes.

use super::{CodecError, Result};
pub use ckptfs_format::frame::{BitfieldSpec, BFLOAT16, FLOAT16, FLOAT32};

/// Splits `body` (a whole number of `w`-byte elements) into `w` planes.
pub fn byteplane_split(body: &[u8], w: usize) -> Vec<Vec<u8>> {
    assert!(w > 0 && body.len().is_multiple_of(w));
    let n = body.len() / w;
    let mut planes: Vec<Vec<u8>> = (0..w).map(|_| vec![0u8; n]).collect();
    match w {
        1 => planes[0].copy_from_slice(body),
        2 => {
            let (p0, p1) = planes.split_at_mut(1);
            for (i, e) in body.chunks_exact(2).enumerate() {
                p0[0][i] = e[0];
                p1[0][i] = e[1];
            }
        }
        _ => {
            for (i, e) in body.chunks_exact(w).enumerate() {
                for (j, p) in planes.iter_mut().enumerate() {
                    p[i] = e[j];
                }
            }
        }
    }
    planes
}

/// Interleaves `planes` (all of length `out.len() / w`) into `out`.
pub fn byteplane_join(planes: &[&[u8]], out: &mut [u8]) -> Result<()> {
    let w = planes.len();
    if w == 0 {
        return if out.is_empty() {
            Ok(())
        } else {
            Err(CodecError::invalid("byte-plane frame", "no planes"))
        };
    }
    let n = out.len() / w;
    if !out.len().is_multiple_of(w) || planes.iter().any(|p| p.len() != n) {
        return Err(CodecError::invalid(
            "byte-plane frame",
            format!("planes of unequal length for {} output bytes", out.len()),
        ));
    }
    match w {
        1 => out.copy_from_slice(planes[0]),
        // Whole words built from the plane bytes: the form the compiler
        // vectorises (indexing four planes per byte did not, and was a
        // tenth of reading an f32 delta).
        2 => {
            let (a, b) = (planes[0], planes[1]);
            for ((o, &x), &y) in out.chunks_exact_mut(2).zip(a).zip(b) {
                let v = u16::from(x) | u16::from(y) << 8;
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        4 => {
            let (a, b, c, d) = (planes[0], planes[1], planes[2], planes[3]);
            for ((o, (&x, &y)), (&z, &t)) in out
                .chunks_exact_mut(4)
                .zip(a.iter().zip(b))
                .zip(c.iter().zip(d))
            {
                let v = u32::from(x) | u32::from(y) << 8 | u32::from(z) << 16 | u32::from(t) << 24;
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        _ => {
            for (i, o) in out.chunks_exact_mut(w).enumerate() {
                for (j, p) in planes.iter().enumerate() {
                    o[j] = p[i];
                }
            }
        }
    }
    Ok(())
}

fn load(e: &[u8]) -> u32 {
    match e.len() {
        2 => u16::from_le_bytes([e[0], e[1]]) as u32,
        _ => u32::from_le_bytes([e[0], e[1], e[2], e[3]]),
    }
}

/// Splits whole elements into [sign, exponent, mantissa...] planes.
pub fn bitfield_split(spec: BitfieldSpec, body: &[u8]) -> Vec<Vec<u8>> {
    let eb = spec.elem_bytes();
    assert!(body.len().is_multiple_of(eb));
    let n = body.len() / eb;
    let mut sign = vec![0u8; n.div_ceil(8)];
    let mut exp = vec![0u8; n];
    let mut mants: Vec<Vec<u8>> = (0..spec.mant_planes()).map(|_| vec![0u8; n]).collect();
    if spec == BFLOAT16 {
        let mant = &mut mants[0];
        for (i, e) in body.chunks_exact(2).enumerate() {
            let (lo, hi) = (e[0], e[1]);
            exp[i] = (hi << 1) | (lo >> 7);
            mant[i] = lo & 0x7f;
        }
        for (s, e) in sign.iter_mut().zip(body.chunks(16)) {
            let mut b = 0u8;
            for (k, el) in e.chunks_exact(2).enumerate() {
                b |= (el[1] >> 7) << (7 - k);
            }
            *s = b;
        }
    } else {
        let emask = (1u32 << spec.exp_bits) - 1;
        let mmask = (1u32 << spec.mant_bits) - 1;
        for (i, e) in body.chunks_exact(eb).enumerate() {
            let u = load(e);
            if u >> (spec.total_bits - 1) != 0 {
                sign[i >> 3] |= 0x80 >> (i & 7);
            }
            exp[i] = ((u >> spec.mant_bits) & emask) as u8;
            let m = u & mmask;
            for (k, p) in mants.iter_mut().enumerate() {
                p[i] = (m >> (8 * k)) as u8;
            }
        }
    }
    // The mantissa byte planes travel as one plane, low byte first.
    let mant = if mants.len() == 1 {
        mants.pop().unwrap()
    } else {
        mants.concat()
    };
    vec![sign, exp, mant]
}

/// Rebuilds `out.len() / elem_bytes` elements from partial planes.
/// `sign` holds the packed sign bits with element 0 of `out` at bit
/// `sign_bit` of `sign[0]` (MSB-first); `exp` and each mantissa plane hold
/// exactly one byte per output element.
pub fn bitfield_join(
    spec: BitfieldSpec,
    sign: &[u8],
    sign_bit: usize,
    exp: &[u8],
    mants: &[&[u8]],
    out: &mut [u8],
) -> Result<()> {
    let eb = spec.elem_bytes();
    let n = out.len() / eb;
    if !out.len().is_multiple_of(eb)
        || exp.len() != n
        || mants.len() != spec.mant_planes()
        || mants.iter().any(|m| m.len() != n)
        || sign_bit >= 8
        || sign.len() * 8 < sign_bit + n
    {
        return Err(CodecError::invalid(
            "bit-field frame",
            format!("plane lengths do not match {n} elements"),
        ));
    }
    if spec == BFLOAT16 {
        bf16_join(sign, sign_bit, exp, mants[0], out);
        return Ok(());
    }
    if spec == FLOAT32 {
        f32_join(sign, sign_bit, exp, mants, out);
        return Ok(());
    }
    let emask = (1u32 << spec.exp_bits) - 1;
    let mmask = (1u32 << spec.mant_bits) - 1;
    for (i, o) in out.chunks_exact_mut(eb).enumerate() {
        let bit = sign_bit + i;
        let s = ((sign[bit >> 3] >> (7 - (bit & 7))) & 1) as u32;
        let mut m = 0u32;
        for (k, p) in mants.iter().enumerate() {
            m |= (p[i] as u32) << (8 * k);
        }
        let u = (s << (spec.total_bits - 1))
            | ((exp[i] as u32 & emask) << spec.mant_bits)
            | (m & mmask);
        o.copy_from_slice(&u.to_le_bytes()[..eb]);
    }
    Ok(())
}

/// For each packed sign byte, the bf16 sign bit (0x8000) of its 8 elements.
static SIGN16: [[u16; 8]; 256] = {
    let mut t = [[0u16; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let mut k = 0;
        while k < 8 {
            t[b][k] = (((b >> (7 - k)) & 1) as u16) << 15;
            k += 1;
        }
        b += 1;
    }
    t
};

/// bf16 join, 8 elements per sign byte where aligned (the hot path of every
/// bit-field read).
fn bf16_join(sign: &[u8], sign_bit: usize, exp: &[u8], mant: &[u8], out: &mut [u8]) {
    #[inline(always)]
    fn put(o: &mut [u8], e: u8, m: u8, s: u8) {
        o[0] = (m & 0x7f) | ((e & 1) << 7);
        o[1] = (e >> 1) | (s << 7);
    }
    let n = exp.len();
    // Unaligned head: elements until the sign bit position is a multiple of 8.
    let head = if sign_bit == 0 {
        0
    } else {
        (8 - sign_bit).min(n)
    };
    for i in 0..head {
        let bit = sign_bit + i;
        put(
            &mut out[2 * i..2 * i + 2],
            exp[i],
            mant[i],
            (sign[bit >> 3] >> (7 - (bit & 7))) & 1,
        );
    }
    let mut head = head;
    #[cfg(target_arch = "x86_64")]
    if super::join_avx512::available() {
        let s = (sign_bit + head) >> 3;
        head += super::join_avx512::bf16_body(
            &sign[s..],
            &exp[head..],
            &mant[head..],
            &mut out[2 * head..],
        );
    }
    let sbase = (sign_bit + head) >> 3;
    let body = (n - head) / 8 * 8;
    let (eo, mo, oo) = (
        &exp[head..head + body],
        &mant[head..head + body],
        &mut out[2 * head..2 * (head + body)],
    );
    for (((e8, m8), o16), &sb) in eo
        .chunks_exact(8)
        .zip(mo.chunks_exact(8))
        .zip(oo.chunks_exact_mut(16))
        .zip(&sign[sbase..])
    {
        // Widen to u16 lanes so the compiler can vectorise the 8 elements;
        // the sign bits come from a table instead of 8 shifts.
        let signs = &SIGN16[sb as usize];
        let mut w = [0u16; 8];
        for k in 0..8 {
            w[k] = signs[k] | ((e8[k] as u16) << 7) | (m8[k] & 0x7f) as u16;
        }
        for (o, v) in o16.chunks_exact_mut(2).zip(w) {
            o.copy_from_slice(&v.to_le_bytes());
        }
    }
    for i in head + body..n {
        let bit = sign_bit + i;
        put(
            &mut out[2 * i..2 * i + 2],
            exp[i],
            mant[i],
            (sign[bit >> 3] >> (7 - (bit & 7))) & 1,
        );
    }
}

/// The sign bits of `n` elements as 64-bit lane masks: element i's sign
/// (bit `sign_bit + i` of `sign`, MSB-first) at bit i % 64 of
/// `masks[i / 64]`, for [`bf16_join_masked`]. Bits past the plane are 0.
pub fn sign_masks(sign: &[u8], sign_bit: usize, n: usize, masks: &mut Vec<u64>) {
    // Eight sign bytes from byte i, each bit-reversed (element order).
    let load = |i: usize| -> u64 {
        let w = match sign.get(i..i + 8) {
            Some(s) => u64::from_le_bytes(s.try_into().expect("8 bytes")),
            None => {
                let mut b = [0u8; 8];
                if let Some(s) = sign.get(i..) {
                    b[..s.len()].copy_from_slice(s);
                }
                u64::from_le_bytes(b)
            }
        };
        w.reverse_bits().swap_bytes()
    };
    let sh = sign_bit % 8;
    let words = n.div_ceil(64);
    masks.clear();
    masks.reserve(words);
    let first = sign_bit / 8;
    let mut cur = load(first);
    for w in 0..words {
        if sh == 0 {
            masks.push(cur);
            cur = load(first + 8 * (w + 1));
        } else {
            let next = load(first + 8 * (w + 1));
            masks.push((cur >> sh) | (next << (64 - sh)));
            cur = next;
        }
    }
}

/// bf16 join whose sign bits come from [`sign_masks`]: element i of `out`
/// takes the sign at bit `first + i` of `masks`. The joined output of a
/// decoder that hands over runs of elements in any order.
pub fn bf16_join_masked(masks: &[u64], first: usize, exp: &[u8], mant: &[u8], out: &mut [u8]) {
    let n = exp.len().min(mant.len()).min(out.len() / 2);
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::join_avx512::available() {
        done = super::join_avx512::bf16_masked_body(masks, first, exp, mant, out);
    } else if super::join_avx2::available() {
        done = super::join_avx2::bf16_masked_body(masks, first, exp, mant, out);
    }
    for i in done..n {
        let at = first + i;
        let s = masks.get(at / 64).map_or(0, |w| (w >> (at % 64)) & 1) as u16;
        let w = (s << 15) | ((exp[i] as u16) << 7) | (mant[i] & 0x7f) as u16;
        out[2 * i..2 * i + 2].copy_from_slice(&w.to_le_bytes());
    }
}

/// [`bf16_join_masked`] of a full round block of the paired rANS decoder,
/// straight from its stages (chunk c's 64 elements from `offsets[c]`; see
/// [`crate::rans::PairSink::stage`]). Returns false, having written
/// nothing, where there is neither AVX-512 nor AVX2 or an element falls
/// outside `out`: the caller then joins chunk by chunk.
pub fn bf16_join_stage(
    masks: &[u64],
    offsets: &[u64; 16],
    chunks: usize,
    exp: &crate::rans::StageRows,
    mant: &crate::rans::StageRows,
    out: &mut [u8],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if stage_fits(offsets, chunks, out.len()) {
        if super::join_avx512::available() {
            super::join_avx512::bf16_stage_body(masks, offsets, chunks, exp, mant, out);
            return true;
        }
        if super::join_avx2::available() {
            super::join_avx2::bf16_stage_body(masks, offsets, chunks, exp, mant, out);
            return true;
        }
    }
    let _ = (masks, offsets, chunks, exp, mant, out);
    false
}

/// Whether chunks `..chunks` (at most 16) of a round block, 64 bf16
/// elements each from `offsets[c]`, lie inside an output of `out_len`
/// bytes.
pub(super) fn stage_fits(offsets: &[u64; 16], chunks: usize, out_len: usize) -> bool {
    let room = out_len as u64 / 2;
    chunks <= 16
        && offsets[..chunks]
            .iter()
            .all(|&o| o.checked_add(64).is_some_and(|e| e <= room))
}

/// float32 bit-field join, 8 elements per sign byte once the sign position
/// is byte-aligned (a block of a frame may start anywhere in a sign byte).
fn f32_join(sign: &[u8], sign_bit: usize, exp: &[u8], mants: &[&[u8]], out: &mut [u8]) {
    let (m0, m1, m2) = (mants[0], mants[1], mants[2]);
    let n = exp.len();
    #[inline(always)]
    fn word(s: u32, e: u8, m2: u8, m1: u8, m0: u8) -> u32 {
        (s << 31)
            | ((e as u32) << 23)
            | (((m2 & 0x7f) as u32) << 16)
            | ((m1 as u32) << 8)
            | m0 as u32
    }
    let one = |i: usize, out: &mut [u8]| {
        let bit = sign_bit + i;
        let s = ((sign[bit >> 3] >> (7 - (bit & 7))) & 1) as u32;
        let u = word(s, exp[i], m2[i], m1[i], m0[i]);
        out[4 * i..4 * i + 4].copy_from_slice(&u.to_le_bytes());
    };
    // Unaligned head: elements until the sign bit position is a multiple of 8.
    let head = if sign_bit == 0 {
        0
    } else {
        (8 - sign_bit).min(n)
    };
    for i in 0..head {
        one(i, out);
    }
    let mut head = head;
    #[cfg(target_arch = "x86_64")]
    {
        let body = if super::join_avx512::available() {
            Some(super::join_avx512::f32_body as fn(_, _, _, _) -> _)
        } else if super::join_avx2::available() {
            Some(super::join_avx2::f32_body as fn(_, _, _, _) -> _)
        } else {
            None
        };
        if let Some(body) = body {
            let s = (sign_bit + head) >> 3;
            head += body(
                &sign[s..],
                &exp[head..],
                [&m0[head..], &m1[head..], &m2[head..]],
                &mut out[4 * head..],
            );
        }
    }
    let sbase = (sign_bit + head) >> 3;
    let body = (n - head) / 8 * 8;
    for (g, o32) in out[4 * head..4 * (head + body)]
        .chunks_exact_mut(32)
        .enumerate()
    {
        let sb = sign[sbase + g];
        let base = head + g * 8;
        let mut w = [0u32; 8];
        for k in 0..8 {
            let i = base + k;
            let s = ((sb >> (7 - k)) & 1) as u32;
            w[k] = word(s, exp[i], m2[i], m1[i], m0[i]);
        }
        for (o, v) in o32.chunks_exact_mut(4).zip(w) {
            o.copy_from_slice(&v.to_le_bytes());
        }
    }
    for i in head + body..n {
        one(i, out);
    }
}

/// Elements per job of the one-plane-at-a-time joins (a multiple of 8, so
/// that every job starts on a sign byte).
const PUT_GROUP: usize = 1 << 20;

/// Runs `f` over every `eb`-byte element of `out` (with its index), in
/// parallel groups for large outputs.
fn for_each_element(out: &mut [u8], eb: usize, f: impl Fn(usize, &mut [u8]) + Sync) {
    use rayon::prelude::*;
    let run = |g: usize, o: &mut [u8]| {
        for (k, e) in o.chunks_exact_mut(eb).enumerate() {
            f(g * PUT_GROUP + k, e);
        }
    };
    if out.len() > PUT_GROUP * eb {
        out.par_chunks_mut(PUT_GROUP * eb)
            .enumerate()
            .for_each(|(g, o)| run(g, o));
    } else {
        run(0, out);
    }
}

/// Writes byte plane `j` of a `w`-byte byte-plane body into `out` (byte `j`
/// of every element), leaving the other bytes as they are: a body is
/// joined one decoded plane at a time, so that only one is held at once.
pub fn byteplane_put(plane: &[u8], j: usize, w: usize, out: &mut [u8]) -> Result<()> {
    if w == 0 || j >= w || out.len() != plane.len() * w {
        return Err(CodecError::invalid(
            "byte-plane frame",
            format!(
                "plane of {} bytes for {} output bytes",
                plane.len(),
                out.len()
            ),
        ));
    }
    for_each_element(out, w, |i, e| e[j] = plane[i]);
    Ok(())
}

/// Adds plane `i` of a bit-field body (0 the packed sign bits, 1 the
/// exponents, 2 the mantissa byte planes concatenated) to the elements in
/// `out`, as [`bitfield_join`] would place it. The mantissa must come first:
/// it overwrites every element; the exponent and sign are ORed in after.
pub fn bitfield_put(spec: BitfieldSpec, i: usize, plane: &[u8], out: &mut [u8]) -> Result<()> {
    let eb = spec.elem_bytes();
    let n = out.len() / eb;
    let want = match i {
        0 => n.div_ceil(8),
        1 => n,
        _ => n * spec.mant_planes(),
    };
    if !out.len().is_multiple_of(eb) || i > 2 || plane.len() != want {
        return Err(CodecError::invalid(
            "bit-field frame",
            format!("plane {i} of {} bytes for {n} elements", plane.len()),
        ));
    }
    let store = |e: &mut [u8], u: u32| e.copy_from_slice(&u.to_le_bytes()[..eb]);
    match i {
        2 => {
            let mmask = (1u32 << spec.mant_bits) - 1;
            let mp = spec.mant_planes();
            for_each_element(out, eb, |k, e| {
                let mut m = 0u32;
                for b in 0..mp {
                    m |= (plane[b * n + k] as u32) << (8 * b);
                }
                store(e, m & mmask);
            });
        }
        1 => {
            let emask = (1u32 << spec.exp_bits) - 1;
            for_each_element(out, eb, |k, e| {
                store(e, load(e) | ((plane[k] as u32 & emask) << spec.mant_bits));
            });
        }
        _ => for_each_element(out, eb, |k, e| {
            let s = ((plane[k >> 3] >> (7 - (k & 7))) & 1) as u32;
            store(e, load(e) | (s << (spec.total_bits - 1)));
        }),
    }
    Ok(())
}

/// Splits whole `w`-byte elements into caller-provided planes (each of
/// `body.len() / w` bytes). Used by the writer on parallel chunks.
pub fn byteplane_split_into(body: &[u8], planes: &mut [&mut [u8]]) {
    let w = planes.len();
    match w {
        2 => {
            let (p0, p1) = planes.split_at_mut(1);
            let (mut body, mut a, mut b) = (body, &mut *p0[0], &mut *p1[0]);
            #[cfg(target_arch = "x86_64")]
            {
                let done = if super::split_avx512::available() {
                    super::split_avx512::bytes2_body(body, a, b)
                } else if super::split_avx2::available() {
                    super::split_avx2::bytes2_body(body, a, b)
                } else {
                    0
                };
                body = &body[2 * done..];
                a = &mut std::mem::take(&mut a)[done..];
                b = &mut std::mem::take(&mut b)[done..];
            }
            for ((e, a), b) in body.chunks_exact(2).zip(a.iter_mut()).zip(b.iter_mut()) {
                *a = e[0];
                *b = e[1];
            }
        }
        4 => {
            let [p0, p1, p2, p3] = planes else {
                unreachable!()
            };
            #[allow(unused_mut)]
            let mut done = 0;
            #[cfg(target_arch = "x86_64")]
            if super::split_avx2::available() {
                done = super::split_avx2::bytes4_body(body, [p0, p1, p2, p3]);
            }
            let (p0, p1, p2, p3) = (
                &mut p0[done..],
                &mut p1[done..],
                &mut p2[done..],
                &mut p3[done..],
            );
            for (i, e) in body[4 * done..].chunks_exact(4).enumerate() {
                p0[i] = e[0];
                p1[i] = e[1];
                p2[i] = e[2];
                p3[i] = e[3];
            }
        }
        _ => {
            for (i, e) in body.chunks_exact(w).enumerate() {
                for (j, p) in planes.iter_mut().enumerate() {
                    p[i] = e[j];
                }
            }
        }
    }
}

/// bf16 bit-field split into caller-provided planes; `body` must start on an
/// element index that is a multiple of 8 (so sign bytes are whole).
pub fn bf16_split_into(body: &[u8], sign: &mut [u8], exp: &mut [u8], mant: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::split_avx512::available() || super::split_avx2::available() {
        let done = if super::split_avx512::available() {
            super::split_avx512::bf16_body(body, sign, exp, mant)
        } else {
            super::split_avx2::bf16_body(body, sign, exp, mant)
        };
        return bf16_split_scalar(
            &body[2 * done..],
            &mut sign[done / 8..],
            &mut exp[done..],
            &mut mant[done..],
        );
    }
    bf16_split_scalar(body, sign, exp, mant)
}

/// float32 bit-field split into caller-provided planes: the packed sign
/// bits, the exponent byte, and the three mantissa byte planes (low,
/// middle, top 7 bits) of every element, as [`bitfield_split`] with
/// [`FLOAT32`] makes them; `body` must start on an element index that is a
/// multiple of 8 (so sign bytes are whole).
pub fn f32_split_into(body: &[u8], sign: &mut [u8], exp: &mut [u8], mant: [&mut [u8]; 3]) {
    let [m0, m1, m2] = mant;
    #[cfg(target_arch = "x86_64")]
    if super::split_avx512::available() || super::split_avx2::available() {
        let mant = [&mut *m0, &mut *m1, &mut *m2];
        let done = if super::split_avx512::available() {
            super::split_avx512::f32_body(body, sign, exp, mant)
        } else {
            super::split_avx2::f32_body(body, sign, exp, mant)
        };
        return f32_split_scalar(
            &body[4 * done..],
            &mut sign[done / 8..],
            &mut exp[done..],
            [&mut m0[done..], &mut m1[done..], &mut m2[done..]],
        );
    }
    f32_split_scalar(body, sign, exp, [m0, m1, m2])
}

fn f32_split_scalar(body: &[u8], sign: &mut [u8], exp: &mut [u8], mant: [&mut [u8]; 3]) {
    let [m0, m1, m2] = mant;
    let n = body.len() / 4;
    for (i, e) in body.chunks_exact(4).enumerate() {
        let u = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
        exp[i] = (u >> 23) as u8;
        m0[i] = u as u8;
        m1[i] = (u >> 8) as u8;
        m2[i] = ((u >> 16) & 0x7f) as u8;
    }
    for (j, s) in sign.iter_mut().take(n.div_ceil(8)).enumerate() {
        let mut b = 0u8;
        for (k, e) in body[32 * j..(32 * j + 32).min(4 * n)]
            .chunks_exact(4)
            .enumerate()
        {
            b |= (e[3] >> 7) << (7 - k);
        }
        *s = b;
    }
}

fn bf16_split_scalar(body: &[u8], sign: &mut [u8], exp: &mut [u8], mant: &mut [u8]) {
    let full = body.len() / 16;
    for (((b16, s), x8), m8) in body
        .chunks_exact(16)
        .zip(sign.iter_mut())
        .zip(exp.chunks_exact_mut(8))
        .zip(mant.chunks_exact_mut(8))
    {
        // u16 lanes so the compiler can vectorise the 8 elements.
        let mut u = [0u16; 8];
        for k in 0..8 {
            u[k] = u16::from_le_bytes([b16[2 * k], b16[2 * k + 1]]);
        }
        let mut sb = 0u16;
        for k in 0..8 {
            x8[k] = (u[k] >> 7) as u8;
            m8[k] = (u[k] & 0x7f) as u8;
            sb |= (u[k] >> 15) << (7 - k);
        }
        *s = sb as u8;
    }
    let rest = &body[full * 16..];
    if !rest.is_empty() {
        let mut sb = 0u8;
        for (k, e) in rest.chunks_exact(2).enumerate() {
            let (lo, hi) = (e[0], e[1]);
            exp[full * 8 + k] = (hi << 1) | (lo >> 7);
            mant[full * 8 + k] = lo & 0x7f;
            sb |= (hi >> 7) << (7 - k);
        }
        sign[full] = sb;
    }
}

#[cfg(test)]
mod tests;
