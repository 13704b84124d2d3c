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
use crate::codec::{CodecError, Result};
use crate::format::cursor::Cursor;
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
/// exactly `b` bits (ckptfs writes it for planes of near-uniform values,
/// such as bf16 mantissas, where Huffman gets no further), and its symbol
/// is the slot's top `b` bits.
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
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::codec::rans::test_util::Rng;
    use crate::codec::rans::test_util::*;
    use crate::codec::rans::*;
    use proptest::prelude::*;

    // ----- spec-literal reference coders (division based) -----

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
    #[should_panic(expected = "frequency 0")]
    fn encode_panics_on_zero_freq_symbol() {
        let mut h = [0u64; 256];
        h[1] = 1;
        let f = normalize_freqs(&h);
        encode_stream(&[1, 1, 2], &f, &mut Vec::new());
    }
}
