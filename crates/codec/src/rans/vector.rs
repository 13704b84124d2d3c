//! Vector order-0 decoding of up to 16 chunks at once: vector lane c
//! holds chunk c's state for rANS lane l (four state vectors), one
//! position vector holds each chunk's stream position. A round decodes
//! lanes 0..3 of every chunk: gather the slot's symbol, gather the
//! symbol's (freq, cum), update, and renormalise by shifting in 0, 1 or 2
//! bytes of an 8-byte window gathered once per round at each chunk's
//! position.
//!
//! A group whose tables all give symbol 0 at least 95% of the slots (the
//! high byte planes of an XOR delta) takes the AVX-512 kernel's zero
//! path: a step whose 16 slots all decode 0 needs no table gather, and a
//! round where no state renormalises needs no window gather (`rans_bench`,
//! a plane 99.2% zero in 64 Ki-symbol chunks: 898 to 1483 M symbols/s).
//! The AVX2 kernel has no such path.
//!
//! Two kernels run the rounds: AVX-512 (one 16-lane vector, here) and
//! AVX2 (two 8-lane vectors, `avx2.rs`), whichever the CPU has; the set-up,
//! the tails and the checks around them (this file) are shared, and both
//! write the same stages, so everything downstream is the same.
//!
//! Invariants: used only after a runtime CPU-feature check; a group that
//! does not suit (short chunks, bad seeds, huge streams) is refused before
//! anything is written and goes to the scalar decoder, which also finishes
//! every chunk's tail and decodes again, from its start, any chunk whose
//! lane read past its own stream (only a damaged stream does; the vector
//! reads stay inside the plane), so output and errors equal the scalar
//! decoder's.

use super::order0::{decode_from, read_seeds};
use super::{chunk_range, AdaptivePayload, DecodeTable, DecodeTables, PairSink, StageRows};
use std::arch::x86_64::*;
use std::ops::Range;

/// Fewer chunks than this go to the scalar decoder (the vector lanes of
/// missing chunks are wasted; break-even is about 6 of 16).
pub(super) const MIN_CHUNKS: usize = 7;
/// Chunks shorter than this go to the scalar decoder.
const MIN_LEN: usize = 64;
/// Rounds (4 symbols per chunk) per kernel call.
pub(super) const BLOCK: usize = 16;
const STRIDE: usize = std::mem::size_of::<DecodeTable>();
/// How far ahead of its position each chunk's stream is prefetched before
/// a kernel call. A call of [`BLOCK`] rounds reads about 21 bytes of an
/// exponent plane's stream (2.6 bits a symbol), so without the hint one of
/// the 16 windows starts on a line not yet in cache every third round or
/// so (an estimate; what was measured: the kernel's samples piled up after
/// the window gathers, and `rans_bench` went from 788 to 885 M symbols/s;
/// 64 to 384 bytes ahead measured alike).
const PREFETCH_AHEAD: usize = 192;
/// A group whose every table gives symbol 0 at least this many of the
/// 16384 slots (95%: all 16 symbols of a step are 0 in 44% of steps or
/// more) runs the kernel's zero path: the high byte planes of an XOR
/// delta, where most symbols are 0.
const ZERO_MIN: u32 = 15565;
const _: () = assert!(STRIDE.is_multiple_of(4) && STRIDE >= super::PROB_SCALE as usize + 4);

/// Whether the AVX-512 kernel runs here.
fn has_avx512() -> bool {
    static HAVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    crate::cpu_check(&HAVE, || {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512cd")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi")
    })
}

/// Whether one of the kernels runs here (AVX-512 or AVX2).
pub(super) fn available() -> bool {
    has_avx512() || super::avx2::available()
}

pub(super) struct State<const NV: usize> {
    pub(super) x: [[[u32; 16]; 4]; NV],
    pub(super) pos: [[i32; 16]; NV],
    pub(super) symoff: [[i32; 16]; NV],
}

