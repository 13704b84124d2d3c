//! AVX2 bodies of the writer's plane splits, for CPUs without AVX-512
//! (`split_avx512` has the same functions with `vpmov*` narrowing): the
//! bf16 and float32 bit-field splits and the 2- and 4-byte byte-plane
//! splits, 32 elements per step.
//!
//! The bytes of each element are sorted into planes with one in-lane byte
//! shuffle per vector, a transpose of 32-bit groups across the vectors
//! (unpack), and one cross-lane permute per plane; bit fields that straddle
//! bytes (a float32 exponent, the bf16 exponent) are then put together
//! from the byte planes, and the sign bits are the top bits of the high
//! plane (`movemask`). Used only after a runtime CPU check ([`available`]);
//! the callers in `transform` keep the portable loops for tails, and both
//! give the same bytes (tested below against those loops).

use std::arch::x86_64::*;

pub(super) use super::has_avx2 as available;
use super::split_avx512::msb_first;

/// The byte planes of 32 four-byte elements at `p`: `[b0, b1, b2, b3]`,
/// each holding byte k of elements 0..32 in order.
///
/// # Safety
/// AVX2; `p..p + 128` readable.
#[inline(always)]
unsafe fn planes4(p: *const u8) -> [__m256i; 4] {
    // SAFETY: per the contract.
    unsafe {
        // In each 128-bit lane: byte k of its 4 elements into 32-bit group k.
        let sort = _mm256_setr_epi8(
            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6,
            10, 14, 3, 7, 11, 15,
        );
        let v: [__m256i; 4] = std::array::from_fn(|i| {
            _mm256_shuffle_epi8(_mm256_loadu_si256(p.add(32 * i).cast()), sort)
        });
        // 4x4 transpose of 32-bit groups per lane: t_k = group k of v0..v3.
        let lo01 = _mm256_unpacklo_epi32(v[0], v[1]);
        let hi01 = _mm256_unpackhi_epi32(v[0], v[1]);
        let lo23 = _mm256_unpacklo_epi32(v[2], v[3]);
        let hi23 = _mm256_unpackhi_epi32(v[2], v[3]);
        let t = [
            _mm256_unpacklo_epi64(lo01, lo23),
            _mm256_unpackhi_epi64(lo01, lo23),
            _mm256_unpacklo_epi64(hi01, hi23),
            _mm256_unpackhi_epi64(hi01, hi23),
        ];
        // Lane 0 holds elements 0-3, 8-11, 16-19, 24-27 and lane 1 the
        // next four of each: interleave the lanes' groups.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        t.map(|x| _mm256_permutevar8x32_epi32(x, order))
    }
}

/// The low and high byte planes of 32 two-byte elements at `p`.
///
/// # Safety
/// AVX2; `p..p + 64` readable.
#[inline(always)]
unsafe fn planes2(p: *const u8) -> [__m256i; 2] {
    // SAFETY: per the contract.
    unsafe {
        // In each lane: the 8 low bytes, then the 8 high bytes.
        let sort = _mm256_setr_epi8(
            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3,
            5, 7, 9, 11, 13, 15,
        );
        let a = _mm256_shuffle_epi8(_mm256_loadu_si256(p.cast()), sort);
        let b = _mm256_shuffle_epi8(_mm256_loadu_si256(p.add(32).cast()), sort);
        // 64-bit groups: [a lo 0-7, a lo 8-15, b lo 16-23, b lo 24-31].
        let lo = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_unpacklo_epi64(a, b));
        let hi = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_unpackhi_epi64(a, b));
        [lo, hi]
    }
}

/// `x >> 7` of every byte (the top bit, as 0 or 1).
#[inline(always)]
unsafe fn top_bits(x: __m256i) -> __m256i {
    // SAFETY: AVX2 (the caller's target feature).
    unsafe { _mm256_and_si256(_mm256_srli_epi16::<7>(x), _mm256_set1_epi8(1)) }
}

/// Steps of 32 elements that fit `n` elements and every plane length.
fn steps(n: usize, sign: usize, planes: &[usize]) -> usize {
    planes
        .iter()
        .fold((n / 32).min(sign / 4), |s, &l| s.min(l / 32))
}

/// Splits the first `n / 32 * 32` of the `n = body.len() / 2` bf16
/// elements (as far as every plane has room); returns how many it split.
pub(super) fn bf16_body(body: &[u8], sign: &mut [u8], exp: &mut [u8], mant: &mut [u8]) -> usize {
    let steps = steps(body.len() / 2, sign.len(), &[exp.len(), mant.len()]);
    assert!(available());
    // SAFETY: AVX2 (checked above); every load and store stays within
    // `steps` whole steps of each slice (bounded above).
    unsafe { bf16_steps(body, sign, exp, mant, steps) };
    steps * 32
}

