//! Plane method 6 (a ckptfs extension, not read by z4ai 0.2.0): rANS with
//! 32 interleaved states and 12-bit probabilities, one table per block.
//!
//! Why: the exponent byte of a float is the only part of it worth entropy
//! coding (doc/FORMAT.md §1, "split-float frames"), and z4ai's method 4
//! (4 states per chunk, 14-bit tables of 16 KiB + a 256-entry side table)
//! is gather-bound. Here a decode step is one lookup in a 4096-entry table
//! of packed `u32`s (16 KiB, L1-resident) giving symbol, frequency and
//! bias at once; 32 states in lock-step are two AVX-512 or four AVX2
//! vectors, and they share one little-endian `u16` word stream, read in
//! state order, so the vector kernels and the portable loop consume the
//! same words in the same order and give identical bytes.
//!
//! Block payload (every block decodes on its own):
//!
//! ```text
//! u8      nsym - 1           symbols with a non-zero frequency, 2..=256
//! nsym ×  (u8 sym, u16 freq) symbols strictly increasing, 1 <= freq <= 4095,
//!                            frequencies summing to exactly 4096
//! 32 × u32 states            initial decoder states, each in [2^16, 2^32)
//! u16 ... words              the renormalisation words, to the block's end
//! ```
//!
//! Symbol `i` of a block is decoded by state `i mod 32` at step `i / 32`.
//! Step: `slot = x & 4095`; `(s, f, c)` from the table; `x = f·(x >> 12) +
//! slot − c`; if `x < 2^16`, `x = x << 16 | next word`. A valid block ends
//! with every word read and every state back at `2^16` (the encoder's
//! start); anything else is an error naming what is wrong.
//!
//! Every decoder here writes every byte of its output (callers may hand in
//! reused buffers), reads nothing past the payload, allocates nothing sized
//! by the payload and never panics on hostile input.

use super::{CodecError, Result};

/// Interleaved states per block.
pub const LANES: usize = 32;
/// Probability precision in bits.
pub const PROB_BITS: u32 = 12;
const SCALE: u32 = 1 << PROB_BITS;
/// Lower bound of a normalised state; renormalisation reads 16 bits.
const LOW: u32 = 1 << 16;
/// Bytes of the fixed part after the symbol list.
const STATE_BYTES: usize = LANES * 4;

/// A block's decode table: slot -> `sym | freq << 8 | (slot - cum) << 20`.
pub struct Table {
    slots: Box<[u32; SCALE as usize]>,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            slots: Box::new([0; SCALE as usize]),
        }
    }
}

fn bad(what: &'static str, msg: impl Into<String>) -> CodecError {
    CodecError::invalid(what, msg)
}

/// A parsed block: its table is built into the caller's [`Table`].
struct Block<'a> {
    states: [u32; LANES],
    words: &'a [u8],
}

impl Table {
    /// Parses a block's header, building the table; returns the states and
    /// the word stream.
    fn load<'a>(&mut self, payload: &'a [u8]) -> Result<Block<'a>> {
        const W: &str = "rans32 block";
        let nsym = *payload.first().ok_or_else(|| bad(W, "empty block"))? as usize + 1;
        let list_end = 1 + 3 * nsym;
        let list = payload.get(1..list_end).ok_or_else(|| {
            bad(
                W,
                format!("{} bytes cannot hold {nsym} symbols", payload.len()),
            )
        })?;
        if nsym < 2 {
            return Err(bad(W, "a table of one symbol"));
        }
        let mut cum = 0u32;
        let mut prev: i32 = -1;
        for e in list.chunks_exact(3) {
            let (s, f) = (e[0] as u32, u16::from_le_bytes([e[1], e[2]]) as u32);
            if s as i32 <= prev {
                return Err(bad(W, "symbols not strictly increasing"));
            }
            if f == 0 || f >= SCALE || cum + f > SCALE {
                return Err(bad(W, format!("frequency {f} of symbol {s} out of range")));
            }
            prev = s as i32;
            for k in 0..f {
                self.slots[(cum + k) as usize] = s | f << 8 | k << 20;
            }
            cum += f;
        }
        if cum != SCALE {
            return Err(bad(W, format!("frequencies sum to {cum}, not 4096")));
        }
        let st = payload
            .get(list_end..list_end + STATE_BYTES)
            .ok_or_else(|| bad(W, "truncated states"))?;
        let mut states = [0u32; LANES];
        for (x, b) in states.iter_mut().zip(st.chunks_exact(4)) {
            *x = u32::from_le_bytes(b.try_into().expect("4 bytes"));
            if *x < LOW {
                return Err(bad(W, format!("state {x} below 2^16")));
            }
        }
        let words = &payload[list_end + STATE_BYTES..];
        if !words.len().is_multiple_of(2) {
            return Err(bad(W, "odd number of stream bytes"));
        }
        Ok(Block { states, words })
    }
}

