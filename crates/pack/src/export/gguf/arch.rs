//! The architectures GGUF export supports, as one table ([`ARCHS`]): how
//! config.json names each, and how its Hugging Face tensor names become
//! llama.cpp's (`convert_hf_to_gguf.py`'s tensor map), which source tensors
//! are dropped on purpose and which are stored transposed or permuted.
//!
//! Every architecture's names have one shape, which [`map_name`] reads off
//! its [`ArchSpec`]: a whole-name table first (tensors outside the scheme,
//! e.g. `lm_head.weight`), then an optional checkpoint prefix is removed,
//! the last dot-separated part is the suffix (`weight`, `bias`, or BERT's
//! old `gamma`/`beta`), and the rest is either a part outside the blocks
//! (`wte` → `token_embd`) or `{blocks}N.{part}` → `blk.N.{gguf}`. Adding an
//! architecture is adding a row (and its hyper-parameters in
//! [`super::hparams`]), not another mapping function.

/// An architecture as llama.cpp knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arch {
    Llama,
    Qwen2,
    Gpt2,
    /// BERT-style encoders (BertModel: embeddings, no rope, no LM head).
    Bert,
}

/// One row of the architecture table.
pub(super) struct ArchSpec {
    arch: Arch,
    /// GGUF `general.architecture` (and the prefix of its keys).
    name: &'static str,
    /// config.json `architectures[0]` values that select it.
    hf_classes: &'static [&'static str],
    /// config.json `model_type` values that select it when `architectures`
    /// is absent.
    model_types: &'static [&'static str],
    /// Whole source names → GGUF names, looked up before anything else.
    whole: &'static [(&'static str, &'static str)],
    /// A prefix some checkpoints put before every name, removed when
    /// present (empty: none).
    prefix: &'static str,
    /// Source suffixes → GGUF suffixes; a name with another suffix has no
    /// GGUF name.
    suffixes: &'static [(&'static str, &'static str)],
    /// Parts outside the blocks → GGUF base name (`{base}.{suffix}`).
    fixed: &'static [(&'static str, &'static str)],
    /// What comes before a block's number: `{blocks}N.{part}`.
    blocks: &'static str,
    /// A block's parts → GGUF base name (`blk.N.{base}.{suffix}`).
    block: &'static [(&'static str, &'static str)],
    /// Source tensors dropped on purpose (as the converter drops them:
    /// buffers, and the parts of a checkpoint an embedding model does not
    /// run): whole names ending so...
    drop_suffixes: &'static [&'static str],
    /// ... or, without the prefix, equal to one of these...
    drop_names: &'static [&'static str],
    /// ... or starting so.
    drop_prefixes: &'static [&'static str],
    /// `.weight`s of parts named so are `Conv1D` weights, stored
    /// `[in, out]`, which GGUF wants transposed.
    conv1d: &'static [&'static str],
    /// q/k weights' rows permuted as llama.cpp's rope wants.
    rope_permute: bool,
}

const WEIGHT_BIAS: &[(&str, &str)] = &[("weight", "weight"), ("bias", "bias")];

/// llama and mistral (GGUF arch `llama`).
const LLAMA: ArchSpec = ArchSpec {
    arch: Arch::Llama,
    name: "llama",
    hf_classes: &["LlamaForCausalLM", "MistralForCausalLM"],
    model_types: &["llama", "mistral"],
    whole: &[
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ],
    prefix: "",
    suffixes: WEIGHT_BIAS,
    fixed: &[],
    blocks: "model.layers.",
    block: &[
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", "ffn_norm"),
    ],
    drop_suffixes: &[".rotary_emb.inv_freq"],
    drop_names: &[],
    drop_prefixes: &[],
    conv1d: &[],
    rope_permute: true,
};

/// qwen2: llama's names, without the q/k permutation.
const QWEN2: ArchSpec = ArchSpec {
    arch: Arch::Qwen2,
    name: "qwen2",
    hf_classes: &["Qwen2ForCausalLM"],
    model_types: &["qwen2"],
    rope_permute: false,
    ..LLAMA
};

/// gpt2 (`transformer.` prefix of GPT2LMHeadModel optional, as GPT2Model
/// saves without it; qkv kept fused as llama.cpp's `attn_qkv`).
const GPT2: ArchSpec = ArchSpec {
    arch: Arch::Gpt2,
    name: "gpt2",
    hf_classes: &["GPT2LMHeadModel", "GPT2Model"],
    model_types: &["gpt2"],
    whole: &[("lm_head.weight", "output.weight")],
    prefix: "transformer.",
    suffixes: WEIGHT_BIAS,
    fixed: &[
        ("wte", "token_embd"),
        ("wpe", "position_embd"),
        ("ln_f", "output_norm"),
    ],
    blocks: "h.",
    block: &[
        ("ln_1", "attn_norm"),
        ("attn.c_attn", "attn_qkv"),
        ("attn.c_proj", "attn_output"),
        ("ln_2", "ffn_norm"),
        ("mlp.c_fc", "ffn_up"),
        ("mlp.c_proj", "ffn_down"),
    ],
    drop_suffixes: &[".attn.bias", ".attn.masked_bias"],
    drop_names: &[],
    drop_prefixes: &[],
    conv1d: &[
        ".attn.c_attn.",
        ".attn.c_proj.",
        ".mlp.c_fc.",
        ".mlp.c_proj.",
    ],
    rope_permute: false,
};

