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
//! [`pre_tokenizer`]) or, for llama, a SentencePiece `tokenizer.model`;
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

use super::quant;
use super::{cast, Cast, ExportError, Options, Result, Summary};
use crate::model::{Model, ModelError, Tensor};
use ckptfs_format::safetensors::Dtype;
use serde_json::Value;
use std::io::{self, Write};
use std::path::Path;

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
    fn name(self) -> &'static str {
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
    fn block(self) -> (u64, u64) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, quant::Q4_0_BYTES as u64),
            GgmlType::Q8_0 => (32, quant::Q8_0_BYTES as u64),
            GgmlType::Q4K => (256, quant::Q4_K_BYTES as u64),
        }
    }
    /// Bytes of `n` elements (`n` a multiple of the block size).
    fn bytes(self, n: u64) -> u64 {
        match self {
            GgmlType::F32 => n * 4,
            GgmlType::F16 | GgmlType::BF16 => n * 2,
            GgmlType::Q4_0 => n / 32 * quant::Q4_0_BYTES as u64,
            GgmlType::Q8_0 => n / 32 * quant::Q8_0_BYTES as u64,
            GgmlType::Q4K => n / 256 * quant::Q4_K_BYTES as u64,
        }
    }
}

const ALIGN: u64 = 32;

/// GGUF metadata value types.
mod vt {
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    Llama,
    Qwen2,
    Gpt2,
    /// BERT-style encoders (BertModel: embeddings, no rope, no LM head).
    Bert,
}

impl Arch {
    fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Gpt2 => "gpt2",
            Arch::Bert => "bert",
        }
    }
}

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

struct Hparams {
    arch: Arch,
    hidden: u64,
    layers: u64,
    ff: u64,
    heads: u64,
    kv_heads: u64,
    /// RMS norm epsilon (llama, qwen2) or layer norm epsilon (gpt2, bert).
    eps: f32,
    rope_theta: f32,
    ctx: u64,
    vocab: Option<u64>,
    head_dim: u64,
    /// bert: rows of the token type embedding.
    token_types: u64,
}

const SUPPORTED: &str =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel, GPT2Model, BertModel";

fn hparams(m: &Model) -> Result<Hparams> {
    let label = format!("{}/config.json", m.path().display());
    let cfg = json_file(m, "config.json")?.ok_or_else(|| {
        input(
            m.path().display(),
            "no config.json: GGUF needs the architecture",
        )
    })?;
    let archs: Vec<&str> = cfg["architectures"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let model_type = cfg["model_type"].as_str().unwrap_or("");
    let arch = match (archs.first().copied(), model_type) {
        (Some("LlamaForCausalLM" | "MistralForCausalLM"), _) => Arch::Llama,
        (Some("Qwen2ForCausalLM"), _) => Arch::Qwen2,
        (Some("GPT2LMHeadModel" | "GPT2Model"), _) => Arch::Gpt2,
        (Some("BertModel"), _) => Arch::Bert,
        (None, "llama" | "mistral") => Arch::Llama,
        (None, "qwen2") => Arch::Qwen2,
        (None, "gpt2") => Arch::Gpt2,
        (None, "bert") => Arch::Bert,
        (a, t) => {
            return Err(input(
                &label,
                format!(
                    "architecture {} (model_type {t:?}) is not supported for GGUF export (supported: {SUPPORTED})",
                    a.map_or("none".to_string(), |a| format!("{a:?}"))
                ),
            ))
        }
    };
    // The first of `keys` present (configs name the same thing differently).
    let u = |keys: &[&str]| -> Result<u64> {
        let v = keys
            .iter()
            .find_map(|k| cfg.get(*k).filter(|v| !v.is_null()));
        v.and_then(|v| v.as_u64())
            .filter(|&v| v > 0)
            .ok_or_else(|| {
                input(
                    &label,
                    format!("{} missing or not a positive integer", keys[0]),
                )
            })
    };
    let f = |k: &str, default: f64| cfg[k].as_f64().unwrap_or(default) as f32;
    if arch == Arch::Gpt2 {
        let hidden = u(&["n_embd", "hidden_size"])?;
        let heads = u(&["n_head", "num_attention_heads"])?;
        // n_inner is null for "4 × n_embd".
        let ff = cfg["n_inner"]
            .as_u64()
            .filter(|&v| v > 0)
            .unwrap_or(4 * hidden);
        return Ok(Hparams {
            arch,
            hidden,
            layers: u(&["n_layer", "num_hidden_layers"])?,
            ff,
            heads,
            kv_heads: heads,
            eps: f("layer_norm_epsilon", 1e-5),
            rope_theta: 0.0,
            ctx: u(&["n_positions", "n_ctx"])?,
            vocab: cfg["vocab_size"].as_u64(),
            head_dim: hidden / heads,
            token_types: 0,
        });
    }
    let hidden = u(&["hidden_size"])?;
    let heads = u(&["num_attention_heads"])?;
    if arch == Arch::Bert {
        return Ok(Hparams {
            arch,
            hidden,
            layers: u(&["num_hidden_layers"])?,
            ff: u(&["intermediate_size"])?,
            heads,
            kv_heads: heads,
            eps: f("layer_norm_eps", 1e-12),
            rope_theta: 0.0,
            ctx: u(&["max_position_embeddings"])?,
            vocab: cfg["vocab_size"].as_u64(),
            head_dim: hidden / heads,
            token_types: cfg["type_vocab_size"].as_u64().unwrap_or(1).max(1),
        });
    }
    let kv_heads = cfg["num_key_value_heads"].as_u64().unwrap_or(heads);
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(input(
            &label,
            format!("num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}"),
        ));
    }
    let head_dim = cfg["head_dim"].as_u64().unwrap_or(hidden / heads);
    Ok(Hparams {
        arch,
        hidden,
        layers: u(&["num_hidden_layers"])?,
        ff: u(&["intermediate_size"])?,
        heads,
        kv_heads,
        eps: f("rms_norm_eps", 1e-6),
        // transformers 5 moved it into rope_parameters.
        rope_theta: cfg["rope_theta"]
            .as_f64()
            .or_else(|| cfg["rope_parameters"]["rope_theta"].as_f64())
            .unwrap_or(10000.0) as f32,
        ctx: cfg["max_position_embeddings"].as_u64().unwrap_or(2048),
        vocab: cfg["vocab_size"].as_u64(),
        head_dim,
        token_types: 0,
    })
}

