//! AVX-512 bodies of the bf16 and float32 bit-field joins (the hot loop of
//! every bit-field read): 32 bf16 or 16 float32 elements per step, the
//! packed sign bits applied as a lane mask. Used only after a runtime CPU
//! check ([`available`]); the callers in `transform` keep the portable
//! loops for heads, tails and other CPUs, and both give the same bytes
//! (tested against each other below).

use crate::rans::StageRows;
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
    // SAFETY: the caller checked the CPU features and the bounds.
    unsafe {
        for j in 0..steps {
            let bits = sign_bits(masks, first + 32 * j) as u32;
            let e = _mm256_loadu_si256(exp.as_ptr().add(32 * j).cast());
            let m = _mm256_loadu_si256(mant.as_ptr().add(32 * j).cast());
            join32(e, m, bits, out.as_mut_ptr().add(64 * j));
        }
    }
}

/// The 64 sign bits of `masks` from bit `at` (element i at bit i % 64 of
/// `masks[i / 64]`; missing words read as 0).
#[inline(always)]
pub(super) fn sign_bits(masks: &[u64], at: usize) -> u64 {
    let word = |w: usize| masks.get(w).copied().unwrap_or(0);
    let (w, sh) = (at / 64, at % 64);
    if sh == 0 {
        word(w)
    } else {
        (word(w) >> sh) | (word(w + 1) << (64 - sh))
    }
}

/// Joins 32 bf16 elements: exponent bytes `e`, mantissa bytes `m` (low 7
/// bits), sign bit i of `signs`; writes 64 bytes at `dst`.
///
/// # Safety
/// AVX-512F/BW available; `dst` valid for 64 bytes of writes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn join32(e: __m256i, m: __m256i, signs: u32, dst: *mut u8) {
    let (e, m) = (_mm512_cvtepu8_epi16(e), _mm512_cvtepu8_epi16(m));
    let v = _mm512_or_si512(
        _mm512_slli_epi16::<7>(e),
        _mm512_and_si512(m, _mm512_set1_epi16(0x7f)),
    );
    let v = _mm512_mask_blend_epi16(
        signs,
        v,
        _mm512_or_si512(v, _mm512_set1_epi16(0x8000u16 as i16)),
    );
    // SAFETY: the caller guarantees 64 writable bytes at `dst`.
    unsafe { _mm512_storeu_si512(dst.cast(), v) };
}

/// Joins a full round block of the paired rANS decoder straight from its
/// stages ([`crate::rans::PairSink::stage`]): for chunk c <
/// `chunks`, the 64 exponents of column c of `exp` and the 64 mantissas of
/// column c of `mant` become elements `offsets[c]..offsets[c] + 64` of
/// `out`, their signs bits `offsets[c]..` of `masks` (as in
/// [`bf16_masked_body`]). The columns stay in registers. Panics if an
/// element would fall outside `out` (`transform::stage_fits`).
pub(super) fn bf16_stage_body(
    masks: &[u64],
    offsets: &[u64; 16],
    chunks: usize,
    exp: &StageRows,
    mant: &StageRows,
    out: &mut [u8],
) {
    assert!(available() && super::transform::stage_fits(offsets, chunks, out.len()));
    // SAFETY: the CPU has AVX-512F/BW and every chunk's 64 elements lie
    // inside `out` (both checked above).
    unsafe { bf16_stage_steps(masks, offsets, chunks, exp, mant, out) };
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bf16_stage_steps(
    masks: &[u64],
    offsets: &[u64; 16],
    chunks: usize,
    exp: &StageRows,
    mant: &StageRows,
    out: &mut [u8],
) {
    // SAFETY: the caller checked the CPU features and that every chunk's
    // 128 output bytes are inside `out`; the loads are of whole rows.
    unsafe {
        let load = |m: &StageRows| -> [__m512i; 16] {
            std::array::from_fn(|t| _mm512_loadu_si512(m[t].as_ptr().cast()))
        };
        let (ec, mc) = (transpose16(&load(exp)), transpose16(&load(mant)));
        let halves = |v: __m512i| [_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v)];
        for c in 0..chunks {
            let o = offsets[c] as usize;
            let bits = sign_bits(masks, o);
            for (h, (e, m)) in halves(ec[c]).into_iter().zip(halves(mc[c])).enumerate() {
                join32(
                    e,
                    m,
                    (bits >> (32 * h)) as u32,
                    out.as_mut_ptr().add(2 * o + 64 * h),
                );
            }
        }
    }
}

