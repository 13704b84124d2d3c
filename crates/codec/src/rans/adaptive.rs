//! Plane method 4, the adaptive order-0 coder (spec §4.4): `k` chunks, each an
//! order-0 stream with its own table, the `k` tables packed into one zstd
//! frame. The payload's layout ([`AdaptivePayload`]: parsing, chunk bounds
//! and bytes) is in `format::plane`; this file decodes it: the tables
//! ([`AdaptivePayload::freq_tables`]), one chunk, or a run of chunks together
//! ([`AdaptivePayload::decode_chunks`], AVX-512 groups when available);
//! [`decode_method4`] and [`encode_method4`] handle whole planes.
//!
//! Invariants: nothing is decoded before `AdaptivePayload::parse` has checked
//! the header and that every chunk lies inside the payload; chunk `j` always
//! covers symbols `[j*n/k, (j+1)*n/k)`; the SIMD and scalar decoders give the
//! same output and the same errors.

use super::order0::{encode_chunks, ENC_GROUP};
#[cfg(target_arch = "x86_64")]
use super::vector;
use super::{
    check_table_sum, chunk_range, decode_stream_with, histogram, length_mismatch, normalize_freqs,
    normalize_freqs_to, out_len_is_large, rans_err, read_freq_table, zstd_decode_first_frame,
    DecodeTable, FreqTable, PAR_MIN_BYTES, PROB_SCALE,
};
use crate::{CodecError, Result};
use ckptfs_format::plane::{AdaptivePayload, ADAPT_FLAG, CHUNK_GROUP};
use rayon::prelude::*;
use std::ops::Range;

// ---------------------------------------------------------------------------
// Method 4
// ---------------------------------------------------------------------------

/// Decoding of an adaptive rANS payload.
pub trait AdaptiveDecode {
    fn freq_tables(&self) -> Result<Vec<FreqTable>>;
    fn decode_chunk(&self, j: usize, table: &FreqTable, out: &mut [u8]) -> Result<()>;
    fn decode_chunk_with(&self, j: usize, table: &DecodeTable, out: &mut [u8]) -> Result<()>;
}