/// The GGUF name of an HF tensor name in `arch`, `None` for tensors
/// llama.cpp does not take.
fn map_name(arch: Arch, name: &str) -> Option<String> {
    match arch {
        Arch::Llama | Arch::Qwen2 => map_llama(name),
        Arch::Gpt2 => map_gpt2(name),
        Arch::Bert => map_bert(name),
    }
}

/// Splits `blk_prefix.N.rest` into (N, rest).
fn layer<'a>(name: &'a str, blk_prefix: &str) -> Option<(u64, &'a str)> {
    let (n, rest) = name.strip_prefix(blk_prefix)?.split_once('.')?;
    Some((n.parse().ok()?, rest))
}

/// gpt2 (`transformer.` prefix of GPT2LMHeadModel optional, as GPT2Model
/// saves without it).
fn map_gpt2(name: &str) -> Option<String> {
    if name == "lm_head.weight" {
        return Some("output.weight".into());
    }
    let name = name.strip_prefix("transformer.").unwrap_or(name);
    let (part, suffix) = name.rsplit_once('.')?;
    if !matches!(suffix, "weight" | "bias") {
        return None;
    }
    let fixed = match part {
        "wte" => Some("token_embd"),
        "wpe" => Some("position_embd"),
        "ln_f" => Some("output_norm"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(format!("{f}.{suffix}"));
    }
    let (n, rest) = layer(part, "h.")?;
    let g = match rest {
        "ln_1" => "attn_norm",
        "attn.c_attn" => "attn_qkv",
        "attn.c_proj" => "attn_output",
        "ln_2" => "ffn_norm",
        "mlp.c_fc" => "ffn_up",
        "mlp.c_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{n}.{g}.{suffix}"))
}

/// A gpt2 weight stored as `Conv1D` (`[in, out]`), which GGUF wants
/// transposed.
fn gpt2_conv1d(name: &str) -> bool {
    name.ends_with(".weight")
        && [
            ".attn.c_attn.",
            ".attn.c_proj.",
            ".mlp.c_fc.",
            ".mlp.c_proj.",
        ]
        .iter()
        .any(|p| name.contains(p))
}