/// The transpose of a 16 x 16 matrix of u32 held as 16 rows: dword t of
/// result c is dword c of row t. 32-bit and 64-bit interleaves within
/// 128-bit lanes, then a 4 x 4 transpose of the lanes.
///
/// # Safety
/// AVX-512F available.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
    // a[2i], a[2i+1]: rows 2i and 2i+1 interleaved by dword.
    let a: [__m512i; 16] = std::array::from_fn(|k| {
        let (x, y) = (r[k & !1], r[k | 1]);
        if k % 2 == 0 {
            _mm512_unpacklo_epi32(x, y)
        } else {
            _mm512_unpackhi_epi32(x, y)
        }
    });
    // b[4i+j], lane L: column 4L+j of rows 4i..4i+4.
    let b: [__m512i; 16] = std::array::from_fn(|k| {
        let (i, j) = (k / 4, k % 4);
        let (x, y) = (a[4 * i + (j >> 1)], a[4 * i + 2 + (j >> 1)]);
        if j % 2 == 0 {
            _mm512_unpacklo_epi64(x, y)
        } else {
            _mm512_unpackhi_epi64(x, y)
        }
    });
    let mut cols = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let [b0, b1, b2, b3] = [b[j], b[4 + j], b[8 + j], b[12 + j]];
        let c0 = _mm512_shuffle_i32x4::<0x44>(b0, b1);
        let c1 = _mm512_shuffle_i32x4::<0xEE>(b0, b1);
        let c2 = _mm512_shuffle_i32x4::<0x44>(b2, b3);
        let c3 = _mm512_shuffle_i32x4::<0xEE>(b2, b3);
        cols[j] = _mm512_shuffle_i32x4::<0x88>(c0, c2);
        cols[4 + j] = _mm512_shuffle_i32x4::<0xDD>(c0, c2);
        cols[8 + j] = _mm512_shuffle_i32x4::<0x88>(c1, c3);
        cols[12 + j] = _mm512_shuffle_i32x4::<0xDD>(c1, c3);
    }
    cols
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
    use crate::transform::{bitfield_join, bitfield_split, BFLOAT16, FLOAT32};

    /// The joins give the original elements: a join of every start
    /// position and length around the step sizes equals them (the split is
    /// the portable reference). On an AVX-512 CPU this checks the vector
    /// bodies, elsewhere the portable loops that replace them.
    #[test]
    fn vector_joins_match_the_elements_at_every_offset() {
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

    /// A round block joined from the decoder's stages equals each chunk's
    /// column joined alone, for chunks at any offsets (sign bits that
    /// straddle mask words), and a chunk reaching past `out` is refused
    /// before anything is written. Without AVX-512 or AVX2 the stage join
    /// declines and writes nothing (the decoder then joins column by
    /// column).
    #[test]
    fn stage_join_matches_joining_each_column() {
        use crate::transform::{bf16_join_masked, bf16_join_stage};
        let vector = super::available() || crate::join_avx2::available();
        let mut x = 0x1234_5678_9ABC_DEF0u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let masks: Vec<u64> = (0..40).map(|_| next()).collect();
        for round in 0..20 {
            let exp: super::StageRows =
                std::array::from_fn(|_| std::array::from_fn(|_| next() as u32));
            let mant: super::StageRows =
                std::array::from_fn(|_| std::array::from_fn(|_| next() as u32));
            let chunks = 1 + round % 16;
            // Chunks 100 elements apart from an odd start: every shift.
            let offsets: [u64; 16] =
                std::array::from_fn(|c| (round * 7 + 100 * c.min(chunks - 1)) as u64);
            let n = offsets[chunks - 1] as usize + 64;
            let mut got = vec![0u8; 2 * n];
            assert_eq!(
                bf16_join_stage(&masks, &offsets, chunks, &exp, &mant, &mut got),
                vector
            );
            let mut want = vec![0u8; 2 * n];
            for c in 0..chunks {
                let col = |m: &super::StageRows| -> Vec<u8> {
                    (0..16).flat_map(|t| m[t][c].to_le_bytes()).collect()
                };
                let o = offsets[c] as usize;
                bf16_join_masked(
                    &masks,
                    o,
                    &col(&exp),
                    &col(&mant),
                    &mut want[2 * o..2 * o + 128],
                );
            }
            if vector {
                assert_eq!(got, want, "round {round}");
            } else {
                assert!(got.iter().all(|&b| b == 0), "declined, yet wrote");
            }
            let mut short = vec![0xEEu8; 2 * n - 2];
            assert!(!bf16_join_stage(
                &masks, &offsets, chunks, &exp, &mant, &mut short
            ));
            assert!(short.iter().all(|&b| b == 0xEE));
        }
    }
}