#[target_feature(enable = "avx2")]
unsafe fn bf16_steps(body: &[u8], sign: &mut [u8], exp: &mut [u8], mant: &mut [u8], steps: usize) {
    // SAFETY: the caller checked the CPU feature and the bounds.
    unsafe {
        let low7 = _mm256_set1_epi8(0x7f);
        for j in 0..steps {
            let [lo, hi] = planes2(body.as_ptr().add(64 * j));
            // Exponent: bits 14..7 = the high byte's low 7 bits and the low
            // byte's top bit.
            let e = _mm256_or_si256(_mm256_add_epi8(hi, hi), top_bits(lo));
            _mm256_storeu_si256(exp.as_mut_ptr().add(32 * j).cast(), e);
            _mm256_storeu_si256(
                mant.as_mut_ptr().add(32 * j).cast(),
                _mm256_and_si256(lo, low7),
            );
            let s = msb_first(_mm256_movemask_epi8(hi) as u32);
            sign[4 * j..4 * j + 4].copy_from_slice(&s.to_le_bytes());
        }
    }
}

/// Splits the first `n / 32 * 32` of the `n = body.len() / 4` float32
/// elements into the sign, exponent and three mantissa byte planes (as far
/// as every plane has room); returns how many it split.
pub(super) fn f32_body(
    body: &[u8],
    sign: &mut [u8],
    exp: &mut [u8],
    mant: [&mut [u8]; 3],
) -> usize {
    let lens = [exp.len(), mant[0].len(), mant[1].len(), mant[2].len()];
    let steps = steps(body.len() / 4, sign.len(), &lens);
    assert!(available());
    // SAFETY: as in `bf16_body`.
    unsafe { f32_steps(body, sign, exp, mant, steps) };
    steps * 32
}

#[target_feature(enable = "avx2")]
unsafe fn f32_steps(
    body: &[u8],
    sign: &mut [u8],
    exp: &mut [u8],
    mant: [&mut [u8]; 3],
    steps: usize,
) {
    // SAFETY: the caller checked the CPU feature and the bounds.
    unsafe {
        let low7 = _mm256_set1_epi8(0x7f);
        let [m0, m1, m2] = mant;
        for j in 0..steps {
            let [b0, b1, b2, b3] = planes4(body.as_ptr().add(128 * j));
            // Exponent: bits 30..23 = byte 3's low 7 bits and byte 2's top bit.
            let e = _mm256_or_si256(_mm256_add_epi8(b3, b3), top_bits(b2));
            let at = 32 * j;
            _mm256_storeu_si256(exp.as_mut_ptr().add(at).cast(), e);
            _mm256_storeu_si256(m0.as_mut_ptr().add(at).cast(), b0);
            _mm256_storeu_si256(m1.as_mut_ptr().add(at).cast(), b1);
            _mm256_storeu_si256(m2.as_mut_ptr().add(at).cast(), _mm256_and_si256(b2, low7));
            let s = msb_first(_mm256_movemask_epi8(b3) as u32);
            sign[4 * j..4 * j + 4].copy_from_slice(&s.to_le_bytes());
        }
    }
}

/// Splits the first `n / 32 * 32` of the `n = body.len() / 2` two-byte
/// elements into their low and high byte planes (as far as both have
/// room); returns how many it split.
pub(super) fn bytes2_body(body: &[u8], lo: &mut [u8], hi: &mut [u8]) -> usize {
    let steps = (body.len() / 64).min(lo.len() / 32).min(hi.len() / 32);
    assert!(available());
    // SAFETY: as in `bf16_body`.
    unsafe { bytes2_steps(body, lo, hi, steps) };
    steps * 32
}

#[target_feature(enable = "avx2")]
unsafe fn bytes2_steps(body: &[u8], lo: &mut [u8], hi: &mut [u8], steps: usize) {
    // SAFETY: the caller checked the CPU feature and the bounds.
    unsafe {
        for j in 0..steps {
            let [a, b] = planes2(body.as_ptr().add(64 * j));
            _mm256_storeu_si256(lo.as_mut_ptr().add(32 * j).cast(), a);
            _mm256_storeu_si256(hi.as_mut_ptr().add(32 * j).cast(), b);
        }
    }
}