/// BertModel (`bert.` prefix optional; old `gamma`/`beta` norm names).
fn map_bert(name: &str) -> Option<String> {
    let name = name.strip_prefix("bert.").unwrap_or(name);
    let (part, suffix) = name.rsplit_once('.')?;
    let suffix = match suffix {
        "weight" | "gamma" => "weight",
        "bias" | "beta" => "bias",
        _ => return None,
    };
    let fixed = match part {
        "embeddings.word_embeddings" => Some("token_embd"),
        "embeddings.token_type_embeddings" => Some("token_types"),
        "embeddings.position_embeddings" => Some("position_embd"),
        "embeddings.LayerNorm" => Some("token_embd_norm"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(format!("{f}.{suffix}"));
    }
    let (n, rest) = layer(part, "encoder.layer.")?;
    let g = match rest {
        "attention.self.query" => "attn_q",
        "attention.self.key" => "attn_k",
        "attention.self.value" => "attn_v",
        "attention.output.dense" => "attn_output",
        "attention.output.LayerNorm" => "attn_output_norm",
        "intermediate.dense" => "ffn_up",
        "output.dense" => "ffn_down",
        "output.LayerNorm" => "layer_output_norm",
        _ => return None,
    };
    Some(format!("blk.{n}.{g}.{suffix}"))
}

/// llama/mistral/qwen2 (one scheme).
fn map_llama(name: &str) -> Option<String> {
    let fixed = match name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (n, rest) = rest.split_once('.')?;
    let n: u64 = n.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let g = match part {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        _ => return None,
    };
    matches!(suffix, "weight" | "bias").then(|| format!("blk.{n}.{g}.{suffix}"))
}

/// Source tensors dropped on purpose (as the converter drops them:
/// buffers, and the parts of a checkpoint an embedding model does not run).
fn dropped(arch: Arch, name: &str) -> bool {
    match arch {
        Arch::Llama | Arch::Qwen2 => name.ends_with(".rotary_emb.inv_freq"),
        Arch::Gpt2 => name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"),
        Arch::Bert => {
            let n = name.strip_prefix("bert.").unwrap_or(name);
            n == "embeddings.position_ids"
                || n.starts_with("pooler.")
                || n.starts_with("cls.predictions")
                || n.starts_with("cls.seq_relationship")
        }
    }
}

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
        let transpose = h.arch == Arch::Gpt2 && gpt2_conv1d(&t.name);
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
        // Kept f32 as the converter keeps them: vectors, norms, and the
        // position and token type embeddings.
        let ty = if shape.len() <= 1
            || name.ends_with("_norm.weight")
            || name.starts_with("position_embd.")
            || name.starts_with("token_types.")
        {
            GgmlType::F32
        } else {
            let keep = match dt {
                Dtype::F16 => GgmlType::F16,
                Dtype::BF16 => GgmlType::BF16,
                _ => GgmlType::F32,
            };
            match c {
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
                        notes.push(format!("{name}: rows of {ne0} elements are not whole {} blocks of 32: written as f16", q.name()));
                        GgmlType::F16
                    }
                }
                // Rows that are not whole 256-element super-blocks: q4_0
                // when they are whole 32-element blocks, else f16.
                Some(Cast::Q4K) if ne0.is_multiple_of(256) => GgmlType::Q4K,
                Some(Cast::Q4K) if ne0.is_multiple_of(32) => {
                    notes.push(format!("{name}: rows of {ne0} elements are not whole q4_k super-blocks of 256: written as q4_0"));
                    GgmlType::Q4_0
                }
                Some(Cast::Q4K) => {
                    notes.push(format!("{name}: rows of {ne0} elements are not whole q4_k or q4_0 blocks: written as f16"));
                    GgmlType::F16
                }
            }
        };
        let permute = match (h.arch, name.rsplit_once('.')) {
            (Arch::Llama, Some((base, "weight"))) if base.ends_with(".attn_q") => Some(h.heads),
            (Arch::Llama, Some((base, "weight"))) if base.ends_with(".attn_k") => Some(h.kv_heads),
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
        off = (off + p.len).div_ceil(ALIGN) * ALIGN;
    }
    Ok(out)
}

/// Metadata, rendered as it will be written.
#[derive(Default)]
struct Kv {
    bytes: Vec<u8>,
    count: u64,
}

