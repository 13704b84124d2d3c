//! AVX2 body of the masked bf16 join (`transform::bf16_join_masked`), the
//! join the paired rANS decoder feeds on CPUs without AVX-512: 16
//! elements per step, the sign bits spread to 16-bit lanes by a compare.
//! The caller keeps the portable loop for the tail; both give the same
//! bytes (tested against each other below).

use std::arch::x86_64::*;

pub(super) fn available() -> bool {
    static HAVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    super::cpu_check(&HAVE, || is_x86_feature_detected!("avx2"))
}

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
}