/// One group of chunks of a payload set up for the kernel: every lane's
/// state, stream end and output place. Lanes beyond the group repeat its
/// last chunk (their output is dropped).
struct Lanes<'a, 'p, const NV: usize> {
    p: &'a AdaptivePayload<'p>,
    js: Range<usize>,
    tables: &'a DecodeTables,
    owners: &'a [usize],
    st: State<NV>,
    end: [[i32; 16]; NV],
    /// Each chunk's first symbol, from the group's first.
    outoff: [[usize; 16]; NV],
    lens: [[usize; 16]; NV],
    seeds: [[[u32; 4]; 16]; NV],
    base: usize,
    /// Bytes of `p.body` from `base` that lanes may read.
    lim: usize,
    /// Whole rounds every chunk has.
    quads: usize,
    mode: Mode,
    /// Each lane's frequency of symbol 0, and whether every table of the
    /// group gives it at least [`ZERO_MIN`] (the AVX-512 kernel then skips
    /// the table gathers of a step whose 16 symbols are all 0).
    f0: [[u32; 16]; NV],
    zero: bool,
}

impl<'a, 'p, const NV: usize> Lanes<'a, 'p, NV> {
    /// `None` if the group does not suit the kernel (short chunks, bad
    /// seeds, huge streams): the scalar decoder then does the work.
    fn new(p: &'a AdaptivePayload<'p>, js: Range<usize>, tables: &'a DecodeTables) -> Option<Self> {
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
        let mut f0 = [[0u32; 16]; NV];
        // Each chunk's built table (chunks that repeat the previous chunk's
        // table share it, so a block's lanes can all read one L1-resident
        // table), as indices into `tables.t`.
        let owners = tables
            .owner
            .get(js.start - tables.first..js.end - tables.first)?;
        for c in 0..lanes {
            let (v, i) = (c / 16, c % 16);
            let cc = c.min(g - 1);
            let j = js.start + cc;
            let r = chunk_range(p.n, p.k, j);
            lens[v][i] = (r.end - r.start) as usize;
            outoff[v][i] = (r.start - lo) as usize;
            if lens[v][i] < MIN_LEN {
                return None;
            }
            let sd = read_seeds(p.chunk_payload(j), lens[v][i]).ok()?;
            seeds[v][i] = sd;
            let e = p.starts[j + 1] - base;
            if e > (i32::MAX / 2) as usize {
                return None;
            }
            st.pos[v][i] = (p.starts[j] - base + 16) as i32;
            end[v][i] = e as i32;
            for (xl, &seed) in st.x[v].iter_mut().zip(&sd) {
                xl[i] = seed;
            }
            // Owners never decrease: offsets from the group's first table
            // are below 16 * NV tables.
            st.symoff[v][i] = ((owners[cc] - owners[0]) * STRIDE) as i32;
            f0[v][i] = u32::from(tables.t[owners[cc]].freqs[0]);
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
        // Lanes past the group repeat its last chunk, so every lane counts.
        let zero = !matches!(mode, Mode::Uniform(_)) && f0.iter().flatten().all(|&f| f >= ZERO_MIN);
        // Lanes read up to the end of the plane's streams, not their own: a
        // chunk that compresses to a few bytes (sparse XOR planes) would
        // otherwise send its whole group to the scalar decoder. A valid
        // stream never reads past its end; a lane that did (a damaged or
        // truncated stream, where the format reads zeros instead) is
        // decoded again by the scalar decoder ([`Self::finish`]).
        let lim = (p.body.len() - base).min((i32::MAX / 2) as usize);
        Some(Lanes {
            p,
            js,
            tables,
            owners,
            st,
            end,
            outoff,
            lens,
            seeds,
            base,
            lim,
            quads,
            mode,
            f0,
            zero,
        })
    }

    /// Rounds every lane can run from its position without reading past
    /// the plane: step l of a round reads 4 bytes at pos + (at most 2l),
    /// a round advances pos by at most 8, so b rounds read below pos + 8b
    /// + 2.
    fn safe(&self) -> usize {
        (0..16 * NV)
            .map(|c| ((self.lim as i32 - self.st.pos[c / 16][c % 16] - 2).max(0) / 8) as usize)
            .min()
            .unwrap()
    }

    /// Rounds the next kernel call may run after `q` rounds: at most
    /// [`BLOCK`], the rounds left, and only safe ones.
    fn rounds(&self, q: usize) -> usize {
        self.safe().min(self.quads - q).min(BLOCK)
    }

    /// Runs `b` rounds (from [`Self::rounds`]) into `stage[..b]`.
    fn run(&mut self, b: usize, stage: &mut [[[u32; 16]; NV]; BLOCK]) {
        assert!(b <= BLOCK && b <= self.safe());
        let tabs: *const u8 = self.tables.t[self.owners[0]..].as_ptr().cast();
        let streams = self.p.body[self.base..self.base + self.lim].as_ptr();
        let st = &mut self.st;
        for c in 0..16 * NV {
            let at = st.pos[c / 16][c % 16] as usize + PREFETCH_AHEAD;
            if at < self.lim {
                // SAFETY: a prefetch of an address inside `streams`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(streams.add(at).cast()) };
            }
        }
        // SAFETY: `available()` was checked before any `Lanes` is built.
        // Lane c's table is T = tables.t[owners[c]] (symoff = (owners[c] -
        // owners[0]) * STRIDE from tables.t[owners[0]]). Gathers read
        // (uniform) no table; (packed) 4 bytes at T.packed[slot / 4],
        // inside T; or (1) 4 bytes at T.sym[slot], slot < 16384, inside T
        // (STRIDE >= 16384 + 4, repr(C)); (2) T.fc[s], s < 256; and (3) 4
        // bytes at streams[pos[c]..], below `lim` by `safe` (asserted).
        unsafe {
            if !has_avx512() {
                super::avx2::rounds::<NV>(self.mode, tabs, streams, st, b, stage);
                return;
            }
            let f0 = &self.f0;
            match (self.mode, self.zero) {
                (Mode::Uniform(bits), _) => {
                    kernel::<NV, UNIFORM, false>(tabs, streams, st, b, stage, bits, f0)
                }
                (Mode::Packed, false) => {
                    kernel::<NV, PACKED, false>(tabs, streams, st, b, stage, 0, f0)
                }
                (Mode::Packed, true) => {
                    kernel::<NV, PACKED, true>(tabs, streams, st, b, stage, 0, f0)
                }
                (Mode::Tables, false) => {
                    kernel::<NV, TABLES, false>(tabs, streams, st, b, stage, 0, f0)
                }
                (Mode::Tables, true) => {
                    kernel::<NV, TABLES, true>(tabs, streams, st, b, stage, 0, f0)
                }
            }
        }
    }

    /// Whether chunk c's lane read past its own stream (a damaged stream).
    fn overran(&self, c: usize) -> bool {
        let (v, i) = (c / 16, c % 16);
        self.st.pos[v][i] > self.end[v][i]
    }

    /// Decodes chunk c with the scalar decoder into `out` (its symbols from
    /// `from`, `lens - from` bytes): from where the kernel left it after
    /// `q` rounds (`from = 4q`), or from its start if its lane overran
    /// (`from = 0`). Returns `from`.
    fn finish(&self, c: usize, q: usize, redo: bool, out: &mut [u8]) -> usize {
        let (t, (v, i)) = (&self.tables.t[self.owners[c]], (c / 16, c % 16));
        let j = self.js.start + c;
        let payload = self.p.chunk_payload(j);
        if redo {
            decode_from(
                t,
                payload,
                self.seeds[v][i],
                16,
                &mut out[..self.lens[v][i]],
            );
            return 0;
        }
        let x = [
            self.st.x[v][0][i],
            self.st.x[v][1][i],
            self.st.x[v][2][i],
            self.st.x[v][3][i],
        ];
        let pos = self.st.pos[v][i] as usize - (self.p.starts[j] - self.base);
        decode_from(t, payload, x, pos, &mut out[..self.lens[v][i] - 4 * q]);
        4 * q
    }

    fn len(&self, c: usize) -> usize {
        self.lens[c / 16][c % 16]
    }

    fn offset(&self, c: usize) -> usize {
        self.outoff[c / 16][c % 16]
    }
}

/// Decode chunks `js` (1..=16*NV, covered by `tables`, `out` sized to
/// their span) if the group suits the SIMD path; returns false, having
/// written nothing, if it does not: the scalar decoder then does the work
/// and reports any error.
pub(super) fn try_decode_group<const NV: usize>(
    p: &AdaptivePayload<'_>,
    js: Range<usize>,
    tables: &DecodeTables,
    out: &mut [u8],
) -> bool {
    let g = js.len();
    let Some(mut ln) = Lanes::<NV>::new(p, js, tables) else {
        return false;
    };
    let mut stage = [[[0u32; 16]; NV]; BLOCK];
    let mut q = 0;
    loop {
        let b = ln.rounds(q);
        if b == 0 {
            break;
        }
        ln.run(b, &mut stage);
        if NV == 1 && b == BLOCK {
            // A full round block of one vector: transpose it, each chunk's
            // 64 symbols one store.
            let cols = columns(&stage);
            for (c, col) in cols.iter().enumerate().take(g) {
                out[ln.offset(c) + 4 * q..][..4 * b].copy_from_slice(col);
            }
        } else {
            for c in 0..g {
                out[ln.offset(c) + 4 * q..][..4 * b]
                    .copy_from_slice(&column(&stage, c, b)[..4 * b]);
            }
        }
        q += b;
    }
    for c in 0..g {
        let redo = ln.overran(c);
        let o = &mut out[ln.offset(c)..ln.offset(c) + ln.len(c)];
        let from = if redo { 0 } else { 4 * q };
        ln.finish(c, q, redo, &mut o[from..]);
    }
    true
}

/// Chunk c's symbols of the first `r` rounds of a stage, in order (the
/// first `4 r` bytes).
fn column<const NV: usize>(stage: &[[[u32; 16]; NV]; BLOCK], c: usize, r: usize) -> [u8; 64] {
    let mut o = [0u8; 64];
    for (d, w) in o.chunks_exact_mut(4).zip(&stage[..r]) {
        d.copy_from_slice(&w[c / 16][c % 16].to_le_bytes());
    }
    o
}

/// A stage of one vector as [`StageRows`] (the same layout: `[T; 1]` is
/// laid out as `T`).
fn rows(stage: &[[[u32; 16]; 1]; BLOCK]) -> &StageRows {
    const _: () = assert!(BLOCK == 16);
    // SAFETY: [[[u32; 16]; 1]; 16] and [[u32; 16]; 16] have the same size,
    // alignment and element order.
    unsafe { &*(stage as *const [[[u32; 16]; 1]; BLOCK]).cast::<StageRows>() }
}

/// A full stage of one vector, transposed: chunk c's 64 symbols of the
/// [`BLOCK`] rounds in order.
fn columns<const NV: usize>(stage: &[[[u32; 16]; NV]; BLOCK]) -> [[u8; 64]; 16] {
    let rows: [[u32; 16]; BLOCK] = std::array::from_fn(|t| stage[t][0]);
    let mut cols = [[0u8; 64]; 16];
    // SAFETY: `available()` was checked before any stage was filled (so
    // the CPU has AVX-512, or else AVX2); both read and write only these
    // two local arrays.
    unsafe {
        if has_avx512() {
            transpose16(&rows, &mut cols)
        } else {
            crate::join_avx2::transpose16(&rows, &mut cols)
        }
    };
    cols
}

/// Decodes chunks `js` of two payloads with the same chunking (`a` and
/// `b` have equal `n` and `k`; the bit-field planes of one frame) in lock
/// step, handing the symbols of both to `sink`, at offsets counted from
/// `at` for the group's first symbol: full round blocks to
/// [`PairSink::stage`] (or, if it declines, chunk by chunk to
/// [`PairSink::run`]), the rest to `run`. Together the calls cover every
/// symbol of the group once, except that a chunk may be handed again,
/// whole, after a damaged stream (its last call wins). Returns false,
/// having called nothing, if the group does not suit the SIMD path.
/// `scratch` holds chunk tails.
pub(super) fn try_decode_pair<S: PairSink>(
    a: (&AdaptivePayload<'_>, &DecodeTables),
    b: (&AdaptivePayload<'_>, &DecodeTables),
    js: Range<usize>,
    scratch: &mut Vec<u8>,
    at: u64,
    sink: &mut S,
) -> bool {
    let g = js.len();
    if a.0.n != b.0.n || a.0.k != b.0.k || !(1..=16).contains(&g) {
        return false;
    }
    let (Some(mut la), Some(mut lb)) = (
        Lanes::<1>::new(a.0, js.clone(), a.1),
        Lanes::<1>::new(b.0, js, b.1),
    ) else {
        return false;
    };
    let (mut sa, mut sb) = ([[[0u32; 16]; 1]; BLOCK], [[[0u32; 16]; 1]; BLOCK]);
    let mut q = 0;
    loop {
        let r = la.rounds(q).min(lb.rounds(q));
        if r == 0 {
            break;
        }
        la.run(r, &mut sa);
        lb.run(r, &mut sb);
        let off = |c: usize| at + (la.offset(c) + 4 * q) as u64;
        if r == BLOCK {
            let offs: [u64; 16] = std::array::from_fn(|c| off(c.min(g - 1)));
            if !sink.stage(&offs, g, rows(&sa), rows(&sb)) {
                let (ca, cb) = (columns(&sa), columns(&sb));
                for c in 0..g {
                    sink.run(offs[c], &ca[c], &cb[c]);
                }
            }
        } else {
            for c in 0..g {
                let (ca, cb) = (column(&sa, c, r), column(&sb, c, r));
                sink.run(off(c), &ca[..4 * r], &cb[..4 * r]);
            }
        }
        q += r;
    }
    let longest = (0..g).map(|c| la.len(c)).max().unwrap_or(0);
    if scratch.len() < 2 * longest {
        scratch.resize(2 * longest, 0);
    }
    let (ta, tb) = scratch.split_at_mut(longest);
    for c in 0..g {
        // A damaged lane in either plane: both chunks again from the
        // start, so that the pair handed over is consistent.
        let redo = la.overran(c) || lb.overran(c);
        let from = la.finish(c, q, redo, ta);
        lb.finish(c, q, redo, tb);
        let n = la.len(c) - from;
        sink.run(at + (la.offset(c) + from) as u64, &ta[..n], &tb[..n]);
    }
    true
}

/// `cols[c][4t..4t + 4] = rows[t][c]` (little-endian) for a 16 x 16
/// matrix of u32 ([`crate::join_avx512::transpose16`]).
///
/// # Safety
/// AVX-512F available.
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(rows: &[[u32; 16]; 16], cols: &mut [[u8; 64]; 16]) {
    // SAFETY: every load and store is of one whole 64-byte row of the two
    // arrays; the caller checked AVX-512F.
    unsafe {
        let r: [__m512i; 16] = std::array::from_fn(|t| _mm512_loadu_si512(rows[t].as_ptr().cast()));
        let c = crate::join_avx512::transpose16(&r);
        for (d, v) in cols.iter_mut().zip(c) {
            _mm512_storeu_si512(d.as_mut_ptr().cast(), v);
        }
    }
}

/// How the kernel finds a slot's symbol, frequency and offset.
#[derive(Clone, Copy)]
pub(super) enum Mode {
    /// Every table of the group is uniform over `0..2^b`: arithmetic only.
    Uniform(u32),
    /// Every table is coarse: one gather of `packed[slot / 4]`.
    Packed,
    /// A gather of `sym[slot]`, then one of `fc[sym]`.
    Tables,
}
pub(super) const UNIFORM: u8 = 0;
pub(super) const PACKED: u8 = 1;
pub(super) const TABLES: u8 = 2;

/// The kernel's constants, made once per call.
struct K {
    m3ffc: __m512i,
    m12: __m512i,
    one: __m512i,
    three: __m512i,
    m14: __m512i,
    m8: __m512i,
    m16: __m512i,
    seven: __m512i,
    eight: __m512i,
    c16: __m512i,
    fbits: __m128i,
    umask: __m512i,
    fmask: __m512i,
    wbase: __m512i,
}

/// One step of one state vector before renormalisation: its 16 symbols
/// and the states `y` they leave (see [`kernel`] for `MODE`).
///
/// # Safety
/// As [`kernel`]'s, for the lanes of `xv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn symbols<const MODE: u8>(
    k: &K,
    xv: __m512i,
    symoff: __m512i,
    fcoff: __m512i,
    tabs: *const u8,
    fc_tabs: *const u8,
    packed_tabs: *const u8,
) -> (__m512i, __m512i) {
    // SAFETY: per the contract (the gathers as in `kernel`).
    unsafe {
        if MODE == UNIFORM {
            let sy = _mm512_and_si512(_mm512_srl_epi32(xv, k.fbits), k.umask);
            let y = _mm512_or_si512(
                _mm512_sll_epi32(_mm512_srli_epi32::<14>(xv), k.fbits),
                _mm512_and_si512(xv, k.fmask),
            );
            (sy, y)
        } else if MODE == PACKED {
            // e = sym | (freq/4 - 1) << 8 | (slot/4 - cum/4) << 20
            let e = _mm512_i32gather_epi32::<1>(
                _mm512_add_epi32(_mm512_and_si512(xv, k.m3ffc), symoff),
                packed_tabs.cast(),
            );
            let f4 = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32::<8>(e), k.m12), k.one);
            let bias = _mm512_add_epi32(
                _mm512_and_si512(_mm512_srli_epi32::<18>(e), k.m3ffc),
                _mm512_and_si512(xv, k.three),
            );
            let y = _mm512_add_epi32(
                _mm512_slli_epi32::<2>(_mm512_mullo_epi32(f4, _mm512_srli_epi32::<14>(xv))),
                bias,
            );
            (_mm512_and_si512(e, k.m8), y)
        } else {
            let slot = _mm512_and_si512(xv, k.m14);
            let sw = _mm512_i32gather_epi32::<1>(_mm512_add_epi32(slot, symoff), tabs.cast());
            let sy = _mm512_and_si512(sw, k.m8);
            let fc = _mm512_i32gather_epi32::<4>(_mm512_add_epi32(sy, fcoff), fc_tabs.cast());
            let freq = _mm512_and_si512(fc, k.m16);
            let cum = _mm512_srli_epi32::<16>(fc);
            let y = _mm512_add_epi32(
                _mm512_mullo_epi32(freq, _mm512_srli_epi32::<14>(xv)),
                _mm512_sub_epi32(slot, cum),
            );
            (sy, y)
        }
    }
}