impl Kv {
    fn key(&mut self, k: &str, ty: u32) {
        put_str(&mut self.bytes, k);
        self.bytes.extend_from_slice(&ty.to_le_bytes());
        self.count += 1;
    }
    fn u32(&mut self, k: &str, v: u64) {
        self.key(k, vt::U32);
        self.bytes
            .extend_from_slice(&(v.min(u32::MAX as u64) as u32).to_le_bytes());
    }
    fn f32(&mut self, k: &str, v: f32) {
        self.key(k, vt::F32);
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    fn bool(&mut self, k: &str, v: bool) {
        self.key(k, vt::BOOL);
        self.bytes.push(v as u8);
    }
    fn str(&mut self, k: &str, v: &str) {
        self.key(k, vt::STRING);
        put_str(&mut self.bytes, v);
    }
    fn strs(&mut self, k: &str, v: &[String]) {
        self.key(k, vt::ARRAY);
        self.bytes.extend_from_slice(&vt::STRING.to_le_bytes());
        self.bytes
            .extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            put_str(&mut self.bytes, s);
        }
    }
    fn f32s(&mut self, k: &str, v: &[f32]) {
        self.key(k, vt::ARRAY);
        self.bytes.extend_from_slice(&vt::F32.to_le_bytes());
        self.bytes
            .extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            self.bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    fn i32s(&mut self, k: &str, v: &[i32]) {
        self.key(k, vt::ARRAY);
        self.bytes.extend_from_slice(&vt::I32.to_le_bytes());
        self.bytes
            .extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            self.bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// The largest token id accepted from a tokenizer (bounds the vocabulary
/// arrays built from untrusted ids and vocab_size; real vocabularies are
/// at most ~2^18).
const MAX_TOKEN_ID: u64 = 1 << 22;

/// Token type values of llama.cpp (gguf.TokenType).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

fn tokenizer(
    m: &Model,
    h: &Hparams,
    n_embd_rows: u64,
    kv: &mut Kv,
    notes: &mut Vec<String>,
) -> Result<()> {
    let Some(tok) = json_file(m, "tokenizer.json")? else {
        if let Some(i) = m.find_file("tokenizer.model") {
            if matches!(h.arch, Arch::Llama) {
                return spm_tokenizer(m, i, h.vocab.unwrap_or(0).max(n_embd_rows), kv);
            }
            return Err(input(
                m.file_label(i),
                format!(
                    "a SentencePiece tokenizer.model is read for llama-family models only, not {}: it needs tokenizer.json",
                    h.arch.name()
                ),
            ));
        }
        return Err(input(
            m.path().display(),
            "no tokenizer.json: GGUF needs the tokenizer",
        ));
    };
    let label = format!("{}/tokenizer.json", m.path().display());
    let model = &tok["model"];
    let kind = model["type"].as_str().unwrap_or("");
    let want = if h.arch == Arch::Bert {
        "WordPiece"
    } else {
        "BPE"
    };
    if kind != want {
        return Err(input(
            &label,
            format!(
                "tokenizer model {} is not supported for GGUF export of {} (it needs {want})",
                model["type"],
                h.arch.name()
            ),
        ));
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| input(&label, "model.vocab is not an object"))?;
    let mut ids: Vec<(u64, String, i32)> = Vec::with_capacity(vocab.len());
    for (t, id) in vocab {
        let id = id.as_u64().filter(|&i| i < MAX_TOKEN_ID).ok_or_else(|| {
            input(
                &label,
                format!("token {t:?}: id {id} is not an integer below {MAX_TOKEN_ID}"),
            )
        })?;
        ids.push((id, t.clone(), NORMAL));
    }
    for a in tok["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(t)) = (a["id"].as_u64(), a["content"].as_str()) else {
            return Err(input(&label, "added_tokens entry without id or content"));
        };
        if id >= MAX_TOKEN_ID {
            return Err(input(
                &label,
                format!("added token {t:?}: id {id} too large"),
            ));
        }
        let ty = if a["special"].as_bool() == Some(true) {
            CONTROL
        } else {
            USER_DEFINED
        };
        ids.push((id, t.to_string(), ty));
    }
    let max = ids.iter().map(|x| x.0 + 1).max().unwrap_or(0);
    let n = max.max(h.vocab.unwrap_or(0)).max(n_embd_rows);
    if n > MAX_TOKEN_ID {
        return Err(input(
            &label,
            format!("vocabulary of {n} tokens is too large"),
        ));
    }
    let mut tokens: Vec<Option<String>> = vec![None; n as usize];
    let mut types = vec![UNUSED; n as usize];
    for (id, t, ty) in ids {
        // An added token overrides the vocabulary's entry of the same id.
        tokens[id as usize] = Some(t);
        types[id as usize] = ty;
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| format!("[PAD{i}]")))
        .collect();
    let tc = json_file(m, "tokenizer_config.json")?.unwrap_or(Value::Null);
    let cfg = json_file(m, "config.json")?.unwrap_or(Value::Null);
    let id_of = |s: &str| tokens.iter().position(|t| t == s).map(|i| i as u64);
    // Special tokens: tokenizer_config.json names them; config.json has ids.
    let special = |field: &str, cfg_key: &str| {
        let named = match &tc[field] {
            Value::String(s) => Some(s.as_str()),
            Value::Object(o) => o.get("content").and_then(|v| v.as_str()),
            _ => None,
        };
        named.and_then(id_of).or_else(|| {
            (!cfg_key.is_empty())
                .then(|| cfg[cfg_key].as_u64())
                .flatten()
                .filter(|&i| i < n)
        })
    };
    if h.arch == Arch::Bert {
        // llama.cpp's WordPiece (WPM) vocabulary: a word-initial piece
        // carries the phantom space "▁", a "##" continuation loses its
        // prefix, control tokens stay as they are.
        let phantom: Vec<String> = tokens
            .iter()
            .zip(&types)
            .map(|(t, &ty)| {
                if ty == CONTROL {
                    t.clone()
                } else if let Some(rest) = t.strip_prefix("##") {
                    rest.to_string()
                } else {
                    format!("\u{2581}{t}")
                }
            })
            .collect();
        kv.u32("tokenizer.ggml.token_type_count", h.token_types);
        kv.str("tokenizer.ggml.model", "bert");
        kv.str("tokenizer.ggml.pre", "default");
        kv.strs("tokenizer.ggml.tokens", &phantom);
        kv.i32s("tokenizer.ggml.token_type", &types);
        // [CLS] is what llama.cpp adds in front ("BOS"), [SEP] at the end.
        for (field, key, cfg_key) in [
            ("cls_token", "tokenizer.ggml.bos_token_id", ""),
            ("unk_token", "tokenizer.ggml.unknown_token_id", ""),
            ("sep_token", "tokenizer.ggml.seperator_token_id", ""),
            (
                "pad_token",
                "tokenizer.ggml.padding_token_id",
                "pad_token_id",
            ),
            ("cls_token", "tokenizer.ggml.cls_token_id", ""),
            ("mask_token", "tokenizer.ggml.mask_token_id", ""),
        ] {
            if let Some(id) = special(field, cfg_key) {
                kv.u32(key, id);
            }
        }
        kv.bool("tokenizer.ggml.add_bos_token", true);
        kv.bool("tokenizer.ggml.add_sep_token", true);
        return Ok(());
    }
    let merges: Vec<String> = match &model["merges"] {
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                Value::Array(p) if p.len() == 2 && p.iter().all(|v| v.is_string()) => Ok(format!(
                    "{} {}",
                    p[0].as_str().unwrap_or(""),
                    p[1].as_str().unwrap_or("")
                )),
                _ => Err(input(
                    &label,
                    "model.merges holds something other than pairs",
                )),
            })
            .collect::<Result<_>>()?,
        Value::Null => Vec::new(),
        _ => return Err(input(&label, "model.merges is not an array")),
    };
    // qwen2 checkpoints were written "qwen2" before detection existed.
    let pre = pre_tokenizer(&tok).or((h.arch == Arch::Qwen2).then_some("qwen2"));
    if pre.is_none() {
        notes.push(format!(
            "{label}: pre-tokenizer {} not recognised: tokenizer.ggml.pre is \"default\" (llama.cpp's default split)",
            serde_json::to_string(&tok["pre_tokenizer"]).unwrap_or_default()
        ));
    }
    kv.str("tokenizer.ggml.model", "gpt2");
    kv.str("tokenizer.ggml.pre", pre.unwrap_or("default"));
    kv.strs("tokenizer.ggml.tokens", &tokens);
    kv.i32s("tokenizer.ggml.token_type", &types);
    kv.strs("tokenizer.ggml.merges", &merges);
    for (field, key, cfg_key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id", ""),
        (
            "pad_token",
            "tokenizer.ggml.padding_token_id",
            "pad_token_id",
        ),
    ] {
        if let Some(id) = special(field, cfg_key) {
            kv.u32(key, id);
        }
    }
    for (field, key) in [
        ("add_bos_token", "tokenizer.ggml.add_bos_token"),
        ("add_eos_token", "tokenizer.ggml.add_eos_token"),
    ] {
        if let Some(b) = tc[field].as_bool() {
            kv.bool(key, b);
        }
    }
    Ok(())
}

