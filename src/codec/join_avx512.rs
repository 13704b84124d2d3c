//! AVX-512 bodies of the bf16 and float32 bit-field joins (the hot loop of
//! every bit-field read): 32 bf16 or 16 float32 elements per step, the
//! packed sign bits applied as a lane mask. Used only after a runtime CPU
//! check ([`available`]); the callers in `transform` keep the portable
//! loops for heads, tails and other CPUs, and both give the same bytes
//! (tested against each other below).

use std::arch::x86_64::*;

pub(super) fn available() -> bool {
    static HAVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    super::cpu_check(&HAVE, || {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
    })
}

/// Lane mask of `k` packed sign bytes (MSB-first: element 0 is bit 7 of
/// byte 0) with element i at bit i.
#[inline(always)]
fn lane_mask(sign: &[u8]) -> u64 {
    sign.iter().enumerate().fold(0u64, |m, (k, &b)| {
        m | (u64::from(b.reverse_bits()) << (8 * k))
    })
}

/// Joins the first `exp.len() / 32 * 32` bf16 elements (sign position
/// byte-aligned at `sign[0]`); returns how many it joined.
pub(super) fn bf16_body(sign: &[u8], exp: &[u8], mant: &[u8], out: &mut [u8]) -> usize {
    let steps = (exp.len() / 32)
        .min(mant.len() / 32)
        .min(sign.len() / 4)
        .min(out.len() / 64);
    assert!(available());
    // SAFETY: the CPU has AVX-512F/BW (checked above); every load and store
    // stays within `steps` whole steps of each slice (bounded above).
    unsafe { bf16_steps(sign, exp, mant, out, steps) };
    steps * 32
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bf16_steps(sign: &[u8], exp: &[u8], mant: &[u8], out: &mut [u8], steps: usize) {
    // SAFETY: the caller checked the CPU features and the bounds.
    unsafe {
        let low7 = _mm512_set1_epi16(0x7f);
        let top = _mm512_set1_epi16(0x8000u16 as i16);
        for j in 0..steps {
            let e = _mm512_cvtepu8_epi16(_mm256_loadu_si256(exp.as_ptr().add(32 * j).cast()));
            let m = _mm512_cvtepu8_epi16(_mm256_loadu_si256(mant.as_ptr().add(32 * j).cast()));
            let w = _mm512_or_si512(_mm512_slli_epi16::<7>(e), _mm512_and_si512(m, low7));
            let mask = lane_mask(&sign[4 * j..4 * j + 4]) as u32;
            let w = _mm512_mask_blend_epi16(mask, w, _mm512_or_si512(w, top));
            _mm512_storeu_si512(out.as_mut_ptr().add(64 * j).cast(), w);
        }
    }
}

/// Joins the first `exp.len() / 32 * 32` bf16 elements whose sign bits are
/// bits `first..` of `masks` (element i at bit i % 64 of `masks[i / 64]`,
/// missing words read as 0); returns how many it joined.
pub(super) fn bf16_masked_body(
    masks: &[u64],
    first: usize,
    exp: &[u8],
    mant: &[u8],
    out: &mut [u8],
) -> usize {
    let steps = (exp.len() / 32).min(mant.len() / 32).min(out.len() / 64);
    assert!(available());
    // SAFETY: the CPU has AVX-512F/BW (checked above); every load and store
    // stays within `steps` whole steps of each slice (bounded above).
    unsafe { bf16_masked_steps(masks, first, exp, mant, out, steps) };
    steps * 32
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bf16_masked_steps(
    masks: &[u64],
    first: usize,
    exp: &[u8],
    mant: &[u8],
    out: &mut [u8],
    steps: usize,
) {
    let word = |w: usize| masks.get(w).copied().unwrap_or(0);
    // SAFETY: the caller checked the CPU features and the bounds.
    unsafe {
        let low7 = _mm512_set1_epi16(0x7f);
        let top = _mm512_set1_epi16(0x8000u16 as i16);
        for j in 0..steps {
            let at = first + 32 * j;
            let (w, sh) = (at / 64, at % 64);
            let bits = if sh > 32 {
                (word(w) >> sh) | (word(w + 1) << (64 - sh))
            } else {
                word(w) >> sh
            };
            let e = _mm512_cvtepu8_epi16(_mm256_loadu_si256(exp.as_ptr().add(32 * j).cast()));
            let m = _mm512_cvtepu8_epi16(_mm256_loadu_si256(mant.as_ptr().add(32 * j).cast()));
            let v = _mm512_or_si512(_mm512_slli_epi16::<7>(e), _mm512_and_si512(m, low7));
            let v = _mm512_mask_blend_epi16(bits as u32, v, _mm512_or_si512(v, top));
            _mm512_storeu_si512(out.as_mut_ptr().add(64 * j).cast(), v);
        }
    }
}

/// Joins the first `exp.len() / 16 * 16` float32 elements (sign position
/// byte-aligned at `sign[0]`); returns how many it joined.
pub(super) fn f32_body(sign: &[u8], exp: &[u8], m: [&[u8]; 3], out: &mut [u8]) -> usize {
    let steps = m
        .iter()
        .fold(exp.len(), |s, p| s.min(p.len()))
        .min(sign.len() * 8)
        .min(out.len() / 4)
        / 16;
    assert!(available());
    // SAFETY: the CPU has AVX-512F/BW (checked above); every load and store
    // stays within `steps` whole steps of each slice (bounded above).
    unsafe { f32_steps(sign, exp, m, out, steps) };
    steps * 16
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn f32_steps(sign: &[u8], exp: &[u8], m: [&[u8]; 3], out: &mut [u8], steps: usize) {
    // SAFETY: the caller checked the CPU features and the bounds.
    unsafe {
        let low7 = _mm512_set1_epi32(0x7f);
        let top = _mm512_set1_epi32(0x8000_0000u32 as i32);
        for j in 0..steps {
            let e = _mm512_slli_epi32::<23>(widen(exp, j));
            let m2 = _mm512_slli_epi32::<16>(_mm512_and_si512(widen(m[2], j), low7));
            let m1 = _mm512_slli_epi32::<8>(widen(m[1], j));
            let w = _mm512_or_si512(_mm512_or_si512(e, m2), _mm512_or_si512(m1, widen(m[0], j)));
            let mask = lane_mask(&sign[2 * j..2 * j + 2]) as u16;
            let w = _mm512_mask_or_epi32(w, mask, w, top);
            _mm512_storeu_si512(out.as_mut_ptr().add(64 * j).cast(), w);
        }
    }
}

/// Bytes `16 j .. 16 j + 16` of `p` widened to 32-bit lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn widen(p: &[u8], j: usize) -> __m512i {
    // SAFETY: the caller checked the CPU features and the bounds.
    unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.as_ptr().add(16 * j).cast())) }
}

