//! The hyper-parameters GGUF carries (`{arch}.context_length`, head
//! counts, norm epsilon, rope base, pooling), read from the model's
//! config.json (and, for sentence-transformers models, the Pooling
//! module's config), and written as the architecture's metadata keys.
//!
//! Configs name the same thing differently (gpt2's `n_embd` is the
//! others' `hidden_size`); a missing required value is refused with the
//! key it looked for, defaults are the transformers defaults.

use super::arch::Arch;
use super::writer::Kv;
use super::{input, json_file};
use crate::export::Result;
use crate::model::Model;

pub(super) struct Hparams {
    pub arch: Arch,
    pub hidden: u64,
    pub layers: u64,
    pub ff: u64,
    pub heads: u64,
    pub kv_heads: u64,
    /// RMS norm epsilon (llama, qwen2) or layer norm epsilon (gpt2, bert).
    pub eps: f32,
    pub rope_theta: f32,
    pub ctx: u64,
    pub vocab: Option<u64>,
    pub head_dim: u64,
    /// bert: rows of the token type embedding.
    pub token_types: u64,
}

impl Hparams {
    /// Reads config.json of `m`; refuses an architecture not in the table.
    pub(super) fn read(m: &Model) -> Result<Hparams> {
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
        let class = archs.first().copied();
        let Some(arch) = Arch::detect(class, model_type) else {
            return Err(input(
                &label,
                format!(
                    "architecture {} (model_type {model_type:?}) is not supported for GGUF export (supported: {})",
                    class.map_or("none".to_string(), |a| format!("{a:?}")),
                    Arch::supported()
                ),
            ));
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
                format!(
                    "num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}"
                ),
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

    /// The architecture's keys (`{arch}.*`); reads the pooling mode of a
    /// BERT model.
    pub(super) fn write(&self, m: &Model, kv: &mut Kv) -> Result<()> {
        let a = self.arch.name();
        kv.u32(&format!("{a}.context_length"), self.ctx);
        kv.u32(&format!("{a}.embedding_length"), self.hidden);
        kv.u32(&format!("{a}.block_count"), self.layers);
        kv.u32(&format!("{a}.feed_forward_length"), self.ff);
        kv.u32(&format!("{a}.attention.head_count"), self.heads);
        match self.arch {
            Arch::Llama | Arch::Qwen2 => {
                kv.u32(&format!("{a}.attention.head_count_kv"), self.kv_heads);
                kv.f32(&format!("{a}.attention.layer_norm_rms_epsilon"), self.eps);
                kv.f32(&format!("{a}.rope.freq_base"), self.rope_theta);
                kv.u32(&format!("{a}.rope.dimension_count"), self.head_dim);
            }
            Arch::Gpt2 => kv.f32(&format!("{a}.attention.layer_norm_epsilon"), self.eps),
            Arch::Bert => {
                kv.f32(&format!("{a}.attention.layer_norm_epsilon"), self.eps);
                kv.bool(&format!("{a}.attention.causal"), false);
                if let Some(p) = pooling(m)? {
                    kv.u32(&format!("{a}.pooling_type"), p);
                }
            }
        }
        if let Some(v) = self.vocab {
            kv.u32(&format!("{a}.vocab_size"), v);
        }
        Ok(())
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