/// A SentencePiece `tokenizer.model` (file `i`) as llama.cpp's `llama`
/// tokenizer: pieces, scores and types as the model has them, padded to
/// `n` (the vocabulary the embedding has) with unused `[PADi]` tokens of
/// score -10000 as the converter pads; special ids from its trainer spec.
fn spm_tokenizer(m: &Model, i: usize, n: u64, kv: &mut Kv) -> Result<()> {
    let label = m.file_label(i);
    let raw = m.read_small(i, 64 << 20)?;
    let spm = super::spm::parse(&raw, MAX_TOKEN_ID as usize)
        .map_err(|e| input(&label, format!("not a SentencePiece model: {e}")))?;
    if spm.model_type != 2 {
        return Err(input(
            &label,
            format!(
                "SentencePiece model type {} is not supported for GGUF export (only BPE, as llama's)",
                spm.model_type
            ),
        ));
    }
    let n = (n as usize).max(spm.pieces.len());
    let mut tokens = Vec::with_capacity(n);
    let mut scores = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for p in &spm.pieces {
        tokens.push(p.text.clone());
        scores.push(p.score);
        types.push(p.ty);
    }
    for k in spm.pieces.len()..n {
        tokens.push(format!("[PAD{k}]"));
        scores.push(-10000.0);
        types.push(UNUSED);
    }
    kv.str("tokenizer.ggml.model", "llama");
    kv.str("tokenizer.ggml.pre", "default");
    kv.strs("tokenizer.ggml.tokens", &tokens);
    kv.f32s("tokenizer.ggml.scores", &scores);
    kv.i32s("tokenizer.ggml.token_type", &types);
    for (id, key) in [
        (spm.bos, "tokenizer.ggml.bos_token_id"),
        (spm.eos, "tokenizer.ggml.eos_token_id"),
        (spm.unk, "tokenizer.ggml.unknown_token_id"),
        (spm.pad, "tokenizer.ggml.padding_token_id"),
    ] {
        if id >= 0 && (id as usize) < spm.pieces.len() {
            kv.u32(key, id as u64);
        }
    }
    kv.bool("tokenizer.ggml.add_space_prefix", spm.add_dummy_prefix);
    let tc = json_file(m, "tokenizer_config.json")?.unwrap_or(Value::Null);
    for (field, key) in [
        ("add_bos_token", "tokenizer.ggml.add_bos_token"),
        ("add_eos_token", "tokenizer.ggml.add_eos_token"),
    ] {
        if let Some(b) = tc[field].as_bool() {
            kv.bool(key, b);
        }
    }
    Ok(())
}

