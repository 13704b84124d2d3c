//! AVX-512 order-0 encoding of up to 16 chunks at once, the mirror of
//! `avx512.rs`: vector lane c holds chunk c's state for rANS lane l (four
//! state vectors) and one vector holds each chunk's write position in its
//! own output region. A round encodes one quad of every chunk, backwards
//! (lane 3, 2, 1, 0, as the scalar encoder does): gather the symbols,
//! gather each symbol's (reciprocal, freq | bias) (or compute them, for a
//! uniform table), renormalise by scattering the state's low two bytes
//! below the chunk's position and moving it down by the 0, 1 or 2 bytes
//! kept, then apply the reciprocal step.
//!
//! Invariants: used only after a runtime CPU-feature check ([`available`]);
//! per chunk, the bytes emitted and the final states are exactly the scalar
//! encoder's (`order0::encode_core`), because every lane runs the same
//! arithmetic in the same order and each chunk writes only its own region.
//! The caller (`order0::encode_chunks`) encodes each chunk's symbols past
//! its last whole common quad with the scalar code first, sizes every
//! region for the worst case (2 bytes a symbol plus 4 of slack for the
//! 4-byte scatter) and checks that every offset fits an `i32`.

use std::arch::x86_64::*;

/// Entries of a per-table constant array (one per byte symbol).
pub(super) const SYMS: usize = 256;

pub(super) fn available() -> bool {
    static HAVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    crate::cpu_check(&HAVE, || {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512cd")
            && is_x86_feature_detected!("avx512bw")
    })
}

/// How the kernel finds a symbol's constants.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Mode {
    /// Every lane codes with the uniform table over `0..2^bits`: no gather.
    Uniform(u32),
    /// Every lane codes with the one table in `rcp`/`info`, whose symbols
    /// all lie in `lo..lo + 32` (`lo <= 224`): the entries are held in
    /// registers and looked up with a two-register permute, not gathered.
    /// (The exponent planes of trained weights span about 20 values.)
    Window(u32),
    /// Gather `rcp[toff + s]` and `info[toff + s]`.
    Tables,
}

/// Symbols a [`Mode::Window`] covers.
pub(super) const WINDOW: u32 = 32;

/// The lanes of one group: states, write positions (from the output base),
/// each chunk's first symbol (from the data base) and table offset (in
/// entries), and which lanes hold a chunk.
pub(super) struct Lanes {
    pub x: [[u32; 16]; 4],
    pub p: [i32; 16],
    pub doff: [i32; 16],
    pub toff: [i32; 16],
    pub active: u16,
}

/// Encodes quads `quads-1` down to `0` of every active lane.
///
/// Returns false if a symbol had frequency 0 (a caller bug; the caller
/// panics as the scalar encoder does).
///
/// # Safety
/// [`available`] returned true. For every active lane c:
/// `data[doff[c] .. doff[c] + 4 * quads]` is readable; the region
/// `out[p[c] - 2 * 4 * quads - 4 .. p[c]]` is writable and no other lane's
/// region overlaps it; with [`Mode::Tables`], `rcp` and `info` hold at
/// least `toff[c] + SYMS` entries (`toff[c] >= 0`); with
/// [`Mode::Window`]`(lo)`, at least `lo + 32` entries.
pub(super) unsafe fn encode_quads(
    data: *const u8,
    out: *mut u8,
    rcp: *const u32,
    info: *const u32,
    mode: Mode,
    lanes: &mut Lanes,
    quads: usize,
) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe {
        match mode {
            Mode::Uniform(bits) => kernel::<UNIFORM>(data, out, rcp, info, bits, lanes, quads),
            Mode::Window(lo) => kernel::<WINDOWED>(data, out, rcp, info, lo, lanes, quads),
            Mode::Tables => kernel::<GATHER>(data, out, rcp, info, 0, lanes, quads),
        }
    }
}