/// `8 *` the bytes a state `y` reads back to at least `RANS_L`: y >= 2^9,
/// so lz <= 22, and 8 * (bytes to read) = round_up8(lz) - 8, saturating at
/// 0 for lz = 0 (a garbage state >= 2^31; 16-bit lanes are enough).
#[inline(always)]
unsafe fn shift_of(k: &K, y: __m512i) -> __m512i {
    // SAFETY: register arithmetic only.
    unsafe {
        let lz = _mm512_lzcnt_epi32(y);
        _mm512_subs_epu16(
            _mm512_andnot_si512(k.seven, _mm512_add_epi32(lz, k.seven)),
            k.eight,
        )
    }
}

/// Renormalises `y` by `sh / 8` bytes read at `pos` from the round's
/// windows `win` (8 bytes at `pos0`); returns the state and the position
/// after.
#[inline(always)]
unsafe fn renorm(
    k: &K,
    y: __m512i,
    sh: __m512i,
    pos: __m512i,
    pos0: __m512i,
    win: [__m512i; 2],
) -> (__m512i, __m512i) {
    // SAFETY: register arithmetic only.
    unsafe {
        let d = _mm512_sub_epi32(pos, pos0);
        let idx = _mm512_add_epi32(k.wbase, _mm512_or_si512(d, _mm512_slli_epi32::<8>(d)));
        let two = _mm512_maskz_permutex2var_epi8(0x3333_3333_3333_3333, win[0], idx, win[1]);
        let x = _mm512_or_si512(
            _mm512_sllv_epi32(y, sh),
            _mm512_srlv_epi32(two, _mm512_sub_epi32(k.c16, sh)),
        );
        (x, _mm512_add_epi32(pos, _mm512_srli_epi32::<3>(sh)))
    }
}