/// Splits the first `n / 32 * 32` of the `n = body.len() / 4` four-byte
/// elements into their four byte planes (as far as every plane has room);
/// returns how many it split.
pub(super) fn bytes4_body(body: &[u8], planes: [&mut [u8]; 4]) -> usize {
    let steps = planes
        .iter()
        .fold(body.len() / 128, |s, p| s.min(p.len() / 32));
    assert!(available());
    // SAFETY: as in `bf16_body`.
    unsafe { bytes4_steps(body, planes, steps) };
    steps * 32
}

#[target_feature(enable = "avx2")]
unsafe fn bytes4_steps(body: &[u8], mut planes: [&mut [u8]; 4], steps: usize) {
    // SAFETY: the caller checked the CPU feature and the bounds.
    unsafe {
        for j in 0..steps {
            let b = planes4(body.as_ptr().add(128 * j));
            for (p, v) in planes.iter_mut().zip(b) {
                _mm256_storeu_si256(p.as_mut_ptr().add(32 * j).cast(), v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::{bitfield_split, BFLOAT16, FLOAT32};

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    // Each body is checked on every length around the step size, against
    // the portable split (`bitfield_split`, plain byte transposes), with
    // dirty planes so that every byte it claims must be written.

    #[test]
    fn bitfield_bodies_equal_the_portable_split() {
        if !is_x86_feature_detected!("avx2") {
            assert!(!available());
            return;
        }
        for n in [0usize, 1, 31, 32, 33, 64, 95, 96, 1000, 4096 + 17] {
            let body = noise(4 * n, n as u64);
            let want = bitfield_split(FLOAT32, &body);
            let mut sign = vec![0xA5u8; n.div_ceil(8)];
            let mut exp = vec![0xA5u8; n];
            let mut m = [vec![0xA5u8; n], vec![0xA5u8; n], vec![0xA5u8; n]];
            let [m0, m1, m2] = &mut m;
            let done = f32_body(&body, &mut sign, &mut exp, [m0, m1, m2]);
            assert_eq!(done, n / 32 * 32);
            assert_eq!(sign[..done / 8], want[0][..done / 8], "f32 sign, n = {n}");
            assert_eq!(exp[..done], want[1][..done], "f32 exponent, n = {n}");
            for (k, mk) in m.iter().enumerate() {
                assert_eq!(
                    mk[..done],
                    want[2][k * n..k * n + done],
                    "f32 m{k}, n = {n}"
                );
            }

            let body = noise(2 * n, n as u64 + 7);
            let want = bitfield_split(BFLOAT16, &body);
            let mut sign = vec![0xA5u8; n.div_ceil(8)];
            let mut exp = vec![0xA5u8; n];
            let mut mant = vec![0xA5u8; n];
            let done = bf16_body(&body, &mut sign, &mut exp, &mut mant);
            assert_eq!(done, n / 32 * 32);
            assert_eq!(sign[..done / 8], want[0][..done / 8], "bf16 sign, n = {n}");
            assert_eq!(exp[..done], want[1][..done], "bf16 exponent, n = {n}");
            assert_eq!(mant[..done], want[2][..done], "bf16 mantissa, n = {n}");
        }
    }

    #[test]
    fn byteplane_bodies_equal_a_transpose() {
        if !is_x86_feature_detected!("avx2") {
            assert!(!available());
            return;
        }
        for n in [0usize, 1, 31, 32, 33, 64, 1000, 4096 + 17] {
            let body = noise(2 * n, n as u64);
            let (mut lo, mut hi) = (vec![0xA5u8; n], vec![0xA5u8; n]);
            let done = bytes2_body(&body, &mut lo, &mut hi);
            assert_eq!(done, n / 32 * 32);
            for i in 0..done {
                assert_eq!([lo[i], hi[i]], body[2 * i..2 * i + 2], "element {i} of {n}");
            }

            let body = noise(4 * n, n as u64 + 3);
            let mut p = [
                vec![0xA5u8; n],
                vec![0xA5u8; n],
                vec![0xA5u8; n],
                vec![0xA5u8; n],
            ];
            let [a, b, c, d] = &mut p;
            let done = bytes4_body(&body, [a, b, c, d]);
            assert_eq!(done, n / 32 * 32);
            for i in 0..done {
                assert_eq!(
                    [p[0][i], p[1][i], p[2][i], p[3][i]],
                    body[4 * i..4 * i + 4],
                    "element {i} of {n}"
                );
            }
        }
    }
}
