//! The AVX2 kernel of the vector order-0 decoder (`vector.rs`): the same
//! rounds as its AVX-512 kernel, each 16-lane vector held as two 8-lane
//! halves, for CPUs without AVX-512 (AMD before Zen 4, Intel client
//! cores). Where AVX-512 has instructions AVX2 lacks, this kernel does:
//!
//! * renormalisation byte counts by unsigned compares instead of `lzcnt`;
//! * each chunk's 8-byte stream window, gathered once per round, kept
//!   big-endian in 64-bit lanes and read at the lane's offset by a 64-bit
//!   variable shift (instead of a two-register byte permute). The window
//!   gathers take chunks {0, 1, 4, 5} and {2, 3, 6, 7} of a half, so that
//!   one `shuffle_ps` of the high words puts chunks 0..7 back in order.
//!
//! Table lookups and windows are hardware gathers, or on AMD cores without
//! AVX-512 (Zen 1 to 3, Hygon) scalar loads ([`soft_gathers`]). There a
//! gather is microcoded: while its micro-ops issue nothing else does, and
//! the kernel spent about half its time behind them. With scalar loads
//! the kernel takes about a quarter less CPU on a Zen 3 (`perf` samples of
//! the kernel in a one-thread `ckptfs unpack` of a 1 GiB bf16 `.zstn`:
//! 1756 against 2310). Intel cores issue gathers as ordinary micro-ops and
//! keep them.
//!
//! Output, states and positions equal the AVX-512 kernel's and so the
//! scalar decoder's (the shared tests compare them on this CPU, with both
//! kinds of gather).

use super::vector::{Mode, State, BLOCK, PACKED, TABLES, UNIFORM};
use super::DecodeTable;
use std::arch::x86_64::*;

pub(super) use crate::has_avx2 as available;

