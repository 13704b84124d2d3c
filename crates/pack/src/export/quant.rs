//! GGML block quantisation of f32 rows, byte-identical to llama.cpp's
//! reference quantisers (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`,
//! which PyPI `gguf`'s `gguf.quants` reproduces in numpy). Every step is
//! f32 arithmetic in the reference's order, so results match bit for bit:
//!
//! - Q8_0, blocks of 32: `d = max|x| / 127`, `q = round(x / d)` (half away
//!   from zero, through `id = 1/d`), stored as f16 `d` then 32 `i8`.
//! - Q4_0, blocks of 32: `m` = the element of largest magnitude (the first
//!   one on ties), `d = m / -8`, `q = min(15, trunc(x·(1/d) + 8.5))`, stored
//!   as f16 `d` then 16 bytes: element `j` in the low nibble of byte `j`,
//!   element `j + 16` in its high nibble.
//! - Q4_K, super-blocks of 256 (`quantize_row_q4_K_ref`, which `gguf.quants`
//!   does not implement): eight sub-blocks of 32, each fitted with a scale
//!   and a min by a weighted least-squares search over 21 candidate
//!   scales (weights `rms(x) + |x|`); the scales and mins are then
//!   quantised to 6 bits against the block's largest, stored as f16 `d`,
//!   f16 `dmin`, 12 bytes of packed 6-bit scales/mins, and 128 bytes of
//!   4-bit values (sub-blocks 2k and 2k+1 share bytes, low then high
//!   nibble). Rounding is llama.cpp's `nearest_int` (add 1.5·2^23, ties to
//!   even). Checked against gguf's Q4_K dequantiser and q4_0's error.

use half::f16;
use rayon::prelude::*;

/// Elements per Q8_0 / Q4_0 block.
pub const QK: usize = 32;
pub const Q8_0_BYTES: usize = 2 + QK;
pub const Q4_0_BYTES: usize = 2 + QK / 2;

fn q8_0_block(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (o, v) in out[2..].iter_mut().zip(x) {
        *o = ((v * id).round() as i8) as u8;
    }
}

fn q4_0_block(x: &[f32], out: &mut [u8]) {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let q = |v: f32| ((v * id + 8.5).trunc() as u8).min(15);
    for j in 0..QK / 2 {
        out[2 + j] = q(x[j]) | (q(x[j + QK / 2]) << 4);
    }
}

/// Elements per Q4_K super-block.
pub const QK_K: usize = 256;
pub const Q4_K_BYTES: usize = 2 + 2 + 12 + QK_K / 2;

/// Round to nearest, ties to even, as llama.cpp's `nearest_int` (valid for
/// |x| < 2^22).
#[inline]
fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0f32;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Fits `x ≈ scale·L + min` with `L` in `0..=nmax`, weighted; returns
/// (scale, -min) and fills `l` (llama.cpp's `make_qkx2_quants`).
fn fit_scale_min(
    nmax: i32,
    x: &[f32],
    w: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best += w[i] * (diff * diff);
    }
    let mut aux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sl, mut sl2, mut sxl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = q as u8;
            let qf = q as f32;
            sl += w[i] * qf;
            sl2 += w[i] * qf * qf;
            sxl += w[i] * qf * x[i];
        }
        let d = sum_w * sl2 - sl * sl;
        if d > 0.0 {
            let mut this_scale = (sum_w * sxl - sum_x * sl) / d;
            let mut this_min = (sl2 * sum_x - sl * sxl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sxl / sl2;
            }
            let mut err = 0f32;
            for i in 0..n {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if err < best {
                l[..n].copy_from_slice(&aux[..n]);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The 6-bit scale and min of sub-block `j` from the packed 12 bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn q4_k_block(x: &[f32], out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut w = [0f32; 32];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (wi, v) in w.iter_mut().zip(xs) {
            *wi = av_x + v.abs();
        }
        let (sc, mn) = fit_scale_min(15, xs, &w, &mut l[32 * j..32 * j + 32], -1.0, 0.1, 20);
        scales[j] = sc;
        mins[j] = mn;
        if sc > max_scale {
            max_scale = sc;
        }
        if mn > max_min {
            max_min = mn;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let (head, qs) = out.split_at_mut(16);
    let packed = &mut head[4..16];
    packed.fill(0);
    for j in 0..8 {
        // C converts the int to uint8_t before MIN(63, ·).
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    head[..2].copy_from_slice(&d.to_le_bytes());
    head[2..4].copy_from_slice(&dmin.to_le_bytes());
    let packed = &head[4..16];
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, packed);
        let dj = d.to_f32() * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, 15) as u8;
        }
    }
    for (k, q) in qs.chunks_mut(32).enumerate() {
        for i in 0..32 {
            q[i] = l[64 * k + i] | (l[64 * k + i + 32] << 4);
        }
    }
}

/// Quantises `x` (a multiple of 256 elements) to Q4_K super-blocks.
pub fn q4_k(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK_K), "whole super-blocks only");
    let mut out = vec![0u8; x.len() / QK_K * Q4_K_BYTES];
    out.par_chunks_mut(Q4_K_BYTES * 64)
        .zip(x.par_chunks(QK_K * 64))
        .for_each(|(o, x)| {
            for (o, x) in o.chunks_mut(Q4_K_BYTES).zip(x.chunks(QK_K)) {
                q4_k_block(x, o);
            }
        });
    out
}

/// Quantises `x` (a multiple of 32 elements) to Q8_0 blocks.
pub fn q8_0(x: &[f32]) -> Vec<u8> {
    blocks(x, Q8_0_BYTES, q8_0_block)
}

/// Quantises `x` (a multiple of 32 elements) to Q4_0 blocks.
pub fn q4_0(x: &[f32]) -> Vec<u8> {
    blocks(x, Q4_0_BYTES, q4_0_block)
}

fn blocks(x: &[f32], bytes: usize, f: fn(&[f32], &mut [u8])) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK), "whole blocks only");
    let mut out = vec![0u8; x.len() / QK * bytes];
    out.par_chunks_mut(bytes * 1024)
        .zip(x.par_chunks(QK * 1024))
        .for_each(|(o, x)| {
            for (o, x) in o.chunks_mut(bytes).zip(x.chunks(QK)) {
                f(x, o);
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_of_a_known_block() {
        let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
        let b = q8_0(&x);
        assert_eq!(b.len(), 34);
        // d = 16/127; -16 -> -127, 15 -> round(119.06) = 119.
        assert_eq!(b[2] as i8, -127);
        assert_eq!(b[33] as i8, 119);
        assert_eq!(
            f16::from_le_bytes([b[0], b[1]]),
            f16::from_f32(16.0 / 127.0)
        );
    }

    #[test]
    fn q4_0_of_a_known_block() {
        let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
        let b = q4_0(&x);
        assert_eq!(b.len(), 18);
        // m = -16, d = 2, id = 0.5: -16 -> trunc(0.5) = 0, 15 -> 16 -> 15.
        assert_eq!(b[2] & 15, 0);
        assert_eq!(b[17] >> 4, 15);
        // Zeros quantise to 8 with d = 0 / -8 = -0 (f16 0x8000), as the
        // reference does.
        let z = q4_0(&[0f32; 32]);
        assert!(z[2..].iter().all(|&v| v == 0x88) && z[..2] == [0, 0x80]);
    }
}
