//! The order-0 rANS coder (spec §4.3): one 4-lane stream (the lane of symbol
//! `i` is `i & 3`) over a 14-bit table, its encoder, its scalar decoder, and
//! plane method 3 (one shared table, one stream or several chunk streams).
//!
//! Invariants: the encoder's output equals the spec's division-based encoder
//! byte for byte; the decoder writes exactly `out.len()` symbols, reads
//! stream bytes past the end as 0 (as the spec says), and checks tables and
//! seed states before the first step, so a bad stream gives an error or wrong
//! symbols, never a panic or an out-of-bounds read.

use super::{
    careful_read, check_table_sum, chunk_offsets, length_mismatch, rans_err, read2_unchecked,
    read_freq_table, split_chunks, FreqTable, CHUNK_FLAG, PAR_MIN_BYTES, PROB_BITS, PROB_SCALE,
    RANS_L,
};
use crate::{CodecError, Result};
use ckptfs_format::cursor::Cursor;
use rayon::prelude::*;

// ---------------------------------------------------------------------------
// Order-0 encoder
// ---------------------------------------------------------------------------

/// Per-symbol encoder constants (ryg_rans `RansEncSymbol`): the division
/// `x / freq` becomes a multiply by a fixed-point reciprocal, exact for
/// `x < 2^31` (the state before an encode step is `< x_max <= 2^31`).
#[derive(Clone, Copy, Default)]
#[repr(C, align(16))]
struct EncSym {
    /// Renormalise (emit a byte) while `x >= x_max`; 0 marks freq 0.
    x_max: u32,
    rcp_freq: u32,
    bias: u32,
    cmpl_freq: u16,
    /// Total right shift after the 32x32→64 multiply (32 + ryg's rcp_shift).
    rcp_shift: u16,
}

impl EncSym {
    fn new(cum: u32, freq: u32) -> Self {
        if freq == 0 {
            return EncSym::default();
        }
        let x_max = ((RANS_L >> PROB_BITS) << 8) * freq;
        let cmpl_freq = (PROB_SCALE - freq) as u16;
        if freq == 1 {
            // rcp = 2^32 - 1, shift 0 gives q = x - 1 for 1 <= x < 2^32; the
            // bias compensates: x + bias + (x-1)(M-1) = x*M + cum.
            EncSym {
                x_max,
                rcp_freq: u32::MAX,
                bias: cum + PROB_SCALE - 1,
                cmpl_freq,
                rcp_shift: 32,
            }
        } else {
            // Alverson: shift = ceil(log2 freq), rcp = ceil(2^(shift+31) / freq).
            let shift = 32 - (freq - 1).leading_zeros();
            let rcp = (1u64 << (shift + 31)).div_ceil(u64::from(freq));
            EncSym {
                x_max,
                rcp_freq: rcp as u32,
                bias: cum,
                cmpl_freq,
                rcp_shift: (32 + shift - 1) as u16,
            }
        }
    }
}

pub(super) struct EncTable([EncSym; 256]);

impl EncTable {
    pub(super) fn new(freqs: &FreqTable) -> Self {
        let mut t = [EncSym::default(); 256];
        let mut cum = 0u32;
        for (s, e) in t.iter_mut().enumerate() {
            let f = u32::from(freqs[s]);
            *e = EncSym::new(cum, f);
            cum += f;
        }
        EncTable(t)
    }
}

/// One encode step on state `x`: renormalise (branch-free, writing two bytes
/// backwards and keeping 0, 1 or 2 of them), then `x = C(s, x)`.
#[inline(always)]
fn enc_put(x: &mut u32, e: &EncSym, buf: &mut [u8], p: &mut usize) {
    let v = *x;
    let n1 = (v >= e.x_max) as usize;
    let n2 = (u64::from(v) >= (u64::from(e.x_max) << 8)) as usize;
    // First emitted byte (v & 0xFF) lands at p-1, the second at p-2; the
    // output is the emitted bytes in reverse emission order.
    buf[*p - 1] = v as u8;
    buf[*p - 2] = (v >> 8) as u8;
    let nb = n1 + n2;
    *p -= nb;
    let v = v >> (8 * nb as u32);
    let q = ((u64::from(v) * u64::from(e.rcp_freq)) >> e.rcp_shift) as u32;
    *x = v
        .wrapping_add(e.bias)
        .wrapping_add(q.wrapping_mul(u32::from(e.cmpl_freq)));
}