impl AdaptiveDecode for AdaptivePayload<'_> {
    /// Decode the k frequency tables (the blob must decode to exactly k*512
    /// bytes, which bounds the output) and check that each sums to 16384.
    fn freq_tables(&self) -> Result<Vec<FreqTable>> {
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
    fn decode_chunk(&self, j: usize, table: &FreqTable, out: &mut [u8]) -> Result<()> {
        let t = DecodeTable::new(table)?;
        self.decode_chunk_with(j, &t, out)
    }

    /// [`Self::decode_chunk`] with prebuilt (reusable) tables.
    fn decode_chunk_with(&self, j: usize, table: &DecodeTable, out: &mut [u8]) -> Result<()> {
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
/// (33 KiB each), for [`AdaptivePayload::decode_chunks`]. Build once per
/// payload (or per block of chunks) and reuse. A chunk whose table equals
/// the previous chunk's shares its built table (`owner`), so a block whose
/// chunks share one table (ckptfs's encoder) costs one build, and its
/// decoder reads one table.
#[derive(Clone, Default)]
pub struct DecodeTables {
    pub(super) first: usize,
    pub(super) t: Vec<DecodeTable>,
    /// For each covered chunk, the index in `t` of its built table.
    pub(super) owner: Vec<usize>,
}

impl DecodeTables {
    /// Tables for all chunks; `freqs` are the k tables of the payload
    /// ([`AdaptivePayload::freq_tables`]). Errors if one does not sum to 16384.
    pub fn new(freqs: &[FreqTable]) -> Result<Self> {
        Self::for_chunks(freqs, 0..freqs.len())
    }

    /// Tables for chunks `js` only (`freqs` are all k tables).
    pub fn for_chunks(freqs: &[FreqTable], js: Range<usize>) -> Result<Self> {
        let mut t = DecodeTables::default();
        t.rebuild(freqs, js)?;
        Ok(t)
    }

    /// Rebuild in place for chunks `js`, reusing the allocation (a table
    /// slot rebuilt for the frequencies it already holds costs nothing).
    pub fn rebuild(&mut self, freqs: &[FreqTable], js: Range<usize>) -> Result<()> {
        let f = freqs.get(js.clone()).ok_or_else(|| {
            CodecError::invalid(
                "method-4 decode tables",
                format!("chunks {js:?} of {}", freqs.len()),
            )
        })?;
        self.first = js.start;
        self.owner.clear();
        self.t.truncate(f.len());
        for (i, fi) in f.iter().enumerate() {
            if i > 0 && *fi == f[i - 1] {
                let o = self.owner[i - 1];
                self.owner.push(o);
                continue;
            }
            // Slots of chunks that share an earlier table stay unbuilt.
            while self.t.len() <= i {
                self.t.push(DecodeTable::empty());
            }
            if let Err(e) = self.t[i].rebuild(fi) {
                self.owner.clear();
                return Err(e);
            }
            self.owner.push(i);
        }
        Ok(())
    }

    /// The chunk indices these tables cover.
    pub fn chunks(&self) -> Range<usize> {
        self.first..self.first + self.owner.len()
    }

    /// The table of chunk `j`, if covered.
    pub fn get(&self, j: usize) -> Option<&DecodeTable> {
        let o = *self.owner.get(j.checked_sub(self.first)?)?;
        self.t.get(o)
    }
}

/// Range and table decoding of an adaptive rANS payload.
pub trait AdaptiveDecodeMore {
    fn span(&self, js: &Range<usize>) -> Range<u64>;
    fn decode_chunks(&self, js: Range<usize>, tables: &DecodeTables, out: &mut [u8]) -> Result<()>;
    fn decode_group(&self, js: Range<usize>, tables: &DecodeTables, out: &mut [u8]) -> Result<()>;
}

impl AdaptiveDecodeMore for AdaptivePayload<'_> {
    /// Symbol range of the consecutive chunks `js` (non-empty, in range).
    fn span(&self, js: &Range<usize>) -> Range<u64> {
        chunk_range(self.n, self.k, js.start).start..chunk_range(self.n, self.k, js.end - 1).end
    }

    /// Decode the consecutive chunks `js` into `out`, whose length must be the
    /// sum of their lengths. `tables` must cover `js`. Groups of up to
    /// [`CHUNK_GROUP`] chunks are decoded together (AVX-512 when available,
    /// one chunk per vector lane), so ranges of 16 chunks or more are fastest.
    /// Output and errors equal [`Self::decode_chunk`] for every chunk.
    fn decode_chunks(&self, js: Range<usize>, tables: &DecodeTables, out: &mut [u8]) -> Result<()> {
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
        let mut rest = out;
        for g in chunk_groups(&js) {
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
        if js.len() >= vector::MIN_CHUNKS && vector::available() {
            // One 16-lane vector per group (two interleaved vectors, NV = 2,
            // measured slower: the kernel is gather-throughput bound).
            if vector::try_decode_group::<1>(self, js.clone(), tables, out) {
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

/// `js` cut into near-equal groups of at most [`CHUNK_GROUP`] chunks, the
/// units the vector decoder takes (20 chunks: 10 + 10).
fn chunk_groups(js: &Range<usize>) -> impl Iterator<Item = Range<usize>> + '_ {
    let m = js.len().div_ceil(CHUNK_GROUP);
    (0..m).map(move |i| js.start + js.len() * i / m..js.start + js.len() * (i + 1) / m)
}

/// Decodes chunks `js` of two method-4 payloads with the same chunking
/// (the exponent and mantissa planes of a bit-field frame) together, with
/// AVX-512, handing the symbols of both to `sink(offset, a, b)`: `offset`
/// counts symbols from the first of `js`, the slices have equal lengths,
/// and together the calls cover every symbol of `js` (a chunk with a
/// damaged stream is handed again whole; its last call wins), full round
/// blocks through [`super::PairSink::stage`] where the sink takes them. Neither
/// plane is written out, so a joined output is made straight from the
/// decoder's registers' spill, in cache.
///
/// Returns `Ok(false)` when this does not apply (no AVX-512, different
/// chunking, chunks unsuited to the vector decoder): `sink` may have been
/// called for some symbols, and the caller decodes the planes one by one
/// instead. `scratch` is reused for chunk tails.
pub fn decode_chunk_pairs(
    a: (&AdaptivePayload<'_>, &DecodeTables),
    b: (&AdaptivePayload<'_>, &DecodeTables),
    js: Range<usize>,
    scratch: &mut Vec<u8>,
    mut sink: impl super::PairSink,
) -> Result<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        if a.0.n != b.0.n || a.0.k != b.0.k || js.is_empty() || !vector::available() {
            return Ok(false);
        }
        for (p, t) in [a, b] {
            let tc = t.chunks();
            if js.end > p.k || tc.start > js.start || tc.end < js.end {
                return Err(CodecError::invalid(
                    "method-4 decode tables",
                    format!("cover chunks {tc:?} of {}, not {js:?}", p.k),
                ));
            }
        }
        let lo = a.0.span(&js).start;
        for g in chunk_groups(&js) {
            if g.len() < vector::MIN_CHUNKS {
                return Ok(false);
            }
            let at = a.0.span(&g).start - lo;
            let ok = vector::try_decode_pair(a, b, g, scratch, at, &mut sink);
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (a, b, js, scratch, &mut sink);
        Ok(false)
    }
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

/// Method-4 encode with `k` chunks (chunk j = symbols `[j*n/k, (j+1)*n/k)`),
/// each with its own table ([`chunk_freqs`]); the tables go into ONE zstd
/// frame (level 3, content size present). `k == 0` is treated as 1. An empty
/// input gives the 8 bytes `u64 0`, which is what z4ai writes and accepts.
/// Parallel over chunks for inputs of at least 1 MiB.
///
/// # Panics
/// If `k` does not fit in a u32.
pub fn encode_method4(data: &[u8], k: usize) -> Vec<u8> {
    encode_method4_with(data, k, |_, c| chunk_freqs(&histogram(c)))
}

/// [`encode_method4`] where each run of `group` consecutive chunks (the
/// last run shorter) shares one table, [`chunk_freqs`] of the run's
/// histogram, stored once per chunk as the format requires (the repeats
/// cost almost nothing in the zstd-packed table blob). With `group` the
/// chunks of one block, the decoder builds one table per block instead of
/// one per chunk, and its SIMD lanes all read that one table (16 KiB, in
/// L1) instead of 16 (in L2). On weights the exponent distribution is
/// stationary over a block, so the ratio moves by under 0.01%.
///
/// # Panics
/// If `k` does not fit in a u32.
pub fn encode_method4_shared(data: &[u8], k: usize, group: usize) -> Vec<u8> {
    encode_method4_runs(data, k, group, &run_histograms(data, k, group))
}

/// The byte histograms of the runs of `group` consecutive chunks (of `k`)
/// that [`encode_method4_shared`] gives one table each; parallel for
/// inputs of at least 1 MiB. A caller that also wants the whole plane's
/// histogram sums these instead of counting the plane twice.
pub fn run_histograms(data: &[u8], k: usize, group: usize) -> Vec<[u64; 256]> {
    let (n, k, group) = (data.len() as u64, k.max(1), group.max(1));
    let runs = k.div_ceil(group);
    let run = |r: usize| {
        let a = chunk_range(n, k, r * group).start as usize;
        let b = chunk_range(n, k, ((r + 1) * group).min(k) - 1).end as usize;
        histogram(&data[a..b])
    };
    if data.len() >= PAR_MIN_BYTES && runs > 1 {
        (0..runs).into_par_iter().map(run).collect()
    } else {
        (0..runs).map(run).collect()
    }
}

/// [`encode_method4_shared`] with the runs' histograms already counted
/// ([`run_histograms`] of the same `data`, `k` and `group`).
///
/// # Panics
/// If `k` does not fit in a u32, or `hists` is not one histogram per run.
pub fn encode_method4_runs(data: &[u8], k: usize, group: usize, hists: &[[u64; 256]]) -> Vec<u8> {
    let (k, group) = (k.max(1), group.max(1));
    assert_eq!(
        hists.len(),
        k.div_ceil(group),
        "encode_method4_runs: one histogram per run"
    );
    let tables: Vec<FreqTable> = if data.len() >= PAR_MIN_BYTES && hists.len() > 1 {
        hists.par_iter().map(chunk_freqs).collect()
    } else {
        hists.iter().map(chunk_freqs).collect()
    };
    encode_method4_with(data, k, |j, _| tables[j / group])
}

/// [`encode_method4`] with every chunk coded with the uniform table over
/// `0..2^bits` ([`super::uniform_bits`]): `bits` bits per symbol exactly,
/// and a decoder that needs no table lookup. ckptfs wrote bf16 mantissas
/// this way until 2026-11-28 (zstd blocks since, see `pack::tensor`); the
/// decoder keeps reading such archives, and tests write them with this.
///
/// # Panics
/// If a symbol is `>= 2^bits`, `bits` is not in `1..=8`, or `k` does not fit
/// in a u32.
#[cfg(test)]
pub fn encode_method4_uniform(data: &[u8], k: usize, bits: u32) -> Vec<u8> {
    let t = super::uniform_table(bits);
    // An OR over the plane (vectorised) rather than `all`, whose early exit
    // kept it scalar: this check cost a fifth of encoding the plane.
    assert!(
        u32::from(data.iter().fold(0u8, |a, &v| a | v)) >> bits == 0,
        "encode_method4_uniform: a symbol above {bits} bits"
    );
    encode_method4_with(data, k, |_, _| t)
}

fn encode_method4_with(
    data: &[u8],
    k: usize,
    table: impl Fn(usize, &[u8]) -> FreqTable + Sync,
) -> Vec<u8> {
    let n = data.len();
    if n == 0 {
        return 0u64.to_le_bytes().to_vec();
    }
    let k = k.max(1);
    assert!(
        k <= u32::MAX as usize,
        "encode_method4: k = {k} does not fit in u32"
    );
    let bounds: Vec<usize> = (0..k)
        .map(|j| chunk_range(n as u64, k, j).start as usize)
        .chain([n])
        .collect();
    let chunk = |j: usize| &data[bounds[j]..bounds[j + 1]];
    let par = n >= PAR_MIN_BYTES && k > 1;
    let freqs: Vec<FreqTable> = if par {
        (0..k).into_par_iter().map(|j| table(j, chunk(j))).collect()
    } else {
        (0..k).map(|j| table(j, chunk(j))).collect()
    };
    let mut raw = Vec::with_capacity(k * 512);
    for t in &freqs {
        for v in t {
            raw.extend_from_slice(&v.to_le_bytes());
        }
    }
    // The thread's zstd context: `zstd::bulk` made a new one per plane
    // (`ZSTD_createCCtx` alone was 1% of a delta pack's profile).
    let blob = crate::zstd::compress(&raw, 3);
    let head = 16 + 4 * k + blob.len();
    // Chunks are encoded in groups (the vector encoder's unit), in
    // parallel for large planes; one group's streams are appended straight
    // to the payload.
    let groups = k.div_ceil(ENC_GROUP);
    let group = |g: usize| g * ENC_GROUP..((g + 1) * ENC_GROUP).min(k);
    let mut out;
    let mut lens = Vec::with_capacity(k);
    if par && groups > 1 {
        let parts: Vec<(Vec<u8>, Vec<usize>)> = (0..groups)
            .into_par_iter()
            .map_init(Vec::new, |scratch, g| {
                let r = group(g);
                let (mut s, mut l) = (Vec::new(), Vec::with_capacity(r.len()));
                encode_chunks(
                    data,
                    &bounds[r.start..=r.end],
                    &freqs[r],
                    scratch,
                    &mut s,
                    &mut l,
                );
                (s, l)
            })
            .collect();
        let body: usize = parts.iter().map(|(s, _)| s.len()).sum();
        out = Vec::with_capacity(head + body);
        out.resize(head, 0);
        for (s, l) in &parts {
            out.extend_from_slice(s);
            lens.extend_from_slice(l);
        }
    } else {
        out = Vec::with_capacity(head + n + n / 8);
        out.resize(head, 0);
        let mut scratch = Vec::new();
        encode_chunks(data, &bounds, &freqs, &mut scratch, &mut out, &mut lens);
    }
    out[..8].copy_from_slice(&(n as u64 | ADAPT_FLAG).to_le_bytes());
    out[8..12].copy_from_slice(&(k as u32).to_le_bytes());
    out[12..16].copy_from_slice(&(blob.len() as u32).to_le_bytes());
    for (d, &l) in out[16..16 + 4 * k].chunks_exact_mut(4).zip(&lens) {
        d.copy_from_slice(&(l as u32).to_le_bytes());
    }
    out[16 + 4 * k..head].copy_from_slice(&blob);
    out
}

/// The frequency table of one chunk: normalised to 4096 and scaled by 4
/// (a coarse table, which the AVX-512 decoder reads with one gather per
/// symbol instead of two) when that costs at most 0.1% more coded bits
/// than the optimal 16384-sum table, else the optimal one. Both are
/// ordinary method-4 tables (sum 16384): z4ai reads either.
pub fn chunk_freqs(hist: &[u64; 256]) -> FreqTable {
    let fine = normalize_freqs(hist);
    let mut coarse = normalize_freqs_to(hist, PROB_SCALE / 4);
    for f in &mut coarse {
        *f *= 4;
    }
    let bits = |t: &FreqTable| -> f64 {
        hist.iter()
            .zip(t)
            .filter(|(&h, _)| h > 0)
            .map(|(&h, &f)| h as f64 * (f64::from(PROB_SCALE) / f64::from(f)).log2())
            .sum()
    };
    if bits(&coarse) <= bits(&fine) * 1.001 {
        coarse
    } else {
        fine
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
#[path = "adaptive_tests.rs"]
mod tests;
