//! Tests of plane method 4 (kept beside `adaptive.rs` to keep both files
//! short): round trips, multi-chunk decoding against the one-chunk decoder,
//! and malformed payloads.

use super::*;
use crate::rans::test_util::Rng;
use crate::rans::test_util::*;
use crate::rans::*;
use proptest::prelude::*;
use std::ops::Range;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

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
}

// ----- multi-chunk decoding (decode_chunks) vs the one-chunk decoder -----

/// Decode chunks `js` one at a time with `decode_stream_with` (the
/// reference): `Err` if any chunk errs.
fn per_chunk_decode(ap: &AdaptivePayload, js: Range<usize>, t: &DecodeTables) -> Result<Vec<u8>> {
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
        // Both kinds of AVX2 gather, whichever this CPU would use.
        for soft in gather_kinds() {
            let _kind = ForceGathers::new(soft);
            let mut got = vec![0u8; len];
            let r = ap.decode_chunks(js.clone(), &t, &mut got);
            // tables for exactly this range work too
            let tj = DecodeTables::for_chunks(&freqs, js.clone()).unwrap();
            let mut got2 = vec![0u8; len];
            let r2 = ap.decode_chunks(js.clone(), &tj, &mut got2);
            match &want {
                Ok(w) => {
                    prop_assert!(r.is_ok(), "{js:?} (soft gathers: {soft:?}): {r:?}");
                    prop_assert_eq!(&got, w, "{:?} (soft gathers: {:?})", js, soft);
                    prop_assert!(r2.is_ok());
                    prop_assert_eq!(&got2, w);
                }
                Err(e) => {
                    prop_assert_eq!(r, Err(e.clone()), "{:?}", js);
                    prop_assert_eq!(r2, Err(e.clone()));
                }
            }
        }
    }
    Ok(())
}

/// The kinds of gather the AVX2 kernel is tested with (`None`: the CPU's).
fn gather_kinds() -> Vec<Option<bool>> {
    if cfg!(target_arch = "x86_64") {
        vec![Some(false), Some(true)]
    } else {
        vec![None]
    }
}

/// Makes this thread's AVX2 decoder use hardware gathers (`Some(false)`)
/// or scalar loads (`Some(true)`) until dropped.
struct ForceGathers;

impl ForceGathers {
    fn new(soft: Option<bool>) -> Self {
        #[cfg(target_arch = "x86_64")]
        crate::rans::avx2::FORCE_SOFT.with(|f| f.set(soft));
        let _ = soft;
        ForceGathers
    }
}

impl Drop for ForceGathers {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        crate::rans::avx2::FORCE_SOFT.with(|f| f.set(None));
    }
}