/// Encode symbols `from..data.len()` of `data` (lane of symbol `i` is
/// `i & 3`) backwards onto states `x`, writing below `*p` in `buf`; returns
/// false if one had frequency 0. The vector encoder's scalar part: it runs
/// before the kernel on the symbols past the last common quad.
fn encode_tail(
    data: &[u8],
    from: usize,
    tab: &EncTable,
    x: &mut [u32; 4],
    buf: &mut [u8],
    p: &mut usize,
) -> bool {
    let mut bad = false;
    for i in (from..data.len()).rev() {
        let e = &tab.0[data[i] as usize];
        bad |= e.x_max == 0;
        enc_put(&mut x[i & 3], e, buf, p);
    }
    !bad
}

/// Encode `data` into `buf` (len >= 2*n + 2) backwards; returns the four final
/// states and the start of the emitted bytes (`buf[start..]`).
fn encode_core(data: &[u8], tab: &EncTable, buf: &mut [u8]) -> ([u32; 4], usize) {
    let n = data.len();
    assert!(buf.len() >= 2 * n + 2);
    let mut p = buf.len();
    let mut x = [RANS_L; 4];
    let mut bad = false;
    let full = n & !3;
    // Symbols past the last whole quad, highest index first.
    for i in (full..n).rev() {
        let e = &tab.0[data[i] as usize];
        bad |= e.x_max == 0;
        enc_put(&mut x[i & 3], e, buf, &mut p);
    }
    let [mut x0, mut x1, mut x2, mut x3] = x;
    for q in data[..full].chunks_exact(4).rev() {
        let e3 = &tab.0[q[3] as usize];
        let e2 = &tab.0[q[2] as usize];
        let e1 = &tab.0[q[1] as usize];
        let e0 = &tab.0[q[0] as usize];
        bad |= (e0.x_max == 0) | (e1.x_max == 0) | (e2.x_max == 0) | (e3.x_max == 0);
        enc_put(&mut x3, e3, buf, &mut p);
        enc_put(&mut x2, e2, buf, &mut p);
        enc_put(&mut x1, e1, buf, &mut p);
        enc_put(&mut x0, e0, buf, &mut p);
    }
    assert!(
        !bad,
        "encode_stream: data contains a symbol with frequency 0"
    );
    ([x0, x1, x2, x3], p)
}

/// Encode one 4-lane order-0 stream (lane of symbol `i` is `i & 3`) exactly as
/// spec §4.3 and append it to `out`: 16 seed bytes, then the renormalisation
/// bytes. Uses reciprocal multiplication; the output equals the spec's
/// division-based encoder.
///
/// # Panics
/// If `freqs` does not sum to 16384 or `data` contains a symbol whose
/// frequency is 0 (both are caller bugs; use [`normalize_freqs`](super::normalize_freqs)).
pub fn encode_stream(data: &[u8], freqs: &FreqTable, out: &mut Vec<u8>) {
    assert!(
        check_table_sum(freqs).is_ok(),
        "encode_stream: table does not sum to 16384"
    );
    let tab = EncTable::new(freqs);
    let mut buf = vec![0u8; 2 * data.len() + 2];
    encode_with(data, &tab, &mut buf, out);
}

pub(super) fn encode_with(data: &[u8], tab: &EncTable, buf: &mut [u8], out: &mut Vec<u8>) {
    let (x, start) = encode_core(data, tab, buf);
    out.reserve(16 + buf.len() - start);
    for v in x {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&buf[start..]);
}

/// Chunks encoded together: one per vector lane.
pub(super) const ENC_GROUP: usize = 16;
/// Groups of fewer chunks than this go to the scalar encoder: a vector
/// round costs the same whatever the lanes in use. With table gathers the
/// kernel's round costs about what 6 chunks cost the scalar encoder;
/// without (uniform or one windowed table), about 3.
#[cfg(target_arch = "x86_64")]
const ENC_MIN_LANES: [usize; 2] = [6, 3];

