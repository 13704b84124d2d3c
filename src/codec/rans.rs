//! rANS entropy coders of the z4ai 0.2.0 format (spec §4.2–§4.4).
//!
//! * Order-0 (`PROB_BITS = 14`): one 4-lane stream, plane method 3 (legacy
//!   shared model, single-stream or chunked) and plane method 4 (adaptive: one
//!   model per chunk, the tables packed into one zstd frame).
//! * Order-1 (`O1_PROB_BITS = 12`): plane method 5, decode only.
//!
//! Every decoder writes into a caller-sized buffer and checks every length in
//! the payload against it and against the payload's own size, so a lying
//! header can cause an error but never an allocation of the claimed size, an
//! out-of-bounds read or a panic.
//!
//! Speed notes. The order-0 decoder uses a 16 KiB slot→symbol table plus a
//! 256-entry (freq, cum) table (17 KiB, L1-resident, built with 256 `memset`s,
//! cheap enough for one table per 64 KiB chunk). Renormalisation needs at most
//! two bytes per symbol (after a decode step `x >= 2^9`), so it is done
//! branch-free with one 2-byte big-endian read. While enough stream bytes
//! remain the reads are unchecked; near the end a careful loop supplies the
//! zero bytes the spec prescribes past the end of the stream. The order-1
//! decoder packs (symbol, freq-1, slot-cum) into one `u32` per slot, so each
//! step is one table load, and runs the four segments of a chunk in lock-step.

use super::{CodecError, Cursor, Result};
use rayon::prelude::*;
use std::ops::Range;

/// Order-0 probability precision (bits).
pub const PROB_BITS: u32 = 14;
/// Order-0 frequency-table total, `1 << PROB_BITS`.
pub const PROB_SCALE: u32 = 1 << PROB_BITS;
/// Lower bound of the normalised rANS state interval (order 0 and order 1).
pub const RANS_L: u32 = 1 << 23;
/// Order-1 probability precision (bits).
pub const O1_PROB_BITS: u32 = 12;
/// Order-1 row total, `1 << O1_PROB_BITS`.
pub const O1_SCALE: u32 = 1 << O1_PROB_BITS;

/// A normalised order-0 frequency table; sums to exactly [`PROB_SCALE`].
pub type FreqTable = [u16; 256];

/// Bit 62 of the method-4 count (`_ADAPT_FLAG`).
const ADAPT_FLAG: u64 = 1 << 62;
/// Bit 63 of the method-3 count (`_CHUNK_FLAG`).
const CHUNK_FLAG: u64 = 1 << 63;
/// Planes at least this large are decoded/encoded in parallel over chunks.
const PAR_MIN_BYTES: usize = 1 << 20;
/// Segments per order-1 chunk; z4ai ignores the header byte and assumes 4.
const O1_NSEG: usize = 4;
/// Largest valid order-1 model blob: 256 rows of `u8 c; u16 nsym; 256 × 3`.
const O1_MODEL_MAX: usize = 256 * (3 + 256 * 3);
/// z4ai decodes zstd with `max_window_size = 1 << 27`.
const ZSTD_WINDOW_LOG_MAX: u32 = 27;
/// The order-0 state is at least `RANS_L` before a step, so afterwards it is at
/// least `RANS_L >> PROB_BITS = 2^9`; two renormalisation bytes always suffice.
const _: () = assert!((RANS_L >> PROB_BITS) << 16 >= RANS_L);
const _: () = assert!((RANS_L >> O1_PROB_BITS) << 16 >= RANS_L);

fn rans_err(msg: impl Into<String>) -> CodecError {
    CodecError::Rans(msg.into())
}

// ---------------------------------------------------------------------------
// Model building
// ---------------------------------------------------------------------------

/// Byte histogram (four interleaved sub-histograms to break store-to-load
/// dependencies on runs of equal bytes).
pub fn histogram(data: &[u8]) -> [u64; 256] {
    let mut total = [0u64; 256];
    // u32 sub-counters cannot overflow within a block of < 2^32 bytes.
    for block in data.chunks(1 << 30) {
        let mut h = [[0u32; 256]; 4];
        let mut words = block.chunks_exact(8);
        for w in &mut words {
            let v = u64::from_le_bytes(w.try_into().unwrap());
            h[0][(v & 0xFF) as usize] += 1;
            h[1][((v >> 8) & 0xFF) as usize] += 1;
            h[2][((v >> 16) & 0xFF) as usize] += 1;
            h[3][((v >> 24) & 0xFF) as usize] += 1;
            h[0][((v >> 32) & 0xFF) as usize] += 1;
            h[1][((v >> 40) & 0xFF) as usize] += 1;
            h[2][((v >> 48) & 0xFF) as usize] += 1;
            h[3][(v >> 56) as usize] += 1;
        }
        for &b in words.remainder() {
            h[0][b as usize] += 1;
        }
        for (s, t) in total.iter_mut().enumerate() {
            *t += u64::from(h[0][s]) + u64::from(h[1][s]) + u64::from(h[2][s]) + u64::from(h[3][s]);
        }
    }
    total
}

/// Normalise a histogram to an order-0 table summing to exactly 16384; see
/// [`normalize_freqs_to`]. An all-zero histogram gives the valid dummy table
/// `freq[0] = 16384`.
pub fn normalize_freqs(hist: &[u64; 256]) -> FreqTable {
    normalize_freqs_to(hist, PROB_SCALE)
}

/// Normalise a histogram to integer frequencies summing to exactly `total`
/// (`256 <= total <= 32768`; 16384 for order 0, 4096 for an order-1 row).
///
/// Every symbol that occurs gets at least 1. The result minimises the coded
/// size `-Σ h[s]·log2(f[s]/total)`: start from the rounded scaled counts
/// (occurring symbols at least 1), fix the sum by greedily moving one unit at
/// a time where it costs the least (largest gain when adding, smallest loss
/// when removing), then apply improving unit swaps until none is left. The
/// cost is separable and convex in each `f[s]`, so a state without an
/// improving swap is optimal. An all-zero histogram gives `f[0] = total`.
pub fn normalize_freqs_to(hist: &[u64; 256], total: u32) -> [u16; 256] {
    assert!(
        (256..=1 << 15).contains(&total),
        "normalize_freqs_to: total {total} out of range"
    );
    let mut f = [0u16; 256];
    let sum: u128 = hist.iter().map(|&h| u128::from(h)).sum();
    if sum == 0 {
        f[0] = total as u16;
        return f;
    }
    let t = u128::from(total);
    let mut fsum: i64 = 0;
    for s in 0..256 {
        if hist[s] != 0 {
            // round(h * total / sum), at least 1 and at most total.
            let v = (u128::from(hist[s]) * t * 2 + sum) / (sum * 2);
            let v = v.clamp(1, t) as u16;
            f[s] = v;
            fsum += i64::from(v);
        }
    }
    let present: Vec<usize> = (0..256).filter(|&s| hist[s] != 0).collect();
    // Marginal value of adding one unit to s / cost of removing one from s.
    let gain = |s: usize, f: &[u16; 256]| -> f64 {
        let v = f64::from(f[s]);
        if u32::from(f[s]) >= total {
            f64::NEG_INFINITY
        } else {
            hist[s] as f64 * (((v + 1.0) / v).log2())
        }
    };
    let loss = |s: usize, f: &[u16; 256]| -> f64 {
        let v = f64::from(f[s]);
        if f[s] <= 1 {
            f64::INFINITY
        } else {
            hist[s] as f64 * ((v / (v - 1.0)).log2())
        }
    };
    let mut gains = [f64::NEG_INFINITY; 256];
    let mut losses = [f64::INFINITY; 256];
    for &s in &present {
        gains[s] = gain(s, &f);
        losses[s] = loss(s, &f);
    }
    let argmax = |g: &[f64; 256]| -> usize {
        let mut best = present[0];
        for &s in &present {
            if g[s] > g[best] {
                best = s;
            }
        }
        best
    };
    let argmin = |l: &[f64; 256]| -> usize {
        let mut best = present[0];
        for &s in &present {
            if l[s] < l[best] {
                best = s;
            }
        }
        best
    };
    let mut diff = i64::from(total) - fsum;
    while diff > 0 {
        let s = argmax(&gains);
        f[s] += 1;
        gains[s] = gain(s, &f);
        losses[s] = loss(s, &f);
        diff -= 1;
    }
    while diff < 0 {
        // present.len() <= 256 <= total, so some symbol has f > 1.
        let s = argmin(&losses);
        f[s] -= 1;
        gains[s] = gain(s, &f);
        losses[s] = loss(s, &f);
        diff += 1;
    }
    // Improving swaps (bounded; each strictly lowers the convex cost).
    for _ in 0..4096 {
        let up = argmax(&gains);
        let mut down = usize::MAX;
        for &s in &present {
            if s != up && (down == usize::MAX || losses[s] < losses[down]) {
                down = s;
            }
        }
        if down == usize::MAX {
            break;
        }
        let improves = gains[up] > losses[down] * (1.0 + 1e-12) + 1e-9;
        if !improves {
            break;
        }
        f[up] += 1;
        f[down] -= 1;
        for s in [up, down] {
            gains[s] = gain(s, &f);
            losses[s] = loss(s, &f);
        }
    }
    debug_assert_eq!(f.iter().map(|&v| u32::from(v)).sum::<u32>(), total);
    f
}

fn check_table_sum(freqs: &FreqTable) -> Result<()> {
    let sum: u32 = freqs.iter().map(|&v| u32::from(v)).sum();
    if sum != PROB_SCALE {
        return Err(rans_err(format!(
            "order-0 frequency table sums to {sum}, not {PROB_SCALE}"
        )));
    }
    Ok(())
}

fn read_freq_table(bytes: &[u8]) -> FreqTable {
    let mut t = [0u16; 256];
    for (v, b) in t.iter_mut().zip(bytes.chunks_exact(2)) {
        *v = u16::from_le_bytes([b[0], b[1]]);
    }
    t
}

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

struct EncTable([EncSym; 256]);

