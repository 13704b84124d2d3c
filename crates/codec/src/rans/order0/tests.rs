use super::*;
use crate::rans::adaptive::AdaptiveDecode;
use crate::rans::test_util::Rng;
use crate::rans::test_util::*;
use crate::rans::*;
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

// ----- chunk groups (the vector encoder) vs one stream at a time -----

/// A table of one of the shapes the encoders meet: a single symbol,
/// uniform over `0..2^b`, every byte, a few symbols plus freq-1 ones,
/// a coarse (multiples of 4) table, or symbols within 32 values.
fn shaped_table(r: &mut Rng, shape: u64) -> FreqTable {
    let mut h = [0u64; 256];
    match shape % 6 {
        0 => h[(r.next() % 256) as usize] = 1,
        5 => {
            // Symbols within 32 values (the vector encoder's window),
            // as an exponent plane's, sometimes at the top of the byte.
            let lo = if r.next().is_multiple_of(3) {
                224
            } else {
                r.next() % 225
            } as usize;
            for _ in 0..(r.next() % 20 + 1) {
                h[lo + (r.next() % 32) as usize] += r.next() % 100_000 + 1;
            }
        }
        1 => return uniform_table(1 + (r.next() % 8) as u32),
        2 => h.iter_mut().for_each(|v| *v = r.next() % 1000 + 1),
        3 => {
            for _ in 0..(r.next() % 40 + 1) {
                h[(r.next() % 256) as usize] += r.next() % 100_000 + 1;
            }
            h[(r.next() % 256) as usize] += 1 << 40; // forces freq-1 symbols
        }
        _ => {
            for _ in 0..(r.next() % 40 + 1) {
                h[(r.next() % 256) as usize] += r.next() % 1000 + 1;
            }
            let mut c = normalize_freqs_to(&h, PROB_SCALE / 4);
            c.iter_mut().for_each(|f| *f *= 4);
            return c;
        }
    }
    normalize_freqs(&h)
}

/// `n` symbols drawn from table `t` (every one has a non-zero freq):
/// mostly by slot, with every present symbol, freq-1 ones included,
/// also drawn directly now and then.
fn sample(r: &mut Rng, t: &FreqTable, n: usize) -> Vec<u8> {
    let cum = cum_of(t);
    let present: Vec<u8> = (0..256).filter(|&s| t[s] != 0).map(|s| s as u8).collect();
    (0..n)
        .map(|_| {
            if r.next().is_multiple_of(16) {
                return present[(r.next() % present.len() as u64) as usize];
            }
            let slot = (r.next() % u64::from(PROB_SCALE)) as u32;
            (0..256)
                .rev()
                .find(|&s| t[s] != 0 && cum[s] <= slot)
                .unwrap() as u8
        })
        .collect()
}

/// `g` chunks with tables shared as `share` says (0: each its own, 1:
/// runs, 2: one for all) and lengths as `lens` says (0: near-equal, as
/// method 4 cuts them; 1: anything up to `max`).
fn chunk_set(
    seed: u64,
    g: usize,
    max: usize,
    share: u8,
    lens: u8,
) -> (Vec<u8>, Vec<usize>, Vec<FreqTable>) {
    let mut r = Rng(seed);
    let shape = r.next();
    let mut freqs: Vec<FreqTable> = Vec::with_capacity(g);
    for c in 0..g {
        let fresh = match share {
            0 => true,
            1 => c == 0 || r.next().is_multiple_of(4),
            _ => c == 0,
        };
        let t = if fresh {
            let sh = shape + r.next() % 2;
            shaped_table(&mut r, sh)
        } else {
            freqs[c - 1]
        };
        freqs.push(t);
    }
    let base = (r.next() % (max as u64 + 1)) as usize;
    let mut data = Vec::new();
    let mut bounds = vec![0];
    for f in &freqs {
        let n = match lens {
            0 => base + (r.next() % 2) as usize,
            _ => (r.next() % (max as u64 + 1)) as usize,
        };
        data.extend(sample(&mut r, f, n));
        bounds.push(data.len());
    }
    (data, bounds, freqs)
}