/// A block decoder that hands out its symbols in tiles, so that a caller
/// can join each tile into its output while it is in L1.
pub struct BlockDecoder<'a, 't> {
    table: &'t Table,
    states: [u32; LANES],
    words: &'a [u8],
    pos: usize,
    /// Symbols decoded so far.
    done: usize,
    len: usize,
}

impl<'a, 't> BlockDecoder<'a, 't> {
    /// Starts decoding a block of `len` symbols whose payload is `payload`,
    /// building its table in `table`.
    pub fn new(table: &'t mut Table, payload: &'a [u8], len: usize) -> Result<Self> {
        let b = table.load(payload)?;
        Ok(BlockDecoder {
            table,
            states: b.states,
            words: b.words,
            pos: 0,
            done: 0,
            len,
        })
    }

    /// Decodes the next `out.len()` symbols into `out` (every byte written).
    /// Except for the block's last tile, `out.len()` must be a multiple of
    /// [`LANES`].
    pub fn next_tile(&mut self, out: &mut [u8]) -> Result<()> {
        if out.len() > self.len - self.done {
            return Err(bad("rans32 block", "tile past the block's end"));
        }
        if !out.len().is_multiple_of(LANES) && self.done + out.len() != self.len {
            return Err(bad("rans32 block", "tile not a whole number of steps"));
        }
        #[cfg(target_arch = "x86_64")]
        let i = self.vector_steps(out);
        #[cfg(not(target_arch = "x86_64"))]
        let i = 0;
        self.scalar(&mut out[i..])?;
        self.done += out.len();
        Ok(())
    }

    /// Checks the block's end state after its last tile.
    pub fn finish(&self) -> Result<()> {
        if self.done != self.len {
            return Err(bad("rans32 block", "not all symbols decoded"));
        }
        if self.pos != self.words.len() {
            return Err(bad(
                "rans32 block",
                format!("{} stream bytes left over", self.words.len() - self.pos),
            ));
        }
        if self.states.iter().any(|&x| x != LOW) {
            return Err(bad("rans32 block", "final states differ from 2^16"));
        }
        Ok(())
    }

    /// The portable decoder: whole steps, then a partial last step.
    fn scalar(&mut self, out: &mut [u8]) -> Result<()> {
        let t = &self.table.slots;
        let w = self.words;
        for step in out.chunks_mut(LANES) {
            for (o, x) in step.iter_mut().zip(self.states.iter_mut()) {
                let e = t[(*x & (SCALE - 1)) as usize];
                *o = e as u8;
                let v = ((e >> 8) & (SCALE - 1)) * (*x >> PROB_BITS) + (e >> 20);
                *x = if v < LOW {
                    let b = w
                        .get(self.pos..self.pos + 2)
                        .ok_or_else(|| bad("rans32 block", "stream ends early"))?;
                    self.pos += 2;
                    v << 16 | u16::from_le_bytes([b[0], b[1]]) as u32
                } else {
                    v
                };
            }
        }
        Ok(())
    }

