//! Throughput of the rANS coders (`codec::rans`), in MB/s of decoded symbols,
//! median of 5 runs.
//!
//!     cargo run --release --example rans_bench [-- MIB]
//!
//! Data: "exponent" = bf16 exponent bytes `(bits >> 7) & 0xFF` of N(0, 0.02)
//! weights (about 2.6 bits/symbol); "mantissa" = uniform over 0..128 (7 bits).
//! "1 thread" runs inside a one-thread rayon pool; "all threads" uses the
//! global pool (method 4/5 parallelise over chunks for planes >= 1 MiB).

use ckptfs::codec::rans::adaptive::AdaptiveDecode;
use ckptfs::codec::rans::adaptive::AdaptiveDecodeMore;
use ckptfs::codec::rans::{
    decode_method4, decode_method5, decode_stream, decode_stream_with, encode_method4,
    encode_stream, histogram, normalize_freqs, normalize_freqs_to, AdaptivePayload, DecodeTables,
    FreqTable, O1_PROB_BITS, O1_SCALE, RANS_L,
};
use std::time::Instant;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Box-Muller.
    fn gauss(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // (0, 1]
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// f32 -> bf16 bits, round to nearest even.
fn bf16_bits(f: f32) -> u16 {
    let b = f.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

fn exponent_data(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..n)
        .map(|_| ((bf16_bits((r.gauss() * 0.02) as f32) >> 7) & 0xFF) as u8)
        .collect()
}

/// The high byte of a bf16 training step's XOR: 99.2% zeros, the rest
/// spread over a few low values.
fn sparse_xor_data(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..n)
        .map(|_| {
            let v = r.next();
            if v % 1000 < 8 {
                1 + ((v >> 20) % 4) as u8
            } else {
                0
            }
        })
        .collect()
}

fn mantissa_data(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..n).map(|_| (r.next() % 128) as u8).collect()
}

/// Median seconds of 5 runs of `f`.
fn median_secs(mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[2]
}

