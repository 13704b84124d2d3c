//! The split-float transform (frame transform 3, doc/FORMAT.md §1): each
//! `w`-byte little-endian element rotated left by one bit, so that the sign
//! sits in bit 0 beside the low mantissa bits and the top byte holds the
//! exponent (bf16, fp32) or the exponent and the top mantissa bits (fp16).
//! [`split`] cuts elements into the top-byte plane and the plane of the
//! other `w − 1` bytes; [`join`] puts them back.
//!
//! [`join`] writes every byte of its output. Its bf16/fp16 and fp32 loops
//! are plain Rust that the compiler vectorises; on CPUs with AVX2 the same
//! loops are compiled for AVX2.

/// Rotates a `w`-byte value (in the low `8w` bits) left by one bit.
fn rotl1(x: u64, w: usize) -> u64 {
    let bits = 8 * w as u32;
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1 << bits) - 1
    };
    ((x << 1) | (x >> (bits - 1))) & mask
}

/// Cuts `n = raw.len() / w` elements (`raw.len()` a multiple of `w`) into
/// their top bytes and their other bytes, after the rotation.
pub fn split(raw: &[u8], w: usize) -> (Vec<u8>, Vec<u8>) {
    assert!((2..=8).contains(&w) && raw.len().is_multiple_of(w));
    let n = raw.len() / w;
    // Written through zipped iterators, not pushed, so that the two
    // common widths vectorise.
    let mut top = vec![0u8; n];
    let mut rest = vec![0u8; n * (w - 1)];
    if w == 2 {
        for ((e, t), r) in raw.chunks_exact(2).zip(&mut top).zip(&mut rest) {
            let x = u16::from_le_bytes([e[0], e[1]]).rotate_left(1);
            *t = (x >> 8) as u8;
            *r = x as u8;
        }
        return (top, rest);
    }
    if w == 4 {
        for ((e, t), r) in raw
            .chunks_exact(4)
            .zip(&mut top)
            .zip(rest.chunks_exact_mut(3))
        {
            let x = u32::from_le_bytes([e[0], e[1], e[2], e[3]])
                .rotate_left(1)
                .to_le_bytes();
            *t = x[3];
            r.copy_from_slice(&x[..3]);
        }
        return (top, rest);
    }
    let (mut top_i, mut rest_i) = (0, 0);
    for e in raw.chunks_exact(w) {
        let mut b = [0u8; 8];
        b[..w].copy_from_slice(e);
        let r = rotl1(u64::from_le_bytes(b), w).to_le_bytes();
        rest[rest_i..rest_i + w - 1].copy_from_slice(&r[..w - 1]);
        top[top_i] = r[w - 1];
        rest_i += w - 1;
        top_i += 1;
    }
    (top, rest)
}

#[inline(always)]
fn join2(top: &[u8], rest: &[u8], out: &mut [u8]) {
    for ((o, &t), &r) in out.chunks_exact_mut(2).zip(top).zip(rest) {
        let x = (t as u16) << 8 | r as u16;
        o.copy_from_slice(&x.rotate_right(1).to_le_bytes());
    }
}

#[inline(always)]
fn join4(top: &[u8], rest: &[u8], out: &mut [u8]) {
    for ((o, &t), r) in out.chunks_exact_mut(4).zip(top).zip(rest.chunks_exact(3)) {
        let x = (t as u32) << 24 | (r[2] as u32) << 16 | (r[1] as u32) << 8 | r[0] as u32;
        o.copy_from_slice(&x.rotate_right(1).to_le_bytes());
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn join2_avx2(top: &[u8], rest: &[u8], out: &mut [u8]) {
    join2(top, rest, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn join4_avx2(top: &[u8], rest: &[u8], out: &mut [u8]) {
    join4(top, rest, out)
}

/// Joins `top.len()` elements of `w` bytes into `out`; the lengths must
/// agree (`rest.len() == top.len() * (w − 1)`, `out.len() == top.len() * w`).
pub fn join(w: usize, top: &[u8], rest: &[u8], out: &mut [u8]) {
    let n = top.len();
    assert!(
        (2..=8).contains(&w) && rest.len() == n * (w - 1) && out.len() == n * w,
        "split::join: lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: the CPU has AVX2 (checked).
        match w {
            2 => return unsafe { join2_avx2(top, rest, out) },
            4 => return unsafe { join4_avx2(top, rest, out) },
            _ => {}
        }
    }
    match w {
        2 => join2(top, rest, out),
        4 => join4(top, rest, out),
        _ => {
            let bits = 8 * w as u32;
            for ((o, &t), r) in out
                .chunks_exact_mut(w)
                .zip(top)
                .zip(rest.chunks_exact(w - 1))
            {
                let mut b = [0u8; 8];
                b[..w - 1].copy_from_slice(r);
                b[w - 1] = t;
                let x = u64::from_le_bytes(b);
                let v = (x >> 1) | ((x & 1) << (bits - 1));
                o.copy_from_slice(&v.to_le_bytes()[..w]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn split_then_join_is_the_identity(w in 2usize..=8, raw in proptest::collection::vec(any::<u8>(), 0..400)) {
            let raw = &raw[..raw.len() / w * w];
            let (top, rest) = split(raw, w);
            let mut out = vec![0x5Au8; raw.len()];
            join(w, &top, &rest, &mut out);
            prop_assert_eq!(&out[..], raw);
        }
    }

    #[test]
    fn bf16_top_byte_is_the_exponent() {
        // -1.5 in bf16: sign 1, exponent 127, mantissa 0b1000000.
        let (top, rest) = split(&0xBFC0u16.to_le_bytes(), 2);
        assert_eq!(top, [127]);
        assert_eq!(rest, [0b1000_0001]);
    }
}
