//! AVX2 bodies of the bit-field joins, for CPUs without AVX-512: the
//! masked bf16 join (`transform::bf16_join_masked`) the paired rANS
//! decoder feeds, 16 elements per step; the same join of a whole round
//! block straight from the decoder's stages (`transform::bf16_join_stage`,
//! transposed in registers); and the float32 join (`transform::f32_join`),
//! 8 per step. The sign bits are spread to lanes by a compare. The callers
//! keep the portable loops for heads and tails; both give the same bytes
//! (tested against each other below and in `join_avx512`'s tests).

use crate::rans::StageRows;
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
    // SAFETY: the caller checked the CPU features and the bounds.
    unsafe {
        for j in 0..steps {
            let bits = super::join_avx512::sign_bits(masks, first + 16 * j) as u16;
            let e = _mm_loadu_si128(exp.as_ptr().add(16 * j).cast());
            let m = _mm_loadu_si128(mant.as_ptr().add(16 * j).cast());
            join16(e, m, bits, out.as_mut_ptr().add(32 * j));
        }
    }
}

/// Joins 16 bf16 elements: exponent bytes `e`, mantissa bytes `m` (low 7
/// bits), sign bit i of `signs`; writes 32 bytes at `dst`.
///
/// # Safety
/// AVX2 available; `dst` valid for 32 bytes of writes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn join16(e: __m128i, m: __m128i, signs: u16, dst: *mut u8) {
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
    let s = _mm256_and_si256(bits_as_lanes(signs, lane_bit), _mm256_set1_epi16(i16::MIN));
    let w = _mm256_or_si256(
        _mm256_or_si256(s, _mm256_slli_epi16::<7>(_mm256_cvtepu8_epi16(e))),
        _mm256_and_si256(_mm256_cvtepu8_epi16(m), _mm256_set1_epi16(0x7f)),
    );
    // SAFETY: the caller guarantees 32 writable bytes at `dst`.
    unsafe { _mm256_storeu_si256(dst.cast(), w) };
}

/// Joins a full round block of the paired rANS decoder straight from its
/// stages: the contract of `join_avx512::bf16_stage_body` (chunk c's 64
/// elements from `offsets[c]`), with AVX2. Each 8 x 8 quarter of a stage is
/// transposed in registers and joined from there.
pub(super) fn bf16_stage_body(
    masks: &[u64],
    offsets: &[u64; 16],
    chunks: usize,
    exp: &StageRows,
    mant: &StageRows,
    out: &mut [u8],
) {
    assert!(available() && super::transform::stage_fits(offsets, chunks, out.len()));
    // SAFETY: the CPU has AVX2 and every chunk's 64 elements lie inside
    // `out` (both checked above).
    unsafe { bf16_stage_steps(masks, offsets, chunks, exp, mant, out) };
}

