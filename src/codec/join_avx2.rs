//! AVX2 bodies of two bit-field joins, for CPUs without AVX-512: the
//! masked bf16 join (`transform::bf16_join_masked`) the paired rANS
//! decoder feeds, 16 elements per step, and the float32 join
//! (`transform::f32_join`), 8 per step; the sign bits are spread to lanes
//! by a compare. The callers keep the portable loops for heads and tails;
//! both give the same bytes (tested against each other below).

use std::arch::x86_64::*;

pub(super) use super::has_avx2 as available;

/// Joins the first `n / 16 * 16` of the `n` elements `bf16_join_masked`
/// is given (element i's sign at bit `first + i` of `masks`); returns how
/// many it joined.
pub(super) fn bf16_masked_body(
    masks: &[u64],
    first: usize,
    exp: &[u8],
    mant: &[u8],
    out: &mut [u8],
) -> usize {
    let steps = (exp.len() / 16).min(mant.len() / 16).min(out.len() / 32);
    assert!(available());
    // SAFETY: the CPU has AVX2 (checked above); every load and store stays
    // within `steps` whole steps of each slice (bounded above).
    unsafe { bf16_masked_steps(masks, first, exp, mant, out, steps) };
    steps * 16
}

#[target_feature(enable = "avx2")]
unsafe fn bf16_masked_steps(
    masks: &[u64],
    first: usize,
    exp: &[u8],
    mant: &[u8],
    out: &mut [u8],
    steps: usize,
) {
    let lane_bit = _mm256_setr_epi16(
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        128,
        256,
        512,
        1024,
        2048,
        4096,
        8192,
        16384,
        i16::MIN,
    );
    let sign = _mm256_set1_epi16(i16::MIN);
    let m7 = _mm256_set1_epi16(0x7f);
    // SAFETY: the caller checked the CPU features and the bounds.
    unsafe {
        for j in 0..steps {
            let bits = super::join_avx512::sign_bits(masks, first + 16 * j) as u16;
            let s = _mm256_and_si256(bits_as_lanes(bits, lane_bit), sign);
            let e = _mm256_cvtepu8_epi16(_mm_loadu_si128(exp.as_ptr().add(16 * j).cast()));
            let m = _mm256_cvtepu8_epi16(_mm_loadu_si128(mant.as_ptr().add(16 * j).cast()));
            let w = _mm256_or_si256(
                _mm256_or_si256(s, _mm256_slli_epi16::<7>(e)),
                _mm256_and_si256(m, m7),
            );
            _mm256_storeu_si256(out.as_mut_ptr().add(32 * j).cast(), w);
        }
    }
}

/// Joins the first float32 elements whose sign position is byte-aligned
/// at `sign[0]` (MSB-first), 8 per step; returns how many it joined.
pub(super) fn f32_body(sign: &[u8], exp: &[u8], m: [&[u8]; 3], out: &mut [u8]) -> usize {
    let steps = m
        .iter()
        .fold(exp.len(), |s, p| s.min(p.len()))
        .min(sign.len() * 8)
        .min(out.len() / 4)
        / 8;
    assert!(available());
    // SAFETY: the CPU has AVX2 (checked above); every load and store stays
    // within `steps` whole steps of each slice (bounded above).
    unsafe { f32_steps(sign, exp, m, out, steps) };
    steps * 8
}

