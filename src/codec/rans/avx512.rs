//! AVX-512 order-0 decoding of up to 16 chunks at once: vector lane c
//! holds chunk c's state for rANS lane l (four state vectors), one
//! position vector holds each chunk's stream position. A round decodes
//! lanes 0..3 of every chunk: gather the slot's symbol, gather the
//! symbol's (freq, cum), update, and renormalise by gathering 4 stream
//! bytes at the chunk's position and shifting in 0, 1 or 2 of them.
//!
//! Invariants: used only after a runtime CPU-feature check; a group that
//! does not suit (short chunks, bad seeds, huge streams) is refused before
//! anything is written and goes to the scalar decoder, which also finishes
//! every chunk's tail and decodes again, from its start, any chunk whose
//! lane read past its own stream (only a damaged stream does; the vector
//! reads stay inside the plane), so output and errors equal the scalar
//! decoder's.

use super::order0::{decode_from, read_seeds};
use super::{chunk_range, AdaptivePayload, DecodeTable, DecodeTables};
use std::arch::x86_64::*;
use std::ops::Range;

/// Fewer chunks than this go to the scalar decoder (the vector lanes of
/// missing chunks are wasted; break-even is about 6 of 16).
pub(super) const MIN_CHUNKS: usize = 7;
/// Chunks shorter than this go to the scalar decoder.
const MIN_LEN: usize = 64;
/// Rounds (4 symbols per chunk) per kernel call.
const BLOCK: usize = 16;
const STRIDE: usize = std::mem::size_of::<DecodeTable>();
const _: () = assert!(STRIDE.is_multiple_of(4) && STRIDE >= super::PROB_SCALE as usize + 4);

pub(super) fn available() -> bool {
    static HAVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    crate::codec::cpu_check(&HAVE, || {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512cd")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi")
    })
}

struct State<const NV: usize> {
    x: [[[u32; 16]; 4]; NV],
    pos: [[i32; 16]; NV],
    symoff: [[i32; 16]; NV],
}

