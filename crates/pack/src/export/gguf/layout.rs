//! The byte layout of a planned GGUF file ([`Layout`]): the header in
//! memory, and each tensor's data computed on its own from the source,
//! piece by piece. Both `export` (in order, [`super::export`]) and the
//! mount's GGUF view (on demand, [`crate::export::gguf_view`]) read the
//! file through it, so they make the same bytes.
//!
//! A tensor's data is its source elements, rows permuted for llama.cpp's
//! rope (llama q/k: within each head, the two halves of rotary pairs
//! interleaved) or a `Conv1D` weight transposed, then encoded as its GGML
//! type and zero-padded to the alignment ([`super::types::ALIGN`]). A
//! piece is whole quantisation blocks (whole heads of a permuted tensor,
//! the whole of a transposed one), so it never needs its neighbours.

use super::hparams::Hparams;
use super::tokenizer::tokenizer;
use super::types::{encode, file_type, padded};
use super::writer::{header, Kv};
use super::{plan, Planned};
use crate::export::{cast, Cast, Result};
use crate::model::{Model, ModelError, Tensor};
use ckptfs_format::safetensors::Dtype;

/// A GGUF file planned from a model, before any tensor is read: the
/// header (metadata and tensor infos, padded to the data section) in
/// memory, and where each tensor's data lies. Any byte range of the file
/// can then be computed on its own ([`Layout::tensor_bytes`]), which is
/// how both `export` (in order) and the mount's GGUF view (on demand) make
/// the same bytes.
pub struct Layout {
    head: Vec<u8>,
    planned: Vec<Planned>,
    /// Length of the data section (every tensor padded to the alignment).
    data_len: u64,
    /// `general.architecture` (for the summary).
    arch: &'static str,
    /// Per-tensor notes (a cast that fell back to another type).
    pub(super) notes: Vec<String>,
}

impl Layout {
    /// Plans the GGUF of `m` with `cast` (reads config.json, the tokenizer
    /// and the tensor headers; no tensor data).
    pub fn new(m: &Model, cast: Option<Cast>) -> Result<Layout> {
        let h = Hparams::read(m)?;
        let mut notes = Vec::new();
        let planned = plan(m, &h, cast, &mut notes)?;
        let embd_rows = planned
            .iter()
            .find(|p| p.name == "token_embd.weight")
            .and_then(|p| p.dims.get(1).copied())
            .unwrap_or(0);
        let mut kv = Kv::default();
        kv.str("general.architecture", h.arch.name());
        let name = m
            .path()
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        kv.str("general.name", &name);
        if let Some(ft) = file_type(cast) {
            kv.u32("general.file_type", ft);
        }
        kv.u32("general.quantization_version", 2);
        h.write(m, &mut kv)?;
        tokenizer(m, &h, embd_rows, &mut kv, &mut notes)?;

        let head = header(&kv, &planned);
        let data_len = planned.last().map_or(0, |p| p.offset + padded(p.len));
        Ok(Layout {
            head,
            planned,
            data_len,
            arch: h.arch.name(),
            notes,
        })
    }