/// Encodes chunks `bounds[c]..bounds[c+1]` of `data` (chunk `c` with
/// `freqs[c]`), each as one 4-lane stream exactly as [`encode_stream`]
/// would, and appends the streams to `out` back to back; pushes their
/// lengths onto `lens`. Groups of up to [`ENC_GROUP`] chunks are encoded
/// together with AVX-512 where available, one chunk per vector lane (the
/// output is the same). `scratch` is reused between calls.
///
/// # Panics
/// If `bounds.len() != freqs.len() + 1`, a bound is out of order or past
/// `data`, a table does not sum to 16384 (a caller bug), or a chunk has a
/// symbol of frequency 0.
pub(super) fn encode_chunks(
    data: &[u8],
    bounds: &[usize],
    freqs: &[FreqTable],
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
    lens: &mut Vec<usize>,
) {
    assert_eq!(bounds.len(), freqs.len() + 1, "encode_chunks: bounds");
    for (g, fs) in freqs.chunks(ENC_GROUP).enumerate() {
        let b = &bounds[g * ENC_GROUP..g * ENC_GROUP + fs.len() + 1];
        encode_group(data, b, fs, scratch, out, lens);
    }
}

/// [`encode_chunks`] for one group of at most [`ENC_GROUP`] chunks. Each
/// chunk `c` gets a region of `scratch` of `2 * len + 4` bytes and is
/// encoded backwards from the region's end (at most 2 bytes a symbol; the
/// vector encoder stores 4 bytes at a time, 2 below its position).
fn encode_group(
    data: &[u8],
    bounds: &[usize],
    fs: &[FreqTable],
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
    lens: &mut Vec<usize>,
) {
    let g = fs.len();
    debug_assert!(g <= ENC_GROUP && bounds.len() == g + 1);
    // Consecutive chunks with the same table share one built table.
    let mut owner = [0usize; ENC_GROUP];
    let mut tabs: Vec<EncTable> = Vec::new();
    for c in 0..g {
        if c > 0 && fs[c] == fs[c - 1] {
            owner[c] = owner[c - 1];
        } else {
            assert!(
                check_table_sum(&fs[c]).is_ok(),
                "encode_stream: table does not sum to 16384"
            );
            tabs.push(EncTable::new(&fs[c]));
            owner[c] = tabs.len() - 1;
        }
    }
    let chunk = |c: usize| &data[bounds[c]..bounds[c + 1]];
    let mut ends = [0usize; ENC_GROUP];
    let mut total = 0usize;
    for (c, e) in ends.iter_mut().enumerate().take(g) {
        total += 2 * chunk(c).len() + 4;
        *e = total;
    }
    // Beyond the regions, room for the AVX2 kernel's idle lanes (which
    // store as much as one chunk's worst case), written and never read.
    let idle = 2 * (0..g).map(|c| chunk(c).len()).max().unwrap_or(0) + 4;
    if scratch.len() < total + idle {
        scratch.resize(total + idle, 0);
    }
    let mut states = [[RANS_L; 4]; ENC_GROUP];
    let mut pos = ends;
    #[cfg(target_arch = "x86_64")]
    let vector_done = encode_group_vector(
        data,
        bounds,
        fs,
        &tabs,
        &owner,
        scratch,
        &mut states,
        &mut pos,
    );
    #[cfg(not(target_arch = "x86_64"))]
    let vector_done = false;
    if !vector_done {
        for c in 0..g {
            let start = ends[c] - (2 * chunk(c).len() + 4);
            let (x, p) = encode_core(chunk(c), &tabs[owner[c]], &mut scratch[start..ends[c]]);
            states[c] = x;
            pos[c] = start + p;
        }
    }
    let body: usize = (0..g).map(|c| 16 + ends[c] - pos[c]).sum();
    out.reserve(body);
    for c in 0..g {
        for v in states[c] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&scratch[pos[c]..ends[c]]);
        lens.push(16 + ends[c] - pos[c]);
    }
}

/// Whether one of the vector encoders runs here (AVX-512, or AVX2).
#[cfg(target_arch = "x86_64")]
fn vector_encoder() -> bool {
    super::enc_avx512::available() || super::enc_avx2::available()
}