#[target_feature(enable = "avx2")]
unsafe fn bf16_stage_steps(
    masks: &[u64],
    offsets: &[u64; 16],
    chunks: usize,
    exp: &StageRows,
    mant: &StageRows,
    out: &mut [u8],
) {
    // SAFETY: the caller checked the CPU features and that every chunk's
    // 128 output bytes are inside `out`; the loads are of 8 u32 inside one
    // row of a stage.
    unsafe {
        for cb in 0..chunks.div_ceil(8) {
            // Vector i of quarter (tb, cb): chunk 8 cb + i's symbols of
            // rounds 8 tb..8 tb + 8, that is its elements 32 tb..32 tb + 32.
            let quarter = |m: &StageRows, tb: usize| {
                transpose8(std::array::from_fn(|i| {
                    _mm256_loadu_si256(m[8 * tb + i][8 * cb..].as_ptr().cast())
                }))
            };
            let e = [quarter(exp, 0), quarter(exp, 1)];
            let m = [quarter(mant, 0), quarter(mant, 1)];
            for i in 0..(chunks - 8 * cb).min(8) {
                let o = offsets[8 * cb + i] as usize;
                let bits = super::join_avx512::sign_bits(masks, o);
                let dst = out.as_mut_ptr().add(2 * o);
                for tb in 0..2 {
                    let (ev, mv) = (e[tb][i], m[tb][i]);
                    let at = 32 * tb;
                    join16(
                        _mm256_castsi256_si128(ev),
                        _mm256_castsi256_si128(mv),
                        (bits >> at) as u16,
                        dst.add(2 * at),
                    );
                    join16(
                        _mm256_extracti128_si256::<1>(ev),
                        _mm256_extracti128_si256::<1>(mv),
                        (bits >> (at + 16)) as u16,
                        dst.add(2 * at + 32),
                    );
                }
            }
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

/// `cols[c][4t..4t + 4] = rows[t][c]` (little-endian) for a 16 x 16
/// matrix of u32: four 8 x 8 transposes.
///
/// # Safety
/// AVX2 available.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn transpose16(rows: &[[u32; 16]; 16], cols: &mut [[u8; 64]; 16]) {
    // SAFETY: every load and store is of 8 u32 inside one row of the two
    // arrays (a row of `cols` is 16 u32).
    unsafe {
        for tb in 0..2 {
            for cb in 0..2 {
                let r: [__m256i; 8] = std::array::from_fn(|i| {
                    _mm256_loadu_si256(rows[8 * tb + i][8 * cb..].as_ptr().cast())
                });
                let c = transpose8(r);
                for (i, v) in c.into_iter().enumerate() {
                    let dst = cols[8 * cb + i][32 * tb..].as_mut_ptr();
                    _mm256_storeu_si256(dst.cast(), v);
                }
            }
        }
    }
}

/// The transpose of an 8 x 8 matrix of u32 held as 8 row vectors.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let a0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let a1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let a2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let a3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let a4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let a5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let a6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let a7 = _mm256_unpackhi_epi32(r[6], r[7]);
    let b0 = _mm256_unpacklo_epi64(a0, a2);
    let b1 = _mm256_unpackhi_epi64(a0, a2);
    let b2 = _mm256_unpacklo_epi64(a1, a3);
    let b3 = _mm256_unpackhi_epi64(a1, a3);
    let b4 = _mm256_unpacklo_epi64(a4, a6);
    let b5 = _mm256_unpackhi_epi64(a4, a6);
    let b6 = _mm256_unpacklo_epi64(a5, a7);
    let b7 = _mm256_unpackhi_epi64(a5, a7);
    [
        _mm256_permute2x128_si256::<0x20>(b0, b4),
        _mm256_permute2x128_si256::<0x20>(b1, b5),
        _mm256_permute2x128_si256::<0x20>(b2, b6),
        _mm256_permute2x128_si256::<0x20>(b3, b7),
        _mm256_permute2x128_si256::<0x31>(b0, b4),
        _mm256_permute2x128_si256::<0x31>(b1, b5),
        _mm256_permute2x128_si256::<0x31>(b2, b6),
        _mm256_permute2x128_si256::<0x31>(b3, b7),
    ]
}

/// Checks a 16 x 16 transpose of u32 rows into little-endian byte columns
/// (this module's and the AVX-512 decoder's).
#[cfg(test)]
pub(crate) fn assert_transposes(transpose: impl Fn(&[[u32; 16]; 16], &mut [[u8; 64]; 16])) {
    let rows: [[u32; 16]; 16] =
        std::array::from_fn(|t| std::array::from_fn(|c| (t * 100 + c) as u32));
    let mut cols = [[0u8; 64]; 16];
    transpose(&rows, &mut cols);
    for t in 0..16 {
        for c in 0..16 {
            let got = u32::from_le_bytes(cols[c][4 * t..4 * t + 4].try_into().unwrap());
            assert_eq!(got, rows[t][c], "[{c}][{t}]");
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::transform::bf16_join_masked;

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

    /// The transpose, where the CPU has AVX2 (every x86-64 CI machine
    /// this project has run on; elsewhere `available()` must say no).
    #[test]
    fn transpose16_transposes() {
        if !is_x86_feature_detected!("avx2") {
            assert!(!super::available());
            return;
        }
        // SAFETY: checked above.
        super::assert_transposes(|r, c| unsafe { super::transpose16(r, c) });
    }
}