/// Decode chunks `js` (1..=16*NV, covered by `tables`, `out` sized to
/// their span) if the group suits the SIMD path; returns false, having
/// written nothing, if it does not (short chunks, bad seeds, huge
/// streams): the scalar decoder then does the work and reports any error.
pub(super) fn try_decode_group<const NV: usize>(
    p: &AdaptivePayload<'_>,
    js: Range<usize>,
    tables: &DecodeTables,
    out: &mut [u8],
) -> bool {
    let g = js.len();
    let lanes = 16 * NV;
    debug_assert!((1..=lanes).contains(&g));
    let lo = chunk_range(p.n, p.k, js.start).start;
    let base = p.starts[js.start];
    let mut st = State::<NV> {
        x: [[[0; 16]; 4]; NV],
        pos: [[0; 16]; NV],
        symoff: [[0; 16]; NV],
    };
    let mut end = [[0i32; 16]; NV];
    let mut outoff = [[0usize; 16]; NV];
    let mut lens = [[0usize; 16]; NV];
    let mut seeds = [[[0u32; 4]; 16]; NV];
    // Each chunk's built table (chunks that repeat the previous chunk's
    // table share it, so a block's lanes can all read one L1-resident
    // table), as indices into `tables.t`.
    let Some(owners) = tables
        .owner
        .get(js.start - tables.first..js.end - tables.first)
    else {
        return false;
    };
    for c in 0..lanes {
        let (v, i) = (c / 16, c % 16);
        // Inactive lanes repeat the last chunk; their output is dropped.
        let cc = c.min(g - 1);
        let j = js.start + cc;
        let r = chunk_range(p.n, p.k, j);
        lens[v][i] = (r.end - r.start) as usize;
        outoff[v][i] = (r.start - lo) as usize;
        if lens[v][i] < MIN_LEN {
            return false;
        }
        let Ok(sd) = read_seeds(p.chunk_payload(j), lens[v][i]) else {
            return false;
        };
        seeds[v][i] = sd;
        let e = p.starts[j + 1] - base;
        if e > (i32::MAX / 2) as usize {
            return false;
        }
        st.pos[v][i] = (p.starts[j] - base + 16) as i32;
        end[v][i] = e as i32;
        for (xl, &seed) in st.x[v].iter_mut().zip(&sd) {
            xl[i] = seed;
        }
        // Owners never decrease: offsets from the group's first table are
        // below 16 * NV tables.
        st.symoff[v][i] = ((owners[cc] - owners[0]) * STRIDE) as i32;
    }
    let quads = lens.iter().flatten().min().unwrap() / 4;
    // No table gather when every table of the group is the same uniform
    // one; one gather per symbol when every table is coarse; else two.
    let tab = |c: usize| &tables.t[owners[c]];
    let ub = tab(0).uniform_bits;
    let mode = if ub != 0 && (0..g).all(|c| tab(c).uniform_bits == ub) {
        Mode::Uniform(ub)
    } else if (0..g).all(|c| tab(c).is_coarse()) {
        Mode::Packed
    } else {
        Mode::Tables
    };
    // Lanes read up to the end of the plane's streams, not their own: a
    // chunk that compresses to a few bytes (sparse XOR planes) would
    // otherwise send its whole group to the scalar decoder. A valid stream
    // never reads past its end; a lane that did (a damaged or truncated
    // stream, where the format reads zeros instead) is decoded again by
    // the scalar decoder below.
    let lim = (p.body.len() - base).min((i32::MAX / 2) as usize);
    let streams = &p.body[base..base + lim];
    let mut stage = [[[0u32; 16]; NV]; BLOCK];
    let mut q = 0;
    while q < quads {
        // Step l of a round reads 4 bytes at pos + (at most 2l), a round
        // advances pos by at most 8: b rounds read below pos + 8b + 2.
        let safe = (0..lanes)
            .map(|c| ((lim as i32 - st.pos[c / 16][c % 16] - 2).max(0) / 8) as usize)
            .min()
            .unwrap();
        let b = safe.min(quads - q).min(BLOCK);
        if b == 0 {
            break;
        }
        // SAFETY: `available()` checked the CPU features. Lane c's table
        // is T = tables.t[owners[c]] (symoff = (owners[c] - owners[0]) *
        // STRIDE from tables.t[owners[0]]). Gathers read (uniform) no table; (packed) 4
        // bytes at T.packed[slot / 4], inside T; or (1) 4 bytes at
        // T.sym[slot], slot < 16384, inside T (STRIDE >= 16384 + 4,
        // repr(C)); (2) T.fc[s], s < 256; and (3) 4 bytes at
        // streams[pos[c]..], below end[c] <= streams.len() by the bound on
        // b above.
        unsafe {
            match mode {
                Mode::Uniform(bits) => kernel::<NV, UNIFORM>(
                    tables.t[owners[0]..].as_ptr().cast(),
                    streams.as_ptr(),
                    &mut st,
                    b,
                    &mut stage,
                    bits,
                ),
                Mode::Packed => kernel::<NV, PACKED>(
                    tables.t[owners[0]..].as_ptr().cast(),
                    streams.as_ptr(),
                    &mut st,
                    b,
                    &mut stage,
                    0,
                ),
                Mode::Tables => kernel::<NV, TABLES>(
                    tables.t[owners[0]..].as_ptr().cast(),
                    streams.as_ptr(),
                    &mut st,
                    b,
                    &mut stage,
                    0,
                ),
            }
        }
        if NV == 1 && b == BLOCK {
            // A full round block of one vector: transpose it, each chunk's
            // 64 symbols one store.
            let rows: [[u32; 16]; BLOCK] = std::array::from_fn(|t| stage[t][0]);
            let mut cols = [[0u32; 16]; 16];
            // SAFETY: `available()` checked the CPU features; the function
            // reads and writes only these two local arrays.
            unsafe { transpose16(&rows, &mut cols) };
            for (c, col) in cols.iter().enumerate().take(g) {
                let o = &mut out[outoff[0][c] + 4 * q..][..4 * b];
                for (d, w) in o.chunks_exact_mut(4).zip(col) {
                    d.copy_from_slice(&w.to_le_bytes());
                }
            }
        } else {
            for c in 0..g {
                let (v, i) = (c / 16, c % 16);
                let o = &mut out[outoff[v][i] + 4 * q..][..4 * b];
                for (d, w) in o.chunks_exact_mut(4).zip(&stage[..b]) {
                    d.copy_from_slice(&w[v][i].to_le_bytes());
                }
            }
        }
        q += b;
    }
    for c in 0..g {
        let (t, (v, i)) = (tab(c), (c / 16, c % 16));
        let j = js.start + c;
        if st.pos[v][i] > end[v][i] {
            // Read past its own stream: start this chunk again, scalar.
            let o = &mut out[outoff[v][i]..outoff[v][i] + lens[v][i]];
            decode_from(t, p.chunk_payload(j), seeds[v][i], 16, o);
            continue;
        }
        let x = [st.x[v][0][i], st.x[v][1][i], st.x[v][2][i], st.x[v][3][i]];
        let pos = st.pos[v][i] as usize - (p.starts[j] - base);
        let o = &mut out[outoff[v][i] + 4 * q..outoff[v][i] + lens[v][i]];
        decode_from(t, p.chunk_payload(j), x, pos, o);
    }
    true
}

