//! `export --to gguf`: GGUF v3 for llama.cpp, written from format facts of
//! llama.cpp's gguf-py (layout, metadata keys, GGML types) and
//! `convert_hf_to_gguf.py` (tensor names, which tensors stay f32, the
//! llama q/k row permutation, tokenizer keys).
//!
//! Layout (all little-endian): `"GGUF"`, u32 version 3, u64 tensor count,
//! u64 metadata count, the metadata (key string, u32 type, value), the
//! tensor infos (name, u32 n_dims, u64 dims innermost first, u32 GGML type,
//! u64 offset into the data section), zero padding to the 32-byte
//! alignment, then each tensor's data, each padded to 32 bytes. Strings are
//! a u64 length and UTF-8 bytes.
//!
//! Supported: llama and mistral (GGUF arch `llama`) and qwen2, with a BPE
//! `tokenizer.json` (its pre-tokenizer named as llama.cpp names it, see
//! [`tokenizer`]) or, for llama, a SentencePiece `tokenizer.model`;
//! gpt2 (BPE; `Conv1D` weights transposed, qkv kept fused as llama.cpp's
//! `attn_qkv`); BERT encoders (`BertModel`: WordPiece vocabulary in
//! llama.cpp's phantom-space form, token types, sentence-transformers'
//! pooling mode). Anything else is refused with a one-line error before
//! the output is created: the tensor count in the header is exactly the
//! tensors written (every source tensor is mapped or deliberately dropped).
//!
//! Types: 1-D tensors (norms, biases) are f32, as the converter does; a
//! q8_0/q4_0 cast of a tensor whose rows are not whole 32-element blocks
//! falls back to f16 (q4_k: to q4_0, else f16), and the summary says so.
//!
//! Modules: [`arch`] (the architecture table: names, dropped and reshaped
//! tensors), [`hparams`] (config.json → `{arch}.*` keys), [`tokenizer`]
//! (`tokenizer.ggml.*`), [`types`] (GGML types, the cast of each tensor,
//! encoding), [`writer`] (the header's key-value pairs and tensor infos),
//! [`layout`] (the file's bytes, computed per tensor piece); planning and
//! the export itself are here.

mod arch;
mod hparams;
mod layout;
mod tokenizer;
mod types;
mod writer;

pub use layout::Layout;
pub use types::GgmlType;

use crate::export::{cast, Cast, ExportError, Options, Result, Summary};
use crate::model::Model;
use arch::{conv1d, dropped, map_name};
use ckptfs_format::safetensors::Dtype;
use hparams::Hparams;
use serde_json::Value;
use std::io::{self, Write};
use std::path::Path;
use types::{padded, tensor_type};

/// One tensor as it goes into the file.
struct Planned {
    /// Index into `Model::tensors`.
    k: usize,
    name: String,
    /// GGUF dims, innermost first.
    dims: Vec<u64>,
    ty: GgmlType,
    /// Rows permuted as llama.cpp's rope wants (q/k of llama): heads.
    permute: Option<u64>,
    /// A GPT-2 `Conv1D` weight, stored `[in, out]`: written transposed.
    transpose: bool,
    offset: u64,
    len: u64,
}

fn input(path: impl std::fmt::Display, what: impl Into<String>) -> ExportError {
    ExportError::Input {
        path: path.to_string(),
        what: what.into(),
    }
}

/// A small JSON file of the model by relative path, if present.
fn json_file(m: &Model, rel: &str) -> Result<Option<Value>> {
    let Some(i) = m.find_file(rel) else {
        return Ok(None);
    };
    let raw = m.read_small(i, 256 << 20)?;
    serde_json::from_slice(&raw)
        .map(Some)
        .map_err(|e| input(m.file_label(i), format!("not JSON: {e}")))
}