    /// Length of the whole file.
    pub fn len(&self) -> u64 {
        self.head.len() as u64 + self.data_len
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// The header, tensor infos and padding: the file's first bytes.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// Number of tensors in the file.
    pub fn tensors(&self) -> usize {
        self.planned.len()
    }

    /// The GGUF name of tensor `i`.
    pub fn tensor_name(&self, i: usize) -> &str {
        &self.planned[i].name
    }

    /// Where tensor `i`'s data, padded to the alignment, lies in the file.
    pub fn tensor_span(&self, i: usize) -> std::ops::Range<u64> {
        let p = &self.planned[i];
        let start = self.head.len() as u64 + p.offset;
        start..start + padded(p.len)
    }

    /// The size (in bytes of tensor `i`'s data) of the pieces that
    /// [`Layout::tensor_bytes`] computes independently, chosen so that
    /// each reads about `source_bytes` of the source tensor: whole
    /// quantisation blocks, and whole heads of a permuted tensor.
    pub fn piece_len(&self, m: &Model, i: usize, source_bytes: u64) -> u64 {
        let p = &self.planned[i];
        let t = &m.tensors()[p.k];
        let (elems, out) = self.unit(m, i);
        let width = Dtype::parse(&t.dtype).map_or(4, |d| cast::width(d) as u64);
        let per = (source_bytes / (elems * width).max(1)).max(1);
        per * out
    }

    /// The smallest piece of tensor `i` computed on its own: (source
    /// elements, output bytes).
    fn unit(&self, m: &Model, i: usize) -> (u64, u64) {
        let p = &self.planned[i];
        let (elems, out) = p.ty.block();
        if p.transpose {
            // Every output row gathers one element of each source row.
            let n: u64 = p.dims.iter().product();
            return (n, p.ty.bytes(n));
        }
        match p.permute {
            None => (elems, out),
            Some(heads) => {
                let t = &m.tensors()[p.k];
                let rows_per_head = t.shape[0] / heads;
                let n = rows_per_head * t.shape[1];
                (n, n / elems * out)
            }
        }
    }

    /// Bytes `range` of tensor `i`'s padded data (see
    /// [`Layout::tensor_span`]). `range.start` must be a multiple of
    /// [`Layout::piece_len`]'s unit and `range.end` one too or the padded
    /// end; reads only the source elements the range covers.
    pub fn tensor_bytes(
        &self,
        m: &Model,
        i: usize,
        range: std::ops::Range<u64>,
    ) -> std::result::Result<Vec<u8>, ModelError> {
        let p = &self.planned[i];
        let t: &Tensor = &m.tensors()[p.k];
        let dt = Dtype::parse(&t.dtype).expect("checked in plan");
        let width = cast::width(dt) as u64;
        let (elems, out) = self.unit(m, i);
        let data_end = range.end.min(p.len);
        let mut bytes = Vec::new();
        if range.start < data_end {
            debug_assert!(range.start.is_multiple_of(out) && data_end.is_multiple_of(out));
            let e0 = range.start / out * elems;
            let e1 = data_end / out * elems;
            let mut src = Vec::new();
            m.stream_range(
                t.file,
                t.offset + e0 * width,
                (e1 - e0) * width,
                1,
                &mut |b| {
                    src.extend_from_slice(b);
                    Ok(())
                },
            )?;
            if let Some(heads) = p.permute {
                // Output row r of a head, pair half i, element j of the
                // pair comes from the head's source row j·half + i.
                let rows_per_head = t.shape[0] / heads;
                let half = rows_per_head / 2;
                let row = (t.shape[1] * width) as usize;
                let head_bytes = rows_per_head as usize * row;
                let mut perm = vec![0u8; src.len()];
                for (s, d) in src.chunks(head_bytes).zip(perm.chunks_mut(head_bytes)) {
                    for i in 0..half as usize {
                        for j in 0..2 {
                            let dst = i * 2 + j;
                            let from = j * half as usize + i;
                            d[dst * row..(dst + 1) * row]
                                .copy_from_slice(&s[from * row..(from + 1) * row]);
                        }
                    }
                }
                src = perm;
            }
            if p.transpose {
                // Source [in, out] → written [out, in].
                let (rows, cols) = (t.shape[0] as usize, t.shape[1] as usize);
                let w = width as usize;
                let mut tr = vec![0u8; src.len()];
                for r in 0..rows {
                    for c in 0..cols {
                        let s = (r * cols + c) * w;
                        let d = (c * rows + r) * w;
                        tr[d..d + w].copy_from_slice(&src[s..s + w]);
                    }
                }
                src = tr;
            }
            bytes = encode(dt, p.ty, &src);
        }
        bytes.resize((range.end - range.start) as usize, 0);
        Ok(bytes)
    }

    /// Source bytes tensor `i` reads in all.
    pub(super) fn source_len(&self, m: &Model, i: usize) -> u64 {
        m.tensors()[self.planned[i].k].len
    }

    /// The summary line's counts: "GGUF v3, arch A, N tensors (...)".
    pub(super) fn summary(&self) -> String {
        let mut counts = std::collections::BTreeMap::<&str, usize>::new();
        for p in &self.planned {
            *counts.entry(p.ty.name()).or_default() += 1;
        }
        format!(
            "GGUF v3, arch {}, {} tensors ({})",
            self.arch,
            self.planned.len(),
            counts
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}