/// `cols[c][t] = rows[t][c]` for a 16 x 16 matrix of u32: 32-bit and
/// 64-bit interleaves within 128-bit lanes, then a 4 x 4 transpose of the
/// lanes.
///
/// # Safety
/// AVX-512F available.
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(rows: &[[u32; 16]; 16], cols: &mut [[u32; 16]; 16]) {
    // SAFETY: every load and store is of one whole 64-byte row of the two
    // arrays.
    unsafe {
        let r: [__m512i; 16] = std::array::from_fn(|t| _mm512_loadu_si512(rows[t].as_ptr().cast()));
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
        for j in 0..4 {
            let [b0, b1, b2, b3] = [b[j], b[4 + j], b[8 + j], b[12 + j]];
            let c0 = _mm512_shuffle_i32x4::<0x44>(b0, b1);
            let c1 = _mm512_shuffle_i32x4::<0xEE>(b0, b1);
            let c2 = _mm512_shuffle_i32x4::<0x44>(b2, b3);
            let c3 = _mm512_shuffle_i32x4::<0xEE>(b2, b3);
            let out = [
                _mm512_shuffle_i32x4::<0x88>(c0, c2),
                _mm512_shuffle_i32x4::<0xDD>(c0, c2),
                _mm512_shuffle_i32x4::<0x88>(c1, c3),
                _mm512_shuffle_i32x4::<0xDD>(c1, c3),
            ];
            for (l, v) in out.into_iter().enumerate() {
                _mm512_storeu_si512(cols[4 * l + j].as_mut_ptr().cast(), v);
            }
        }
    }
}

/// How the kernel finds a slot's symbol, frequency and offset.
#[derive(Clone, Copy)]
enum Mode {
    /// Every table of the group is uniform over `0..2^b`: arithmetic only.
    Uniform(u32),
    /// Every table is coarse: one gather of `packed[slot / 4]`.
    Packed,
    /// A gather of `sym[slot]`, then one of `fc[sym]`.
    Tables,
}
const UNIFORM: u8 = 0;
const PACKED: u8 = 1;
const TABLES: u8 = 2;

