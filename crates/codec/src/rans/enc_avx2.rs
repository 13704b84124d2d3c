//! The AVX2 order-0 encoder of up to 16 chunks at once, for CPUs without
//! AVX-512: the rounds of `enc_avx512.rs`, each 16-lane vector held as two
//! 8-lane halves. Where AVX-512 has instructions AVX2 lacks, this kernel
//! does:
//!
//! * unsigned compares as `max` then `cmpeq`;
//! * a [`Mode::Window`] lookup (32 entries) as four 8-entry permutes and
//!   two blends, on bits 3 and 4 of the index;
//! * [`Mode::Tables`] lookups by scalar loads (AMD cores before Zen 4
//!   microcode gathers): each lane loads its symbol byte and then its
//!   (reciprocal, info) pair, one 8-byte entry, so no index is extracted
//!   from a vector register; the data words of the other modes too;
//! * `ceil(log2 f) - 1` from the exponent of `f - 1` as a float (exact:
//!   `f <= 2^14`), instead of `lzcnt`;
//! * the renormalisation bytes by scalar stores (each lane's position and
//!   word extracted from the registers) instead of a scatter. Every lane
//!   stores its 4 bytes at each step, kept or not: they land below the
//!   lane's position, where nothing is final yet, inside the slack the
//!   caller leaves (the kept bytes are the same as the masked scatter's).
//!   So every lane must hold a chunk: the kernel runs on full groups of 16
//!   only. (Storing the positions and words to the stack and reading them
//!   back lane by lane made the kernel slower than the scalar encoder: a
//!   wide store does not forward to narrow loads on this CPU.)
//!
//! Why: the scalar encoder runs each chunk's four states one after another
//! (`perf` of `ckptfs pack` of a bf16 file: a third of its CPU). Sixteen
//! chunks side by side keep the vector units busy instead of waiting on
//! each state's multiply chain.
//!
//! Invariants: those of `enc_avx512.rs` (the caller is the same) with all
//! 16 lanes active; per chunk, the bytes kept and the final states are the
//! scalar encoder's.

use super::enc_avx512::{Lanes, Mode, BSWAP_LOW16};
use std::arch::x86_64::*;

pub(super) use crate::has_avx2 as available;

const GATHER: u8 = 0;
const UNIFORM: u8 = 1;
const WINDOWED: u8 = 2;

/// [`enc_avx512::encode_quads`](super::enc_avx512::encode_quads) with AVX2.
///
/// # Safety
/// As that function's, with [`available`] in place of its CPU check, and
/// with [`Mode::Tables`], `tables.pairs` holding as many entries as `rcp`;
/// all 16 lanes are active (`lanes.active == 0xFFFF`).
pub(super) unsafe fn encode_quads(
    data: *const u8,
    out: *mut u8,
    tables: Tables,
    mode: Mode,
    lanes: &mut Lanes,
    quads: usize,
) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe {
        match mode {
            Mode::Uniform(bits) => kernel::<UNIFORM>(data, out, tables, bits, lanes, quads),
            Mode::Window(lo) => kernel::<WINDOWED>(data, out, tables, lo, lanes, quads),
            Mode::Tables => kernel::<GATHER>(data, out, tables, 0, lanes, quads),
        }
    }
}

/// The kernel's per-symbol constants: the AVX-512 kernel's `rcp` and
/// `info` (a window is read from them), and for [`Mode::Tables`] the same
/// pairs interleaved, `rcp | info << 32`, so that each lane's lookup is one
/// 8-byte load.
#[derive(Clone, Copy)]
pub(super) struct Tables {
    pub rcp: *const u32,
    pub info: *const u32,
    pub pairs: *const u64,
}

/// Entry `e` (0..32, from the low 5 bits) of the 32 entries in `t`.
#[inline(always)]
unsafe fn lookup32(t: &[__m256i; 4], e: __m256i) -> __m256i {
    // SAFETY: register operations only (AVX2 per the caller).
    unsafe {
        let ps = _mm256_castsi256_ps;
        let a = |k: usize| ps(_mm256_permutevar8x32_epi32(t[k], e));
        let bit3 = ps(_mm256_slli_epi32::<28>(e));
        let lo = _mm256_blendv_ps(a(0), a(1), bit3);
        let hi = _mm256_blendv_ps(a(2), a(3), bit3);
        _mm256_castps_si256(_mm256_blendv_ps(lo, hi, ps(_mm256_slli_epi32::<27>(e))))
    }
}