/// The 8 bytes at each chunk's position `pos0[c]`, which cover a round.
///
/// # Safety
/// AVX-512F available; 8 bytes readable at `streams + pos0[c]`.
#[inline(always)]
unsafe fn windows<const NV: usize>(streams: *const u8, pos0: &[__m512i; NV]) -> [[__m512i; 2]; NV] {
    // SAFETY: per the contract.
    unsafe {
        let mut w = [[_mm512_setzero_si512(); 2]; NV];
        for v in 0..NV {
            let lo = _mm512_castsi512_si256(pos0[v]);
            let hi = _mm512_extracti64x4_epi64::<1>(pos0[v]);
            w[v] = [
                _mm512_i32gather_epi64::<1>(lo, streams.cast()),
                _mm512_i32gather_epi64::<1>(hi, streams.cast()),
            ];
        }
        w
    }
}

/// Decode `rounds` rounds (4 symbols of each of 16 chunks) into
/// `stage[t][c]` (chunk c's 4 symbols of round t, little-endian).
/// `MODE` is one of [`Mode`]'s (`bits` is the uniform alphabet's, else 0):
/// `UNIFORM`: the symbol is the slot's top `bits` bits, and the new state
/// `(x >> 14) << (14 - bits) | x mod 2^(14 - bits)`; `PACKED`: one gather of
/// `packed[slot / 4]` gives the symbol, its frequency and the slot's offset
/// in it; `TABLES`: two gathers.
///
/// `ZERO` (a group whose tables all give symbol 0 at least [`ZERO_MIN`]
/// slots, `f0[c]` each): a step whose 16 slots all fall in symbol 0's
/// range (its cumulative count is 0) decodes 0 without a table gather,
/// and a round where no state needs renormalising gathers no stream
/// window (the round's steps are computed first, then renormalised
/// together). Otherwise the step and the round are as without.
///
/// # Safety
/// AVX-512F/CD/BW/VBMI available; `tabs` points at consecutive
/// `DecodeTable`s such that `tabs + st.symoff[c]` is one for every lane;
/// every state is at least `RANS_L`; for every lane,
/// `streams + pos[c] .. + 8*rounds + 2` is readable; `rounds <= BLOCK`;
/// with `ZERO`, `f0[c]` is the frequency of symbol 0 in lane c's table.
#[target_feature(enable = "avx512f,avx512cd,avx512bw,avx512vbmi")]
#[allow(clippy::needless_range_loop)]
unsafe fn kernel<const NV: usize, const MODE: u8, const ZERO: bool>(
    tabs: *const u8,
    streams: *const u8,
    st: &mut State<NV>,
    rounds: usize,
    stage: &mut [[[u32; 16]; NV]; BLOCK],
    bits: u32,
    f0: &[[u32; 16]; NV],
) {
    // SAFETY: all loads/stores are of whole arrays of 64 bytes; the
    // gathers stay in bounds per the function's contract.
    unsafe {
        let fc_tabs = tabs.add(std::mem::offset_of!(DecodeTable, fc));
        let packed_tabs = tabs.add(std::mem::offset_of!(DecodeTable, packed));
        // Uniform tables: f = 2^(14 - bits) slots per symbol.
        let ub = bits.clamp(1, 8) as i32;
        let k = K {
            m3ffc: _mm512_set1_epi32(0x3FFC),
            m12: _mm512_set1_epi32(0xFFF),
            one: _mm512_set1_epi32(1),
            three: _mm512_set1_epi32(3),
            m14: _mm512_set1_epi32(0x3FFF),
            m8: _mm512_set1_epi32(0xFF),
            m16: _mm512_set1_epi32(0xFFFF),
            seven: _mm512_set1_epi32(7),
            eight: _mm512_set1_epi32(8),
            c16: _mm512_set1_epi32(16),
            fbits: _mm_cvtsi32_si128(14 - ub),
            umask: _mm512_set1_epi32((1 << ub) - 1),
            fmask: _mm512_set1_epi32((1 << (14 - ub)) - 1),
            // Byte (8c + d, 8c + d - 1) of the 128-byte window, as the
            // permute index of a big-endian 16-bit read at offset d.
            wbase: _mm512_set_epi32(
                0x7879, 0x7071, 0x6869, 0x6061, 0x5859, 0x5051, 0x4849, 0x4041, 0x3839, 0x3031,
                0x2829, 0x2021, 0x1819, 0x1011, 0x0809, 0x0001,
            ),
        };
        let symoff: [__m512i; NV] =
            std::array::from_fn(|v| _mm512_loadu_si512(st.symoff[v].as_ptr().cast()));
        let fcoff: [__m512i; NV] = std::array::from_fn(|v| _mm512_srli_epi32::<2>(symoff[v]));
        let f0v: [__m512i; NV] = std::array::from_fn(|v| _mm512_loadu_si512(f0[v].as_ptr().cast()));
        let mut x: [[__m512i; 4]; NV] = std::array::from_fn(|v| {
            std::array::from_fn(|l| _mm512_loadu_si512(st.x[v][l].as_ptr().cast()))
        });
        let mut pos: [__m512i; NV] =
            std::array::from_fn(|v| _mm512_loadu_si512(st.pos[v].as_ptr().cast()));
        for row in stage.iter_mut().take(rounds) {
            let mut s = [[_mm512_setzero_si512(); 4]; NV];
            let pos0 = pos;
            if ZERO {
                let mut y = [[_mm512_setzero_si512(); 4]; NV];
                let mut sh = [[_mm512_setzero_si512(); 4]; NV];
                let mut reads = 0u16;
                for l in 0..4 {
                    for v in 0..NV {
                        let xv = x[v][l];
                        let slot = _mm512_and_si512(xv, k.m14);
                        let (sy, yv) = if _mm512_cmplt_epu32_mask(slot, f0v[v]) == 0xFFFF {
                            let y0 = _mm512_mullo_epi32(f0v[v], _mm512_srli_epi32::<14>(xv));
                            (_mm512_setzero_si512(), _mm512_add_epi32(y0, slot))
                        } else {
                            symbols::<MODE>(&k, xv, symoff[v], fcoff[v], tabs, fc_tabs, packed_tabs)
                        };
                        let shv = shift_of(&k, yv);
                        reads |= _mm512_test_epi32_mask(shv, shv);
                        (s[v][l], y[v][l], sh[v][l]) = (sy, yv, shv);
                    }
                }
                if reads == 0 {
                    x = y;
                } else {
                    let win = windows(streams, &pos0);
                    for l in 0..4 {
                        for v in 0..NV {
                            (x[v][l], pos[v]) =
                                renorm(&k, y[v][l], sh[v][l], pos[v], pos0[v], win[v]);
                        }
                    }
                }
            } else {
                let win = windows(streams, &pos0);
                for l in 0..4 {
                    for v in 0..NV {
                        let (sy, y) = symbols::<MODE>(
                            &k,
                            x[v][l],
                            symoff[v],
                            fcoff[v],
                            tabs,
                            fc_tabs,
                            packed_tabs,
                        );
                        let sh = shift_of(&k, y);
                        (x[v][l], pos[v]) = renorm(&k, y, sh, pos[v], pos0[v], win[v]);
                        s[v][l] = sy;
                    }
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
    /// On an AVX-512 CPU, the transpose; elsewhere this code never runs
    /// (every caller is behind `has_avx512()`), and what is checked is that
    /// `has_avx512()` says so.
    #[test]
    fn transpose16_transposes() {
        let cpu = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512cd")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi");
        if !cpu {
            assert!(
                !super::has_avx512(),
                "the AVX-512 kernel on a CPU without it"
            );
            return;
        }
        assert!(super::has_avx512());
        // SAFETY: checked above.
        crate::join_avx2::assert_transposes(|r, c| unsafe { super::transpose16(r, c) });
    }
}
