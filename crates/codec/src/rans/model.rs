//! Frequency models: byte histograms and their normalisation to integer
//! tables of a fixed total (16384 for order 0, 4096 for an order-1 row).
//!
//! Invariant: every table built here sums to exactly its total and gives
//! every symbol that occurs at least 1, so the encoders can code any input
//! the table was built from. Pure arithmetic: no I/O, no decoding.

use super::{FreqTable, PROB_SCALE};

/// Byte histogram. Eight interleaved sub-histograms, one per byte of a
/// word, break the store-to-load dependency of counting runs of equal
/// bytes (four, each hit twice a word, ran 10-15% slower on exponent and
/// XOR planes), and an all-zero word is counted at once: the planes of an
/// XOR delta are mostly zeros (3.5x faster on a plane 99% zero, no slower
/// on exponent or uniform bytes; `rans_bench` prints the rates).
pub fn histogram(data: &[u8]) -> [u64; 256] {
    let mut total = [0u64; 256];
    // u32 sub-counters cannot overflow within a block of < 2^32 bytes.
    for block in data.chunks(1 << 30) {
        let mut h = [[0u32; 256]; 8];
        let mut zero_words = 0u64;
        let mut words = block.chunks_exact(8);
        for w in &mut words {
            let v = u64::from_le_bytes(w.try_into().unwrap());
            if v == 0 {
                zero_words += 1;
                continue;
            }
            for (k, t) in h.iter_mut().enumerate() {
                t[((v >> (8 * k)) & 0xFF) as usize] += 1;
            }
        }
        for &b in words.remainder() {
            h[0][b as usize] += 1;
        }
        total[0] += 8 * zero_words;
        for (s, t) in total.iter_mut().enumerate() {
            *t += h.iter().map(|x| u64::from(x[s])).sum::<u64>();
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

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::rans::test_util::Rng;
    use crate::rans::test_util::*;
    use proptest::prelude::*;

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
        // Mostly zero, with zero words, odd lengths and a non-zero tail.
        let sparse: Vec<u8> = (0..100_013u32)
            .map(|i| {
                if i % 97 == 0 || i > 100_005 {
                    (i % 251) as u8
                } else {
                    0
                }
            })
            .collect();
        let mut h = [0u64; 256];
        for &b in &sparse {
            h[b as usize] += 1;
        }
        assert_eq!(histogram(&sparse), h);
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
}