fn encode_each(data: &[u8], bounds: &[usize], freqs: &[FreqTable]) -> (Vec<u8>, Vec<usize>) {
    let (mut out, mut lens) = (Vec::new(), Vec::new());
    for (c, f) in freqs.iter().enumerate() {
        let before = out.len();
        encode_stream(&data[bounds[c]..bounds[c + 1]], f, &mut out);
        lens.push(out.len() - before);
    }
    (out, lens)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn chunk_groups_match_one_stream_at_a_time(seed in any::<u64>(), g in prop_oneof![1usize..=16, 1usize..40], max in prop_oneof![0usize..12, 0usize..300, 0usize..5000], share in 0u8..3, lens in 0u8..2) {
        let (data, bounds, freqs) = chunk_set(seed, g, max, share, lens);
        let (want, want_lens) = encode_each(&data, &bounds, &freqs);
        let mut scratch = vec![0x5A; 7]; // reused, dirty
        let (mut got, mut got_lens) = (vec![0xEE], Vec::new());
        encode_chunks(&data, &bounds, &freqs, &mut scratch, &mut got, &mut got_lens);
        prop_assert_eq!(got[0], 0xEE); // appends
        prop_assert_eq!(&got[1..], &want[..]);
        prop_assert_eq!(&got_lens, &want_lens);
        // and each stream decodes back to its chunk
        let mut at = 1;
        for (c, &l) in got_lens.iter().enumerate() {
            let chunk = &data[bounds[c]..bounds[c + 1]];
            let mut o = vec![0u8; chunk.len()];
            decode_stream(&got[at..at + l], &freqs[c], &mut o).unwrap();
            prop_assert_eq!(&o[..], chunk);
            at += l;
        }
    }
}

#[test]
fn the_vector_encoder_takes_full_groups_and_matches_scalar() {
    #[cfg(target_arch = "x86_64")]
    for (seed, share, lens) in [(1u64, 0u8, 0u8), (2, 1, 1), (3, 2, 0), (4, 2, 1)] {
        let (data, bounds, freqs) = chunk_set(seed, 16, 3000, share, lens);
        if bounds.windows(2).any(|w| w[1] - w[0] < 4) {
            continue;
        }
        let mut owner = [0usize; ENC_GROUP];
        let mut tabs = Vec::new();
        for c in 0..16 {
            if c > 0 && freqs[c] == freqs[c - 1] {
                owner[c] = owner[c - 1];
            } else {
                tabs.push(EncTable::new(&freqs[c]));
                owner[c] = tabs.len() - 1;
            }
        }
        let mut ends = [0usize; ENC_GROUP];
        let mut total = 0;
        for c in 0..16 {
            total += 2 * (bounds[c + 1] - bounds[c]) + 4;
            ends[c] = total;
        }
        // and the idle room `encode_group` leaves past the regions
        let longest = bounds.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        let mut scratch = vec![0u8; total + 2 * longest + 4];
        let mut states = [[RANS_L; 4]; ENC_GROUP];
        let mut pos = ends;
        let ran = encode_group_vector(
            &data,
            &bounds,
            &freqs,
            &tabs,
            &owner,
            &mut scratch,
            &mut states,
            &mut pos,
        );
        assert_eq!(ran, vector_encoder(), "seed {seed}");
        if !ran {
            continue;
        }
        let (want, _) = encode_each(&data, &bounds, &freqs);
        let mut got = Vec::new();
        for c in 0..16 {
            for v in states[c] {
                got.extend_from_slice(&v.to_le_bytes());
            }
            got.extend_from_slice(&scratch[pos[c]..ends[c]]);
        }
        assert_eq!(got, want, "seed {seed}");
    }
}

/// `data` as 16 chunks of 100 symbols, every chunk with table `f`.
fn encode_16_chunks_of_100(data: &[u8], f: FreqTable) {
    let bounds: Vec<usize> = (0..=16).map(|c| c * 100).collect();
    encode_chunks(
        data,
        &bounds,
        &[f; 16],
        &mut Vec::new(),
        &mut Vec::new(),
        &mut Vec::new(),
    );
}

#[test]
#[should_panic(expected = "frequency 0")]
fn chunk_groups_panic_on_zero_freq_symbol() {
    let f = normalize_freqs(&{
        let mut h = [0u64; 256];
        h[1] = 3;
        h[2] = 1;
        h
    });
    let mut data = vec![1u8; 16 * 100];
    data[5] = 3; // early: inside the vector part
    encode_16_chunks_of_100(&data, f);
}

#[test]
fn window_chunk_groups_panic_on_symbols_either_side_of_the_window() {
    let mut h = [0u64; 256];
    h[100..110].fill(5);
    let f = normalize_freqs(&h);
    for bad in [99u8, 110, 131, 200, 0] {
        let mut data: Vec<u8> = (0..16 * 100).map(|i| 100 + (i % 10) as u8).collect();
        data[300] = bad;
        let r = std::panic::catch_unwind(|| encode_16_chunks_of_100(&data, f));
        assert!(r.is_err(), "symbol {bad} outside the table");
    }
}

#[test]
#[should_panic(expected = "frequency 0")]
fn uniform_chunk_groups_panic_on_a_symbol_above_the_table() {
    let f = uniform_table(3);
    let mut data = vec![7u8; 16 * 100];
    data[700] = 8;
    encode_16_chunks_of_100(&data, f);
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