    /// Whole steps with the widest kernel the CPU has, while a step cannot
    /// read past the stream (each reads at most 64 bytes); returns the
    /// symbols written. The portable loop finishes the rest.
    #[cfg(target_arch = "x86_64")]
    fn vector_steps(&mut self, out: &mut [u8]) -> usize {
        let steps = out.len() / LANES;
        if steps == 0 || force_portable() {
            return 0;
        }
        let (done, pos) = if has_avx512() && !force_avx2() {
            // SAFETY: the CPU has AVX-512F/BW (checked); the kernel reads
            // words only while 64 bytes remain and tables by 12-bit slots.
            unsafe {
                avx512::steps(
                    &self.table.slots,
                    &mut self.states,
                    self.words,
                    self.pos,
                    &mut out[..steps * LANES],
                )
            }
        } else if super::has_avx2() {
            // SAFETY: as above, with AVX2.
            unsafe {
                avx2::steps(
                    &self.table.slots,
                    &mut self.states,
                    self.words,
                    self.pos,
                    &mut out[..steps * LANES],
                )
            }
        } else {
            return 0;
        };
        self.pos = pos;
        done
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    static HAVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    super::cpu_check(&HAVE, || {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
    })
}

#[cfg(all(target_arch = "x86_64", test))]
thread_local! {
    /// Tests compare the kernels: 0 = best, 1 = portable, 2 = AVX2.
    pub(crate) static KERNEL: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Tests run the AVX2 kernel on AVX-512 machines too.
#[cfg(target_arch = "x86_64")]
fn force_avx2() -> bool {
    #[cfg(test)]
    {
        KERNEL.with(|k| k.get() == 2)
    }
    #[cfg(not(test))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
fn force_portable() -> bool {
    #[cfg(test)]
    {
        KERNEL.with(|k| k.get() == 1)
    }
    #[cfg(not(test))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{LANES, LOW, SCALE};
    use std::arch::x86_64::*;

    /// Decodes whole steps into `out` while 64 stream bytes remain; returns
    /// (symbols written, new stream position).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn steps(
        table: &[u32; SCALE as usize],
        states: &mut [u32; LANES],
        words: &[u8],
        mut pos: usize,
        out: &mut [u8],
    ) -> (usize, usize) {
        let tp = table.as_ptr() as *const i32;
        let mask12 = _mm512_set1_epi32((SCALE - 1) as i32);
        let low = _mm512_set1_epi32(LOW as i32);
        // SAFETY: `states` holds 32 u32s.
        let mut x0 = unsafe { _mm512_loadu_si512(states.as_ptr() as *const _) };
        let mut x1 = unsafe { _mm512_loadu_si512(states.as_ptr().add(16) as *const _) };
        let mut i = 0;
        while i + LANES <= out.len() && words.len() - pos >= 64 {
            macro_rules! lane {
                ($x:ident, $o:expr) => {{
                    let slot = _mm512_and_si512($x, mask12);
                    // SAFETY: slots are < 4096, the table's length.
                    let e = unsafe { _mm512_i32gather_epi32::<4>(slot, tp) };
                    let f = _mm512_and_si512(_mm512_srli_epi32::<8>(e), mask12);
                    let v = _mm512_add_epi32(
                        _mm512_mullo_epi32(f, _mm512_srli_epi32::<12>($x)),
                        _mm512_srli_epi32::<20>(e),
                    );
                    let m = _mm512_cmplt_epu32_mask(v, low);
                    // SAFETY: 64 bytes remain from `pos` (loop condition),
                    // and this step reads at most 32 words in all.
                    let w = unsafe {
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                            words.as_ptr().add(pos) as *const __m256i
                        ))
                    };
                    pos += 2 * m.count_ones() as usize;
                    $x = _mm512_mask_or_epi32(
                        v,
                        m,
                        _mm512_slli_epi32::<16>(v),
                        _mm512_maskz_expand_epi32(m, w),
                    );
                    // SAFETY: `$o + 16 <= i + 32 <= out.len()`.
                    unsafe {
                        _mm_storeu_si128(
                            out.as_mut_ptr().add($o) as *mut __m128i,
                            _mm512_cvtepi32_epi8(e),
                        )
                    };
                }};
            }
            lane!(x0, i);
            lane!(x1, i + 16);
            i += LANES;
        }
        // SAFETY: as the loads.
        unsafe {
            _mm512_storeu_si512(states.as_mut_ptr() as *mut _, x0);
            _mm512_storeu_si512(states.as_mut_ptr().add(16) as *mut _, x1);
        }
        (i, pos)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{LANES, SCALE};
    use std::arch::x86_64::*;

    /// For an 8-lane mask, the index of the word each set lane takes.
    const fn expand_table() -> [[u32; 8]; 256] {
        let mut t = [[0u32; 8]; 256];
        let mut m = 0;
        while m < 256 {
            let mut k = 0;
            let mut j = 0;
            while j < 8 {
                if m & (1 << j) != 0 {
                    t[m][j] = k;
                    k += 1;
                }
                j += 1;
            }
            m += 1;
        }
        t
    }
    static EXPAND: [[u32; 8]; 256] = expand_table();

    /// As `avx512::steps`, with four 8-lane vectors.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn steps(
        table: &[u32; SCALE as usize],
        states: &mut [u32; LANES],
        words: &[u8],
        mut pos: usize,
        out: &mut [u8],
    ) -> (usize, usize) {
        let tp = table.as_ptr() as *const i32;
        let mask12 = _mm256_set1_epi32((SCALE - 1) as i32);
        let mask8 = _mm256_set1_epi32(0xFF);
        let zero = _mm256_setzero_si256();
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let sp = states.as_mut_ptr() as *mut __m256i;
        // SAFETY: `states` holds 32 u32s: four vectors.
        let mut x = unsafe {
            [
                _mm256_loadu_si256(sp),
                _mm256_loadu_si256(sp.add(1)),
                _mm256_loadu_si256(sp.add(2)),
                _mm256_loadu_si256(sp.add(3)),
            ]
        };
        let mut i = 0;
        while i + LANES <= out.len() && words.len() - pos >= 64 {
            let mut syms = [zero; 4];
            for (k, xk) in x.iter_mut().enumerate() {
                let slot = _mm256_and_si256(*xk, mask12);
                // SAFETY: slots are < 4096, the table's length.
                let e = unsafe { _mm256_i32gather_epi32::<4>(tp, slot) };
                let f = _mm256_and_si256(_mm256_srli_epi32::<8>(e), mask12);
                let v = _mm256_add_epi32(
                    _mm256_mullo_epi32(f, _mm256_srli_epi32::<12>(*xk)),
                    _mm256_srli_epi32::<20>(e),
                );
                let need = _mm256_cmpeq_epi32(_mm256_srli_epi32::<16>(v), zero);
                let m = _mm256_movemask_ps(_mm256_castsi256_ps(need)) as usize;
                // SAFETY: 64 bytes remain from `pos`; a step reads <= 64.
                let w = unsafe {
                    _mm256_cvtepu16_epi32(
                        _mm_loadu_si128(words.as_ptr().add(pos) as *const __m128i),
                    )
                };
                pos += 2 * m.count_ones() as usize;
                // SAFETY: EXPAND[m] holds 8 u32s.
                let idx = unsafe { _mm256_loadu_si256(EXPAND[m].as_ptr() as *const __m256i) };
                let w = _mm256_permutevar8x32_epi32(w, idx);
                let nv = _mm256_or_si256(_mm256_slli_epi32::<16>(v), w);
                *xk = _mm256_blendv_epi8(v, nv, need);
                syms[k] = _mm256_and_si256(e, mask8);
            }
            let a = _mm256_packus_epi32(syms[0], syms[1]);
            let b = _mm256_packus_epi32(syms[2], syms[3]);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), order);
            // SAFETY: `i + 32 <= out.len()`.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(i) as *mut __m256i, bytes) };
            i += LANES;
        }
        // SAFETY: as the loads.
        unsafe {
            for (k, xk) in x.iter().enumerate() {
                _mm256_storeu_si256(sp.add(k), *xk);
            }
        }
        (i, pos)
    }
}