/// The vector part of [`encode_group`]: returns false, having written
/// nothing, where it does not apply (no AVX-512 or AVX2, too few chunks,
/// offsets beyond `i32`); else sets every chunk's final states and the
/// start of its bytes in `scratch` (`pos`, which enters as the regions'
/// ends).
#[cfg(target_arch = "x86_64")]
fn encode_group_vector(
    data: &[u8],
    bounds: &[usize],
    fs: &[FreqTable],
    tabs: &[EncTable],
    owner: &[usize; ENC_GROUP],
    scratch: &mut [u8],
    states: &mut [[u32; 4]; ENC_GROUP],
    pos: &mut [usize; ENC_GROUP],
) -> bool {
    use super::enc_avx2;
    use super::enc_avx512::{self, Lanes, Mode, SYMS, WINDOW};
    let g = fs.len();
    let base = bounds[0];
    let span = bounds[g] - base;
    let limit = i32::MAX as usize / 2;
    if g < ENC_MIN_LANES[1] || span > limit || pos[g - 1] > limit || !vector_encoder() {
        return false;
    }
    let chunk = |c: usize| &data[bounds[c]..bounds[c + 1]];
    let quads = (0..g).map(|c| chunk(c).len() / 4).min().unwrap_or(0);
    if quads == 0 {
        return false;
    }
    let mode = match uniform_bits(&fs[0]) {
        Some(b) if tabs.len() == 1 => Mode::Uniform(b),
        _ if tabs.len() == 1 => {
            // One table whose symbols span at most WINDOW values: held in
            // registers instead of gathered.
            let first = fs[0].iter().position(|&f| f != 0).unwrap_or(0);
            let last = fs[0].iter().rposition(|&f| f != 0).unwrap_or(0);
            let lo = first.min(SYMS - WINDOW as usize);
            if last < lo + WINDOW as usize {
                Mode::Window(lo as u32)
            } else {
                Mode::Tables
            }
        }
        _ => Mode::Tables,
    };
    if mode == Mode::Tables && g < ENC_MIN_LANES[0] {
        return false;
    }
    // The kernel's tables: per symbol the reciprocal and freq | bias << 16.
    let (mut rcp, mut info) = (Vec::new(), Vec::new());
    if !matches!(mode, Mode::Uniform(_)) {
        rcp.reserve(SYMS * tabs.len());
        info.reserve(SYMS * tabs.len());
        for t in tabs {
            for e in &t.0 {
                let freq = if e.x_max == 0 {
                    0
                } else {
                    PROB_SCALE - u32::from(e.cmpl_freq)
                };
                rcp.push(e.rcp_freq);
                info.push(freq | e.bias << 16);
            }
        }
    }
    // Where the idle room starts: the last region's end, before its tail.
    let regions_end = pos[g - 1];
    // Symbols past the last common quad first (encoding runs backwards).
    let mut ok = true;
    for c in 0..g {
        let t = &tabs[owner[c]];
        ok &= encode_tail(chunk(c), 4 * quads, t, &mut states[c], scratch, &mut pos[c]);
    }
    let avx512 = enc_avx512::available();
    // The AVX2 kernel runs all 16 lanes: a lane without a chunk encodes the
    // first chunk's symbols again into the idle room past the regions
    // (`encode_group` leaves 2 bytes a symbol of its longest chunk plus 4
    // there), and its output is dropped.
    let idle_end = regions_end + 8 * quads + 4;
    if !avx512 && (idle_end > scratch.len() || idle_end > limit) {
        return false;
    }
    let mut lanes = Lanes {
        x: [[RANS_L; 16]; 4],
        p: [idle_end as i32; 16],
        doff: [0; 16],
        toff: [0; 16],
        active: if avx512 {
            ((1u32 << g) - 1) as u16
        } else {
            0xFFFF
        },
    };
    for c in 0..g {
        for l in 0..4 {
            lanes.x[l][c] = states[c][l];
        }
        lanes.p[c] = pos[c] as i32;
        lanes.doff[c] = (bounds[c] - base) as i32;
        lanes.toff[c] = (owner[c] * SYMS) as i32;
    }
    // Lane c reads data[bounds[c] .. bounds[c] + 4 * quads] (quads <= its
    // length / 4), and writes its own region of `scratch`: [ends[c] - 2 len
    // - 4, pos[c]), where pos[c] has moved down by at most 2 a symbol for
    // the tail and moves down by at most 2 a symbol for the 4 * quads
    // symbols left, so its 4-byte stores at pos - 4 stay at or above the
    // region's start. Offsets fit i32 (checked above); toff[c] + 256 <=
    // rcp.len() with tables, and a window's lo + 32 <= 256 = rcp.len().
    let (src, dst) = (data[base..].as_ptr(), scratch.as_mut_ptr());
    let kernel_ok = if avx512 {
        let (rcp, info) = (rcp.as_ptr(), info.as_ptr());
        // SAFETY: AVX-512 is available; the lanes as above.
        unsafe { enc_avx512::encode_quads(src, dst, rcp, info, mode, &mut lanes, quads) }
    } else {
        // One 8-byte (reciprocal, info) entry per symbol, for table lookups
        // by scalar loads.
        let pairs: Vec<u64> = match mode {
            Mode::Tables => rcp
                .iter()
                .zip(&info)
                .map(|(&r, &i)| u64::from(r) | u64::from(i) << 32)
                .collect(),
            _ => Vec::new(),
        };
        let tables = enc_avx2::Tables {
            rcp: rcp.as_ptr(),
            info: info.as_ptr(),
            pairs: pairs.as_ptr(),
        };
        // SAFETY: only AVX2 is left (`vector_encoder()`); the lanes as
        // above, and the idle ones (all 16 are active) read the first
        // chunk's symbols and table and store inside [regions_end,
        // idle_end), inside `scratch` (checked above); `pairs` is as long
        // as `rcp` with tables.
        unsafe { enc_avx2::encode_quads(src, dst, tables, mode, &mut lanes, quads) }
    };
    assert!(
        ok && kernel_ok,
        "encode_stream: data contains a symbol with frequency 0"
    );
    for c in 0..g {
        for l in 0..4 {
            states[c][l] = lanes.x[l][c];
        }
        pos[c] = lanes.p[c] as usize;
    }
    true
}

