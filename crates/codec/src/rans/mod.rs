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
//!
//! Layout: this file holds the constants, the shared table and chunk helpers
//! and the re-exports (callers use `codec::rans::X`); one file per coder:
//!
//! * `model.rs`: byte histograms and their normalisation to frequency tables;
//! * `order0.rs`: the 4-lane order-0 stream coder and plane method 3;
//! * `adaptive.rs`: plane method 4 (per-chunk tables, multi-chunk decoding;
//!   the payload layout, `AdaptivePayload`, is parsed in `format::plane`);
//! * `vector.rs`: the vector decoder of method-4 chunk groups (x86-64 only)
//!   and its AVX-512 kernel; `avx2.rs`: its AVX2 kernel;
//! * `enc_avx512.rs`: its mirror, the AVX-512 encoder of up to 16 chunks at
//!   once (output identical to the scalar encoder's); `enc_avx2.rs`: the
//!   same rounds with AVX2;
//! * `order1.rs`: the order-1 decoder, plane method 5.
//!
//! Each coder's tests sit beside it (method 4's in `adaptive_tests.rs`);
//! `test_util.rs` holds the test-only encoders of methods 3 and 5 and the
//! data generators they share. Nothing here does I/O or knows about frames;
//! the only dependencies are the error type, the format's `Cursor` and
//! method-4 layout, zstd (for the packed tables) and rayon.

use super::{CodecError, Result};
use ckptfs_format::plane::{chunk_offsets, chunk_range, CHUNK_FLAG};

pub mod adaptive;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod enc_avx2;
#[cfg(target_arch = "x86_64")]
mod enc_avx512;
mod model;
mod order0;
mod order1;
#[cfg(test)]
mod test_util;
#[cfg(target_arch = "x86_64")]
mod vector;

pub use adaptive::{
    decode_chunk_pairs, decode_method4, encode_method4, encode_method4_runs, encode_method4_shared,
    run_histograms, DecodeTables,
};
pub use ckptfs_format::plane::{AdaptivePayload, CHUNK_GROUP};
pub use model::{histogram, normalize_freqs, normalize_freqs_to};
pub use order0::{
    decode_method3, decode_stream, decode_stream_with, encode_stream, uniform_bits, uniform_table,
    DecodeTable,
};
pub use order1::decode_method5;

/// One full round block of the paired vector decoder
/// ([`decode_chunk_pairs`]): `rows[t][c]` holds symbols `4t..4t + 4` of
/// chunk c, little-endian, so column c holds the chunk's 64 symbols.
pub type StageRows = [[u32; 16]; 16];

/// Where [`decode_chunk_pairs`] hands the symbols of its two planes.
pub trait PairSink {
    /// Symbols of both planes from `offset` (counted from the first
    /// chunk's first symbol); `a` and `b` have equal lengths.
    fn run(&mut self, offset: u64, a: &[u8], b: &[u8]);

    /// A full round block: chunk c (`c < chunks`) has its next 64 symbols
    /// of each plane in column c of `a` and `b`, from `offsets[c]`. Returns
    /// false to have them handed to [`Self::run`] chunk by chunk instead
    /// (the default).
    fn stage(&mut self, offsets: &[u64; 16], chunks: usize, a: &StageRows, b: &StageRows) -> bool {
        let _ = (offsets, chunks, a, b);
        false
    }
}

impl<F: FnMut(u64, &[u8], &[u8])> PairSink for F {
    fn run(&mut self, offset: u64, a: &[u8], b: &[u8]) {
        self(offset, a, b)
    }
}

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

/// Planes at least this large are decoded/encoded in parallel over chunks.
const PAR_MIN_BYTES: usize = 1 << 20;
/// z4ai decodes zstd with `max_window_size = 1 << 27`.
const ZSTD_WINDOW_LOG_MAX: u32 = 27;
/// The order-0 state is at least `RANS_L` before a step, so afterwards it is at
/// least `RANS_L >> PROB_BITS = 2^9`; two renormalisation bytes always suffice.
const _: () = assert!((RANS_L >> PROB_BITS) << 16 >= RANS_L);
const _: () = assert!((RANS_L >> O1_PROB_BITS) << 16 >= RANS_L);

fn rans_err(msg: impl Into<String>) -> CodecError {
    CodecError::Rans(msg.into())
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

fn out_len_is_large(n: u64) -> bool {
    n >= PAR_MIN_BYTES as u64
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::test_util::*;
    use super::*;
    use crate::rans::adaptive::AdaptiveDecode;
    use proptest::prelude::*;

    // ----- every coder -----

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

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

    // ----- real vectors (tests/data/rans, extracted with scripts/extract_rans_planes.py) -----

    #[test]
    fn decodes_z4ai_vector_planes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/rans");
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
}
