//! Element casts between the float dtypes safetensors holds (F64, F32,
//! F16, BF16): through `half`, which rounds to nearest, ties to even, and
//! keeps NaN a NaN (quiet) and infinities infinite. Other dtypes are never
//! cast (the caller keeps them as they are).

use ckptfs_format::safetensors::Dtype;
use half::{bf16, f16};
use rayon::prelude::*;

/// Elements converted by one task.
const TASK: usize = 1 << 16;

/// True for the dtypes a float cast applies to.
pub fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::F64 | Dtype::F32 | Dtype::F16 | Dtype::BF16)
}

/// Bytes per element of a float dtype.
pub fn width(d: Dtype) -> usize {
    (d.bits() / 8) as usize
}

/// Element `i` of `b` (of float dtype `d`) as f64 (exact).
#[inline]
fn get(d: Dtype, b: &[u8], i: usize) -> f64 {
    match d {
        Dtype::F64 => f64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()),
        Dtype::F32 => f32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
        Dtype::F16 => f16::from_le_bytes([b[i * 2], b[i * 2 + 1]]).to_f64(),
        Dtype::BF16 => bf16::from_le_bytes([b[i * 2], b[i * 2 + 1]]).to_f64(),
        _ => unreachable!("not a float dtype"),
    }
}

/// Converts `src` (whole elements of float dtype `from`) to float dtype
/// `to`, appending to `out`. Each element rounds once, from its exact
/// value, to nearest-even.
pub fn convert(from: Dtype, to: Dtype, src: &[u8], out: &mut Vec<u8>) {
    let n = src.len() / width(from);
    let start = out.len();
    out.resize(start + n * width(to), 0);
    let dst = &mut out[start..];
    let w = width(to);
    let wf = width(from);
    dst.par_chunks_mut(TASK * w)
        .zip(src.par_chunks(TASK * wf))
        .for_each(|(d, s)| {
            for i in 0..s.len() / wf {
                let x = get(from, s, i);
                let o = &mut d[i * w..i * w + w];
                match to {
                    Dtype::F64 => o.copy_from_slice(&x.to_le_bytes()),
                    // f64 -> f32 rounds to nearest-even once (`as`).
                    Dtype::F32 => o.copy_from_slice(&(x as f32).to_le_bytes()),
                    // From F32/F16/BF16, `x as f32` is exact: round once
                    // from f32; from F64, round once from f64.
                    Dtype::F16 if from == Dtype::F64 => {
                        o.copy_from_slice(&f16::from_f64(x).to_le_bytes())
                    }
                    Dtype::F16 => o.copy_from_slice(&f16::from_f32(x as f32).to_le_bytes()),
                    Dtype::BF16 if from == Dtype::F64 => {
                        o.copy_from_slice(&bf16::from_f64(x).to_le_bytes())
                    }
                    Dtype::BF16 => o.copy_from_slice(&bf16::from_f32(x as f32).to_le_bytes()),
                    _ => unreachable!("not a float dtype"),
                }
            }
        });
}

/// Elements of float dtype `d` as f32 (exact for F32/F16/BF16; F64 rounds
/// to nearest-even).
pub fn to_f32(d: Dtype, src: &[u8]) -> Vec<f32> {
    let n = src.len() / width(d);
    let mut out = vec![0f32; n];
    let wf = width(d);
    out.par_chunks_mut(TASK)
        .zip(src.par_chunks(TASK * wf))
        .for_each(|(o, s)| {
            for (i, v) in o.iter_mut().enumerate() {
                *v = get(d, s, i) as f32;
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(from: Dtype, to: Dtype, x: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        convert(from, to, x, &mut v);
        v
    }

    #[test]
    fn f32_to_bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0).
        let tie = (1.0f32 + 2f32.powi(-8)).to_le_bytes();
        assert_eq!(one(Dtype::F32, Dtype::BF16, &tie), 0x3f80u16.to_le_bytes());
        // 1 + 3*2^-8 ties between 0x3f81 and 0x3f82: even is 0x3f82.
        let tie = (1.0f32 + 3.0 * 2f32.powi(-8)).to_le_bytes();
        assert_eq!(one(Dtype::F32, Dtype::BF16, &tie), 0x3f82u16.to_le_bytes());
        let nan = one(Dtype::F32, Dtype::BF16, &f32::NAN.to_le_bytes());
        assert!(bf16::from_le_bytes([nan[0], nan[1]]).is_nan());
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even_and_overflows_to_inf() {
        let tie = (1.0f32 + 2f32.powi(-11)).to_le_bytes();
        assert_eq!(one(Dtype::F32, Dtype::F16, &tie), 0x3c00u16.to_le_bytes());
        let big = 70000f32.to_le_bytes();
        assert_eq!(one(Dtype::F32, Dtype::F16, &big), 0x7c00u16.to_le_bytes());
    }

    #[test]
    fn widening_is_exact() {
        let v: Vec<u8> = [0x3f81u16, 0x8001, 0x7f80]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let f = one(Dtype::BF16, Dtype::F32, &v);
        assert_eq!(one(Dtype::F32, Dtype::BF16, &f), v);
    }
}