// ---------------------------------------------------------------------------
// Order-0 decoder
// ---------------------------------------------------------------------------

/// Order-0 decode tables for one frequency table: slot → symbol (16 KiB) and
/// symbol → `freq | cum << 16`. `repr(C)`: the SIMD decoder gathers 4 bytes
/// at `sym[slot]`, which for the last slots reads into `fc` (in bounds).
///
/// When every frequency is a multiple of 4 (a *coarse* table, which
/// ckptfs's encoder writes where it costs under 0.1% of the plane), `packed`
/// also holds, per 4 slots, `sym | (freq/4 - 1) << 8 | (slot/4 - cum/4) <<
/// 20`: the SIMD decoder then needs one table gather per symbol instead of
/// two (it is gather-bound).
#[derive(Clone)]
#[repr(C)]
pub struct DecodeTable {
    pub(super) sym: [u8; PROB_SCALE as usize],
    pub(super) fc: [u32; 256],
    pub(super) packed: [u32; PROB_SCALE as usize / 4],
    pub(super) coarse: bool,
    /// `b` when the table is uniform over symbols `0..2^b` (every one of
    /// them `2^(14-b)`, the rest 0), else 0: the symbol is then the slot's
    /// top `b` bits, which the SIMD decoder computes without a table.
    pub(super) uniform_bits: u32,
    /// The frequencies these tables were built from (a rebuild for the same
    /// table is skipped: ckptfs's encoder repeats tables across chunks).
    pub(super) freqs: FreqTable,
}

impl DecodeTable {
    /// Build the tables; errors if `freqs` does not sum to 16384.
    pub fn new(freqs: &FreqTable) -> Result<Box<Self>> {
        let mut t = Box::new(DecodeTable::empty());
        t.rebuild(freqs)?;
        Ok(t)
    }

    pub(super) fn empty() -> DecodeTable {
        DecodeTable {
            sym: [0; PROB_SCALE as usize],
            fc: [0; 256],
            packed: [0; PROB_SCALE as usize / 4],
            coarse: false,
            uniform_bits: 0,
            // Sums to 0, so no valid table equals it: the first rebuild builds.
            freqs: [0; 256],
        }
    }