/// Whether the kernel reads its tables and windows by scalar loads: on
/// AMD and Hygon CPUs, whose AVX2 gathers are microcoded (this kernel runs
/// only where AVX-512 does not, so not on Zen 4 and later).
pub(super) fn soft_gathers() -> bool {
    #[cfg(test)]
    if let Some(soft) = FORCE_SOFT.with(std::cell::Cell::get) {
        return soft;
    }
    static SOFT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    crate::cpu_check(&SOFT, || {
        let v = __cpuid(0);
        let vendor: Vec<u8> = [v.ebx, v.edx, v.ecx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .collect();
        vendor == *b"AuthenticAMD" || vendor == *b"HygonGenuine"
    })
}

#[cfg(test)]
thread_local! {
    /// Tests on this thread use this kind of gather (None: the CPU's).
    pub(super) static FORCE_SOFT: std::cell::Cell<Option<bool>> =
        const { std::cell::Cell::new(None) };
}

/// [`kernel`] in `mode`, with the gathers this CPU wants
/// ([`soft_gathers`]).
///
/// # Safety
/// As [`kernel`]'s.
pub(super) unsafe fn rounds<const NV: usize>(
    mode: Mode,
    tabs: *const u8,
    streams: *const u8,
    st: &mut State<NV>,
    rounds: usize,
    stage: &mut [[[u32; 16]; NV]; BLOCK],
) {
    let bits = if let Mode::Uniform(b) = mode { b } else { 0 };
    let k = match (mode, soft_gathers()) {
        (Mode::Uniform(_), true) => kernel::<NV, UNIFORM, true>,
        (Mode::Uniform(_), false) => kernel::<NV, UNIFORM, false>,
        (Mode::Packed, true) => kernel::<NV, PACKED, true>,
        (Mode::Packed, false) => kernel::<NV, PACKED, false>,
        (Mode::Tables, true) => kernel::<NV, TABLES, true>,
        (Mode::Tables, false) => kernel::<NV, TABLES, false>,
    };
    // SAFETY: the caller keeps `kernel`'s contract.
    unsafe { k(tabs, streams, st, rounds, stage, bits) }
}

/// Decode `rounds` rounds (4 symbols of each of 16 chunks per vector)
/// into `stage[t][v][c]` (chunk c's 4 symbols of round t, little-endian):
/// the AVX-512 kernel's contract (`vector::kernel`), with AVX2.
///
/// # Safety
/// AVX2 available; `tabs` points at consecutive `DecodeTable`s such that
/// `tabs + st.symoff[v][c]` is one for every lane; every state is at least
/// `RANS_L`; for every lane, `streams + pos[v][c] .. + 8*rounds + 2` is
/// readable; `rounds <= BLOCK`.
#[target_feature(enable = "avx2")]
#[allow(clippy::needless_range_loop)]
unsafe fn kernel<const NV: usize, const MODE: u8, const SOFT: bool>(
    tabs: *const u8,
    streams: *const u8,
    st: &mut State<NV>,
    rounds: usize,
    stage: &mut [[[u32; 16]; NV]; BLOCK],
    bits: u32,
) {
    // SAFETY: every load and store is of 8 u32 inside the arrays of `st`
    // and `stage`; the gathers stay in bounds per the contract.
    unsafe {
        let fc_tabs = tabs.add(std::mem::offset_of!(DecodeTable, fc));
        let packed_tabs = tabs.add(std::mem::offset_of!(DecodeTable, packed));
        let ld = |p: *const u32| _mm256_loadu_si256(p.cast());
        let ldi = |p: *const i32| _mm256_loadu_si256(p.cast());
        // Half h = 2v + k is lanes 8k..8k + 8 of vector v.
        let symoff: [[__m256i; 2]; NV] =
            std::array::from_fn(|v| std::array::from_fn(|k| ldi(st.symoff[v][8 * k..].as_ptr())));
        let fcoff: [[__m256i; 2]; NV] =
            std::array::from_fn(|v| std::array::from_fn(|k| _mm256_srli_epi32::<2>(symoff[v][k])));
        let mut x: [[[__m256i; 2]; 4]; NV] = std::array::from_fn(|v| {
            std::array::from_fn(|l| std::array::from_fn(|k| ld(st.x[v][l][8 * k..].as_ptr())))
        });
        let mut pos: [[__m256i; 2]; NV] =
            std::array::from_fn(|v| std::array::from_fn(|k| ldi(st.pos[v][8 * k..].as_ptr())));
        let m3ffc = _mm256_set1_epi32(0x3FFC);
        let m12 = _mm256_set1_epi32(0xFFF);
        let one = _mm256_set1_epi32(1);
        let three = _mm256_set1_epi32(3);
        let m14 = _mm256_set1_epi32(0x3FFF);
        let m8 = _mm256_set1_epi32(0xFF);
        let m16 = _mm256_set1_epi32(0xFFFF);
        let below23 = _mm256_set1_epi32((1 << 23) - 1);
        let below15 = _mm256_set1_epi32((1 << 15) - 1);
        let c32 = _mm256_set1_epi32(32);
        let zero = _mm256_setzero_si256();
        let ub = bits.clamp(1, 8) as i32;
        let fbits = _mm_cvtsi32_si128(14 - ub);
        let umask = _mm256_set1_epi32((1 << ub) - 1);
        let fmask = _mm256_set1_epi32((1 << (14 - ub)) - 1);
        // Chunks {0, 1, 4, 5, 2, 3, 6, 7}: the window gathers' order.
        let split = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
        // Byte swap of each 64-bit lane (little-endian load -> big-endian).
        let bswap64 = _mm256_setr_epi8(
            7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 15, 14,
            13, 12, 11, 10, 9, 8,
        );
        for row in stage.iter_mut().take(rounds) {
            let pos0 = pos;
            // Each chunk's 8 stream bytes from its round-start position,
            // big-endian: [chunks 0, 1, 4, 5] and [2, 3, 6, 7].
            let win: [[[__m256i; 2]; 2]; NV] = std::array::from_fn(|v| {
                std::array::from_fn(|k| {
                    if SOFT {
                        return windows_soft(streams, pos0[v][k], bswap64);
                    }
                    let p = _mm256_permutevar8x32_epi32(pos0[v][k], split);
                    let g = |i: __m128i| {
                        _mm256_shuffle_epi8(_mm256_i32gather_epi64::<1>(streams.cast(), i), bswap64)
                    };
                    [
                        g(_mm256_castsi256_si128(p)),
                        g(_mm256_extracti128_si256::<1>(p)),
                    ]
                })
            });
            let mut s = [[[zero; 2]; 4]; NV];
            for l in 0..4 {
                for v in 0..NV {
                    for k in 0..2 {
                        let xv = x[v][l][k];
                        let (sy, y) = if MODE == UNIFORM {
                            let sy = _mm256_and_si256(_mm256_srl_epi32(xv, fbits), umask);
                            let y = _mm256_or_si256(
                                _mm256_sll_epi32(_mm256_srli_epi32::<14>(xv), fbits),
                                _mm256_and_si256(xv, fmask),
                            );
                            (sy, y)
                        } else if MODE == PACKED {
                            // e = sym | (freq/4 - 1) << 8 | (slot/4 - cum/4) << 20
                            let at = _mm256_add_epi32(_mm256_and_si256(xv, m3ffc), symoff[v][k]);
                            let e = if SOFT {
                                gather_u32(packed_tabs, at)
                            } else {
                                _mm256_i32gather_epi32::<1>(packed_tabs.cast(), at)
                            };
                            let f4 = _mm256_add_epi32(
                                _mm256_and_si256(_mm256_srli_epi32::<8>(e), m12),
                                one,
                            );
                            let bias = _mm256_add_epi32(
                                _mm256_and_si256(_mm256_srli_epi32::<18>(e), m3ffc),
                                _mm256_and_si256(xv, three),
                            );
                            let y = _mm256_add_epi32(
                                _mm256_slli_epi32::<2>(_mm256_mullo_epi32(
                                    f4,
                                    _mm256_srli_epi32::<14>(xv),
                                )),
                                bias,
                            );
                            (_mm256_and_si256(e, m8), y)
                        } else {
                            debug_assert_eq!(MODE, TABLES);
                            let slot = _mm256_and_si256(xv, m14);
                            let at = _mm256_add_epi32(slot, symoff[v][k]);
                            let sw = if SOFT {
                                gather_u32(tabs, at)
                            } else {
                                _mm256_i32gather_epi32::<1>(tabs.cast(), at)
                            };
                            let sy = _mm256_and_si256(sw, m8);
                            let fat = _mm256_add_epi32(sy, fcoff[v][k]);
                            let fc = if SOFT {
                                gather_u32(fc_tabs, _mm256_slli_epi32::<2>(fat))
                            } else {
                                _mm256_i32gather_epi32::<4>(fc_tabs.cast(), fat)
                            };
                            let freq = _mm256_and_si256(fc, m16);
                            let cum = _mm256_srli_epi32::<16>(fc);
                            let y = _mm256_add_epi32(
                                _mm256_mullo_epi32(freq, _mm256_srli_epi32::<14>(xv)),
                                _mm256_sub_epi32(slot, cum),
                            );
                            (sy, y)
                        };
                        // Bytes to read: 0 from 2^23 up, 1 from 2^15, else
                        // 2 (y >= 2^9); unsigned compares, as -1 per byte.
                        let lt = |m: __m256i| _mm256_cmpeq_epi32(_mm256_min_epu32(y, m), y);
                        let neg = _mm256_add_epi32(lt(below23), lt(below15));
                        let sh = _mm256_slli_epi32::<3>(_mm256_sub_epi32(zero, neg));
                        // The 4 window bytes from the lane's offset, as a
                        // big-endian u32 (the high word of the shifted window).
                        let d = _mm256_slli_epi32::<3>(_mm256_sub_epi32(pos[v][k], pos0[v][k]));
                        let [wa, wb] = win[v][k];
                        let va = _mm256_sllv_epi64(wa, _mm256_unpacklo_epi32(d, zero));
                        let vb = _mm256_sllv_epi64(wb, _mm256_unpackhi_epi32(d, zero));
                        let four = _mm256_castps_si256(_mm256_shuffle_ps::<0xDD>(
                            _mm256_castsi256_ps(va),
                            _mm256_castsi256_ps(vb),
                        ));
                        // srlv by 32 (no byte) gives 0.
                        x[v][l][k] = _mm256_or_si256(
                            _mm256_sllv_epi32(y, sh),
                            _mm256_srlv_epi32(four, _mm256_sub_epi32(c32, sh)),
                        );
                        pos[v][k] = _mm256_sub_epi32(pos[v][k], neg);
                        s[v][l][k] = sy;
                    }
                }
            }
            for v in 0..NV {
                for k in 0..2 {
                    let [s0, s1, s2, s3] = [s[v][0][k], s[v][1][k], s[v][2][k], s[v][3][k]];
                    let w = _mm256_or_si256(
                        _mm256_or_si256(s0, _mm256_slli_epi32::<8>(s1)),
                        _mm256_or_si256(_mm256_slli_epi32::<16>(s2), _mm256_slli_epi32::<24>(s3)),
                    );
                    _mm256_storeu_si256(row[v][8 * k..].as_mut_ptr().cast(), w);
                }
            }
        }
        for v in 0..NV {
            for k in 0..2 {
                for l in 0..4 {
                    _mm256_storeu_si256(st.x[v][l][8 * k..].as_mut_ptr().cast(), x[v][l][k]);
                }
                _mm256_storeu_si256(st.pos[v][8 * k..].as_mut_ptr().cast(), pos[v][k]);
            }
        }
    }
}

/// `_mm256_i32gather_epi32::<1>(base, at)` as eight scalar loads. On AMD
/// cores before Zen 4 a gather is microcoded: while it issues, nothing else
/// does, and the decoder waited on it for most of its time.
///
/// # Safety
/// AVX2 available; 4 bytes readable at `base + at[i]` for every lane
/// (`at[i] >= 0`).
#[inline(always)]
unsafe fn gather_u32(base: *const u8, at: __m256i) -> __m256i {
    // SAFETY: per the contract.
    unsafe {
        let lo = _mm256_castsi256_si128(at);
        let hi = _mm256_extracti128_si256::<1>(at);
        let ld = |o: i64| -> i32 { base.add(o as u32 as usize).cast::<i32>().read_unaligned() };
        let q = |h: __m128i| {
            let (a, b) = (_mm_cvtsi128_si64(h), _mm_extract_epi64::<1>(h));
            _mm_setr_epi32(ld(a), ld(a >> 32), ld(b), ld(b >> 32))
        };
        _mm256_set_m128i(q(hi), q(lo))
    }
}

/// The round's stream windows of a half (as the hardware gathers above
/// take them: chunks {0, 1, 4, 5} and {2, 3, 6, 7}, each 8 bytes from its
/// position `pos[c]`, big-endian) by eight scalar loads.
///
/// # Safety
/// AVX2 available; 8 bytes readable at `streams + pos[c]` for every lane
/// (`pos[c] >= 0`).
#[inline(always)]
unsafe fn windows_soft(streams: *const u8, pos: __m256i, bswap64: __m256i) -> [__m256i; 2] {
    // SAFETY: per the contract.
    unsafe {
        let lo = _mm256_castsi256_si128(pos);
        let hi = _mm256_extracti128_si256::<1>(pos);
        let ld = |o: i64| -> i64 {
            streams
                .add(o as u32 as usize)
                .cast::<i64>()
                .read_unaligned()
        };
        let (c01, c23) = (_mm_cvtsi128_si64(lo), _mm_extract_epi64::<1>(lo));
        let (c45, c67) = (_mm_cvtsi128_si64(hi), _mm_extract_epi64::<1>(hi));
        let a = _mm256_setr_epi64x(ld(c01), ld(c01 >> 32), ld(c45), ld(c45 >> 32));
        let b = _mm256_setr_epi64x(ld(c23), ld(c23 >> 32), ld(c67), ld(c67 >> 32));
        [
            _mm256_shuffle_epi8(a, bswap64),
            _mm256_shuffle_epi8(b, bswap64),
        ]
    }
}
