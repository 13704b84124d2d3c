//! Test-only helpers shared by the coders' tests: reference encoders for the
//! plane methods ckptfs never writes (3 and 5), deterministic data
//! generators, a checksum.

use super::*;
use proptest::prelude::*;
use std::ops::Range;

pub(super) fn cum_of(freqs: &[u16; 256]) -> [u32; 256] {
    let mut c = [0u32; 256];
    let mut acc = 0;
    for s in 0..256 {
        c[s] = acc;
        acc += u32::from(freqs[s]);
    }
    c
}

// ----- test-only order-1 encoder (method 5 payloads) -----

pub(super) fn o1_segments(cn: usize) -> [Range<usize>; 4] {
    std::array::from_fn(|l| cn * l / 4..cn * (l + 1) / 4)
}

/// Build the sparse order-1 model for `data` cut into `k` chunks.
pub(super) fn o1_model(data: &[u8], k: usize) -> Vec<[u16; 256]> {
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

pub(super) fn o1_serialize(freq: &[[u16; 256]]) -> Vec<u8> {
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

pub(super) fn o1_encode_chunk(c: &[u8], freq: &[[u16; 256]]) -> Vec<u8> {
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
pub(super) fn o1_payload_with(
    data: &[u8],
    k: usize,
    freq: &[[u16; 256]],
    raw_model: &[u8],
) -> Vec<u8> {
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
pub(super) fn o1_encode(data: &[u8], k: usize) -> Vec<u8> {
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

pub(super) fn method3_single(data: &[u8], freqs: &FreqTable) -> Vec<u8> {
    let mut p = (data.len() as u64).to_le_bytes().to_vec();
    for v in freqs {
        p.extend_from_slice(&v.to_le_bytes());
    }
    encode_stream(data, freqs, &mut p);
    p
}

pub(super) fn method3_chunked(data: &[u8], k: usize) -> Vec<u8> {
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

pub(super) fn fnv1a64(b: &[u8]) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(super) fn gauss(&mut self) -> f64 {
        let u1 = ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// bf16 exponent bytes of N(0, 0.02) weights.
pub(super) fn exponent_data(n: usize, seed: u64) -> Vec<u8> {
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

pub(super) fn data_strategy() -> impl Strategy<Value = Vec<u8>> {
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