/// Split regexes of tokenizer.json pre-tokenizers and llama.cpp's name for
/// each (`tokenizer.ggml.pre`; llama-vocab.cpp quotes these originals).
const PRE_REGEXES: &[(&str, &str)] = &[
    (
        "llama-bpe",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    (
        "qwen2",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
];

/// llama.cpp's pre-tokenizer name for a BPE tokenizer.json, from its
/// `pre_tokenizer` (what convert_hf_to_gguf.py's get_vocab_base_pre
/// identifies by hashing the tokenization of a fixed text: the split
/// rules). `None` when the rules are not ones recognised here.
///
/// - a byte-level pre-tokenizer with its built-in (GPT-2) split: "gpt-2";
/// - a Split by one of [`PRE_REGEXES`] followed by byte-level without a
///   split of its own: that regex's name.
fn pre_tokenizer(tok: &Value) -> Option<&'static str> {
    let pt = &tok["pre_tokenizer"];
    let steps: Vec<&Value> = match pt["type"].as_str()? {
        "Sequence" => pt["pretokenizers"].as_array()?.iter().collect(),
        _ => vec![pt],
    };
    let byte_level = |v: &Value| v["type"] == "ByteLevel";
    // ByteLevel's use_regex defaults to true.
    let own_split = |v: &Value| v["use_regex"].as_bool().unwrap_or(true);
    match steps.as_slice() {
        [b] if byte_level(b) && own_split(b) => Some("gpt-2"),
        [sp, b] if sp["type"] == "Split" && byte_level(b) && !own_split(b) => {
            let re = sp["pattern"]["Regex"].as_str()?;
            PRE_REGEXES.iter().find(|(_, r)| *r == re).map(|(n, _)| *n)
        }
        _ => None,
    }
}

/// llama.cpp's pooling type (MEAN 1, CLS 2, LAST 3) of a
/// sentence-transformers model: modules.json names the Pooling module's
/// directory, whose config.json sets the mode. `None` without modules.json
/// (llama.cpp then pools as the caller asks).
fn pooling(m: &Model) -> Result<Option<u64>> {
    let Some(modules) = json_file(m, "modules.json")? else {
        return Ok(None);
    };
    let Some(dir) = modules.as_array().into_iter().flatten().find_map(|v| {
        v["type"]
            .as_str()
            .filter(|t| t.ends_with("Pooling"))
            .and_then(|_| v["path"].as_str())
    }) else {
        return Ok(None);
    };
    let rel = format!("{dir}/config.json");
    let cfg = json_file(m, &rel)?.ok_or_else(|| {
        input(
            format!("{}/modules.json", m.path().display()),
            format!("names a Pooling module in {dir:?}, which has no config.json"),
        )
    })?;
    let on = |k: &str| cfg[k].as_bool() == Some(true);
    let mode = cfg["pooling_mode"].as_str();
    if on("pooling_mode_mean_tokens") || mode == Some("mean") {
        Ok(Some(1))
    } else if on("pooling_mode_cls_token") || mode == Some("cls") {
        Ok(Some(2))
    } else if on("pooling_mode_lasttoken") || mode == Some("lasttoken") {
        Ok(Some(3))
    } else {
        Err(input(
            format!("{}/{rel}", m.path().display()),
            "pooling mode is none of mean, cls, lasttoken (what llama.cpp supports)",
        ))
    }
}

/// llama.cpp's file type code for a cast (LlamaFileType).
fn file_type(c: Option<Cast>) -> Option<u64> {
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

/// A GGUF file planned from a model, before any tensor is read: the
/// header (metadata and tensor infos, padded to the data section) in
/// memory, and where each tensor's data lies. Any byte range of the file
/// can then be computed on its own ([`Layout::tensor_bytes`]), which is
/// how both `export` (in order) and the mount's GGUF view (on demand) make
/// the same bytes.
pub struct Layout {
    head: Vec<u8>,
    planned: Vec<Planned>,
    /// Length of the data section (every tensor padded to [`ALIGN`]).
    data_len: u64,
    arch: Arch,
    /// Per-tensor notes (a cast that fell back to another type).
    notes: Vec<String>,
}

impl Layout {
    /// Plans the GGUF of `m` with `cast` (reads config.json, the tokenizer
    /// and the tensor headers; no tensor data).
    pub fn new(m: &Model, cast: Option<Cast>) -> Result<Layout> {
        let h = hparams(m)?;
        let mut notes = Vec::new();
        let planned = plan(m, &h, cast, &mut notes)?;
        let embd_rows = planned
            .iter()
            .find(|p| p.name == "token_embd.weight")
            .and_then(|p| p.dims.get(1).copied())
            .unwrap_or(0);
        let a = h.arch.name();
        let mut kv = Kv::default();
        kv.str("general.architecture", a);
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
        kv.u32(&format!("{a}.context_length"), h.ctx);
        kv.u32(&format!("{a}.embedding_length"), h.hidden);
        kv.u32(&format!("{a}.block_count"), h.layers);
        kv.u32(&format!("{a}.feed_forward_length"), h.ff);
        kv.u32(&format!("{a}.attention.head_count"), h.heads);
        match h.arch {
            Arch::Llama | Arch::Qwen2 => {
                kv.u32(&format!("{a}.attention.head_count_kv"), h.kv_heads);
                kv.f32(&format!("{a}.attention.layer_norm_rms_epsilon"), h.eps);
                kv.f32(&format!("{a}.rope.freq_base"), h.rope_theta);
                kv.u32(&format!("{a}.rope.dimension_count"), h.head_dim);
            }
            Arch::Gpt2 => kv.f32(&format!("{a}.attention.layer_norm_epsilon"), h.eps),
            Arch::Bert => {
                kv.f32(&format!("{a}.attention.layer_norm_epsilon"), h.eps);
                kv.bool(&format!("{a}.attention.causal"), false);
                if let Some(p) = pooling(m)? {
                    kv.u32(&format!("{a}.pooling_type"), p);
                }
            }
        }
        if let Some(v) = h.vocab {
            kv.u32(&format!("{a}.vocab_size"), v);
        }
        tokenizer(m, &h, embd_rows, &mut kv, &mut notes)?;

        let mut head = Vec::new();
        head.extend_from_slice(b"GGUF");
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(planned.len() as u64).to_le_bytes());
        head.extend_from_slice(&kv.count.to_le_bytes());
        head.extend_from_slice(&kv.bytes);
        for p in &planned {
            put_str(&mut head, &p.name);
            head.extend_from_slice(&(p.dims.len() as u32).to_le_bytes());
            for d in &p.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&(p.ty as u32).to_le_bytes());
            head.extend_from_slice(&p.offset.to_le_bytes());
        }
        head.resize(padded(head.len() as u64) as usize, 0);
        let data_len = planned.last().map_or(0, |p| p.offset + padded(p.len));
        Ok(Layout {
            head,
            planned,
            data_len,
            arch: h.arch,
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
    fn source_len(&self, m: &Model, i: usize) -> u64 {
        m.tensors()[self.planned[i].k].len
    }

    /// The summary line's counts: "GGUF v3, arch A, N tensors (...)".
    fn summary(&self) -> String {
        let mut counts = std::collections::BTreeMap::<&str, usize>::new();
        for p in &self.planned {
            *counts.entry(p.ty.name()).or_default() += 1;
        }
        format!(
            "GGUF v3, arch {}, {} tensors ({})",
            self.arch.name(),
            self.planned.len(),
            counts
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

fn padded(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

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

/// Encodes f32-or-float source bytes of dtype `dt` as `ty`.
fn encode(dt: Dtype, ty: GgmlType, src: &[u8]) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn split_then_bytes(re: &str) -> Value {
        serde_json::json!({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ]}})
    }

    #[test]
    fn pre_tokenizer_names_the_split_rules() {
        let gpt2 =
            serde_json::json!({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}});
        assert_eq!(pre_tokenizer(&gpt2), Some("gpt-2"));
        for (name, re) in PRE_REGEXES {
            assert_eq!(pre_tokenizer(&split_then_bytes(re)), Some(*name));
        }
        // A regex of its own, byte-level without a split after a split
        // that is not known, or no byte-level step: not recognised.
        assert_eq!(pre_tokenizer(&split_then_bytes(r"\s+")), None);
        let no_regex =
            serde_json::json!({"pre_tokenizer": {"type": "ByteLevel", "use_regex": false}});
        assert_eq!(pre_tokenizer(&no_regex), None);
        assert_eq!(
            pre_tokenizer(&serde_json::json!({"pre_tokenizer": null})),
            None
        );
        let ws = serde_json::json!({"pre_tokenizer": {"type": "Whitespace"}});
        assert_eq!(pre_tokenizer(&ws), None);
    }

    #[test]
    fn names_map_per_architecture() {
        assert_eq!(
            map_name(Arch::Gpt2, "transformer.h.3.attn.c_attn.weight").as_deref(),
            Some("blk.3.attn_qkv.weight")
        );
        assert_eq!(
            map_name(Arch::Gpt2, "h.0.mlp.c_proj.bias").as_deref(),
            Some("blk.0.ffn_down.bias")
        );
        assert!(gpt2_conv1d("transformer.h.0.mlp.c_fc.weight"));
        assert!(!gpt2_conv1d("transformer.h.0.mlp.c_fc.bias"));
        assert_eq!(
            map_name(Arch::Bert, "bert.encoder.layer.5.output.LayerNorm.gamma").as_deref(),
            Some("blk.5.layer_output_norm.weight")
        );
        assert_eq!(
            map_name(Arch::Bert, "embeddings.token_type_embeddings.weight").as_deref(),
            Some("token_types.weight")
        );
        assert_eq!(map_name(Arch::Bert, "pooler.dense.weight"), None);
        assert!(dropped(Arch::Bert, "pooler.dense.weight"));
        assert!(!dropped(Arch::Bert, "encoder.layer.0.extra.weight"));
    }
}
