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