/// BertModel (`bert.` prefix optional; old `gamma`/`beta` norm names).
const BERT: ArchSpec = ArchSpec {
    arch: Arch::Bert,
    name: "bert",
    hf_classes: &["BertModel"],
    model_types: &["bert"],
    whole: &[],
    prefix: "bert.",
    suffixes: &[
        ("weight", "weight"),
        ("gamma", "weight"),
        ("bias", "bias"),
        ("beta", "bias"),
    ],
    fixed: &[
        ("embeddings.word_embeddings", "token_embd"),
        ("embeddings.token_type_embeddings", "token_types"),
        ("embeddings.position_embeddings", "position_embd"),
        ("embeddings.LayerNorm", "token_embd_norm"),
    ],
    blocks: "encoder.layer.",
    block: &[
        ("attention.self.query", "attn_q"),
        ("attention.self.key", "attn_k"),
        ("attention.self.value", "attn_v"),
        ("attention.output.dense", "attn_output"),
        ("attention.output.LayerNorm", "attn_output_norm"),
        ("intermediate.dense", "ffn_up"),
        ("output.dense", "ffn_down"),
        ("output.LayerNorm", "layer_output_norm"),
    ],
    drop_suffixes: &[],
    drop_names: &["embeddings.position_ids"],
    drop_prefixes: &["pooler.", "cls.predictions", "cls.seq_relationship"],
    conv1d: &[],
    rope_permute: false,
};

/// Every supported architecture, in the order the refusal lists them.
const ARCHS: [&ArchSpec; 4] = [&LLAMA, &QWEN2, &GPT2, &BERT];

impl Arch {
    fn spec(self) -> &'static ArchSpec {
        match self {
            Arch::Llama => &LLAMA,
            Arch::Qwen2 => &QWEN2,
            Arch::Gpt2 => &GPT2,
            Arch::Bert => &BERT,
        }
    }

    /// GGUF `general.architecture`.
    pub(super) fn name(self) -> &'static str {
        self.spec().name
    }

    /// The architecture config.json names: by its first `architectures`
    /// entry (`class`) when it has one, else by `model_type`.
    pub(super) fn detect(class: Option<&str>, model_type: &str) -> Option<Arch> {
        ARCHS
            .iter()
            .find(|s| match class {
                Some(c) => s.hf_classes.contains(&c),
                None => s.model_types.contains(&model_type),
            })
            .map(|s| s.arch)
    }

    /// The `architectures` entries supported, for the refusal.
    pub(super) fn supported() -> String {
        ARCHS
            .iter()
            .flat_map(|s| s.hf_classes.iter().copied())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether q/k weights' rows are permuted for llama.cpp's rope.
    pub(super) fn rope_permute(self) -> bool {
        self.spec().rope_permute
    }
}

fn lookup(table: &[(&str, &'static str)], key: &str) -> Option<&'static str> {
    table.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// The GGUF name of an HF tensor name in `arch`, `None` for tensors
/// llama.cpp does not take.
pub(super) fn map_name(arch: Arch, name: &str) -> Option<String> {
    let s = arch.spec();
    if let Some(g) = lookup(s.whole, name) {
        return Some(g.to_string());
    }
    let name = name.strip_prefix(s.prefix).unwrap_or(name);
    let (part, suffix) = name.rsplit_once('.')?;
    let suffix = lookup(s.suffixes, suffix)?;
    if let Some(f) = lookup(s.fixed, part) {
        return Some(format!("{f}.{suffix}"));
    }
    let (n, rest) = part.strip_prefix(s.blocks)?.split_once('.')?;
    let n: u64 = n.parse().ok()?;
    let g = lookup(s.block, rest)?;
    Some(format!("blk.{n}.{g}.{suffix}"))
}

/// Source tensors of `arch` dropped on purpose (see [`ArchSpec`]).
pub(super) fn dropped(arch: Arch, name: &str) -> bool {
    let s = arch.spec();
    if s.drop_suffixes.iter().any(|x| name.ends_with(x)) {
        return true;
    }
    let n = name.strip_prefix(s.prefix).unwrap_or(name);
    s.drop_names.contains(&n) || s.drop_prefixes.iter().any(|p| n.starts_with(p))
}

/// A weight of `arch` stored as `Conv1D` (`[in, out]`), which GGUF wants
/// transposed.
pub(super) fn conv1d(arch: Arch, name: &str) -> bool {
    name.ends_with(".weight") && arch.spec().conv1d.iter().any(|p| name.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2_conv1d(name: &str) -> bool {
        conv1d(Arch::Gpt2, name)
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