/// CPU time of the calling thread, in seconds (the machine is shared).
fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Median thread-CPU seconds of 7 single-threaded runs of `f`.
fn median_cpu_secs(mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    let mut t: Vec<f64> = (0..7)
        .map(|_| {
            let s = thread_cpu_secs();
            f();
            thread_cpu_secs() - s
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[3]
}

/// Old (one chunk at a time, `decode_stream_with`) vs new
/// (`AdaptivePayload::decode_chunks`) method-4 chunk decoding, single thread,
/// thread CPU time, tables built beforehand (they are cached per payload).
fn bench_chunks(what: &str, data: &[u8]) {
    let n = data.len();
    println!(
        "\n== method-4 chunk decode, {} MiB {what} plane ({:.3} bits/symbol entropy), 1 thread, CPU time, median of 7",
        n >> 20,
        entropy_bits(data)
    );
    for chunk in [1usize << 14, 1 << 16, 1 << 17] {
        let k = n.div_ceil(chunk);
        let payload = encode_method4(data, k);
        let ap = AdaptivePayload::parse(&payload).unwrap();
        let tables = DecodeTables::new(&ap.freq_tables().unwrap()).unwrap();
        let mut out = vec![0u8; n];
        let t_old = median_cpu_secs(|| {
            for j in 0..k {
                let r = ap.chunk_bounds(j);
                let o = &mut out[r.start as usize..r.end as usize];
                decode_stream_with(tables.get(j).unwrap(), ap.chunk_payload(j), o).unwrap();
            }
        });
        assert_eq!(out, data);
        out.fill(0);
        let t_new = median_cpu_secs(|| ap.decode_chunks(0..k, &tables, &mut out).unwrap());
        assert_eq!(out, data);
        let mut groups = Vec::new();
        for g in [8usize, 4] {
            let t = median_cpu_secs(|| {
                let mut rest = &mut out[..];
                for j0 in (0..k).step_by(g) {
                    let js = j0..(j0 + g).min(k);
                    let len =
                        (ap.chunk_bounds(js.end - 1).end - ap.chunk_bounds(j0).start) as usize;
                    let (o, r) = rest.split_at_mut(len);
                    ap.decode_chunks(js, &tables, o).unwrap();
                    rest = r;
                }
            });
            groups.push((g, t));
        }
        assert_eq!(out, data);
        let ms = |t: f64| n as f64 / t / 1e6;
        println!(
            "  {:>4}K-symbol chunks (k={k:>4}, {:.3} bits/sym): old {:>7.1} M sym/s, new {:>7.1} M sym/s ({:.2}x); new in calls of 8 chunks {:>7.1}, of 4 chunks {:>7.1}",
            chunk >> 10,
            payload.len() as f64 * 8.0 / n as f64,
            ms(t_old),
            ms(t_new),
            t_old / t_new,
            ms(groups[0].1),
            ms(groups[1].1),
        );
    }
    // The encoder's byte count of a plane (`histogram`), for the same data.
    let t = median_cpu_secs(|| {
        std::hint::black_box(histogram(data));
    });
    println!("  histogram of the plane: {:.0} MB/s", n as f64 / t / 1e6);
}

fn report(what: &str, bytes: usize, secs: f64) {
    println!("{what:<58} {:>9.1} MB/s", bytes as f64 / secs / 1e6);
}

fn entropy_bits(data: &[u8]) -> f64 {
    let h = histogram(data);
    let n = data.len() as f64;
    h.iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum()
}

// --- a small order-1 (method 5) encoder, only to produce benchmark input ---

fn bounds(n: usize, k: usize, j: usize) -> std::ops::Range<usize> {
    (n as u128 * j as u128 / k as u128) as usize..(n as u128 * (j as u128 + 1) / k as u128) as usize
}

fn o1_encode(data: &[u8], k: usize) -> Vec<u8> {
    let n = data.len();
    let seg = |cn: usize, l: usize| cn * l / 4..cn * (l + 1) / 4;
    let mut joint = vec![[0u64; 256]; 256];
    for j in 0..k {
        let c = &data[bounds(n, k, j)];
        for l in 0..4 {
            let r = seg(c.len(), l);
            for i in r.clone() {
                let ctx = if i == r.start { 0 } else { c[i - 1] };
                joint[ctx as usize][c[i] as usize] += 1;
            }
        }
    }
    let freq: Vec<[u16; 256]> = joint
        .iter()
        .map(|row| {
            if row.iter().all(|&v| v == 0) {
                [0; 256]
            } else {
                normalize_freqs_to(row, O1_SCALE)
            }
        })
        .collect();
    let cum: Vec<[u32; 256]> = freq
        .iter()
        .map(|row| {
            let mut c = [0u32; 256];
            for s in 1..256 {
                c[s] = c[s - 1] + u32::from(row[s - 1]);
            }
            c
        })
        .collect();
    let mut raw = Vec::new();
    for (c, row) in freq.iter().enumerate() {
        let nz: Vec<usize> = (0..256).filter(|&s| row[s] != 0).collect();
        if !nz.is_empty() {
            raw.push(c as u8);
            raw.extend_from_slice(&(nz.len() as u16).to_le_bytes());
            for s in nz {
                raw.push(s as u8);
                raw.extend_from_slice(&row[s].to_le_bytes());
            }
        }
    }
    let blob = zstd::bulk::compress(&raw, 19).unwrap();
    let mut chunks = Vec::new();
    for j in 0..k {
        let c = &data[bounds(n, k, j)];
        let mut subs = Vec::new();
        for l in 0..4 {
            let r = seg(c.len(), l);
            let mut x = RANS_L;
            let mut em = Vec::new();
            for i in r.clone().rev() {
                let ctx = if i == r.start { 0 } else { c[i - 1] as usize };
                let s = c[i] as usize;
                let f = u32::from(freq[ctx][s]);
                while u64::from(x) >= u64::from((RANS_L >> O1_PROB_BITS) << 8) * u64::from(f) {
                    em.push(x as u8);
                    x >>= 8;
                }
                x = (x / f) * O1_SCALE + x % f + cum[ctx][s];
            }
            let mut sub = x.to_le_bytes().to_vec();
            sub.extend(em.iter().rev());
            subs.push(sub);
        }
        let mut cp = Vec::new();
        for s in &subs {
            cp.extend_from_slice(&(s.len() as u32).to_le_bytes());
        }
        for s in &subs {
            cp.extend_from_slice(s);
        }
        chunks.push(cp);
    }
    let mut out = b"R1".to_vec();
    out.extend_from_slice(&[4, 0]);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    out.extend_from_slice(&(blob.len() as u32).to_le_bytes());
    out.extend_from_slice(&(k as u16).to_le_bytes());
    out.extend_from_slice(&blob);
    for c in &chunks {
        out.extend_from_slice(&(c.len() as u32).to_le_bytes());
    }
    for c in &chunks {
        out.extend_from_slice(c);
    }
    out
}

fn bench_plane(name: &str, data: &[u8], one: &rayon::ThreadPool) {
    let n = data.len();
    println!(
        "\n== {name}: {} MiB, order-0 entropy {:.3} bits/symbol",
        n >> 20,
        entropy_bits(data)
    );

    let t = median_secs(|| {
        std::hint::black_box(normalize_freqs(&histogram(data)));
    });
    report("histogram + normalize (whole plane)", n, t);
    let t = median_secs(|| {
        for c in data.chunks(1 << 16) {
            std::hint::black_box(normalize_freqs(&histogram(c)));
        }
    });
    report("histogram + normalize (per 64 KiB chunk)", n, t);

    let freqs: FreqTable = normalize_freqs(&histogram(data));
    let mut stream = Vec::new();
    encode_stream(data, &freqs, &mut stream);
    let t = median_secs(|| {
        let mut s = Vec::with_capacity(stream.len());
        encode_stream(data, &freqs, &mut s);
        std::hint::black_box(s);
    });
    report(
        &format!(
            "encode_stream ({:.3} bits/symbol)",
            stream.len() as f64 * 8.0 / n as f64
        ),
        n,
        t,
    );
    let mut out = vec![0u8; n];
    let t = median_secs(|| decode_stream(&stream, &freqs, &mut out).unwrap());
    assert_eq!(out, data);
    report("decode_stream", n, t);

    for (label, chunk) in [("64 KiB", 1usize << 16), ("512 KiB", 1 << 19)] {
        let k = n.div_ceil(chunk);
        let payload = encode_method4(data, k);
        let ratio = payload.len() as f64 * 8.0 / n as f64;
        let t1 =
            one.install(|| median_secs(|| drop(std::hint::black_box(encode_method4(data, k)))));
        let tn = median_secs(|| drop(std::hint::black_box(encode_method4(data, k))));
        report(
            &format!("encode_method4 {label} chunks, 1 thread ({ratio:.3} bits/sym)"),
            n,
            t1,
        );
        report(
            &format!("encode_method4 {label} chunks, all threads"),
            n,
            tn,
        );
        let t1 = one.install(|| median_secs(|| decode_method4(&payload, &mut out).unwrap()));
        assert_eq!(out, data);
        let tn = median_secs(|| decode_method4(&payload, &mut out).unwrap());
        assert_eq!(out, data);
        report(&format!("decode_method4 {label} chunks, 1 thread"), n, t1);
        report(
            &format!("decode_method4 {label} chunks, all threads"),
            n,
            tn,
        );
    }

    for k in [1usize, 2] {
        let payload = o1_encode(data, k);
        let ratio = payload.len() as f64 * 8.0 / n as f64;
        let t1 = one.install(|| median_secs(|| decode_method5(&payload, &mut out).unwrap()));
        assert_eq!(out, data);
        let tn = median_secs(|| decode_method5(&payload, &mut out).unwrap());
        assert_eq!(out, data);
        report(
            &format!("decode_method5 k={k}, 1 thread ({ratio:.3} bits/sym)"),
            n,
            t1,
        );
        report(&format!("decode_method5 k={k}, all threads"), n, tn);
    }
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(8);
    let n = mib << 20;
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    println!(
        "rans_bench: {} MiB planes, {} rayon threads",
        mib,
        rayon::current_num_threads()
    );
    bench_chunks("exponent", &exponent_data(n, 1));
    bench_chunks("sparse XOR (99.2% zeros)", &sparse_xor_data(n, 4));
    if std::env::args().nth(2).as_deref() == Some("chunks") {
        return;
    }
    bench_plane("bf16 exponent of N(0,0.02)", &exponent_data(n, 1), &one);
    bench_plane("mantissa-like, uniform 0..128", &mantissa_data(n, 2), &one);
    // Locally correlated exponents (order-1 wins): a random walk that stays
    // near the typical exponent, like a smooth weight matrix.
    let mut r = Rng(3);
    let mut v = 0.0f64;
    let corr: Vec<u8> = (0..n)
        .map(|_| {
            v = 0.97 * v + 0.25 * r.gauss();
            ((bf16_bits((v * 0.02) as f32) >> 7) & 0xFF) as u8
        })
        .collect();
    bench_plane("locally correlated exponent (AR(1))", &corr, &one);
}