/// Decode `rounds` rounds (4 symbols of each of 16 chunks) into
/// `stage[t][c]` (chunk c's 4 symbols of round t, little-endian).
/// `MODE` is one of [`Mode`]'s (`bits` is the uniform alphabet's, else 0):
/// `UNIFORM`: the symbol is the slot's top `bits` bits, and the new state
/// `(x >> 14) << (14 - bits) | x mod 2^(14 - bits)`; `PACKED`: one gather of
/// `packed[slot / 4]` gives the symbol, its frequency and the slot's offset
/// in it; `TABLES`: two gathers.
///
/// # Safety
/// AVX-512F/CD/BW/VBMI available; `tabs` points at consecutive
/// `DecodeTable`s such that `tabs + st.symoff[c]` is one for every lane;
/// every state is at least `RANS_L`; for every lane,
/// `streams + pos[c] .. + 8*rounds + 2` is readable; `rounds <= BLOCK`.
#[target_feature(enable = "avx512f,avx512cd,avx512bw,avx512vbmi")]
#[allow(clippy::needless_range_loop)]
unsafe fn kernel<const NV: usize, const MODE: u8>(
    tabs: *const u8,
    streams: *const u8,
    st: &mut State<NV>,
    rounds: usize,
    stage: &mut [[[u32; 16]; NV]; BLOCK],
    bits: u32,
) {
    // SAFETY: all loads/stores are of whole arrays of 64 bytes; the
    // gathers stay in bounds per the function's contract.
    unsafe {
        let fc_tabs = tabs.add(std::mem::offset_of!(DecodeTable, fc));
        let packed_tabs = tabs.add(std::mem::offset_of!(DecodeTable, packed));
        let m3ffc = _mm512_set1_epi32(0x3FFC);
        let m12 = _mm512_set1_epi32(0xFFF);
        let one = _mm512_set1_epi32(1);
        let three = _mm512_set1_epi32(3);
        let symoff: [__m512i; NV] =
            std::array::from_fn(|v| _mm512_loadu_si512(st.symoff[v].as_ptr().cast()));
        let fcoff: [__m512i; NV] = std::array::from_fn(|v| _mm512_srli_epi32::<2>(symoff[v]));
        let mut x: [[__m512i; 4]; NV] = std::array::from_fn(|v| {
            std::array::from_fn(|l| _mm512_loadu_si512(st.x[v][l].as_ptr().cast()))
        });
        let mut pos: [__m512i; NV] =
            std::array::from_fn(|v| _mm512_loadu_si512(st.pos[v].as_ptr().cast()));
        let m14 = _mm512_set1_epi32(0x3FFF);
        let m8 = _mm512_set1_epi32(0xFF);
        let m16 = _mm512_set1_epi32(0xFFFF);
        let seven = _mm512_set1_epi32(7);
        let eight = _mm512_set1_epi32(8);
        let c16 = _mm512_set1_epi32(16);
        // Uniform tables: f = 2^(14 - bits) slots per symbol.
        let ub = bits.clamp(1, 8) as i32;
        let fbits = _mm_cvtsi32_si128(14 - ub);
        let umask = _mm512_set1_epi32((1 << ub) - 1);
        let fmask = _mm512_set1_epi32((1 << (14 - ub)) - 1);
        // Byte (8c + d, 8c + d - 1) of the 128-byte window, as the
        // permute index of a big-endian 16-bit read at offset d.
        let wbase = _mm512_set_epi32(
            0x7879, 0x7071, 0x6869, 0x6061, 0x5859, 0x5051, 0x4849, 0x4041, 0x3839, 0x3031, 0x2829,
            0x2021, 0x1819, 0x1011, 0x0809, 0x0001,
        );
        for row in stage.iter_mut().take(rounds) {
            let mut s = [[_mm512_setzero_si512(); 4]; NV];
            // The 8 bytes at each chunk's position cover this round.
            let pos0 = pos;
            let win: [[__m512i; 2]; NV] = std::array::from_fn(|v| {
                let lo = _mm512_castsi512_si256(pos0[v]);
                let hi = _mm512_extracti64x4_epi64::<1>(pos0[v]);
                [
                    _mm512_i32gather_epi64::<1>(lo, streams.cast()),
                    _mm512_i32gather_epi64::<1>(hi, streams.cast()),
                ]
            });
            for l in 0..4 {
                for v in 0..NV {
                    let xv = x[v][l];
                    let (sy, y) = if MODE == UNIFORM {
                        let sy = _mm512_and_si512(_mm512_srl_epi32(xv, fbits), umask);
                        let y = _mm512_or_si512(
                            _mm512_sll_epi32(_mm512_srli_epi32::<14>(xv), fbits),
                            _mm512_and_si512(xv, fmask),
                        );
                        (sy, y)
                    } else if MODE == PACKED {
                        // e = sym | (freq/4 - 1) << 8 | (slot/4 - cum/4) << 20
                        let e = _mm512_i32gather_epi32::<1>(
                            _mm512_add_epi32(_mm512_and_si512(xv, m3ffc), symoff[v]),
                            packed_tabs.cast(),
                        );
                        let f4 =
                            _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32::<8>(e), m12), one);
                        let bias = _mm512_add_epi32(
                            _mm512_and_si512(_mm512_srli_epi32::<18>(e), m3ffc),
                            _mm512_and_si512(xv, three),
                        );
                        let y = _mm512_add_epi32(
                            _mm512_slli_epi32::<2>(_mm512_mullo_epi32(
                                f4,
                                _mm512_srli_epi32::<14>(xv),
                            )),
                            bias,
                        );
                        (_mm512_and_si512(e, m8), y)
                    } else {
                        let slot = _mm512_and_si512(xv, m14);
                        let sw = _mm512_i32gather_epi32::<1>(
                            _mm512_add_epi32(slot, symoff[v]),
                            tabs.cast(),
                        );
                        let sy = _mm512_and_si512(sw, m8);
                        let fc = _mm512_i32gather_epi32::<4>(
                            _mm512_add_epi32(sy, fcoff[v]),
                            fc_tabs.cast(),
                        );
                        let freq = _mm512_and_si512(fc, m16);
                        let cum = _mm512_srli_epi32::<16>(fc);
                        let y = _mm512_add_epi32(
                            _mm512_mullo_epi32(freq, _mm512_srli_epi32::<14>(xv)),
                            _mm512_sub_epi32(slot, cum),
                        );
                        (sy, y)
                    };
                    // y >= 2^9, so lz <= 22, and 8 * (bytes to read) =
                    // round_up8(lz) - 8, saturating at 0 for lz = 0 (a
                    // garbage state >= 2^31; 16-bit lanes are enough).
                    let lz = _mm512_lzcnt_epi32(y);
                    let sh = _mm512_subs_epu16(
                        _mm512_andnot_si512(seven, _mm512_add_epi32(lz, seven)),
                        eight,
                    );
                    let d = _mm512_sub_epi32(pos[v], pos0[v]);
                    let idx =
                        _mm512_add_epi32(wbase, _mm512_or_si512(d, _mm512_slli_epi32::<8>(d)));
                    let two = _mm512_maskz_permutex2var_epi8(
                        0x3333_3333_3333_3333,
                        win[v][0],
                        idx,
                        win[v][1],
                    );
                    x[v][l] = _mm512_or_si512(
                        _mm512_sllv_epi32(y, sh),
                        _mm512_srlv_epi32(two, _mm512_sub_epi32(c16, sh)),
                    );
                    pos[v] = _mm512_add_epi32(pos[v], _mm512_srli_epi32::<3>(sh));
                    s[v][l] = sy;
                }
            }
            for v in 0..NV {
                let [s0, s1, s2, s3] = s[v];
                let w = _mm512_or_si512(
                    _mm512_or_si512(s0, _mm512_slli_epi32::<8>(s1)),
                    _mm512_or_si512(_mm512_slli_epi32::<16>(s2), _mm512_slli_epi32::<24>(s3)),
                );
                _mm512_storeu_si512(row[v].as_mut_ptr().cast(), w);
            }
        }
        for v in 0..NV {
            for l in 0..4 {
                _mm512_storeu_si512(st.x[v][l].as_mut_ptr().cast(), x[v][l]);
            }
            _mm512_storeu_si512(st.pos[v].as_mut_ptr().cast(), pos[v]);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn transpose16_transposes() {
        assert!(
            super::available(),
            "this test needs an AVX-512 CPU (the CI machine has one)"
        );
        let rows: [[u32; 16]; 16] =
            std::array::from_fn(|t| std::array::from_fn(|c| (t * 100 + c) as u32));
        let mut cols = [[0u32; 16]; 16];
        // SAFETY: checked above.
        unsafe { super::transpose16(&rows, &mut cols) };
        for t in 0..16 {
            for c in 0..16 {
                assert_eq!(cols[c][t], rows[t][c], "[{c}][{t}]");
            }
        }
    }
}