/// Every tensor of `m` as it goes into the file, in the model's order, with
/// its GGUF name, dims, type and offset in the data section; refuses a
/// tensor with no GGUF name that is not dropped on purpose, two tensors of
/// one name, a non-float dtype, and a model without a token embedding.
fn plan(m: &Model, h: &Hparams, c: Option<Cast>, notes: &mut Vec<String>) -> Result<Vec<Planned>> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (k, t) in m.tensors().iter().enumerate() {
        let label = || format!("{}: tensor {:?}", m.file_label(t.file), t.name);
        let Some(name) = map_name(h.arch, &t.name) else {
            if dropped(h.arch, &t.name) {
                continue;
            }
            return Err(input(
                label(),
                format!("no GGUF name for it in architecture {}", h.arch.name()),
            ));
        };
        if !seen.insert(name.clone()) {
            return Err(input(
                label(),
                format!("maps to {name}, which another tensor maps to"),
            ));
        }
        let dt = Dtype::parse(&t.dtype)
            .filter(|d| cast::is_float(*d))
            .ok_or_else(|| {
                input(
                    label(),
                    format!(
                        "dtype {} cannot be written as a GGUF float or quantised tensor",
                        t.dtype
                    ),
                )
            })?;
        let transpose = conv1d(h.arch, &t.name);
        if transpose && t.shape.len() != 2 {
            return Err(input(
                label(),
                format!("shape {:?} is not a Conv1D matrix", t.shape),
            ));
        }
        // The shape as written (a Conv1D weight transposed).
        let shape: Vec<u64> = if transpose {
            t.shape.iter().rev().copied().collect()
        } else {
            t.shape.clone()
        };
        let n: u64 = shape.iter().product();
        let ne0 = shape.last().copied().unwrap_or(1);
        let ty = tensor_type(&name, dt, shape.len(), ne0, c, notes);
        let rope = h.arch.rope_permute();
        let permute = match name.strip_suffix(".weight") {
            Some(base) if rope && base.ends_with(".attn_q") => Some(h.heads),
            Some(base) if rope && base.ends_with(".attn_k") => Some(h.kv_heads),
            _ => None,
        };
        if let Some(heads) = permute {
            let rows = t.shape.first().copied().unwrap_or(0);
            if t.shape.len() != 2 || !rows.is_multiple_of(2 * heads) {
                return Err(input(
                    label(),
                    format!(
                        "shape {:?} does not split into {heads} heads of rotary pairs",
                        t.shape
                    ),
                ));
            }
        }
        out.push(Planned {
            k,
            name,
            dims: shape.iter().rev().copied().collect(),
            ty,
            permute,
            transpose,
            offset: 0,
            len: ty.bytes(n),
        });
    }
    if !out.iter().any(|p| p.name == "token_embd.weight") {
        return Err(input(
            m.path().display(),
            format!(
                "no token embedding tensor: not a {} checkpoint",
                h.arch.name()
            ),
        ));
    }
    let mut off = 0;
    for p in &mut out {
        p.offset = off;
        off = padded(off + p.len);
    }
    Ok(out)
}

/// Writes the GGUF of `m` to `out` (atomically), reading each tensor once.
pub fn export(
    m: &Model,
    out: &Path,
    opts: &Options,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Summary> {
    let layout = Layout::new(m, opts.cast)?;
    let mut s = Summary {
        files: 1,
        tensors: layout.tensors(),
        source_bytes: (0..layout.tensors()).map(|i| layout.source_len(m, i)).sum(),
        notes: layout.notes.clone(),
        ..Summary::default()
    };
    let mut failed = None;
    let r = ckptfs_format::fsutil::write_atomic(out, opts.force, |w| {
        w.write_all(layout.head())?;
        for i in 0..layout.tensors() {
            let span = layout.tensor_span(i);
            let len = span.end - span.start;
            let step = layout.piece_len(m, i, crate::model::CHUNK);
            let total_src = layout.source_len(m, i) as u128;
            let (mut pos, mut reported) = (0, 0);
            while pos < len {
                let end = (pos + step).min(len);
                match layout.tensor_bytes(m, i, pos..end) {
                    Ok(b) => w.write_all(&b)?,
                    Err(e) => {
                        failed = Some(e);
                        return Err(io::Error::other("reading the model failed"));
                    }
                }
                pos = end;
                let done = (total_src * pos as u128 / len as u128) as u64;
                progress(done - reported);
                reported = done;
            }
        }
        Ok(())
    });
    if let Some(e) = failed {
        return Err(e.into());
    }
    r.map_err(|source| ExportError::Output {
        path: out.display().to_string(),
        source,
    })?;
    s.written_bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    s.notes.push(layout.summary());
    Ok(s)
}
