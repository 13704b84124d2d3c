//! GGML tensor types as the GGUF writer uses them: their sizes, which one
//! each tensor gets for a `--cast`, and the encoding of source bytes into
//! one. Values are ggml.h's (`ggml_type`) and llama.cpp's
//! (`LlamaFileType`); the quantised encodings live in [`crate::export::quant`].
//!
//! A tensor's type follows the converter (`convert_hf_to_gguf.py`): 1-D
//! tensors, norms and the position and token type embeddings stay f32; a
//! block type falls back when a row is not whole blocks (q8_0/q4_0 to f16,
//! q4_k to q4_0, else f16), with a note saying so.

use crate::export::{cast, quant, Cast};
use ckptfs_format::safetensors::Dtype;

/// GGML tensor types written here (values from ggml.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q8_0 = 8,
    Q4K = 12,
    BF16 = 30,
}

impl GgmlType {
    pub(super) fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q4K => "q4_k",
            GgmlType::BF16 => "bf16",
        }
    }
    /// Elements per block and bytes per block.
    pub(super) fn block(self) -> (u64, u64) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, quant::Q4_0_BYTES as u64),
            GgmlType::Q8_0 => (32, quant::Q8_0_BYTES as u64),
            GgmlType::Q4K => (256, quant::Q4_K_BYTES as u64),
        }
    }
    /// Bytes of `n` elements (`n` a multiple of the block size).
    pub(super) fn bytes(self, n: u64) -> u64 {
        match self {
            GgmlType::F32 => n * 4,
            GgmlType::F16 | GgmlType::BF16 => n * 2,
            GgmlType::Q4_0 => n / 32 * quant::Q4_0_BYTES as u64,
            GgmlType::Q8_0 => n / 32 * quant::Q8_0_BYTES as u64,
            GgmlType::Q4K => n / 256 * quant::Q4_K_BYTES as u64,
        }
    }
}

/// Alignment of the data section and of each tensor's data in it.
pub(super) const ALIGN: u64 = 32;

/// `n` rounded up to [`ALIGN`].
pub(super) fn padded(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// The type tensor `name` (GGUF name) of source dtype `dt` is written as,
/// with `n_dims` dimensions and rows of `ne0` elements, under `cast`. A
/// block type that does not fit the rows falls back, with a note.
pub(super) fn tensor_type(
    name: &str,
    dt: Dtype,
    n_dims: usize,
    ne0: u64,
    cast: Option<Cast>,
    notes: &mut Vec<String>,
) -> GgmlType {
    // Kept f32 as the converter keeps them: vectors, norms, and the
    // position and token type embeddings.
    if n_dims <= 1
        || name.ends_with("_norm.weight")
        || name.starts_with("position_embd.")
        || name.starts_with("token_types.")
    {
        return GgmlType::F32;
    }
    let keep = match dt {
        Dtype::F16 => GgmlType::F16,
        Dtype::BF16 => GgmlType::BF16,
        _ => GgmlType::F32,
    };
    match cast {
        None => keep,
        Some(Cast::F32) => GgmlType::F32,
        Some(Cast::F16) => GgmlType::F16,
        Some(Cast::BF16) => GgmlType::BF16,
        Some(q @ (Cast::Q8_0 | Cast::Q4_0)) => {
            if ne0.is_multiple_of(32) {
                if q == Cast::Q8_0 {
                    GgmlType::Q8_0
                } else {
                    GgmlType::Q4_0
                }
            } else {
                notes.push(format!(
                    "{name}: rows of {ne0} elements are not whole {} blocks of 32: written as f16",
                    q.name()
                ));
                GgmlType::F16
            }
        }
        // Rows that are not whole 256-element super-blocks: q4_0 when they
        // are whole 32-element blocks, else f16.
        Some(Cast::Q4K) if ne0.is_multiple_of(256) => GgmlType::Q4K,
        Some(Cast::Q4K) if ne0.is_multiple_of(32) => {
            notes.push(format!("{name}: rows of {ne0} elements are not whole q4_k super-blocks of 256: written as q4_0"));
            GgmlType::Q4_0
        }
        Some(Cast::Q4K) => {
            notes.push(format!(
                "{name}: rows of {ne0} elements are not whole q4_k or q4_0 blocks: written as f16"
            ));
            GgmlType::F16
        }
    }
}

/// llama.cpp's file type code for a cast (LlamaFileType).
pub(super) fn file_type(c: Option<Cast>) -> Option<u64> {
    match c? {
        Cast::F32 => Some(0),
        Cast::F16 => Some(1),
        Cast::Q4_0 => Some(2),
        Cast::Q8_0 => Some(7),
        Cast::BF16 => Some(32),
        // MOSTLY_Q4_K_S: q4_k throughout.
        Cast::Q4K => Some(14),
    }
}

/// Encodes f32-or-float source bytes of dtype `dt` as `ty`.
pub(super) fn encode(dt: Dtype, ty: GgmlType, src: &[u8]) -> Vec<u8> {
    let same = matches!(
        (dt, ty),
        (Dtype::F32, GgmlType::F32) | (Dtype::F16, GgmlType::F16) | (Dtype::BF16, GgmlType::BF16)
    );
    if same {
        return src.to_vec();
    }
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 => cast::convert(dt, Dtype::F32, src, &mut out),
        GgmlType::F16 => cast::convert(dt, Dtype::F16, src, &mut out),
        GgmlType::BF16 => cast::convert(dt, Dtype::BF16, src, &mut out),
        GgmlType::Q8_0 => out = quant::q8_0(&cast::to_f32(dt, src)),
        GgmlType::Q4_0 => out = quant::q4_0(&cast::to_f32(dt, src)),
        GgmlType::Q4K => out = quant::q4_k(&cast::to_f32(dt, src)),
    }
    out
}