impl EncTable {
    fn new(freqs: &FreqTable) -> Self {
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
/// frequency is 0 (both are caller bugs; use [`normalize_freqs`]).
pub fn encode_stream(data: &[u8], freqs: &FreqTable, out: &mut Vec<u8>) {
    assert!(
        check_table_sum(freqs).is_ok(),
        "encode_stream: table does not sum to 16384"
    );
    let tab = EncTable::new(freqs);
    let mut buf = vec![0u8; 2 * data.len() + 2];
    encode_with(data, &tab, &mut buf, out);
}

fn encode_with(data: &[u8], tab: &EncTable, buf: &mut [u8], out: &mut Vec<u8>) {
    let (x, start) = encode_core(data, tab, buf);
    out.reserve(16 + buf.len() - start);
    for v in x {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&buf[start..]);
}

// ---------------------------------------------------------------------------
// Order-0 decoder
// ---------------------------------------------------------------------------

/// Order-0 decode tables for one frequency table: slot → symbol (16 KiB) and
/// symbol → `freq | cum << 16`. `repr(C)`: the SIMD decoder gathers 4 bytes
/// at `sym[slot]`, which for the last slots reads into `fc` (in bounds).
#[derive(Clone)]
#[repr(C)]
pub struct DecodeTable {
    sym: [u8; PROB_SCALE as usize],
    fc: [u32; 256],
}

impl DecodeTable {
    /// Build the tables; errors if `freqs` does not sum to 16384.
    pub fn new(freqs: &FreqTable) -> Result<Box<Self>> {
        let mut t = Box::new(DecodeTable {
            sym: [0; PROB_SCALE as usize],
            fc: [0; 256],
        });
        t.rebuild(freqs)?;
        Ok(t)
    }

    /// Rebuild in place for another table (cheap: 256 `memset`s).
    pub fn rebuild(&mut self, freqs: &FreqTable) -> Result<()> {
        check_table_sum(freqs)?;
        let mut cum = 0usize;
        for (s, &f) in freqs.iter().enumerate() {
            let f = usize::from(f);
            self.sym[cum..cum + f].fill(s as u8);
            self.fc[s] = f as u32 | ((cum as u32) << 16);
            cum += f;
        }
        Ok(())
    }
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
fn read_seeds(stream: &[u8], n: usize) -> Result<[u32; 4]> {
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
fn decode_from(table: &DecodeTable, stream: &[u8], x: [u32; 4], mut pos: usize, out: &mut [u8]) {
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

/// `[j*n/k, (j+1)*n/k)` without overflow.
fn chunk_range(n: u64, k: usize, j: usize) -> Range<u64> {
    let lo = (u128::from(n) * j as u128 / k as u128) as u64;
    let hi = (u128::from(n) * (j as u128 + 1) / k as u128) as u64;
    lo..hi
}

/// Split `out` (len n) into the k chunk slices `[j*n/k, (j+1)*n/k)`.
fn split_chunks(out: &mut [u8], k: usize) -> Vec<&mut [u8]> {
    let n = out.len() as u64;
    let mut v = Vec::with_capacity(k);
    let mut rest = out;
    for j in 0..k {
        let r = chunk_range(n, k, j);
        let (a, b) = rest.split_at_mut((r.end - r.start) as usize);
        v.push(a);
        rest = b;
    }
    v
}

fn length_mismatch(what: &'static str, got: u64, expected: usize) -> CodecError {
    CodecError::LengthMismatch {
        what,
        got,
        expected: expected as u64,
    }
}

/// Read `k` u32 chunk lengths from `clens` and check that the chunks fit in
/// `avail` bytes; returns the k+1 chunk start offsets relative to the first.
fn chunk_offsets(clens: &[u8], avail: usize, what: &'static str) -> Result<Vec<usize>> {
    let mut starts = Vec::with_capacity(clens.len() / 4 + 1);
    let mut acc = 0u64;
    starts.push(0);
    for c in clens.chunks_exact(4) {
        acc += u64::from(u32::from_le_bytes(c.try_into().unwrap()));
        if acc > avail as u64 {
            return Err(CodecError::Truncated {
                what,
                need: acc,
                have: avail as u64,
            });
        }
        starts.push(acc as usize);
    }
    Ok(starts)
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

// ---------------------------------------------------------------------------
// Method 4
// ---------------------------------------------------------------------------

/// Parsed view of a method-4 (adaptive order-0) payload, for random access to
/// its chunks.
#[derive(Debug, Clone)]
pub struct AdaptivePayload<'a> {
    n: u64,
    k: usize,
    freq_blob: &'a [u8],
    /// The concatenated chunk streams.
    body: &'a [u8],
    /// k + 1 offsets into `body`.
    starts: Vec<usize>,
}

impl<'a> AdaptivePayload<'a> {
    /// Parse and validate the header, the chunk-length table and the layout.
    /// The only allocation is the offset table, at most `payload.len() / 4`
    /// entries. Trailing bytes after the last chunk are ignored, as z4ai does.
    pub fn parse(payload: &'a [u8]) -> Result<Self> {
        let mut c = Cursor::new(payload);
        let raw = c.u64("method-4 count")?;
        if raw == 0 {
            // z4ai writes an empty plane as the 8 bytes `u64 0`.
            return Ok(AdaptivePayload {
                n: 0,
                k: 0,
                freq_blob: &[],
                body: &[],
                starts: vec![0],
            });
        }
        if raw & ADAPT_FLAG == 0 {
            return Err(CodecError::invalid(
                "method-4 payload",
                "count without the bit-62 adaptive flag",
            ));
        }
        if raw & CHUNK_FLAG != 0 {
            return Err(CodecError::invalid(
                "method-4 payload",
                "count has bit 63 set (n >= 2^62)",
            ));
        }
        let n = raw & !ADAPT_FLAG;
        let k = c.u32("method-4 chunk count")? as usize;
        let fbl = c.u32("method-4 freq blob length")?;
        if k == 0 && n != 0 {
            return Err(CodecError::invalid(
                "method-4 payload",
                format!("0 chunks for {n} symbols"),
            ));
        }
        let clens = c.take(4 * k as u64, "method-4 chunk lengths")?;
        let freq_blob = c.take(u64::from(fbl), "method-4 freq blob")?;
        let body = c.rest();
        let starts = chunk_offsets(clens, body.len(), "method-4 chunk streams")?;
        Ok(AdaptivePayload {
            n,
            k,
            freq_blob,
            body,
            starts,
        })
    }

    /// Number of symbols n.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True if the plane is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Number of chunks k.
    pub fn chunks(&self) -> usize {
        self.k
    }

    /// Symbol range `[j*n/k, (j+1)*n/k)` of chunk j. Panics if `j >= k`.
    pub fn chunk_bounds(&self, j: usize) -> Range<u64> {
        assert!(j < self.k, "chunk {j} out of range ({} chunks)", self.k);
        chunk_range(self.n, self.k, j)
    }

    /// Compressed bytes of chunk j. Panics if `j >= k`.
    pub fn chunk_payload(&self, j: usize) -> &'a [u8] {
        assert!(j < self.k, "chunk {j} out of range ({} chunks)", self.k);
        &self.body[self.starts[j]..self.starts[j + 1]]
    }

    /// The zstd frame holding the k frequency tables.
    pub fn freq_blob(&self) -> &'a [u8] {
        self.freq_blob
    }

    /// Decode the k frequency tables (the blob must decode to exactly k*512
    /// bytes, which bounds the output) and check that each sums to 16384.
    pub fn freq_tables(&self) -> Result<Vec<FreqTable>> {
        if self.k == 0 {
            return Ok(Vec::new());
        }
        let raw = zstd_decode_first_frame(self.freq_blob, self.k * 512, "method-4 freq blob")?;
        if raw.len() != self.k * 512 {
            return Err(length_mismatch(
                "method-4 freq blob",
                raw.len() as u64,
                self.k * 512,
            ));
        }
        let mut v = Vec::with_capacity(self.k);
        for (j, b) in raw.chunks_exact(512).enumerate() {
            let t = read_freq_table(b);
            check_table_sum(&t).map_err(|e| rans_err(format!("chunk {j}: {e}")))?;
            v.push(t);
        }
        Ok(v)
    }

    /// Decode chunk j with its table; `out.len()` must be the chunk length.
    pub fn decode_chunk(&self, j: usize, table: &FreqTable, out: &mut [u8]) -> Result<()> {
        let t = DecodeTable::new(table)?;
        self.decode_chunk_with(j, &t, out)
    }

    /// [`Self::decode_chunk`] with prebuilt (reusable) tables.
    pub fn decode_chunk_with(&self, j: usize, table: &DecodeTable, out: &mut [u8]) -> Result<()> {
        if j >= self.k {
            return Err(CodecError::invalid(
                "method-4 chunk index",
                format!("{j} >= {}", self.k),
            ));
        }
        let r = chunk_range(self.n, self.k, j);
        if r.end - r.start != out.len() as u64 {
            return Err(length_mismatch(
                "method-4 chunk",
                r.end - r.start,
                out.len(),
            ));
        }
        decode_stream_with(table, self.chunk_payload(j), out)
    }
}

// ---------------------------------------------------------------------------
// Method 4: multi-chunk decoding
// ---------------------------------------------------------------------------

/// Order-0 decode tables of the consecutive method-4 chunks `first..first+len`
/// (17 KiB each), for [`AdaptivePayload::decode_chunks`]. Build once per
/// payload (or per block of chunks) and reuse.
#[derive(Clone, Default)]
pub struct DecodeTables {
    first: usize,
    t: Vec<DecodeTable>,
}

impl DecodeTables {
    /// Tables for all chunks; `freqs` are the k tables of the payload
    /// ([`AdaptivePayload::freq_tables`]). Errors if one does not sum to 16384.
    pub fn new(freqs: &[FreqTable]) -> Result<Self> {
        Self::for_chunks(freqs, 0..freqs.len())
    }

    /// Tables for chunks `js` only; `freqs` are still all k tables.
    pub fn for_chunks(freqs: &[FreqTable], js: Range<usize>) -> Result<Self> {
        let mut t = DecodeTables::default();
        t.rebuild(freqs, js)?;
        Ok(t)
    }

    /// Rebuild in place for chunks `js`, reusing the allocation.
    pub fn rebuild(&mut self, freqs: &[FreqTable], js: Range<usize>) -> Result<()> {
        let f = freqs.get(js.clone()).ok_or_else(|| {
            CodecError::invalid(
                "method-4 decode tables",
                format!("chunks {js:?} of {}", freqs.len()),
            )
        })?;
        self.first = js.start;
        self.t.truncate(f.len());
        for (t, f) in self.t.iter_mut().zip(f) {
            t.rebuild(f)?;
        }
        while self.t.len() < f.len() {
            let mut t = DecodeTable {
                sym: [0; PROB_SCALE as usize],
                fc: [0; 256],
            };
            t.rebuild(&f[self.t.len()])?;
            self.t.push(t);
        }
        Ok(())
    }

    /// The chunk indices these tables cover.
    pub fn chunks(&self) -> Range<usize> {
        self.first..self.first + self.t.len()
    }

    /// The table of chunk `j`, if covered.
    pub fn get(&self, j: usize) -> Option<&DecodeTable> {
        self.t.get(j.checked_sub(self.first)?)
    }
}

/// Chunks decoded together by [`AdaptivePayload::decode_chunks`] (one SIMD
/// lane each).
pub const CHUNK_GROUP: usize = 16;

impl AdaptivePayload<'_> {
    /// Symbol range of the consecutive chunks `js` (non-empty, in range).
    fn span(&self, js: &Range<usize>) -> Range<u64> {
        chunk_range(self.n, self.k, js.start).start..chunk_range(self.n, self.k, js.end - 1).end
    }

    /// Decode the consecutive chunks `js` into `out`, whose length must be the
    /// sum of their lengths. `tables` must cover `js`. Groups of up to
    /// [`CHUNK_GROUP`] chunks are decoded together (AVX-512 when available,
    /// one chunk per vector lane), so ranges of 16 chunks or more are fastest.
    /// Output and errors equal [`Self::decode_chunk`] for every chunk.
    pub fn decode_chunks(
        &self,
        js: Range<usize>,
        tables: &DecodeTables,
        out: &mut [u8],
    ) -> Result<()> {
        if js.start > js.end || js.end > self.k {
            return Err(CodecError::invalid(
                "method-4 chunk range",
                format!("{js:?} of {} chunks", self.k),
            ));
        }
        if js.is_empty() {
            return if out.is_empty() {
                Ok(())
            } else {
                Err(length_mismatch("method-4 chunks", 0, out.len()))
            };
        }
        let tc = tables.chunks();
        if tc.start > js.start || tc.end < js.end {
            return Err(CodecError::invalid(
                "method-4 decode tables",
                format!("cover chunks {tc:?}, not {js:?}"),
            ));
        }
        let span = self.span(&js);
        if span.end - span.start != out.len() as u64 {
            return Err(length_mismatch(
                "method-4 chunks",
                span.end - span.start,
                out.len(),
            ));
        }
        // Near-equal groups of at most CHUNK_GROUP chunks (20 = 10 + 10).
        let m = js.len().div_ceil(CHUNK_GROUP);
        let mut rest = out;
        for i in 0..m {
            let g = js.start + js.len() * i / m..js.start + js.len() * (i + 1) / m;
            let r = self.span(&g);
            let (o, r2) = rest.split_at_mut((r.end - r.start) as usize);
            rest = r2;
            self.decode_group(g, tables, o)?;
        }
        Ok(())
    }

    /// Decode at most [`CHUNK_GROUP`] consecutive chunks (checked by the caller).
    fn decode_group(&self, js: Range<usize>, tables: &DecodeTables, out: &mut [u8]) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if js.len() >= simd::MIN_CHUNKS && simd::available() {
            // One 16-lane vector per group (two interleaved vectors, NV = 2,
            // measured slower: the kernel is gather-throughput bound).
            if simd::try_decode_group::<1>(self, js.clone(), tables, out) {
                return Ok(());
            }
        }
        let lo = self.span(&js).start;
        for j in js {
            let r = chunk_range(self.n, self.k, j);
            let o = &mut out[(r.start - lo) as usize..(r.end - lo) as usize];
            let t = tables.get(j).expect("tables cover the group");
            decode_stream_with(t, self.chunk_payload(j), o)?;
        }
        Ok(())
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    //! AVX-512 order-0 decoding of up to 16 chunks at once: vector lane c
    //! holds chunk c's state for rANS lane l (four state vectors), one
    //! position vector holds each chunk's stream position. A round decodes
    //! lanes 0..3 of every chunk: gather the slot's symbol, gather the
    //! symbol's (freq, cum), update, and renormalise by gathering 4 stream
    //! bytes at the chunk's position and shifting in 0, 1 or 2 of them.

    use super::{chunk_range, decode_from, read_seeds, AdaptivePayload, DecodeTable, DecodeTables};
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
        use std::sync::atomic::{AtomicU8, Ordering};
        static HAVE: AtomicU8 = AtomicU8::new(0);
        match HAVE.load(Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => {
                let y = is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512cd")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vbmi");
                HAVE.store(1 + u8::from(y), Ordering::Relaxed);
                y
            }
        }
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
            let Ok(seeds) = read_seeds(p.chunk_payload(j), lens[v][i]) else {
                return false;
            };
            let e = p.starts[j + 1] - base;
            if e > (i32::MAX / 2) as usize {
                return false;
            }
            st.pos[v][i] = (p.starts[j] - base + 16) as i32;
            end[v][i] = e as i32;
            for (xl, &seed) in st.x[v].iter_mut().zip(&seeds) {
                xl[i] = seed;
            }
            st.symoff[v][i] = (cc * STRIDE) as i32;
        }
        let Some(tab) = tables.t.get(js.start - tables.first..js.end - tables.first) else {
            return false;
        };
        let quads = lens.iter().flatten().min().unwrap() / 4;
        let streams = &p.body[base..p.starts[js.end]];
        let mut stage = [[[0u32; 16]; NV]; BLOCK];
        let mut q = 0;
        while q < quads {
            // Step l of a round reads 4 bytes at pos + (at most 2l), a round
            // advances pos by at most 8: b rounds read below pos + 8b + 2.
            let safe = (0..lanes)
                .map(|c| ((end[c / 16][c % 16] - st.pos[c / 16][c % 16] - 2).max(0) / 8) as usize)
                .min()
                .unwrap();
            let b = safe.min(quads - q).min(BLOCK);
            if b == 0 {
                break;
            }
            // SAFETY: `available()` checked the CPU features. Gathers read
            // (1) 4 bytes at tab[c].sym[slot], slot < 16384, inside tab[c]
            // (STRIDE >= 16384 + 4, repr(C)), c < g; (2) tab[c].fc[s], s < 256;
            // (3) 4 bytes at streams[pos[c]..], below end[c] <= streams.len()
            // by the bound on b above.
            unsafe {
                kernel::<NV>(
                    tab.as_ptr().cast(),
                    streams.as_ptr(),
                    &mut st,
                    b,
                    &mut stage,
                );
            }
            for c in 0..g {
                let (v, i) = (c / 16, c % 16);
                let o = &mut out[outoff[v][i] + 4 * q..][..4 * b];
                for (d, w) in o.chunks_exact_mut(4).zip(&stage[..b]) {
                    d.copy_from_slice(&w[v][i].to_le_bytes());
                }
            }
            q += b;
        }
        for (c, t) in tab.iter().enumerate() {
            let (v, i) = (c / 16, c % 16);
            let j = js.start + c;
            let x = [st.x[v][0][i], st.x[v][1][i], st.x[v][2][i], st.x[v][3][i]];
            let pos = st.pos[v][i] as usize - (p.starts[j] - base);
            let o = &mut out[outoff[v][i] + 4 * q..outoff[v][i] + lens[v][i]];
            decode_from(t, p.chunk_payload(j), x, pos, o);
        }
        true
    }

    /// Decode `rounds` rounds (4 symbols of each of 16 chunks) into
    /// `stage[t][c]` (chunk c's 4 symbols of round t, little-endian).
    ///
    /// # Safety
    /// AVX-512F/CD/BW/VBMI available; `tabs` points at consecutive
    /// `DecodeTable`s such that `tabs + st.symoff[c]` is one for every lane;
    /// every state is at least `RANS_L`; for every lane,
    /// `streams + pos[c] .. + 8*rounds + 2` is readable; `rounds <= BLOCK`.
    #[target_feature(enable = "avx512f,avx512cd,avx512bw,avx512vbmi")]
    #[allow(clippy::needless_range_loop)]
    unsafe fn kernel<const NV: usize>(
        tabs: *const u8,
        streams: *const u8,
        st: &mut State<NV>,
        rounds: usize,
        stage: &mut [[[u32; 16]; NV]; BLOCK],
    ) {
        // SAFETY: all loads/stores are of whole arrays of 64 bytes; the
        // gathers stay in bounds per the function's contract.
        unsafe {
            let fc_tabs = tabs.add(super::PROB_SCALE as usize);
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
            // Byte (8c + d, 8c + d - 1) of the 128-byte window, as the
            // permute index of a big-endian 16-bit read at offset d.
            let wbase = _mm512_set_epi32(
                0x7879, 0x7071, 0x6869, 0x6061, 0x5859, 0x5051, 0x4849, 0x4041, 0x3839, 0x3031,
                0x2829, 0x2021, 0x1819, 0x1011, 0x0809, 0x0001,
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
}

/// Decode the first zstd frame of `blob` into at most `cap` bytes.
fn zstd_decode_first_frame(blob: &[u8], cap: usize, what: &'static str) -> Result<Vec<u8>> {
    let zerr = |e: &dyn std::fmt::Display| CodecError::Zstd(format!("{what}: {e}"));
    let fsz = ::zstd::zstd_safe::find_frame_compressed_size(blob)
        .map_err(|c| zerr(&::zstd::zstd_safe::get_error_name(c)))?;
    let mut d = ::zstd::bulk::Decompressor::new().map_err(|e| zerr(&e))?;
    d.window_log_max(ZSTD_WINDOW_LOG_MAX)
        .map_err(|e| zerr(&e))?;
    let mut out = Vec::with_capacity(cap);
    d.decompress_to_buffer(&blob[..fsz], &mut out)
        .map_err(|e| zerr(&e))?;
    Ok(out)
}

/// Whole method-4 decode into `out` (`out.len()` = the plane's `orig_len`)
/// with [`AdaptivePayload::decode_chunks`] over blocks of [`CHUNK_GROUP`]
/// chunks, parallel over blocks with rayon for planes of at least 1 MiB.
pub fn decode_method4(payload: &[u8], out: &mut [u8]) -> Result<()> {
    let p = AdaptivePayload::parse(payload)?;
    if p.n != out.len() as u64 {
        return Err(length_mismatch("method-4 plane", p.n, out.len()));
    }
    if p.n == 0 {
        return Ok(());
    }
    let freqs = p.freq_tables()?;
    let par = out_len_is_large(p.n) && p.k > 1;
    // Chunks per job: a full SIMD group, unless that starves the threads.
    let per = if par {
        CHUNK_GROUP.min(p.k.div_ceil(rayon::current_num_threads()))
    } else {
        CHUNK_GROUP
    };
    let nb = p.k.div_ceil(per);
    let block = |b: usize| b * per..((b + 1) * per).min(p.k);
    let mut parts = Vec::with_capacity(nb);
    let mut rest = out;
    for b in 0..nb {
        let r = p.span(&block(b));
        let (o, r2) = rest.split_at_mut((r.end - r.start) as usize);
        parts.push(o);
        rest = r2;
    }
    let job = |t: &mut DecodeTables, (b, o): (usize, &mut [u8])| -> Result<()> {
        t.rebuild(&freqs, block(b))?;
        p.decode_chunks(block(b), t, o)
    };
    if par {
        parts
            .into_par_iter()
            .enumerate()
            .try_for_each_init(DecodeTables::default, job)
    } else {
        let mut t = DecodeTables::default();
        parts
            .into_iter()
            .enumerate()
            .try_for_each(|a| job(&mut t, a))
    }
}

fn out_len_is_large(n: u64) -> bool {
    n >= PAR_MIN_BYTES as u64
}

/// Method-4 encode with `k` chunks (chunk j = symbols `[j*n/k, (j+1)*n/k)`),
/// each with its own optimally normalised table; the tables go into ONE zstd
/// frame (level 3, content size present). `k == 0` is treated as 1. An empty
/// input gives the 8 bytes `u64 0`, which is what z4ai writes and accepts.
/// Parallel over chunks for inputs of at least 1 MiB.
///
/// # Panics
/// If `k` does not fit in a u32.
pub fn encode_method4(data: &[u8], k: usize) -> Vec<u8> {
    let n = data.len();
    if n == 0 {
        return 0u64.to_le_bytes().to_vec();
    }
    let k = k.max(1);
    assert!(
        k <= u32::MAX as usize,
        "encode_method4: k = {k} does not fit in u32"
    );
    let chunk = |j: usize| -> &[u8] {
        let r = chunk_range(n as u64, k, j);
        &data[r.start as usize..r.end as usize]
    };
    let enc = |buf: &mut Vec<u8>, j: usize| -> (FreqTable, Vec<u8>) {
        let c = chunk(j);
        let freqs = normalize_freqs(&histogram(c));
        let tab = EncTable::new(&freqs);
        if buf.len() < 2 * c.len() + 2 {
            buf.resize(2 * c.len() + 2, 0);
        }
        let mut s = Vec::new();
        encode_with(c, &tab, &mut buf[..2 * c.len() + 2], &mut s);
        (freqs, s)
    };
    let results: Vec<(FreqTable, Vec<u8>)> = if n >= PAR_MIN_BYTES && k > 1 {
        (0..k).into_par_iter().map_init(Vec::new, enc).collect()
    } else {
        let mut buf = Vec::new();
        (0..k).map(|j| enc(&mut buf, j)).collect()
    };
    let mut tables = Vec::with_capacity(k * 512);
    for (t, _) in &results {
        for v in t {
            tables.extend_from_slice(&v.to_le_bytes());
        }
    }
    let blob = ::zstd::bulk::compress(&tables, 3).expect("zstd compression of the freq tables");
    let body: usize = results.iter().map(|(_, s)| s.len()).sum();
    let mut out = Vec::with_capacity(16 + 4 * k + blob.len() + body);
    out.extend_from_slice(&(n as u64 | ADAPT_FLAG).to_le_bytes());
    out.extend_from_slice(&(k as u32).to_le_bytes());
    out.extend_from_slice(&(blob.len() as u32).to_le_bytes());
    for (_, s) in &results {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(&blob);
    for (_, s) in &results {
        out.extend_from_slice(s);
    }
    out
}

// ---------------------------------------------------------------------------
// Method 5: order-1
// ---------------------------------------------------------------------------

/// Order-1 decode tables: for each present context row, 4096 packed entries
/// `sym | (freq-1) << 8 | (slot-cum) << 20`, plus one "poison" row (decodes
/// symbol 0 and leaves the state unchanged) for contexts without a row.
struct O1Model {
    tab: Vec<u32>,
    /// Offset of each context's row in `tab`.
    rowbase: [u32; 256],
    present: [bool; 256],
    /// Some present row gives non-zero probability to a symbol without a row
    /// (legal only if that symbol only ends segments): check after decoding.
    missing_reachable: bool,
}

impl O1Model {
    fn from_blob(blob: &[u8]) -> Result<Self> {
        use ::zstd::zstd_safe;
        // z4ai decodes the blob without a size hint: the content size is
        // mandatory. It also bounds our decode.
        let size = match zstd_safe::get_frame_content_size(blob) {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(CodecError::Zstd(
                    "order-1 model blob: frame has no content size".into(),
                ))
            }
            Err(_) => {
                return Err(CodecError::Zstd(
                    "order-1 model blob: bad frame header".into(),
                ))
            }
        };
        if size > O1_MODEL_MAX as u64 {
            return Err(CodecError::invalid(
                "order-1 model",
                format!("content size {size} exceeds {O1_MODEL_MAX}"),
            ));
        }
        let raw = zstd_decode_first_frame(blob, size as usize, "order-1 model blob")?;
        if raw.len() as u64 != size {
            return Err(length_mismatch(
                "order-1 model blob",
                raw.len() as u64,
                size as usize,
            ));
        }
        Self::from_raw(&raw)
    }

    fn from_raw(raw: &[u8]) -> Result<Self> {
        let mut freq = vec![[0u16; 256]; 256];
        let mut c = Cursor::new(raw);
        while c.remaining() > 0 {
            let ctx = usize::from(c.u8("order-1 model row")?);
            let nsym = c.u16("order-1 model row")?;
            let entries = c.take(3 * u64::from(nsym), "order-1 model row entries")?;
            for e in entries.chunks_exact(3) {
                freq[ctx][usize::from(e[0])] = u16::from_le_bytes([e[1], e[2]]);
            }
        }
        let mut present = [false; 256];
        let mut nrows = 0usize;
        for (ctx, row) in freq.iter().enumerate() {
            let sum: u32 = row.iter().map(|&v| u32::from(v)).sum();
            if sum == 0 {
                continue;
            }
            if sum != O1_SCALE {
                return Err(rans_err(format!(
                    "order-1 row {ctx} sums to {sum}, not {O1_SCALE}"
                )));
            }
            present[ctx] = true;
            nrows += 1;
        }
        let rs = O1_SCALE as usize;
        let mut tab = vec![0u32; (nrows + 1) * rs];
        let poison = nrows * rs;
        for (slot, e) in tab[poison..].iter_mut().enumerate() {
            *e = ((O1_SCALE - 1) << 8) | ((slot as u32) << 20);
        }
        let mut rowbase = [poison as u32; 256];
        let mut missing_reachable = false;
        let mut r = 0usize;
        for ctx in 0..256 {
            if !present[ctx] {
                continue;
            }
            rowbase[ctx] = (r * rs) as u32;
            let row = &mut tab[r * rs..(r + 1) * rs];
            let mut cum = 0usize;
            for (s, &f) in freq[ctx].iter().enumerate() {
                if f == 0 {
                    continue;
                }
                missing_reachable |= !present[s];
                let f = usize::from(f);
                let hi = (s as u32) | ((f as u32 - 1) << 8);
                for (j, e) in row[cum..cum + f].iter_mut().enumerate() {
                    *e = hi | ((j as u32) << 20);
                }
                cum += f;
            }
            r += 1;
        }
        Ok(O1Model {
            tab,
            rowbase,
            present,
            missing_reachable,
        })
    }
}

/// One order-1 step: `base` is the current context's row offset.
#[inline(always)]
fn o1_step(
    x: &mut u32,
    base: &mut u32,
    m: &O1Model,
    p: &mut usize,
    read2: impl Fn(usize) -> u32,
) -> u8 {
    let v = *x;
    let slot = v & (O1_SCALE - 1);
    let e = m.tab[(*base + slot) as usize];
    let s = e as u8;
    let f = ((e >> 8) & 0xFFF) + 1;
    let v = f * (v >> O1_PROB_BITS) + (e >> 20);
    let nb = u32::from(v < RANS_L) + u32::from(v < (RANS_L >> 8));
    let sh = nb * 8;
    let two = read2(*p);
    *x = (v << sh) | (two >> (16 - sh));
    *p += nb as usize;
    *base = m.rowbase[s as usize];
    s
}

/// Big-endian u16 at `p` without a bounds check.
///
/// # Safety
/// `p + 2 <= s.len()`.
#[inline(always)]
unsafe fn read2_unchecked(s: &[u8], p: usize) -> u32 {
    debug_assert!(p + 2 <= s.len());
    // SAFETY: the caller guarantees p + 2 <= s.len().
    unsafe {
        u32::from(u16::from_be_bytes([
            *s.get_unchecked(p),
            *s.get_unchecked(p + 1),
        ]))
    }
}

fn careful_read(sub: &[u8], p: usize) -> u32 {
    let b0 = sub.get(p).copied().unwrap_or(0);
    let b1 = sub.get(p + 1).copied().unwrap_or(0);
    u32::from(u16::from_be_bytes([b0, b1]))
}

/// Decode one order-1 chunk (4 segments) into `out`.
fn o1_decode_chunk(m: &O1Model, payload: &[u8], out: &mut [u8]) -> Result<()> {
    let cn = out.len() as u64;
    if cn == 0 {
        return Ok(());
    }
    let mut c = Cursor::new(payload);
    let mut sublens = [0u64; O1_NSEG];
    for s in &mut sublens {
        *s = u64::from(c.u32("order-1 substream lengths")?);
    }
    let mut subs: [&[u8]; O1_NSEG] = [&[]; O1_NSEG];
    for (s, &l) in subs.iter_mut().zip(&sublens) {
        *s = c.take(l, "order-1 substream")?;
    }
    // Segment l covers [cn*l/4, cn*(l+1)/4).
    let b: [usize; O1_NSEG + 1] =
        std::array::from_fn(|l| (cn * l as u64 / O1_NSEG as u64) as usize);
    let mut x = [0u32; O1_NSEG];
    let mut pos = [4usize; O1_NSEG];
    for l in 0..O1_NSEG {
        if b[l + 1] > b[l] {
            if subs[l].len() < 4 {
                return Err(CodecError::Truncated {
                    what: "order-1 substream state",
                    need: 4,
                    have: subs[l].len() as u64,
                });
            }
            x[l] = u32::from_le_bytes(subs[l][..4].try_into().unwrap());
            if x[l] < RANS_L {
                return Err(rans_err(format!(
                    "order-1 segment {l} state {:#x} is below RANS_L",
                    x[l]
                )));
            }
        }
    }
    if !m.present[0] {
        return Err(rans_err("order-1 model has no row for context 0"));
    }
    let (o0, rest) = out.split_at_mut(b[1]);
    let (o1, rest) = rest.split_at_mut(b[2] - b[1]);
    let (o2, o3) = rest.split_at_mut(b[3] - b[2]);
    let mut base = [m.rowbase[0]; O1_NSEG];
    // Lock-step over the common length (segments differ by at most 1).
    let common = o0.len().min(o1.len()).min(o2.len()).min(o3.len());
    let mut i = 0usize;
    while i < common {
        let safe = (0..O1_NSEG)
            .map(|l| subs[l].len().saturating_sub(pos[l]) / 2)
            .min()
            .unwrap();
        let batch = safe.min(common - i);
        if batch >= 8 {
            let [s0, s1, s2, s3] = subs;
            // SAFETY (all four closures): `batch` <= (sub.len() - pos at batch
            // start) / 2, each step advances pos by at most 2 and reads the 2
            // bytes at the current pos, so p + 2 <= sub.len().
            let r0 = |p: usize| unsafe { read2_unchecked(s0, p) };
            let r1 = |p: usize| unsafe { read2_unchecked(s1, p) };
            let r2 = |p: usize| unsafe { read2_unchecked(s2, p) };
            let r3 = |p: usize| unsafe { read2_unchecked(s3, p) };
            let it = o0[i..i + batch]
                .iter_mut()
                .zip(o1[i..i + batch].iter_mut())
                .zip(o2[i..i + batch].iter_mut())
                .zip(o3[i..i + batch].iter_mut());
            let [mut x0, mut x1, mut x2, mut x3] = x;
            let [mut b0, mut b1, mut b2, mut b3] = base;
            let [mut p0, mut p1, mut p2, mut p3] = pos;
            for (((a, bb), cc), d) in it {
                *a = o1_step(&mut x0, &mut b0, m, &mut p0, r0);
                *bb = o1_step(&mut x1, &mut b1, m, &mut p1, r1);
                *cc = o1_step(&mut x2, &mut b2, m, &mut p2, r2);
                *d = o1_step(&mut x3, &mut b3, m, &mut p3, r3);
            }
            x = [x0, x1, x2, x3];
            base = [b0, b1, b2, b3];
            pos = [p0, p1, p2, p3];
            i += batch;
        } else {
            o0[i] = o1_step(&mut x[0], &mut base[0], m, &mut pos[0], |p| {
                careful_read(subs[0], p)
            });
            o1[i] = o1_step(&mut x[1], &mut base[1], m, &mut pos[1], |p| {
                careful_read(subs[1], p)
            });
            o2[i] = o1_step(&mut x[2], &mut base[2], m, &mut pos[2], |p| {
                careful_read(subs[2], p)
            });
            o3[i] = o1_step(&mut x[3], &mut base[3], m, &mut pos[3], |p| {
                careful_read(subs[3], p)
            });
            i += 1;
        }
    }
    let segs: [&mut [u8]; O1_NSEG] = [o0, o1, o2, o3];
    for (l, seg) in segs.into_iter().enumerate() {
        for o in seg[common..].iter_mut() {
            *o = o1_step(&mut x[l], &mut base[l], m, &mut pos[l], |p| {
                careful_read(subs[l], p)
            });
        }
        if m.missing_reachable && seg.len() > 1 {
            // A symbol with no row was used as a context (the poison row
            // decoded garbage from then on): the payload is invalid.
            if let Some(&s) = seg[..seg.len() - 1]
                .iter()
                .find(|&&s| !m.present[usize::from(s)])
            {
                return Err(rans_err(format!("order-1 context {s} has no model row")));
            }
        }
    }
    Ok(())
}

/// Plane method 5 (order-1): decode the whole payload into `out`
/// (`out.len()` = the plane's `orig_len`). The `nseg` header byte is ignored
/// and 4 segments are assumed, as z4ai does; the context resets to 0 at every
/// segment start. Parallel over chunks for planes of at least 1 MiB.
pub fn decode_method5(payload: &[u8], out: &mut [u8]) -> Result<()> {
    let mut c = Cursor::new(payload);
    let magic = c.take(2, "order-1 header")?;
    if magic != b"R1" {
        return Err(CodecError::invalid(
            "order-1 payload",
            "bad magic (expected \"R1\")",
        ));
    }
    let _nseg = c.u8("order-1 header")?;
    let _pad = c.u8("order-1 header")?;
    let n = u64::from(c.u32("order-1 header")?);
    let blob_len = c.u32("order-1 header")?;
    let k = usize::from(c.u16("order-1 header")?);
    if n != out.len() as u64 {
        return Err(length_mismatch("order-1 plane", n, out.len()));
    }
    if n == 0 {
        return Ok(());
    }
    let blob = c.take(u64::from(blob_len), "order-1 model blob")?;
    if k == 0 {
        return Err(CodecError::invalid(
            "order-1 payload",
            format!("0 chunks for {n} symbols"),
        ));
    }
    let clens = c.take(4 * k as u64, "order-1 chunk lengths")?;
    let body = c.rest();
    let starts = chunk_offsets(clens, body.len(), "order-1 chunk payloads")?;
    let model = O1Model::from_blob(blob)?;
    let parts = split_chunks(out, k);
    let job =
        |(j, o): (usize, &mut [u8])| o1_decode_chunk(&model, &body[starts[j]..starts[j + 1]], o);
    if out_len_is_large(n) && k > 1 {
        parts.into_par_iter().enumerate().try_for_each(job)
    } else {
        parts.into_iter().enumerate().try_for_each(job)
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // ----- spec-literal reference coders (division based) -----

    fn cum_of(freqs: &[u16; 256]) -> [u32; 256] {
        let mut c = [0u32; 256];
        let mut acc = 0;
        for s in 0..256 {
            c[s] = acc;
            acc += u32::from(freqs[s]);
        }
        c
    }

    /// §4.3 encoder, literally: division, byte-wise while loop.
    fn div_encode_stream(data: &[u8], freqs: &FreqTable) -> Vec<u8> {
        let cum = cum_of(freqs);
        let mut x = [RANS_L; 4];
        let mut emitted = Vec::new();
        for i in (0..data.len()).rev() {
            let s = data[i] as usize;
            let f = u32::from(freqs[s]);
            let l = i & 3;
            while u64::from(x[l]) >= u64::from((RANS_L >> PROB_BITS) << 8) * u64::from(f) {
                emitted.push(x[l] as u8);
                x[l] >>= 8;
            }
            x[l] = (x[l] / f) * PROB_SCALE + (x[l] % f) + cum[s];
        }
        let mut out = Vec::new();
        for v in x {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend(emitted.iter().rev());
        out
    }

    /// §4.3 decoder, literally.
    fn ref_decode_stream(stream: &[u8], freqs: &FreqTable, n: usize) -> Vec<u8> {
        let cum = cum_of(freqs);
        let mut s2s = vec![0u8; PROB_SCALE as usize];
        for s in 0..256 {
            for j in 0..usize::from(freqs[s]) {
                s2s[cum[s] as usize + j] = s as u8;
            }
        }
        let mut x = [0u32; 4];
        for l in 0..4 {
            x[l] = u32::from_le_bytes(stream[4 * l..4 * l + 4].try_into().unwrap());
        }
        let mut pos = 16;
        let mut out = vec![0u8; n];
        for i in 0..n {
            let l = i & 3;
            let slot = x[l] & 0x3FFF;
            let s = s2s[slot as usize];
            out[i] = s;
            x[l] = u32::from(freqs[s as usize]) * (x[l] >> 14) + slot - cum[s as usize];
            while x[l] < RANS_L {
                x[l] = (x[l] << 8) | u32::from(stream.get(pos).copied().unwrap_or(0));
                pos += 1;
            }
        }
        out
    }

    // ----- test-only order-1 encoder (method 5 payloads) -----

    fn o1_segments(cn: usize) -> [Range<usize>; 4] {
        std::array::from_fn(|l| cn * l / 4..cn * (l + 1) / 4)
    }

    /// Build the sparse order-1 model for `data` cut into `k` chunks.
    fn o1_model(data: &[u8], k: usize) -> Vec<[u16; 256]> {
        let n = data.len();
        let mut joint = vec![[0u64; 256]; 256];
        for j in 0..k {
            let r = chunk_range(n as u64, k, j);
            let c = &data[r.start as usize..r.end as usize];
            for seg in o1_segments(c.len()) {
                for i in seg.clone() {
                    let ctx = if i == seg.start { 0 } else { c[i - 1] };
                    joint[usize::from(ctx)][usize::from(c[i])] += 1;
                }
            }
        }
        joint
            .iter()
            .map(|row| {
                if row.iter().all(|&v| v == 0) {
                    [0u16; 256]
                } else {
                    normalize_freqs_to(row, O1_SCALE)
                }
            })
            .collect()
    }

    fn o1_serialize(freq: &[[u16; 256]]) -> Vec<u8> {
        let mut raw = Vec::new();
        for (c, row) in freq.iter().enumerate() {
            let nz: Vec<usize> = (0..256).filter(|&s| row[s] != 0).collect();
            if nz.is_empty() {
                continue;
            }
            raw.push(c as u8);
            raw.extend_from_slice(&(nz.len() as u16).to_le_bytes());
            for s in nz {
                raw.push(s as u8);
                raw.extend_from_slice(&row[s].to_le_bytes());
            }
        }
        raw
    }

    fn o1_encode_chunk(c: &[u8], freq: &[[u16; 256]]) -> Vec<u8> {
        let cums: Vec<[u32; 256]> = freq.iter().map(cum_of).collect();
        let mut subs = Vec::new();
        for seg in o1_segments(c.len()) {
            let mut x = RANS_L;
            let mut emitted = Vec::new();
            for i in seg.clone().rev() {
                let ctx = if i == seg.start {
                    0
                } else {
                    usize::from(c[i - 1])
                };
                let s = usize::from(c[i]);
                let f = u32::from(freq[ctx][s]);
                while u64::from(x) >= u64::from((RANS_L >> O1_PROB_BITS) << 8) * u64::from(f) {
                    emitted.push(x as u8);
                    x >>= 8;
                }
                x = (x / f) * O1_SCALE + (x % f) + cums[ctx][s];
            }
            let mut sub = x.to_le_bytes().to_vec();
            sub.extend(emitted.iter().rev());
            subs.push(sub);
        }
        let mut out = Vec::new();
        for s in &subs {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        }
        for s in &subs {
            out.extend_from_slice(s);
        }
        out
    }

    /// Method-5 payload from an explicit model (serialised raw model bytes).
    fn o1_payload_with(data: &[u8], k: usize, freq: &[[u16; 256]], raw_model: &[u8]) -> Vec<u8> {
        let n = data.len();
        let blob = ::zstd::bulk::compress(raw_model, 19).unwrap();
        let mut out = b"R1".to_vec();
        out.push(4);
        out.push(0);
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.extend_from_slice(&(blob.len() as u32).to_le_bytes());
        out.extend_from_slice(&(k as u16).to_le_bytes());
        out.extend_from_slice(&blob);
        let chunks: Vec<Vec<u8>> = (0..k)
            .map(|j| {
                let r = chunk_range(n as u64, k, j);
                o1_encode_chunk(&data[r.start as usize..r.end as usize], freq)
            })
            .collect();
        for c in &chunks {
            out.extend_from_slice(&(c.len() as u32).to_le_bytes());
        }
        for c in &chunks {
            out.extend_from_slice(c);
        }
        out
    }

    /// Test-only order-1 (method 5) encoder.
    fn o1_encode(data: &[u8], k: usize) -> Vec<u8> {
        if data.is_empty() {
            let mut h = b"R1".to_vec();
            h.extend_from_slice(&[4, 0]);
            h.extend_from_slice(&[0u8; 10]);
            return h;
        }
        let freq = o1_model(data, k);
        o1_payload_with(data, k, &freq, &o1_serialize(&freq))
    }

    // ----- helpers -----

    fn method3_single(data: &[u8], freqs: &FreqTable) -> Vec<u8> {
        let mut p = (data.len() as u64).to_le_bytes().to_vec();
        for v in freqs {
            p.extend_from_slice(&v.to_le_bytes());
        }
        encode_stream(data, freqs, &mut p);
        p
    }

    fn method3_chunked(data: &[u8], k: usize) -> Vec<u8> {
        let freqs = normalize_freqs(&histogram(data));
        let n = data.len();
        let mut p = (n as u64 | CHUNK_FLAG).to_le_bytes().to_vec();
        p.extend_from_slice(&(k as u16).to_le_bytes());
        for v in freqs {
            p.extend_from_slice(&v.to_le_bytes());
        }
        let streams: Vec<Vec<u8>> = (0..k)
            .map(|j| {
                let r = chunk_range(n as u64, k, j);
                let mut s = Vec::new();
                encode_stream(&data[r.start as usize..r.end as usize], &freqs, &mut s);
                s
            })
            .collect();
        for s in &streams {
            p.extend_from_slice(&(s.len() as u32).to_le_bytes());
        }
        for s in &streams {
            p.extend_from_slice(s);
        }
        p
    }

    fn fnv1a64(b: &[u8]) -> u64 {
        let mut h = 0xCBF2_9CE4_8422_2325u64;
        for &x in b {
            h ^= u64::from(x);
            h = h.wrapping_mul(0x0000_0100_0000_01B3);
        }
        h
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn gauss(&mut self) -> f64 {
            let u1 = ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
            (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
        }
    }

    /// bf16 exponent bytes of N(0, 0.02) weights.
    fn exponent_data(n: usize, seed: u64) -> Vec<u8> {
        let mut r = Rng(seed);
        (0..n)
            .map(|_| {
                let f = (r.gauss() * 0.02) as f32;
                let b = f.to_bits();
                let bf = (b + 0x7FFF + ((b >> 16) & 1)) >> 16;
                ((bf >> 7) & 0xFF) as u8
            })
            .collect()
    }

    fn data_strategy() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..2000),
            proptest::collection::vec(0u8..4, 0..2000),
            proptest::collection::vec(Just(7u8), 0..300),
            (any::<u64>(), 0usize..5000).prop_map(|(s, n)| exponent_data(n, s)),
            (any::<u64>(), 0usize..3000).prop_map(|(s, n)| {
                // skewed: mostly one symbol, rare others (forces freq-1 symbols)
                let mut r = Rng(s);
                (0..n)
                    .map(|_| {
                        let v = r.next();
                        if v.is_multiple_of(64) {
                            (v >> 8) as u8
                        } else {
                            200
                        }
                    })
                    .collect()
            }),
        ]
    }

    // ----- histogram / normalisation -----

    #[test]
    fn histogram_matches_naive() {
        let d = exponent_data(100_003, 1);
        let mut h = [0u64; 256];
        for &b in &d {
            h[b as usize] += 1;
        }
        assert_eq!(histogram(&d), h);
        assert_eq!(histogram(&[]), [0u64; 256]);
    }

    fn cost(hist: &[u64; 256], f: &[u16; 256], total: u32) -> f64 {
        (0..256)
            .filter(|&s| hist[s] > 0)
            .map(|s| -(hist[s] as f64) * (f64::from(f[s]) / f64::from(total)).log2())
            .sum()
    }

    #[test]
    fn normalize_is_optimal_on_small_cases() {
        // Brute force over all splits of total=256 between three symbols.
        let mut r = Rng(5);
        for _ in 0..200 {
            let mut h = [0u64; 256];
            h[3] = r.next() % 1000 + 1;
            h[100] = r.next() % 50 + 1;
            h[255] = r.next() % 100_000 + 1;
            let f = normalize_freqs_to(&h, 256);
            let got = cost(&h, &f, 256);
            let mut best = f64::INFINITY;
            for a in 1..255u16 {
                for b in 1..(256 - a) {
                    let mut g = [0u16; 256];
                    g[3] = a;
                    g[100] = b;
                    g[255] = 256 - a - b;
                    best = best.min(cost(&h, &g, 256));
                }
            }
            assert!(got <= best + 1e-6, "got {got} best {best} for {h:?}");
        }
    }

    #[test]
    fn normalize_edge_cases() {
        let f = normalize_freqs(&[0; 256]);
        assert_eq!(f[0], 16384);
        assert_eq!(f.iter().map(|&v| u32::from(v)).sum::<u32>(), 16384);
        let mut h = [0u64; 256];
        h[9] = 5;
        assert_eq!(normalize_freqs(&h)[9], 16384);
        // all 256 present, one dominant: forced ones must be taken back.
        let mut h = [1u64; 256];
        h[17] = u64::MAX / 2;
        let f = normalize_freqs(&h);
        assert!(f.iter().all(|&v| v >= 1));
        assert_eq!(f[17], 16384 - 255);
        // huge counts do not overflow
        let h = [u64::MAX; 256];
        let f = normalize_freqs(&h);
        assert!(f.iter().all(|&v| v == 64));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn normalize_valid_and_no_worse_than_z4ai(hist in proptest::collection::vec(prop_oneof![Just(0u64), 0u64..10, 0u64..1_000_000], 256)) {
            let h: [u64; 256] = hist.try_into().unwrap();
            let f = normalize_freqs(&h);
            prop_assert_eq!(f.iter().map(|&v| u32::from(v)).sum::<u32>(), 16384);
            for s in 0..256 {
                prop_assert_eq!(h[s] > 0, f[s] > 0, "symbol {}", s);
            }
            // z4ai's _normalize: floor, bump zeros to 1, fix on the largest.
            let total: u64 = h.iter().sum();
            if total > 0 {
                let mut g = [0i64; 256];
                for s in 0..256 {
                    if h[s] > 0 {
                        g[s] = ((h[s] as f64 * (16384.0 / total as f64)).floor() as i64).max(1);
                    }
                }
                let mut diff = 16384 - g.iter().sum::<i64>();
                let mut order: Vec<usize> = (0..256).collect();
                order.sort_by_key(|&s| -g[s]);
                if diff > 0 {
                    g[order[0]] += diff;
                } else {
                    for &s in &order {
                        let take = (g[s] - 1).min(-diff).max(0);
                        g[s] -= take;
                        diff += take;
                    }
                }
                let gz: [u16; 256] = std::array::from_fn(|s| g[s] as u16);
                prop_assert!(cost(&h, &f, 16384) <= cost(&h, &gz, 16384) + 1e-6);
            }
        }
    }

    // ----- encoder: reciprocal == division -----

    #[test]
    fn reciprocal_step_matches_division_for_every_freq() {
        let mut r = Rng(11);
        for f in 1..=PROB_SCALE {
            let cum = (r.next() % u64::from(PROB_SCALE - f + 1)) as u32;
            let e = EncSym::new(cum, f);
            let x_max = e.x_max;
            assert_eq!(x_max, ((RANS_L >> PROB_BITS) << 8) * f);
            // x before the step is in [x_max >> 8 .. x_max) after renormalisation
            // (or any smaller positive value for the first steps).
            let mut xs = vec![
                1,
                2,
                f.saturating_sub(1).max(1),
                f,
                f + 1,
                x_max - 1,
                x_max - f,
                x_max >> 8,
                (x_max >> 8) + 1,
            ];
            for _ in 0..24 {
                xs.push(1 + (r.next() % u64::from(x_max - 1)) as u32);
            }
            for &x in &xs {
                let q = ((u64::from(x) * u64::from(e.rcp_freq)) >> e.rcp_shift) as u32;
                let got = x
                    .wrapping_add(e.bias)
                    .wrapping_add(q.wrapping_mul(u32::from(e.cmpl_freq)));
                let want = (x / f) * PROB_SCALE + x % f + cum;
                assert_eq!(got, want, "f={f} cum={cum} x={x}");
            }
        }
    }

    #[test]
    fn encoder_matches_division_encoder_on_large_inputs() {
        for (seed, n) in [(1u64, 1 << 20), (2, 65_537), (3, 3)] {
            let d = exponent_data(n, seed);
            let f = normalize_freqs(&histogram(&d));
            let mut s = Vec::new();
            encode_stream(&d, &f, &mut s);
            assert_eq!(s, div_encode_stream(&d, &f));
        }
        let mut r = Rng(9);
        let d: Vec<u8> = (0..200_001).map(|_| (r.next() % 128) as u8).collect();
        let f = normalize_freqs(&histogram(&d));
        let mut s = Vec::new();
        encode_stream(&d, &f, &mut s);
        assert_eq!(s, div_encode_stream(&d, &f));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn stream_roundtrip_and_matches_spec(data in data_strategy(), extra in proptest::collection::vec(any::<u8>(), 0..4)) {
            // A table that also gives weight to symbols not in the data.
            let mut h = histogram(&data);
            for &b in &extra { h[b as usize] += 1; }
            let f = normalize_freqs(&h);
            let mut s = vec![0xAA]; // appends, does not clobber
            encode_stream(&data, &f, &mut s);
            prop_assert_eq!(s[0], 0xAA);
            let s = s[1..].to_vec();
            prop_assert_eq!(&s, &div_encode_stream(&data, &f));
            let mut out = vec![0u8; data.len()];
            decode_stream(&s, &f, &mut out).unwrap();
            prop_assert_eq!(&out, &data);
            // the fast path and the literal spec decoder agree, also on
            // arbitrary garbage after the seeds and on over-long reads.
            if !data.is_empty() {
                let mut g = s.clone();
                let cut = g.len().min(16 + extra.len() * 3);
                g.truncate(cut);
                let mut a = vec![0u8; data.len()];
                decode_stream(&g, &f, &mut a).unwrap();
                prop_assert_eq!(a, ref_decode_stream(&g, &f, data.len()));
            }
        }

        #[test]
        fn garbage_streams_match_spec_decoder(body in proptest::collection::vec(any::<u8>(), 0..200), seeds in proptest::collection::vec(RANS_L..=u32::MAX, 4), n in 0usize..600, hseed in any::<u64>()) {
            let mut r = Rng(hseed);
            let mut h = [0u64; 256];
            for _ in 0..(r.next() % 40 + 1) { h[(r.next() % 256) as usize] += r.next() % 1000 + 1; }
            let f = normalize_freqs(&h);
            let mut s = Vec::new();
            for v in &seeds { s.extend_from_slice(&v.to_le_bytes()); }
            s.extend_from_slice(&body);
            let mut a = vec![0u8; n];
            decode_stream(&s, &f, &mut a).unwrap();
            prop_assert_eq!(a, ref_decode_stream(&s, &f, n));
        }

        #[test]
        fn method4_roundtrip(data in data_strategy(), k in prop_oneof![Just(1usize), 1usize..8, 1usize..3000]) {
            let p = encode_method4(&data, k);
            let mut out = vec![0u8; data.len()];
            decode_method4(&p, &mut out).unwrap();
            prop_assert_eq!(&out, &data);
            let ap = AdaptivePayload::parse(&p).unwrap();
            prop_assert_eq!(ap.len(), data.len() as u64);
            if !data.is_empty() {
                prop_assert_eq!(ap.chunks(), k);
                let tables = ap.freq_tables().unwrap();
                let mut covered = 0u64;
                for j in 0..ap.chunks() {
                    let r = ap.chunk_bounds(j);
                    prop_assert_eq!(r.start, covered);
                    covered = r.end;
                    let mut o = vec![0u8; (r.end - r.start) as usize];
                    ap.decode_chunk(j, &tables[j], &mut o).unwrap();
                    prop_assert_eq!(&o[..], &data[r.start as usize..r.end as usize]);
                }
                prop_assert_eq!(covered, data.len() as u64);
            }
        }

        #[test]
        fn method3_roundtrip(data in data_strategy(), k in 1usize..20) {
            let f = normalize_freqs(&histogram(&data));
            let p = method3_single(&data, &f);
            let mut out = vec![0u8; data.len()];
            decode_method3(&p, &mut out).unwrap();
            prop_assert_eq!(&out, &data);
            if !data.is_empty() {
                let p = method3_chunked(&data, k);
                let mut out = vec![0u8; data.len()];
                decode_method3(&p, &mut out).unwrap();
                prop_assert_eq!(&out, &data);
            }
        }

        #[test]
        fn method5_roundtrip(data in data_strategy(), k in prop_oneof![Just(1usize), 1usize..6, 1usize..200]) {
            let p = o1_encode(&data, k);
            let mut out = vec![0u8; data.len()];
            decode_method5(&p, &mut out).unwrap();
            prop_assert_eq!(&out, &data);
        }

        #[test]
        fn mutated_payloads_never_panic(data in data_strategy(), k in 1usize..5, muts in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6), which in 0u8..3) {
            let mut p = match which {
                0 => encode_method4(&data, k),
                1 => o1_encode(&data, k),
                _ => method3_chunked(&data, k.max(1)),
            };
            for (i, v) in muts {
                let len = p.len();
                p[i % len] ^= v;
            }
            let mut out = vec![0u8; data.len()];
            let _ = match which {
                0 => decode_method4(&p, &mut out),
                1 => decode_method5(&p, &mut out),
                _ => decode_method3(&p, &mut out),
            };
        }
    }

    // ----- multi-chunk decoding (decode_chunks) vs the one-chunk decoder -----

    /// Decode chunks `js` one at a time with `decode_stream_with` (the
    /// reference): `Err` if any chunk errs.
    fn per_chunk_decode(
        ap: &AdaptivePayload,
        js: Range<usize>,
        t: &DecodeTables,
    ) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for j in js {
            let r = ap.chunk_bounds(j);
            let mut o = vec![0u8; (r.end - r.start) as usize];
            decode_stream_with(t.get(j).unwrap(), ap.chunk_payload(j), &mut o)?;
            out.extend_from_slice(&o);
        }
        Ok(out)
    }

    /// Assemble a method-4 payload from explicit tables and chunk streams.
    fn method4_payload(n: u64, tables: &[FreqTable], streams: &[Vec<u8>]) -> Vec<u8> {
        let mut raw = Vec::new();
        for t in tables {
            for v in t {
                raw.extend_from_slice(&v.to_le_bytes());
            }
        }
        let blob = ::zstd::bulk::compress(&raw, 1).unwrap();
        let mut p = (n | ADAPT_FLAG).to_le_bytes().to_vec();
        p.extend_from_slice(&(tables.len() as u32).to_le_bytes());
        p.extend_from_slice(&(blob.len() as u32).to_le_bytes());
        for s in streams {
            p.extend_from_slice(&(s.len() as u32).to_le_bytes());
        }
        p.extend_from_slice(&blob);
        for s in streams {
            p.extend_from_slice(s);
        }
        p
    }

    /// Check `decode_chunks` against the reference on every group-ish range.
    fn check_decode_chunks(p: &[u8]) -> std::result::Result<(), TestCaseError> {
        let ap = AdaptivePayload::parse(p).unwrap();
        let k = ap.chunks();
        let freqs = ap.freq_tables().unwrap();
        let t = DecodeTables::new(&freqs).unwrap();
        let mut ranges: Vec<Range<usize>> = Vec::new();
        ranges.push(0..k);
        for g in [7usize, 8, 16, 17, 33] {
            for j0 in (0..k).step_by(g) {
                ranges.push(j0..(j0 + g).min(k));
            }
        }
        if k > 2 {
            ranges.push(1..k - 1);
        }
        for js in ranges {
            let want = per_chunk_decode(&ap, js.clone(), &t);
            let len = if js.is_empty() {
                0
            } else {
                (ap.chunk_bounds(js.end - 1).end - ap.chunk_bounds(js.start).start) as usize
            };
            let mut got = vec![0u8; len];
            let r = ap.decode_chunks(js.clone(), &t, &mut got);
            // tables for exactly this range work too
            let tj = DecodeTables::for_chunks(&freqs, js.clone()).unwrap();
            let mut got2 = vec![0u8; len];
            let r2 = ap.decode_chunks(js.clone(), &tj, &mut got2);
            match want {
                Ok(w) => {
                    prop_assert!(r.is_ok(), "{js:?}: {r:?}");
                    prop_assert_eq!(&got, &w, "{:?}", js);
                    prop_assert!(r2.is_ok());
                    prop_assert_eq!(&got2, &w);
                }
                Err(e) => {
                    prop_assert_eq!(r, Err(e.clone()), "{:?}", js);
                    prop_assert_eq!(r2, Err(e));
                }
            }
        }
        Ok(())
    }

    fn random_table(r: &mut Rng) -> FreqTable {
        let mut h = [0u64; 256];
        match r.next() % 4 {
            0 => h[(r.next() % 256) as usize] = 1,
            1 => h.iter_mut().for_each(|v| *v = r.next() % 1000),
            2 => {
                for _ in 0..(r.next() % 40 + 1) {
                    h[(r.next() % 256) as usize] += r.next() % 100_000 + 1;
                }
                h[(r.next() % 256) as usize] += 1 << 40; // forces freq-1 symbols
            }
            _ => {
                for _ in 0..(r.next() % 40 + 1) {
                    h[(r.next() % 256) as usize] += r.next() % 1000 + 1;
                }
            }
        }
        normalize_freqs(&h)
    }

    #[test]
    fn decode_chunks_large_planes() {
        for (seed, n, chunk) in [
            (1u64, 1 << 20, 1 << 14),
            (2, 3_000_017, 1 << 16),
            (3, 700_001, 999),
        ] {
            let d = exponent_data(n, seed);
            let k = n.div_ceil(chunk);
            let p = encode_method4(&d, k);
            let ap = AdaptivePayload::parse(&p).unwrap();
            let t = DecodeTables::new(&ap.freq_tables().unwrap()).unwrap();
            let mut out = vec![0u8; n];
            ap.decode_chunks(0..k, &t, &mut out).unwrap();
            assert!(out == d, "n={n}");
            check_decode_chunks(&p).unwrap();
        }
        // uniform bytes (8 bits/symbol, two renormalisation bytes often)
        let mut r = Rng(4);
        let d: Vec<u8> = (0..1_000_000).map(|_| r.next() as u8).collect();
        check_decode_chunks(&encode_method4(&d, 40)).unwrap();
    }

    #[test]
    fn decode_chunks_rejects_bad_arguments() {
        let d = exponent_data(50_000, 5);
        let p = encode_method4(&d, 20);
        let ap = AdaptivePayload::parse(&p).unwrap();
        let f = ap.freq_tables().unwrap();
        let t = DecodeTables::new(&f).unwrap();
        let len = |js: Range<usize>| {
            (ap.chunk_bounds(js.end - 1).end - ap.chunk_bounds(js.start).start) as usize
        };
        let mut out = vec![0u8; len(0..20)];
        assert!(ap.decode_chunks(0..21, &t, &mut out).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let bad = 5..3;
        assert!(ap.decode_chunks(bad, &t, &mut out).is_err());
        assert!(ap.decode_chunks(0..20, &t, &mut out[1..]).is_err());
        assert!(ap.decode_chunks(3..3, &t, &mut []).is_ok());
        assert!(ap.decode_chunks(3..3, &t, &mut out[..1]).is_err());
        let part = DecodeTables::for_chunks(&f, 4..12).unwrap();
        assert_eq!(part.chunks(), 4..12);
        assert!(part.get(3).is_none() && part.get(12).is_none() && part.get(4).is_some());
        assert!(ap
            .decode_chunks(3..12, &part, &mut out[..len(3..12)])
            .is_err());
        assert!(ap
            .decode_chunks(4..13, &part, &mut out[..len(4..13)])
            .is_err());
        ap.decode_chunks(4..12, &part, &mut out[..len(4..12)])
            .unwrap();
        assert_eq!(
            &out[..len(4..12)],
            &d[ap.chunk_bounds(4).start as usize..ap.chunk_bounds(11).end as usize]
        );
        assert!(DecodeTables::for_chunks(&f, 4..21).is_err());
        let mut g = f.clone();
        g[3][0] ^= 1;
        assert!(DecodeTables::new(&g).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn decode_chunks_matches_scalar(data in data_strategy(), big in (any::<u64>(), 0usize..60_000, 0u8..3), k in prop_oneof![1usize..20, 1usize..300]) {
            let (seed, n, kind) = big;
            let mut r = Rng(seed);
            let d: Vec<u8> = match kind {
                0 => exponent_data(n, seed),
                1 => (0..n).map(|_| (r.next() % 7) as u8 * 30).collect(),
                _ => data,
            };
            let p = encode_method4(&d, k);
            if !d.is_empty() {
                check_decode_chunks(&p)?;
            }
            let mut out = vec![0u8; d.len()];
            decode_method4(&p, &mut out).unwrap();
            prop_assert_eq!(out, d);
        }

        #[test]
        fn decode_chunks_garbage_matches_scalar(seed in any::<u64>(), k in 1usize..40, n in 0u64..40_000, mode in 0u8..4) {
            let mut r = Rng(seed);
            let tables: Vec<FreqTable> = (0..k).map(|_| random_table(&mut r)).collect();
            let streams: Vec<Vec<u8>> = (0..k)
                .map(|j| {
                    let cn = {
                        let c = chunk_range(n, k, j);
                        (c.end - c.start) as usize
                    };
                    // lengths: plausible, short, tiny (< 16), or random
                    let len = match (mode, r.next() % 8) {
                        (_, 0) => (r.next() % 20) as usize,
                        (0, _) => cn * 3 / 8 + 16,
                        (1, _) => (r.next() % (cn as u64 + 40)) as usize,
                        (2, _) => cn + 16,
                        _ => 16 + (r.next() % 64) as usize,
                    };
                    let mut s: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
                    for l in 0..4 {
                        if s.len() >= 4 * l + 4 && !r.next().is_multiple_of(64) {
                            // mostly valid seeds, sometimes below RANS_L
                            let v = RANS_L + (r.next() as u32 % (u32::MAX - RANS_L));
                            s[4 * l..4 * l + 4].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                    s
                })
                .collect();
            let p = method4_payload(n, &tables, &streams);
            check_decode_chunks(&p)?;
            // whole-plane decode: same result as the one-chunk decoder
            let ap = AdaptivePayload::parse(&p).unwrap();
            let t = DecodeTables::new(&tables).unwrap();
            let want = per_chunk_decode(&ap, 0..k, &t);
            let mut out = vec![0u8; n as usize];
            let got = decode_method4(&p, &mut out);
            match want {
                Ok(w) => { prop_assert!(got.is_ok()); prop_assert_eq!(out, w); }
                Err(_) => prop_assert!(got.is_err()),
            }
        }

        #[test]
        fn decode_chunks_truncated_streams_match_scalar(seed in any::<u64>(), n in 1000usize..50_000, k in 7usize..40, cut in 0usize..40) {
            // Valid streams cut short: the decoder reads zeros past each end.
            let d = exponent_data(n, seed);
            let p = encode_method4(&d, k);
            let ap = AdaptivePayload::parse(&p).unwrap();
            let tables = ap.freq_tables().unwrap();
            let mut r = Rng(seed ^ 77);
            let streams: Vec<Vec<u8>> = (0..k)
                .map(|j| {
                    let s = ap.chunk_payload(j);
                    let c = if r.next().is_multiple_of(2) { 0 } else { cut.min(s.len() - 16) };
                    s[..s.len() - c].to_vec()
                })
                .collect();
            check_decode_chunks(&method4_payload(n as u64, &tables, &streams))?;
        }
    }

    #[test]
    fn method4_small_and_edge_sizes() {
        for n in 0..40usize {
            let d: Vec<u8> = (0..n).map(|i| (i * 37 % 5) as u8).collect();
            for k in [0usize, 1, 2, 3, 4, 7, 64] {
                let p = encode_method4(&d, k);
                let mut out = vec![0u8; n];
                decode_method4(&p, &mut out).unwrap();
                assert_eq!(out, d, "n={n} k={k}");
            }
        }
        assert_eq!(encode_method4(&[], 5), vec![0u8; 8]);
        let mut e = [];
        decode_method4(&[0u8; 8], &mut e).unwrap();
        // Flagged n = 0 with chunks is accepted too.
        let mut p = ADAPT_FLAG.to_le_bytes().to_vec();
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        decode_method4(&p, &mut e).unwrap();
        // full 256-symbol alphabet, large, parallel path
        let mut r = Rng(3);
        let d: Vec<u8> = (0..3_000_000).map(|_| r.next() as u8).collect();
        for k in [1usize, 46, 12] {
            let p = encode_method4(&d, k);
            let mut out = vec![0u8; d.len()];
            decode_method4(&p, &mut out).unwrap();
            assert_eq!(out, d);
        }
    }

    #[test]
    fn method4_freq_blob_is_one_frame_with_content_size() {
        let d = exponent_data(300_000, 4);
        let p = encode_method4(&d, 5);
        let ap = AdaptivePayload::parse(&p).unwrap();
        let blob = ap.freq_blob();
        assert_eq!(
            ::zstd::zstd_safe::get_frame_content_size(blob).unwrap(),
            Some(5 * 512)
        );
        assert_eq!(
            ::zstd::zstd_safe::find_frame_compressed_size(blob).unwrap(),
            blob.len()
        );
        // level-3 zstd: check the frame header has no checksum and no dict id.
        let fhd = blob[4];
        assert_eq!(fhd & 0x04, 0, "checksum flag");
        assert_eq!(fhd & 0x03, 0, "dictionary id");
        // chunk layout: clens cover the body exactly
        let total: usize = (0..ap.chunks()).map(|j| ap.chunk_payload(j).len()).sum();
        assert_eq!(16 + 4 * 5 + blob.len() + total, p.len());
    }

    #[test]
    fn method5_edge_cases() {
        // segments with 0 or 1 symbols, chunk sizes not multiple of 4
        for n in 0..30usize {
            let d: Vec<u8> = (0..n).map(|i| (i * 7 % 3) as u8 + 10).collect();
            for k in [1usize, 2, 3, 9] {
                let p = o1_encode(&d, k);
                let mut out = vec![0u8; n];
                decode_method5(&p, &mut out).unwrap();
                assert_eq!(out, d, "n={n} k={k}");
            }
        }
        // symbol 99 only at segment ends: it has no row (legal).
        let mut d = vec![1u8; 400];
        for l in 1..=4 {
            d[100 * l - 1] = 99;
        }
        let p = o1_encode(&d, 1);
        let mut out = vec![0u8; d.len()];
        decode_method5(&p, &mut out).unwrap();
        assert_eq!(out, d);
        // large, parallel path, 256 symbols
        let mut r = Rng(8);
        let d: Vec<u8> = (0..2_500_000)
            .map(|i| {
                if i % 3 == 0 {
                    r.next() as u8
                } else {
                    (r.next() % 4) as u8
                }
            })
            .collect();
        let p = o1_encode(&d, 3);
        let mut out = vec![0u8; d.len()];
        decode_method5(&p, &mut out).unwrap();
        assert_eq!(out, d);
    }

    // ----- real vectors (tests/data/rans, extracted with scripts/extract_rans_planes.py) -----

    #[test]
    fn decodes_z4ai_vector_planes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/rans");
        let list = std::fs::read_to_string(dir.join("planes.txt")).expect("testdata/planes.txt");
        let mut seen = [0usize; 6];
        for line in list.lines().filter(|l| !l.trim().is_empty()) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let payload = std::fs::read(dir.join(f[0])).unwrap();
            let method: usize = f[1].parse().unwrap();
            let n: usize = f[2].parse().unwrap();
            let want = u64::from_str_radix(f[3], 16).unwrap();
            let mut out = vec![0u8; n];
            match method {
                3 => decode_method3(&payload, &mut out),
                4 => decode_method4(&payload, &mut out),
                5 => decode_method5(&payload, &mut out),
                _ => unreachable!(),
            }
            .unwrap_or_else(|e| panic!("{}: {e}", f[0]));
            assert_eq!(fnv1a64(&out), want, "{}", f[0]);
            seen[method] += 1;
            // every chunk of a method-4 plane decodes on its own too
            if method == 4 {
                let ap = AdaptivePayload::parse(&payload).unwrap();
                let t = ap.freq_tables().unwrap();
                for j in 0..ap.chunks() {
                    let r = ap.chunk_bounds(j);
                    let mut o = vec![0u8; (r.end - r.start) as usize];
                    ap.decode_chunk(j, &t[j], &mut o).unwrap();
                    assert_eq!(&o[..], &out[r.start as usize..r.end as usize]);
                }
            }
            // truncations never panic and (when they cut data) fail
            for cut in [
                0usize,
                1,
                7,
                8,
                13,
                15,
                16,
                20,
                payload.len() / 2,
                payload.len() - 1,
            ] {
                let cut = cut.min(payload.len() - 1);
                let mut o = vec![0u8; n];
                let r = match method {
                    4 => decode_method4(&payload[..cut], &mut o),
                    _ => decode_method5(&payload[..cut], &mut o),
                };
                assert!(
                    r.is_err() || o != out || cut + 2 >= payload.len(),
                    "{} cut {cut}",
                    f[0]
                );
            }
        }
        assert!(seen[4] >= 19 && seen[5] >= 3, "{seen:?}");
    }

    // ----- malformed input -----

    #[test]
    fn rejects_bad_tables() {
        let mut f = [0u16; 256];
        f[0] = 16383;
        let mut out = [0u8; 4];
        assert!(matches!(
            decode_stream(&[0xFF; 32], &f, &mut out),
            Err(CodecError::Rans(_))
        ));
        f[1] = 2;
        assert!(decode_stream(&[0xFF; 32], &f, &mut out).is_err());
        f = [u16::MAX; 256];
        assert!(decode_stream(&[0xFF; 32], &f, &mut out).is_err());
        assert!(decode_stream(&[0xFF; 32], &f, &mut []).is_err());
        // seeds too short / below RANS_L
        let g = normalize_freqs(&[1; 256]);
        assert!(matches!(
            decode_stream(&[0xFF; 15], &g, &mut out),
            Err(CodecError::Truncated { .. })
        ));
        let mut s = vec![0xFF; 32];
        s[8..12].copy_from_slice(&(RANS_L - 1).to_le_bytes());
        assert!(decode_stream(&s, &g, &mut out).is_err());
        // ... but unused lanes are not checked
        decode_stream(&s, &g, &mut out[..2]).unwrap();
        // method 4 with a table not summing to 16384
        let d = exponent_data(1000, 1);
        let p = encode_method4(&d, 2);
        let ap = AdaptivePayload::parse(&p).unwrap();
        let mut tables = ap.freq_tables().unwrap();
        tables[1][0] = tables[1][0].wrapping_add(1);
        let mut raw = Vec::new();
        for t in &tables {
            for v in t {
                raw.extend_from_slice(&v.to_le_bytes());
            }
        }
        let blob = ::zstd::bulk::compress(&raw, 3).unwrap();
        let mut q = p[..16].to_vec();
        q[12..16].copy_from_slice(&(blob.len() as u32).to_le_bytes());
        q.extend_from_slice(&p[16..24]);
        q.extend_from_slice(&blob);
        q.extend_from_slice(&p[24 + ap.freq_blob().len()..]);
        let mut out = vec![0u8; d.len()];
        assert!(matches!(
            decode_method4(&q, &mut out),
            Err(CodecError::Rans(_))
        ));
    }

    #[test]
    fn rejects_lying_headers() {
        let d = exponent_data(5000, 2);
        let p = encode_method4(&d, 3);
        let mut out = vec![0u8; d.len()];
        // lying n (bigger and smaller than the caller's buffer)
        for n in [d.len() as u64 + 1, d.len() as u64 - 1, (1 << 62) - 1, 0] {
            let mut q = p.clone();
            q[..8].copy_from_slice(&(n | ADAPT_FLAG).to_le_bytes());
            assert!(matches!(
                decode_method4(&q, &mut out),
                Err(CodecError::LengthMismatch { .. })
            ));
        }
        // bit 63 set, flag missing
        let mut q = p.clone();
        q[7] |= 0x80;
        assert!(decode_method4(&q, &mut out).is_err());
        let mut q = p.clone();
        q[7] &= !0x40;
        assert!(decode_method4(&q, &mut out).is_err());
        // k larger than the payload allows: error before any allocation
        for k in [4u32, 1000, u32::MAX] {
            let mut q = p.clone();
            q[8..12].copy_from_slice(&k.to_le_bytes());
            assert!(decode_method4(&q, &mut out).is_err(), "k={k}");
            assert!(AdaptivePayload::parse(&q).is_err() || k == 4);
        }
        // k = 0 with n > 0
        let mut q = p.clone();
        q[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert!(decode_method4(&q, &mut out).is_err());
        // chunk lengths past the end
        let mut q = p.clone();
        q[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            AdaptivePayload::parse(&q),
            Err(CodecError::Truncated { .. })
        ));
        // freq blob that decodes to more/less than k*512
        let mut q = p.clone();
        q[8..12].copy_from_slice(&2u32.to_le_bytes());
        let mut q2 = q[..16].to_vec();
        q2.extend_from_slice(&q[16..24]);
        q2.extend_from_slice(&q[28..]);
        assert!(decode_method4(&q2, &mut out).is_err());
        // every truncation errs
        for cut in 0..p.len().min(200) {
            assert!(decode_method4(&p[..cut], &mut out).is_err(), "cut {cut}");
        }
        // method 3
        let m3 = method3_chunked(&d, 3);
        for cut in 0..600 {
            assert!(decode_method3(&m3[..cut], &mut out).is_err(), "cut {cut}");
        }
        let mut q = m3.clone();
        q[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(decode_method3(&q, &mut out).is_err());
        assert!(decode_method3(&0u64.to_le_bytes(), &mut out).is_err());
        assert!(decode_method3(&0u64.to_le_bytes(), &mut []).is_ok());
    }

    #[test]
    fn rejects_bad_order1_payloads() {
        let d = exponent_data(20_000, 3);
        let p = o1_encode(&d, 2);
        let mut out = vec![0u8; d.len()];
        decode_method5(&p, &mut out).unwrap();
        for cut in (0..p.len()).step_by(97) {
            assert!(decode_method5(&p[..cut], &mut out).is_err(), "cut {cut}");
        }
        let mut q = p.clone();
        q[0] = b'X';
        assert!(decode_method5(&q, &mut out).is_err());
        // nseg byte is ignored (z4ai assumes 4)
        let mut q = p.clone();
        q[2] = 2;
        decode_method5(&q, &mut out).unwrap();
        // lying n, k = 0, huge k
        let mut q = p.clone();
        q[4..8].copy_from_slice(&(d.len() as u32 + 1).to_le_bytes());
        assert!(matches!(
            decode_method5(&q, &mut out),
            Err(CodecError::LengthMismatch { .. })
        ));
        let mut q = p.clone();
        q[12..14].copy_from_slice(&0u16.to_le_bytes());
        assert!(decode_method5(&q, &mut out).is_err());
        let mut q = p.clone();
        q[12..14].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(decode_method5(&q, &mut out).is_err());
        // model rows: wrong sum, context 0 missing, used row missing
        let freq = o1_model(&d, 1);
        let mut bad = freq.clone();
        let s = (0..256).find(|&s| bad[0][s] > 1).unwrap();
        bad[0][s] -= 1;
        let q = o1_payload_with(&d, 1, &freq, &o1_serialize(&bad));
        assert!(matches!(
            decode_method5(&q, &mut out),
            Err(CodecError::Rans(_))
        ));
        let mut bad = freq.clone();
        bad[0] = [0; 256];
        let q = o1_payload_with(&d, 1, &freq, &o1_serialize(&bad));
        assert!(decode_method5(&q, &mut out).is_err());
        let mut bad = freq.clone();
        let used = usize::from(d[5]);
        bad[used] = [0; 256];
        let q = o1_payload_with(&d, 1, &freq, &o1_serialize(&bad));
        assert!(matches!(
            decode_method5(&q, &mut out),
            Err(CodecError::Rans(_))
        ));
        // model blob without content size, and one claiming too much
        let raw = o1_serialize(&freq);
        let mut c = ::zstd::bulk::Compressor::new(19).unwrap();
        c.include_contentsize(false).unwrap();
        let blob = c.compress(&raw).unwrap();
        assert_eq!(
            ::zstd::zstd_safe::get_frame_content_size(&blob).unwrap(),
            None
        );
        let q = replace_o1_blob(&p, &blob);
        assert!(matches!(
            decode_method5(&q, &mut out),
            Err(CodecError::Zstd(_))
        ));
        let big = vec![0u8; O1_MODEL_MAX + 1];
        let q = replace_o1_blob(&p, &::zstd::bulk::compress(&big, 1).unwrap());
        assert!(decode_method5(&q, &mut out).is_err());
        // truncated model row
        let mut raw2 = raw.clone();
        raw2.pop();
        let q = replace_o1_blob(&p, &::zstd::bulk::compress(&raw2, 3).unwrap());
        assert!(decode_method5(&q, &mut out).is_err());
        // segment state below RANS_L
        let chunk0 = 14 + u32::from_le_bytes(p[8..12].try_into().unwrap()) as usize + 8;
        let mut q = p.clone();
        q[chunk0 + 16..chunk0 + 20].copy_from_slice(&5u32.to_le_bytes());
        assert!(decode_method5(&q, &mut out).is_err());
    }

    fn replace_o1_blob(p: &[u8], blob: &[u8]) -> Vec<u8> {
        let old = u32::from_le_bytes(p[8..12].try_into().unwrap()) as usize;
        let mut q = p[..14].to_vec();
        q[8..12].copy_from_slice(&(blob.len() as u32).to_le_bytes());
        q.extend_from_slice(blob);
        q.extend_from_slice(&p[14 + old..]);
        q
    }

    #[test]
    #[should_panic(expected = "frequency 0")]
    fn encode_panics_on_zero_freq_symbol() {
        let mut h = [0u64; 256];
        h[1] = 1;
        let f = normalize_freqs(&h);
        encode_stream(&[1, 1, 2], &f, &mut Vec::new());
    }
}
