//! The tokenizer as GGUF's `tokenizer.ggml.*` keys: a BPE tokenizer.json
//! (`gpt2` model, with merges and llama.cpp's name of its pre-tokenizer),
//! a WordPiece one (`bert`, in llama.cpp's phantom-space form), or a
//! SentencePiece `tokenizer.model` of a llama-family model (`llama`, with
//! scores; see [`crate::export::spm`]). Special token ids come from
//! tokenizer_config.json's names, else config.json's ids.
//!
//! Ids and sizes come from untrusted files: every id and the vocabulary
//! are bounded by [`MAX_TOKEN_ID`] before an array is sized by them.

use super::arch::Arch;
use super::hparams::Hparams;
use super::writer::Kv;
use super::{input, json_file};
use crate::export::Result;
use crate::model::Model;
use serde_json::Value;

/// The largest token id accepted from a tokenizer (bounds the vocabulary
/// arrays built from untrusted ids and vocab_size; real vocabularies are
/// at most ~2^18).
const MAX_TOKEN_ID: u64 = 1 << 22;

/// Token type values of llama.cpp (gguf.TokenType).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// Writes the `tokenizer.ggml.*` keys of `m` (vocabulary padded to the
/// larger of config.json's vocab_size and the `n_embd_rows` rows of the
/// token embedding); notes a pre-tokenizer it does not recognise.
pub(super) fn tokenizer(
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
    add_bos_eos(&tc, kv);
    Ok(())
}

/// A SentencePiece `tokenizer.model` (file `i`) as llama.cpp's `llama`
/// tokenizer: pieces, scores and types as the model has them, padded to
/// `n` (the vocabulary the embedding has) with unused `[PADi]` tokens of
/// score -10000 as the converter pads; special ids from its trainer spec.
fn spm_tokenizer(m: &Model, i: usize, n: u64, kv: &mut Kv) -> Result<()> {
    let label = m.file_label(i);
    let raw = m.read_small(i, 64 << 20)?;
    let spm = crate::export::spm::parse(&raw, MAX_TOKEN_ID as usize)
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
    let pieces = spm.pieces.len();
    let n = (n as usize).max(pieces);
    let mut tokens = Vec::with_capacity(n);
    let mut scores = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for p in spm.pieces {
        tokens.push(p.text);
        scores.push(p.score);
        types.push(p.ty);
    }
    for k in pieces..n {
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
        if id >= 0 && (id as usize) < pieces {
            kv.u32(key, id as u64);
        }
    }
    kv.bool("tokenizer.ggml.add_space_prefix", spm.add_dummy_prefix);
    let tc = json_file(m, "tokenizer_config.json")?.unwrap_or(Value::Null);
    add_bos_eos(&tc, kv);
    Ok(())
}

/// tokenizer_config.json's add_bos_token / add_eos_token, where it sets them.
fn add_bos_eos(tc: &Value, kv: &mut Kv) {
    for (field, key) in [
        ("add_bos_token", "tokenizer.ggml.add_bos_token"),
        ("add_eos_token", "tokenizer.ggml.add_eos_token"),
    ] {
        if let Some(b) = tc[field].as_bool() {
            kv.bool(key, b);
        }
    }
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
}