#[target_feature(enable = "avx2")]
unsafe fn f32_steps(sign: &[u8], exp: &[u8], m: [&[u8]; 3], out: &mut [u8], steps: usize) {
    // Element k of a sign byte is its bit 7 - k.
    let lane_bit = _mm256_setr_epi32(128, 64, 32, 16, 8, 4, 2, 1);
    let top = _mm256_set1_epi32(i32::MIN);
    let m7 = _mm256_set1_epi32(0x7f);
    // SAFETY: the caller checked the CPU features and the bounds: step j
    // reads 8 bytes at 8j of each plane and byte j of `sign`, and writes
    // 32 bytes at 32j of `out`.
    unsafe {
        let bytes = |p: &[u8], j: usize| {
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.as_ptr().add(8 * j).cast()))
        };
        for j in 0..steps {
            let b = _mm256_set1_epi32(i32::from(*sign.get_unchecked(j)));
            let s = _mm256_and_si256(
                _mm256_cmpeq_epi32(_mm256_and_si256(b, lane_bit), lane_bit),
                top,
            );
            let e = _mm256_slli_epi32::<23>(bytes(exp, j));
            let m2 = _mm256_slli_epi32::<16>(_mm256_and_si256(bytes(m[2], j), m7));
            let m1 = _mm256_slli_epi32::<8>(bytes(m[1], j));
            let w = _mm256_or_si256(
                _mm256_or_si256(s, e),
                _mm256_or_si256(_mm256_or_si256(m2, m1), bytes(m[0], j)),
            );
            _mm256_storeu_si256(out.as_mut_ptr().add(32 * j).cast(), w);
        }
    }
}

/// 0xFFFF in 16-bit lane i where bit i of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn bits_as_lanes(bits: u16, lane_bit: __m256i) -> __m256i {
    let b = _mm256_set1_epi16(bits as i16);
    _mm256_cmpeq_epi16(_mm256_and_si256(b, lane_bit), lane_bit)
}

#[cfg(test)]
mod tests {
    use crate::codec::transform::bf16_join_masked;

    /// The AVX2 body equals the portable loop, at every alignment of the
    /// first element in the sign words and for lengths around a step.
    #[test]
    fn masked_body_matches_the_portable_loop() {
        if !is_x86_feature_detected!("avx2") {
            assert!(!super::available());
            return;
        }
        let mut r = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            r
        };
        let masks: Vec<u64> = (0..8).map(|_| next()).collect();
        for first in [0usize, 1, 7, 63, 64, 100] {
            for n in [0usize, 15, 16, 17, 33, 200] {
                let exp: Vec<u8> = (0..n).map(|_| next() as u8).collect();
                let mant: Vec<u8> = (0..n).map(|_| next() as u8).collect();
                let mut got = vec![0u8; 2 * n];
                bf16_join_masked(&masks, first, &exp, &mant, &mut got);
                for i in 0..n {
                    let at = first + i;
                    let s = ((masks[at / 64] >> (at % 64)) & 1) as u16;
                    let w = (s << 15) | ((exp[i] as u16) << 7) | (mant[i] & 0x7f) as u16;
                    assert_eq!(
                        got[2 * i..2 * i + 2],
                        w.to_le_bytes(),
                        "first {first} n {n} i {i}"
                    );
                }
                let done = super::bf16_masked_body(&masks, first, &exp, &mant, &mut got);
                assert_eq!(done, n / 16 * 16);
            }
        }
    }

    /// The float32 body equals a plain join of the same planes, for
    /// lengths around a step (the rest is left to the caller's loop).
    #[test]
    fn f32_body_matches_a_plain_join() {
        if !is_x86_feature_detected!("avx2") {
            assert!(!super::available());
            return;
        }
        let mut r = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            r as u8
        };
        for n in [0usize, 7, 8, 9, 64, 203] {
            let p: Vec<Vec<u8>> = (0..4).map(|_| (0..n).map(|_| next()).collect()).collect();
            let sign: Vec<u8> = (0..n.div_ceil(8)).map(|_| next()).collect();
            let mut got = vec![0u8; 4 * n];
            let done = super::f32_body(&sign, &p[0], [&p[1], &p[2], &p[3]], &mut got);
            assert_eq!(done, n / 8 * 8);
            for i in 0..done {
                let s = u32::from((sign[i / 8] >> (7 - i % 8)) & 1);
                let w = (s << 31)
                    | (u32::from(p[0][i]) << 23)
                    | (u32::from(p[3][i] & 0x7f) << 16)
                    | (u32::from(p[2][i]) << 8)
                    | u32::from(p[1][i]);
                assert_eq!(got[4 * i..4 * i + 4], w.to_le_bytes(), "n {n} i {i}");
            }
        }
    }
}