/// `n` bytes, each non-zero (1..=4) with probability `per_mille` / 1000.
fn sparse_data(n: usize, per_mille: u64, r: &mut Rng) -> Vec<u8> {
    (0..n)
        .map(|_| {
            let v = r.next();
            if v % 1000 < per_mille {
                1 + (v >> 32) as u8 % 4
            } else {
                0
            }
        })
        .collect()
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

/// `d` in chunks of `chunk` symbols, decoded whole by `decode_chunks`, then
/// checked group by group against the scalar decoder.
fn whole_plane_round_trip(d: &[u8], chunk: usize, what: &str) {
    let k = d.len().div_ceil(chunk);
    let p = encode_method4(d, k);
    let ap = AdaptivePayload::parse(&p).unwrap();
    let t = DecodeTables::new(&ap.freq_tables().unwrap()).unwrap();
    let mut out = vec![0u8; d.len()];
    ap.decode_chunks(0..k, &t, &mut out).unwrap();
    assert!(out == d, "{what}");
    check_decode_chunks(&p).unwrap();
}

#[test]
fn decode_chunks_large_planes() {
    for (seed, n, chunk) in [
        (1u64, 1 << 20, 1 << 14),
        (2, 3_000_017, 1 << 16),
        (3, 700_001, 999),
    ] {
        whole_plane_round_trip(&exponent_data(n, seed), chunk, &format!("n={n}"));
    }
    // Mostly zeros (XOR high bytes), in chunks of 16 Ki and 64 Ki symbols:
    // the zero path, where rounds without a renormalisation skip the
    // window gathers.
    for (seed, per_mille, chunk) in [
        (5u64, 8u64, 1usize << 14),
        (6, 2, 1 << 16),
        (7, 45, 1 << 14),
    ] {
        let d = sparse_data(1 << 21, per_mille, &mut Rng(seed));
        whole_plane_round_trip(&d, chunk, &format!("{per_mille} per mille"));
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
    fn decode_chunks_matches_scalar(data in data_strategy(), big in (any::<u64>(), 0usize..60_000, 0u8..4), k in prop_oneof![1usize..20, 1usize..300]) {
        let (seed, n, kind) = big;
        let mut r = Rng(seed);
        let d: Vec<u8> = match kind {
            0 => exponent_data(n, seed),
            1 => (0..n).map(|_| (r.next() % 7) as u8 * 30).collect(),
            // Mostly zeros (the high bytes of an XOR delta): the AVX-512
            // kernel's zero path, at densities around its threshold.
            2 => sparse_data(n, [1, 8, 30, 60][(seed % 4) as usize], &mut r),
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
        let tables: Vec<FreqTable> = (0..k)
            .map(|_| {
                let t = random_table(&mut r);
                // A quarter of the cases each: coarse tables (the
                // one-gather SIMD path); uniform tables (no table gather);
                // tables where symbol 0 has 95% or more (the zero path).
                if seed % 4 == 3 {
                    let mut h: [u64; 256] = std::array::from_fn(|i| u64::from(t[i]));
                    h[0] = h.iter().sum::<u64>() * (20 + seed / 4 % 2000);
                    normalize_freqs(&h)
                } else if seed % 4 == 2 {
                    uniform_table(1 + (seed / 4 % 8) as u32)
                } else if seed % 4 == 0 {
                    let h: [u64; 256] = std::array::from_fn(|i| u64::from(t[i]));
                    let mut c = crate::rans::normalize_freqs_to(&h, 4096);
                    c.iter_mut().for_each(|f| *f *= 4);
                    c
                } else {
                    t
                }
            })
            .collect();
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
    fn uniform_tables_round_trip_and_match_scalar(seed in any::<u64>(), bits in 1u32..=8, n in 0usize..60_000, k in prop_oneof![1usize..20, 1usize..100]) {
        let mut r = Rng(seed);
        let d: Vec<u8> = (0..n).map(|_| (r.next() % (1 << bits)) as u8).collect();
        let p = encode_method4_uniform(&d, k, bits);
        let ap = AdaptivePayload::parse(&p).unwrap();
        prop_assert!(ap.freq_tables().unwrap().iter().all(|t| crate::rans::uniform_bits(t) == Some(bits)));
        // exactly `bits` bits a symbol, plus 16 seed bytes a chunk at most
        let body: usize = (0..ap.chunks()).map(|j| ap.chunk_payload(j).len()).sum();
        prop_assert!(body <= (n * bits as usize).div_ceil(8) + 16 * ap.chunks() + 4, "{body}");
        if !d.is_empty() {
            check_decode_chunks(&p)?;
        }
        let mut out = vec![0u8; n];
        decode_method4(&p, &mut out).unwrap();
        prop_assert_eq!(out, d);
    }

    #[test]
    fn decode_chunks_truncated_streams_match_scalar(seed in any::<u64>(), n in 1000usize..50_000, k in 7usize..40, cut in 0usize..40) {
        // Valid streams cut short: the decoder reads zeros past each end.
        let d = if seed % 2 == 0 {
            exponent_data(n, seed)
        } else {
            sparse_data(n, 1 + seed / 2 % 40, &mut Rng(seed))
        };
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
fn the_encoder_writes_coarse_tables_where_they_cost_under_a_thousandth() {
    // Exponent-like data: coarse tables, decoded by the one-gather path.
    let d = exponent_data(200_000, 9);
    let p = encode_method4(&d, 16);
    let ap = AdaptivePayload::parse(&p).unwrap();
    let t = DecodeTables::new(&ap.freq_tables().unwrap()).unwrap();
    assert!(t.t.iter().all(DecodeTable::is_coarse));
    let mut out = vec![0u8; d.len()];
    decode_method4(&p, &mut out).unwrap();
    assert_eq!(out, d);
    // Many rare symbols of uneven counts beside a dominant one lose more
    // than that at 1/4096 granularity: the fine table is kept.
    let h: [u64; 256] = std::array::from_fn(|i| {
        if i == 0 {
            900_000
        } else {
            300 + (i as u64 * 7919) % 200
        }
    });
    let f = super::chunk_freqs(&h);
    assert!(f.iter().any(|&v| v % 4 != 0));
    assert_eq!(f.iter().map(|&v| u32::from(v)).sum::<u32>(), PROB_SCALE);
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

// ----- malformed input -----

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

// ----- two planes decoded in lock step (decode_chunk_pairs) -----

/// Decodes chunk ranges of `pa` and `pb` together and checks what the sink
/// receives against each plane decoded one chunk at a time. Returns
/// whether the paired decoder took every range of 7 chunks or more (fewer
/// go to the scalar decoder).
fn check_chunk_pairs(pa: &[u8], pb: &[u8]) -> std::result::Result<bool, TestCaseError> {
    let (a, b) = (
        AdaptivePayload::parse(pa).unwrap(),
        AdaptivePayload::parse(pb).unwrap(),
    );
    let ta = DecodeTables::new(&a.freq_tables().unwrap()).unwrap();
    let tb = DecodeTables::new(&b.freq_tables().unwrap()).unwrap();
    let k = a.chunks();
    let mut all = true;
    for js in [0..k, 0..k.min(16), k / 2..k] {
        if js.is_empty() {
            continue;
        }
        let lo = a.chunk_bounds(js.start).start as usize;
        let len = a.chunk_bounds(js.end - 1).end as usize - lo;
        let (mut ga, mut gb) = (vec![0xA5u8; len], vec![0x5Au8; len]);
        let mut scratch = Vec::new();
        let took = decode_chunk_pairs(
            (&a, &ta),
            (&b, &tb),
            js.clone(),
            &mut scratch,
            |o: u64, x: &[u8], y: &[u8]| {
                let o = o as usize;
                assert_eq!(x.len(), y.len());
                ga[o..o + x.len()].copy_from_slice(x);
                gb[o..o + y.len()].copy_from_slice(y);
            },
        )
        .unwrap();
        all &= took || js.len() < 7;
        if took {
            let ra = per_chunk_decode(&a, js.clone(), &ta);
            let rb = per_chunk_decode(&b, js.clone(), &tb);
            prop_assert_eq!(&ga, ra.as_ref().unwrap(), "plane a, chunks {:?}", js);
            prop_assert_eq!(&gb, rb.as_ref().unwrap(), "plane b, chunks {:?}", js);
        }
    }
    Ok(all)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]

    #[test]
    fn chunk_pairs_match_each_plane_decoded_alone(seed in any::<u64>(), n in 3000usize..60_000, k in 7usize..40, cut in 0usize..40, damage in 0u8..3) {
        // An exponent-like plane and a uniform 7-bit plane, as the bf16
        // bit-field planes are written.
        let e = exponent_data(n, seed);
        let mut r = Rng(seed ^ 5);
        let m: Vec<u8> = (0..n).map(|_| (r.next() % 128) as u8).collect();
        let (pe, pm) = (encode_method4_shared(&e, k, 16), encode_method4_uniform(&m, k, 7));
        if damage == 0 {
            // Valid planes take the paired path, where the CPU has it; it
            // declines elsewhere (each plane is then decoded alone).
            prop_assert_eq!(
                check_chunk_pairs(&pe, &pm)?,
                crate::rans::vector::available(),
                "valid planes take the paired path exactly where the CPU has it"
            );
            return Ok(());
        }
        // One plane's streams cut short, or overwritten with garbage: the
        // pairs still equal each plane's own decoder.
        let victim = if damage == 1 { &pe } else { &pm };
        let ap = AdaptivePayload::parse(victim).unwrap();
        let tables = ap.freq_tables().unwrap();
        let streams: Vec<Vec<u8>> = (0..k)
            .map(|j| {
                let mut s = ap.chunk_payload(j).to_vec();
                match r.next() % 3 {
                    0 => s.truncate(s.len() - cut.min(s.len() - 16)),
                    1 => s[16..].iter_mut().for_each(|b| *b = r.next() as u8),
                    _ => {}
                }
                s
            })
            .collect();
        let bad = method4_payload(n as u64, &tables, &streams);
        if damage == 1 {
            check_chunk_pairs(&bad, &pm)?;
        } else {
            check_chunk_pairs(&pe, &bad)?;
        }
    }
}