    /// Rebuild in place for another table (cheap: 256 `memset`s, plus 4096
    /// words for a coarse table).
    pub fn rebuild(&mut self, freqs: &FreqTable) -> Result<()> {
        if *freqs == self.freqs {
            return Ok(());
        }
        check_table_sum(freqs)?;
        let mut cum = 0usize;
        for (s, &f) in freqs.iter().enumerate() {
            let f = usize::from(f);
            self.sym[cum..cum + f].fill(s as u8);
            self.fc[s] = f as u32 | ((cum as u32) << 16);
            cum += f;
        }
        self.coarse = freqs.iter().all(|&f| f % 4 == 0);
        if self.coarse {
            let mut cum = 0usize;
            for (s, &f) in freqs.iter().enumerate() {
                let (f4, c4) = (usize::from(f) / 4, cum / 4);
                for (i, e) in self.packed[c4..c4 + f4].iter_mut().enumerate() {
                    *e = s as u32 | ((f4 as u32 - 1) << 8) | ((i as u32) << 20);
                }
                cum += usize::from(f);
            }
        }
        self.uniform_bits = uniform_bits(freqs).unwrap_or(0);
        self.freqs = *freqs;
        Ok(())
    }

    /// True when every frequency is a multiple of 4 (`packed` is valid).
    pub fn is_coarse(&self) -> bool {
        self.coarse
    }
}

/// `b` (1..=8) when `freqs` is uniform over symbols `0..2^b`: each of them
/// `2^(14-b)`, every other symbol 0. Such a table codes `b`-bit values in
/// exactly `b` bits (ckptfs wrote it for bf16 mantissas until 2026-11-28;
/// archives written then still use it), and its symbol is the slot's top
/// `b` bits.
pub fn uniform_bits(freqs: &FreqTable) -> Option<u32> {
    (1..=8u32).find(|&b| *freqs == uniform_table(b))
}

/// The uniform table over symbols `0..2^bits` ([`uniform_bits`]).
///
/// # Panics
/// If `bits` is not in `1..=8`.
pub fn uniform_table(bits: u32) -> FreqTable {
    assert!((1..=8).contains(&bits), "uniform table of {bits} bits");
    let mut t = [0u16; 256];
    t[..1 << bits].fill(1 << (PROB_BITS - bits));
    t
}

/// One order-0 decode step with branch-free renormalisation. `read2(p)` gives
/// the stream bytes at `p` and `p + 1` as a big-endian u16.
#[inline(always)]
fn dec_step(x: &mut u32, t: &DecodeTable, p: &mut usize, read2: impl Fn(usize) -> u32) -> u8 {
    let v = *x;
    let slot = v & (PROB_SCALE - 1);
    let s = t.sym[slot as usize];
    let e = t.fc[s as usize];
    let v = (e & 0xFFFF) * (v >> PROB_BITS) + (slot - (e >> 16));
    let nb = u32::from(v < RANS_L) + u32::from(v < (RANS_L >> 8));
    let sh = nb * 8;
    let two = read2(*p);
    *x = (v << sh) | (two >> (16 - sh));
    *p += nb as usize;
    s
}

/// Decode `out.len()` symbols of a 4-lane stream with prebuilt tables.
pub fn decode_stream_with(table: &DecodeTable, stream: &[u8], out: &mut [u8]) -> Result<()> {
    let n = out.len();
    if n == 0 {
        return Ok(());
    }
    let x = read_seeds(stream, n)?;
    decode_from(table, stream, x, 16, out);
    Ok(())
}

/// The four seed states of a stream that decodes `n > 0` symbols; errors if
/// the stream is shorter than 16 bytes or a used lane's seed is below RANS_L.
pub(super) fn read_seeds(stream: &[u8], n: usize) -> Result<[u32; 4]> {
    if stream.len() < 16 {
        return Err(CodecError::Truncated {
            what: "rANS stream seed states",
            need: 16,
            have: stream.len() as u64,
        });
    }
    let mut x = [0u32; 4];
    for (l, v) in x.iter_mut().enumerate() {
        *v = u32::from_le_bytes(stream[4 * l..4 * l + 4].try_into().unwrap());
        // A valid encoder's final state is >= RANS_L; a smaller seed would
        // break the "at most two renormalisation bytes" invariant.
        if l < n && *v < RANS_L {
            return Err(rans_err(format!("seed state {l} = {v:#x} is below RANS_L")));
        }
    }
    Ok(x)
}