#[cfg(test)]
mod tests {
    use crate::codec::transform::{bitfield_join, bitfield_split, BFLOAT16, FLOAT32};

    /// The vector bodies give the bytes of the portable loops: a join of
    /// every start position and length around the step sizes equals the
    /// original elements (the split is the portable reference).
    #[test]
    fn vector_joins_match_the_elements_at_every_offset() {
        assert!(
            super::available(),
            "this test needs an AVX-512 CPU (the CI machine has one)"
        );
        for spec in [BFLOAT16, FLOAT32] {
            let eb = spec.elem_bytes();
            let n = 200;
            let body: Vec<u8> = (0..n * eb)
                .map(|i| {
                    (i as u64)
                        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        .rotate_left(17) as u8
                })
                .collect();
            let planes = bitfield_split(spec, &body);
            for a in 0..40 {
                for b in [a, a + 1, a + 31, a + 33, a + 65, n] {
                    let b = b.min(n).max(a);
                    let mants: Vec<&[u8]> = (0..spec.mant_planes())
                        .map(|k| &planes[2][k * n + a..k * n + b])
                        .collect();
                    let mut part = vec![0u8; (b - a) * eb];
                    bitfield_join(
                        spec,
                        &planes[0][a / 8..],
                        a % 8,
                        &planes[1][a..b],
                        &mants,
                        &mut part,
                    )
                    .unwrap();
                    assert_eq!(part, body[a * eb..b * eb], "{spec:?} [{a}, {b})");
                }
            }
        }
    }
}