/// `arg` is the uniform table's bits or the window's first symbol.
#[target_feature(enable = "avx2")]
#[allow(clippy::needless_range_loop)]
unsafe fn kernel<const MODE: u8>(
    data: *const u8,
    out: *mut u8,
    tables: Tables,
    arg: u32,
    lanes: &mut Lanes,
    quads: usize,
) -> bool {
    // SAFETY: the vector loads and stores are of `lanes`' own 16-lane
    // arrays, 8 lanes at a time. The scalar loads read 4 bytes at
    // `data + doff[c] + 4q` (q < quads); with tables, the data byte of the
    // step and the pair at entry `toff[c] + s`, s < 256; with a window,
    // the 32 entries from `arg`. The scalar stores write 4 bytes at
    // `out + p[c] - 4`, each p moving down by at most 2 a symbol. All lanes
    // are active, so all of this is inside what the caller guarantees.
    unsafe {
        assert_eq!(lanes.active, 0xFFFF, "the AVX2 encoder takes full groups");
        let ld = |p: *const i32| _mm256_loadu_si256(p.cast());
        let zero = _mm256_setzero_si256();
        let one = _mm256_set1_epi32(1);
        let ff = _mm256_set1_epi32(0xFF);
        let ffff = _mm256_set1_epi32(0xFFFF);
        let c31 = _mm256_set1_epi32(31);
        let c127 = _mm256_set1_epi32(127);
        let scale = _mm256_set1_epi32(super::PROB_SCALE as i32);
        let bswap = _mm256_loadu_si256(BSWAP_LOW16.as_ptr().cast());
        let all = _mm256_set1_epi32(-1);
        let (rcp, info) = (tables.rcp, tables.info);
        let mut p: [__m256i; 2] = std::array::from_fn(|h| ld(lanes.p[8 * h..].as_ptr()));
        let mut x: [[__m256i; 2]; 4] = std::array::from_fn(|l| {
            std::array::from_fn(|h| ld(lanes.x[l][8 * h..].as_ptr().cast()))
        });
        // Uniform table over 0..2^bits: freq 2^fb, cum s * 2^fb.
        let bits = if MODE == UNIFORM { arg } else { 8 };
        let fb = super::PROB_BITS.saturating_sub(bits);
        let u_shift = _mm_cvtsi32_si128(fb as i32);
        let u_xmax = _mm256_set1_epi32(((1u32 << fb) << 17) as i32);
        let u_low = _mm256_set1_epi32((1i32 << fb) - 1);
        let u_nsym = _mm256_set1_epi32(1i32 << bits.min(8));
        // The window's entries, symbols lo..lo+32 in four registers each.
        let (mut w_r, mut w_i) = ([zero; 4], [zero; 4]);
        if MODE == WINDOWED {
            for k in 0..4 {
                w_r[k] = _mm256_loadu_si256(rcp.add(arg as usize + 8 * k).cast());
                w_i[k] = _mm256_loadu_si256(info.add(arg as usize + 8 * k).cast());
            }
        }
        let w_lo = _mm256_set1_epi32(arg as i32);
        let mut bad = zero;
        let word = |c: usize, q: usize| -> i32 {
            data.add(lanes.doff[c] as usize + 4 * q)
                .cast::<i32>()
                .read_unaligned()
        };
        // Lane c's pair for symbol l of quad q, by scalar loads: the symbol
        // byte, then its entry (no index leaves a vector register).
        let pair = |c: usize, q: usize, l: usize| -> i64 {
            let s = *data.add(lanes.doff[c] as usize + 4 * q + l);
            *tables.pairs.add(lanes.toff[c] as usize + s as usize) as i64
        };
        let pairs = |h: usize, q: usize, l: usize| -> (__m256i, __m256i) {
            // Lanes {0, 1, 4, 5} and {2, 3, 6, 7}: one shuffle of each
            // half's low or high dwords puts lanes 0..7 in order.
            let c = 8 * h;
            let e = |i: usize| pair(c + i, q, l);
            let a = _mm256_setr_epi64x(e(0), e(1), e(4), e(5));
            let b = _mm256_setr_epi64x(e(2), e(3), e(6), e(7));
            let (a, b) = (_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
            (
                _mm256_castps_si256(_mm256_shuffle_ps::<0x88>(a, b)),
                _mm256_castps_si256(_mm256_shuffle_ps::<0xDD>(a, b)),
            )
        };

        macro_rules! step {
            ($w:expr, $q:expr, $l:literal, $sh:literal) => {{
                for h in 0..2 {
                    let s = _mm256_and_si256(_mm256_srli_epi32::<$sh>($w[h]), ff);
                    let (xmax, bias, r, freq);
                    if MODE == UNIFORM {
                        let ok = _mm256_cmpgt_epi32(u_nsym, s);
                        bad = _mm256_or_si256(bad, _mm256_andnot_si256(ok, all));
                        xmax = u_xmax;
                        bias = _mm256_sll_epi32(s, u_shift);
                        r = zero;
                        freq = zero;
                    } else {
                        let inf;
                        if MODE == WINDOWED {
                            // Outside the window is frequency 0 (the
                            // lookup reads only the index's low 5 bits).
                            let e = _mm256_sub_epi32(s, w_lo);
                            let inside = _mm256_cmpeq_epi32(_mm256_min_epu32(e, c31), e);
                            bad = _mm256_or_si256(bad, _mm256_andnot_si256(inside, all));
                            r = lookup32(&w_r, e);
                            inf = lookup32(&w_i, e);
                        } else {
                            (r, inf) = pairs(h, $q, $l);
                        }
                        freq = _mm256_and_si256(inf, ffff);
                        bias = _mm256_srli_epi32::<16>(inf);
                        let none = _mm256_cmpeq_epi32(freq, zero);
                        bad = _mm256_or_si256(bad, none);
                        xmax = _mm256_slli_epi32::<17>(freq);
                    }
                    let v = x[$l][h];
                    // Renormalise: one byte out if v >= x_max, a second if
                    // v >= x_max << 8 (x_max is a multiple of 256); as -1
                    // per byte.
                    let ge = |a: __m256i| _mm256_cmpeq_epi32(_mm256_max_epu32(a, xmax), a);
                    let n = _mm256_add_epi32(ge(v), ge(_mm256_srli_epi32::<8>(v)));
                    {
                        let wv = _mm256_shuffle_epi8(v, bswap);
                        macro_rules! put {
                            ($i:literal) => {
                                out.add((_mm256_extract_epi32::<$i>(p[h]) - 4) as usize)
                                    .cast::<i32>()
                                    .write_unaligned(_mm256_extract_epi32::<$i>(wv));
                            };
                        }
                        put!(0);
                        put!(1);
                        put!(2);
                        put!(3);
                        put!(4);
                        put!(5);
                        put!(6);
                        put!(7);
                    }
                    p[h] = _mm256_add_epi32(p[h], n);
                    let v = _mm256_srlv_epi32(v, _mm256_slli_epi32::<3>(_mm256_sub_epi32(zero, n)));
                    x[$l][h] = if MODE == UNIFORM {
                        // x = (v / f) * M + v % f + cum, f a power of two.
                        let hi = _mm256_slli_epi32::<14>(_mm256_srl_epi32(v, u_shift));
                        let lo = _mm256_and_si256(v, u_low);
                        _mm256_add_epi32(_mm256_add_epi32(hi, lo), bias)
                    } else {
                        // q = v / f by the reciprocal: the high half of
                        // v * rcp (even and odd lanes), shifted by
                        // ceil(log2 f) - 1 = floor(log2(f - 1)), the
                        // exponent of f - 1 as a float (0 for f = 1).
                        let even = _mm256_srli_epi64::<32>(_mm256_mul_epu32(v, r));
                        let odd = _mm256_mul_epu32(
                            _mm256_srli_epi64::<32>(v),
                            _mm256_srli_epi64::<32>(r),
                        );
                        let hi = _mm256_blend_epi32::<0xAA>(even, odd);
                        let fm1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(freq, one));
                        let exp = _mm256_srli_epi32::<23>(_mm256_castps_si256(fm1));
                        let extra = _mm256_max_epi32(_mm256_sub_epi32(exp, c127), zero);
                        let q = _mm256_srlv_epi32(hi, extra);
                        // x = v + bias + q * (M - f)
                        let cmpl = _mm256_sub_epi32(scale, freq);
                        _mm256_add_epi32(_mm256_add_epi32(v, bias), _mm256_mullo_epi32(q, cmpl))
                    };
                }
            }};
        }

        for q in (0..quads).rev() {
            let w: [__m256i; 2] = std::array::from_fn(|h| {
                let c = 8 * h;
                _mm256_setr_epi32(
                    word(c, q),
                    word(c + 1, q),
                    word(c + 2, q),
                    word(c + 3, q),
                    word(c + 4, q),
                    word(c + 5, q),
                    word(c + 6, q),
                    word(c + 7, q),
                )
            });
            step!(w, q, 3, 24);
            step!(w, q, 2, 16);
            step!(w, q, 1, 8);
            step!(w, q, 0, 0);
        }

        for h in 0..2 {
            _mm256_storeu_si256(lanes.p[8 * h..].as_mut_ptr().cast(), p[h]);
            for l in 0..4 {
                _mm256_storeu_si256(lanes.x[l][8 * h..].as_mut_ptr().cast(), x[l][h]);
            }
        }
        _mm256_testz_si256(bad, bad) == 1
    }
}