/// Continue decoding a stream at byte `pos` with lane states `x`, the next
/// symbol being in lane 0. Every used state must be >= RANS_L.
pub(super) fn decode_from(
    table: &DecodeTable,
    stream: &[u8],
    x: [u32; 4],
    mut pos: usize,
    out: &mut [u8],
) {
    let n = out.len();
    let [mut x0, mut x1, mut x2, mut x3] = x;
    let len = stream.len();
    let careful = |p: usize| careful_read(stream, p);
    let (quads, rest) = out.split_at_mut(n & !3);
    let mut quads = quads.chunks_exact_mut(4);
    loop {
        // Each quad consumes at most 8 bytes; `safe` quads can read unchecked.
        let safe = len.saturating_sub(pos) / 8;
        if safe >= 2 {
            let start = pos;
            let mut done = 0;
            for q in quads.by_ref().take(safe) {
                // SAFETY: this batch decodes at most `safe` quads, each
                // advancing `pos` by at most 8, and each step reads 2 bytes at
                // the current `pos`; so p + 2 <= start + 8*safe <= len.
                let fast = |p: usize| unsafe { read2_unchecked(stream, p) };
                q[0] = dec_step(&mut x0, table, &mut pos, fast);
                q[1] = dec_step(&mut x1, table, &mut pos, fast);
                q[2] = dec_step(&mut x2, table, &mut pos, fast);
                q[3] = dec_step(&mut x3, table, &mut pos, fast);
                done += 1;
            }
            debug_assert!(pos <= start + 8 * done);
            if done < safe {
                break;
            }
        } else {
            match quads.next() {
                Some(q) => {
                    q[0] = dec_step(&mut x0, table, &mut pos, careful);
                    q[1] = dec_step(&mut x1, table, &mut pos, careful);
                    q[2] = dec_step(&mut x2, table, &mut pos, careful);
                    q[3] = dec_step(&mut x3, table, &mut pos, careful);
                }
                None => break,
            }
        }
    }
    let mut xs = [x0, x1, x2, x3];
    for (l, o) in rest.iter_mut().enumerate() {
        *o = dec_step(&mut xs[l], table, &mut pos, careful);
    }
}

/// Decode a 4-lane order-0 stream of exactly `out.len()` symbols. Bytes past
/// the end of `stream` read as 0 (spec §4.3). Errors on a table that does not
/// sum to 16384 and on a stream without its 16 seed bytes.
pub fn decode_stream(stream: &[u8], freqs: &FreqTable, out: &mut [u8]) -> Result<()> {
    let t = DecodeTable::new(freqs)?;
    decode_stream_with(&t, stream, out)
}

// ---------------------------------------------------------------------------
// Method 3
// ---------------------------------------------------------------------------

/// Plane method 3 (legacy shared model, single-stream or chunked): decode the
/// whole payload into `out` (`out.len()` = the plane's `orig_len`).
pub fn decode_method3(payload: &[u8], out: &mut [u8]) -> Result<()> {
    let mut c = Cursor::new(payload);
    let raw = c.u64("method-3 count")?;
    if raw == 0 {
        return if out.is_empty() {
            Ok(())
        } else {
            Err(length_mismatch("method-3 plane", 0, out.len()))
        };
    }
    let chunked = raw & CHUNK_FLAG != 0;
    let n = raw & !CHUNK_FLAG;
    if n != out.len() as u64 {
        return Err(length_mismatch("method-3 plane", n, out.len()));
    }
    if !chunked {
        let freqs = read_freq_table(c.take(512, "method-3 frequency table")?);
        return decode_stream(c.rest(), &freqs, out);
    }
    let k = usize::from(c.u16("method-3 chunk count")?);
    let freqs = read_freq_table(c.take(512, "method-3 frequency table")?);
    let table = DecodeTable::new(&freqs)?;
    if k == 0 {
        return Err(length_mismatch("method-3 plane", 0, out.len()));
    }
    let clens = c.take(4 * k as u64, "method-3 chunk lengths")?;
    let body = c.rest();
    let starts = chunk_offsets(clens, body.len(), "method-3 chunk streams")?;
    let parts = split_chunks(out, k);
    let job =
        |(j, o): (usize, &mut [u8])| decode_stream_with(&table, &body[starts[j]..starts[j + 1]], o);
    if n as usize >= PAR_MIN_BYTES && k > 1 {
        parts.into_par_iter().enumerate().try_for_each(job)
    } else {
        parts.into_iter().enumerate().try_for_each(job)
    }
}

#[cfg(test)]
mod tests;