/// Decodes one whole block of `out.len()` symbols into `out`.
pub fn decode_block(table: &mut Table, payload: &[u8], out: &mut [u8]) -> Result<()> {
    let mut d = BlockDecoder::new(table, payload, out.len())?;
    d.next_tile(out)?;
    d.finish()
}

/// Decodes one block with a per-thread table.
pub fn decode_block_here(payload: &[u8], out: &mut [u8]) -> Result<()> {
    thread_local! {
        static TABLE: std::cell::RefCell<Table> = std::cell::RefCell::new(Table::default());
    }
    TABLE.with(|t| decode_block(&mut t.borrow_mut(), payload, out))
}

/// Encodes one block (at least one symbol).
pub fn encode_block(data: &[u8]) -> Vec<u8> {
    assert!(!data.is_empty(), "rans32: empty block");
    let mut hist = super::rans::histogram(data);
    // A table needs two symbols (no frequency may be 4096).
    if hist.iter().filter(|&&h| h > 0).count() < 2 {
        let s = data[0] as usize;
        hist[s ^ 1] = 1;
    }
    let freqs = super::rans::normalize_freqs_to(&hist, SCALE);
    let mut cum = [0u32; 256];
    let mut acc = 0;
    let mut head = vec![0u8];
    for s in 0..256 {
        cum[s] = acc;
        let f = freqs[s] as u32;
        if f > 0 {
            head.push(s as u8);
            head.extend_from_slice(&(f as u16).to_le_bytes());
        }
        acc += f;
    }
    head[0] = ((head.len() - 1) / 3 - 1) as u8;
    // x / f by a multiply: the f64 quotient is off by at most one, which
    // the remainder's range corrects (a division per symbol made encoding
    // several times slower than decoding). Per symbol: its (freq, cum,
    // 1/freq) in one table entry, and no branch: the renormalisation and
    // the correction are data-dependent, and mispredicted branches were
    // most of the encoder's time.
    let mut sym = [(0u32, 0u32, 0f64); 256];
    for (s, e) in sym.iter_mut().enumerate() {
        let f = freqs[s] as u32;
        *e = (f, cum[s], if f > 0 { 1.0 / f as f64 } else { 0.0 });
    }
    let mut states = [LOW; LANES];
    // At most one word per symbol.
    let mut words: Vec<u16> = vec![0; data.len()];
    let mut n_words = 0usize;
    for i in (0..data.len()).rev() {
        let (f, c, inv) = sym[data[i] as usize];
        let x = &mut states[i % LANES];
        let renorm = (*x >= f << 20) as u32;
        words[n_words] = *x as u16;
        n_words += renorm as usize;
        let xs = *x >> (16 * renorm);
        let q0 = (xs as f64 * inv) as u32;
        let r0 = xs.wrapping_sub(q0.wrapping_mul(f)) as i32;
        let down = (r0 < 0) as u32;
        let up = (r0 >= f as i32) as u32;
        let q = q0.wrapping_add(up).wrapping_sub(down);
        let r = (r0 as u32).wrapping_add(down * f).wrapping_sub(up * f);
        debug_assert!(q == xs / f && r == xs % f);
        *x = (q << PROB_BITS) + r + c;
    }
    words.truncate(n_words);
    let mut out = head;
    out.reserve(STATE_BYTES + 2 * words.len());
    for x in states {
        out.extend_from_slice(&x.to_le_bytes());
    }
    for w in words.iter().rev() {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

/// Encodes a method-6 plane payload: blocks of `block_size` symbols (the
/// last shorter), with the block table of method 2 (`u32 block_size, u32
/// count, count × u32 length`).
pub fn encode_plane(data: &[u8], block_size: usize) -> Vec<u8> {
    use rayon::prelude::*;
    let blocks: Vec<Vec<u8>> = data
        .par_chunks(block_size.max(1))
        .map(encode_block)
        .collect();
    let mut v =
        Vec::with_capacity(8 + blocks.len() * 4 + blocks.iter().map(Vec::len).sum::<usize>());
    v.extend_from_slice(&(block_size as u32).to_le_bytes());
    v.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
    for b in &blocks {
        v.extend_from_slice(&(b.len() as u32).to_le_bytes());
    }
    for b in &blocks {
        v.extend_from_slice(b);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_with(kernel: u8, payload: &[u8], n: usize) -> Result<Vec<u8>> {
        #[cfg(target_arch = "x86_64")]
        KERNEL.with(|k| k.set(kernel));
        let _ = kernel;
        let mut out = vec![0xAAu8; n];
        let r = decode_block_here(payload, &mut out);
        #[cfg(target_arch = "x86_64")]
        KERNEL.with(|k| k.set(0));
        r.map(|()| out)
    }

    fn skewed(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Roughly geometric around 120, like bf16 exponents.
                (120 + (x % 64).trailing_zeros() as u64 - (x >> 40) % 3) as u8
            })
            .collect()
    }

    fn round_trip(data: &[u8]) {
        let p = encode_block(data);
        for k in [0u8, 1, 2] {
            let got = decode_with(k, &p, data.len()).unwrap();
            assert!(got == data, "kernel {k}, {} symbols", data.len());
        }
    }

    #[test]
    fn sizes_around_the_lane_count() {
        for n in [1, 2, 31, 32, 33, 63, 64, 65, 1000, 4096, 70_001] {
            round_trip(&skewed(n, n as u64));
            round_trip(&vec![7u8; n]);
            let flat: Vec<u8> = (0..n).map(|i| (i * 7919 % 256) as u8).collect();
            round_trip(&flat);
        }
    }

    proptest! {
        #[test]
        fn any_bytes_round_trip(data in proptest::collection::vec(any::<u8>(), 1..3000)) {
            round_trip(&data);
        }

        #[test]
        fn skewed_round_trip(n in 1usize..20_000, seed in any::<u64>()) {
            round_trip(&skewed(n, seed));
        }

        #[test]
        fn hostile_blocks_are_errors_not_panics(
            data in proptest::collection::vec(any::<u8>(), 1..2000),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
            n in 0usize..3000,
        ) {
            let mut p = encode_block(&data);
            for (at, v) in flips {
                let l = p.len();
                p[at % l] ^= v | 1;
            }
            let a = decode_with(1, &p, n);
            let b = decode_with(0, &p, n);
            prop_assert_eq!(a.is_ok(), b.is_ok());
            if let (Ok(a), Ok(b)) = (a, b) {
                prop_assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn damaged_blocks_name_the_fault() {
        let data = skewed(5000, 3);
        let p = encode_block(&data);
        let e = decode_with(0, &p[..p.len() - 2], data.len()).unwrap_err();
        assert!(e.to_string().contains("rans32"), "{e}");
        let e = decode_with(0, &p, data.len() - 1).unwrap_err();
        assert!(e.to_string().contains("rans32"), "{e}");
        let e = decode_with(0, &[], 1).unwrap_err();
        assert!(e.to_string().contains("empty block"), "{e}");
        let mut q = p.clone();
        q[2] ^= 0x40; // a frequency
        assert!(decode_with(0, &q, data.len()).is_err());
    }
}
