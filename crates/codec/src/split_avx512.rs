//! AVX-512 bodies of the bf16 and float32 bit-field splits (the writer's
//! pass over every element of a bit-field tensor): 32 bf16 or 16 float32
//! elements per step, the fields narrowed with `vpmov*` and the sign bits
//! taken as a lane mask. Used only after a runtime CPU check
//! ([`available`]); the callers in `transform` keep the portable loops for
//! tails and other CPUs, and both give the same bytes (tested against
//! `transform::bitfield_split`).

use std::arch::x86_64::*;

pub(super) fn available() -> bool {
    static HAVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    super::cpu_check(&HAVE, || {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
    })
}

/// Packed sign bytes (MSB-first: element 0 is bit 7 of byte 0) of a lane
/// mask with element i at bit i: the bits of each byte reversed.
#[inline(always)]
pub(super) fn msb_first(mask: u32) -> u32 {
    mask.reverse_bits().swap_bytes()
}

/// Splits the first `n / 32 * 32` of the `n = body.len() / 2` bf16
/// elements (as far as every plane has room); returns how many it split.
pub(super) fn bf16_body(body: &[u8], sign: &mut [u8], exp: &mut [u8], mant: &mut [u8]) -> usize {
    let steps = (body.len() / 64)
        .min(sign.len() / 4)
        .min(exp.len() / 32)
        .min(mant.len() / 32);
    assert!(available());
    // SAFETY: the CPU has AVX-512F/BW (checked above); every load and store
    // stays within `steps` whole steps of each slice (bounded above).
    unsafe { bf16_steps(body, sign, exp, mant, steps) };
    steps * 32
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bf16_steps(body: &[u8], sign: &mut [u8], exp: &mut [u8], mant: &mut [u8], steps: usize) {
    // SAFETY: the caller checked the CPU features and the bounds.
    unsafe {
        let low7 = _mm512_set1_epi16(0x7f);
        for j in 0..steps {
            let v = _mm512_loadu_si512(body.as_ptr().add(64 * j).cast());
            let e = _mm512_cvtepi16_epi8(_mm512_srli_epi16::<7>(v));
            let m = _mm512_cvtepi16_epi8(_mm512_and_si512(v, low7));
            _mm256_storeu_si256(exp.as_mut_ptr().add(32 * j).cast(), e);
            _mm256_storeu_si256(mant.as_mut_ptr().add(32 * j).cast(), m);
            let s = msb_first(_mm512_movepi16_mask(v));
            sign[4 * j..4 * j + 4].copy_from_slice(&s.to_le_bytes());
        }
    }
}

/// Splits the first `n / 16 * 16` of the `n = body.len() / 4` float32
/// elements into the sign, exponent and three mantissa byte planes (as far
/// as every plane has room); returns how many it split.
pub(super) fn f32_body(
    body: &[u8],
    sign: &mut [u8],
    exp: &mut [u8],
    mant: [&mut [u8]; 3],
) -> usize {
    let steps = (body.len() / 64)
        .min(sign.len() / 2)
        .min(exp.len() / 16)
        .min(mant.iter().map(|m| m.len() / 16).min().unwrap_or(0));
    assert!(available());
    // SAFETY: as in `bf16_body`.
    unsafe { f32_steps(body, sign, exp, mant, steps) };
    steps * 16
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn f32_steps(
    body: &[u8],
    sign: &mut [u8],
    exp: &mut [u8],
    mant: [&mut [u8]; 3],
    steps: usize,
) {
    // SAFETY: the caller checked the CPU features and the bounds.
    unsafe {
        let low7 = _mm512_set1_epi32(0x7f);
        let [m0, m1, m2] = mant;
        for j in 0..steps {
            let v = _mm512_loadu_si512(body.as_ptr().add(64 * j).cast());
            let e = _mm512_cvtepi32_epi8(_mm512_srli_epi32::<23>(v));
            let a = _mm512_cvtepi32_epi8(v);
            let b = _mm512_cvtepi32_epi8(_mm512_srli_epi32::<8>(v));
            let c = _mm512_cvtepi32_epi8(_mm512_and_si512(_mm512_srli_epi32::<16>(v), low7));
            _mm_storeu_si128(exp.as_mut_ptr().add(16 * j).cast(), e);
            _mm_storeu_si128(m0.as_mut_ptr().add(16 * j).cast(), a);
            _mm_storeu_si128(m1.as_mut_ptr().add(16 * j).cast(), b);
            _mm_storeu_si128(m2.as_mut_ptr().add(16 * j).cast(), c);
            let s = msb_first(u32::from(_mm512_movepi32_mask(v)));
            sign[2 * j..2 * j + 2].copy_from_slice(&(s as u16).to_le_bytes());
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

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bytes2_steps(body: &[u8], lo: &mut [u8], hi: &mut [u8], steps: usize) {
    // SAFETY: the caller checked the CPU features and the bounds.
    unsafe {
        for j in 0..steps {
            let v = _mm512_loadu_si512(body.as_ptr().add(64 * j).cast());
            let a = _mm512_cvtepi16_epi8(v);
            let b = _mm512_cvtepi16_epi8(_mm512_srli_epi16::<8>(v));
            _mm256_storeu_si256(lo.as_mut_ptr().add(32 * j).cast(), a);
            _mm256_storeu_si256(hi.as_mut_ptr().add(32 * j).cast(), b);
        }
    }
}