/// Per dword: bytes 2 and 3 take the source's bytes 1 and 0, bytes 0 and 1
/// are zero; stored at `p - 4`, the state's low byte lands at `p - 1` and
/// the next at `p - 2`, as `order0::enc_put` writes them.
pub(super) const BSWAP_LOW16: [u32; 16] = {
    let mut t = [0u32; 16];
    let mut i = 0;
    while i < 16 {
        let b = (4 * (i % 4)) as u32;
        t[i] = 0x8080 | ((b + 1) << 16) | (b << 24);
        i += 1;
    }
    t
};

const GATHER: u8 = 0;
const UNIFORM: u8 = 1;
const WINDOWED: u8 = 2;

/// `arg` is the uniform table's bits or the window's first symbol.
#[target_feature(enable = "avx512f,avx512cd,avx512bw")]
unsafe fn kernel<const MODE: u8>(
    data: *const u8,
    out: *mut u8,
    rcp: *const u32,
    info: *const u32,
    arg: u32,
    lanes: &mut Lanes,
    quads: usize,
) -> bool {
    // SAFETY: the loads and stores of `lanes` are of its own arrays (16
    // lanes each). Gathers read 4 bytes at `data + doff[c] + 4q` (q <
    // quads) and, with tables, `rcp`/`info` at `toff[c] + s` (s < 256) of
    // active lanes only, or (window) 32 entries each from `rcp + arg` and
    // `info + arg`; the scatter writes 4 bytes at `out + p[c] - 4` of
    // active lanes, and each lane's p moves down by at most 2 a symbol:
    // all inside what the caller guarantees (see `encode_quads`).
    unsafe {
        let active: __mmask16 = lanes.active;
        let zero = _mm512_setzero_si512();
        let one = _mm512_set1_epi32(1);
        let four = _mm512_set1_epi32(4);
        let ff = _mm512_set1_epi32(0xFF);
        let ffff = _mm512_set1_epi32(0xFFFF);
        let c31 = _mm512_set1_epi32(31);
        let scale = _mm512_set1_epi32(super::PROB_SCALE as i32);
        let bswap = _mm512_loadu_si512(BSWAP_LOW16.as_ptr().cast());
        let doff = _mm512_loadu_si512(lanes.doff.as_ptr().cast());
        let toff = _mm512_loadu_si512(lanes.toff.as_ptr().cast());
        let mut p = _mm512_loadu_si512(lanes.p.as_ptr().cast());
        let mut x = [zero; 4];
        for (v, a) in x.iter_mut().zip(&lanes.x) {
            *v = _mm512_loadu_si512(a.as_ptr().cast());
        }
        // Uniform table over 0..2^bits: freq 2^fb, cum s * 2^fb.
        let bits = if MODE == UNIFORM { arg } else { 8 };
        let fb = super::PROB_BITS.saturating_sub(bits);
        let u_shift = _mm512_set1_epi32(fb as i32);
        let u_xmax = _mm512_set1_epi32(((1u32 << fb) << 17) as i32);
        let u_low = _mm512_set1_epi32((1i32 << fb) - 1);
        let u_nsym = _mm512_set1_epi32(1i32 << bits.min(8));
        // The window's entries, symbols lo..lo+32 in two registers each.
        let (mut w_r, mut w_i) = ([zero; 2], [zero; 2]);
        if MODE == WINDOWED {
            for h in 0..2 {
                w_r[h] = _mm512_loadu_si512(rcp.add(arg as usize + 16 * h).cast());
                w_i[h] = _mm512_loadu_si512(info.add(arg as usize + 16 * h).cast());
            }
        }
        let w_lo = _mm512_set1_epi32(arg as i32);
        let w_len = _mm512_set1_epi32(WINDOW as i32);
        let mut bad: __mmask16 = 0;

        macro_rules! step {
            ($w:expr, $l:literal, $sh:literal) => {{
                let s = _mm512_and_si512(_mm512_srli_epi32::<$sh>($w), ff);
                let (xmax, bias, r, freq);
                if MODE == UNIFORM {
                    bad |= _mm512_mask_cmpge_epu32_mask(active, s, u_nsym);
                    xmax = u_xmax;
                    bias = _mm512_sllv_epi32(s, u_shift);
                    r = zero;
                    freq = zero;
                } else {
                    let inf;
                    if MODE == WINDOWED {
                        // Outside the window is frequency 0 (the permute
                        // reads only the index's low 5 bits).
                        let e = _mm512_sub_epi32(s, w_lo);
                        bad |= _mm512_mask_cmpge_epu32_mask(active, e, w_len);
                        r = _mm512_permutex2var_epi32(w_r[0], e, w_r[1]);
                        inf = _mm512_permutex2var_epi32(w_i[0], e, w_i[1]);
                    } else {
                        let e = _mm512_add_epi32(toff, s);
                        r = _mm512_mask_i32gather_epi32::<4>(zero, active, e, rcp.cast());
                        inf = _mm512_mask_i32gather_epi32::<4>(zero, active, e, info.cast());
                    }
                    freq = _mm512_and_si512(inf, ffff);
                    bias = _mm512_srli_epi32::<16>(inf);
                    bad |= _mm512_mask_cmpeq_epi32_mask(active, freq, zero);
                    xmax = _mm512_slli_epi32::<17>(freq);
                }
                let v = x[$l];
                // Renormalise: one byte out if v >= x_max, a second if
                // v >= x_max << 8 (x_max is a multiple of 256).
                let m1 = _mm512_mask_cmpge_epu32_mask(active, v, xmax);
                let m2 = _mm512_mask_cmpge_epu32_mask(active, _mm512_srli_epi32::<8>(v), xmax);
                let word = _mm512_shuffle_epi8(v, bswap);
                _mm512_mask_i32scatter_epi32::<1>(out.cast(), m1, _mm512_sub_epi32(p, four), word);
                p = _mm512_mask_sub_epi32(p, m1, p, one);
                p = _mm512_mask_sub_epi32(p, m2, p, one);
                let v = _mm512_mask_srli_epi32::<8>(v, m1, v);
                let v = _mm512_mask_srli_epi32::<8>(v, m2, v);
                if MODE == UNIFORM {
                    // x = (v / f) * M + v % f + cum, f a power of two.
                    let hi = _mm512_slli_epi32::<14>(_mm512_srlv_epi32(v, u_shift));
                    let lo = _mm512_and_si512(v, u_low);
                    x[$l] = _mm512_add_epi32(_mm512_add_epi32(hi, lo), bias);
                } else {
                    // q = v / f by the reciprocal: the high half of v * rcp
                    // (even and odd lanes), shifted by ceil(log2 f) - 1
                    // (0 for f = 1, whose rcp is 2^32 - 1).
                    let even = _mm512_srli_epi64::<32>(_mm512_mul_epu32(v, r));
                    let odd =
                        _mm512_mul_epu32(_mm512_srli_epi64::<32>(v), _mm512_srli_epi64::<32>(r));
                    let hi = _mm512_mask_blend_epi32(0xAAAA, even, odd);
                    let lz = _mm512_lzcnt_epi32(_mm512_sub_epi32(freq, one));
                    let extra = _mm512_max_epi32(_mm512_sub_epi32(c31, lz), zero);
                    let q = _mm512_srlv_epi32(hi, extra);
                    // x = v + bias + q * (M - f)
                    let cmpl = _mm512_sub_epi32(scale, freq);
                    x[$l] =
                        _mm512_add_epi32(_mm512_add_epi32(v, bias), _mm512_mullo_epi32(q, cmpl));
                }
            }};
        }

        for q in (0..quads).rev() {
            let idx = _mm512_add_epi32(doff, _mm512_set1_epi32(4 * q as i32));
            let w = _mm512_mask_i32gather_epi32::<1>(zero, active, idx, data.cast());
            step!(w, 3, 24);
            step!(w, 2, 16);
            step!(w, 1, 8);
            step!(w, 0, 0);
        }

        _mm512_storeu_si512(lanes.p.as_mut_ptr().cast(), p);
        for (v, a) in x.iter().zip(lanes.x.iter_mut()) {
            _mm512_storeu_si512(a.as_mut_ptr().cast(), *v);
        }
        bad == 0
    }
}
