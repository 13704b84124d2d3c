"""Writes a tiny llama model directory (2 layers, hidden 64, GQA 4/2 heads,
the tensor names and config.json keys transformers' LlamaForCausalLM
uses) with a byte-level BPE tokenizer trained by `tokenizers` on a few
sentences: python make_tiny_llama.py OUT [f32|bf16|f16] [SHARDS] [HIDDEN]
[STD]. Weights are normal with standard deviation STD (default 0.2; 0.02 is
transformers' initializer_range for llama, a well-conditioned model whose
logits move with its weights by about as much as they change, as a trained
model's do). Deterministic (seeded numpy)."""

import json
import os
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

out = sys.argv[1]
dtype = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[
    sys.argv[2] if len(sys.argv) > 2 else "f32"
]
shards = int(sys.argv[3]) if len(sys.argv) > 3 else 1
hidden = int(sys.argv[4]) if len(sys.argv) > 4 else 64
std = float(sys.argv[5]) if len(sys.argv) > 5 else 0.2
os.makedirs(out, exist_ok=True)
text = [
    "the quick brown fox jumps over the lazy dog",
    "compressed model checkpoints served as ordinary files",
    "llama reads gguf files; ckptfs writes them from a compressed store",
] * 20
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=300,
    special_tokens=["<s>", "</s>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tok.train_from_iterator(text, trainer)
tok.save(os.path.join(out, "tokenizer.json"))
json.dump(
    {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
     "tokenizer_class": "PreTrainedTokenizerFast"},
    open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2,
)
V, H, F, L, NH, NKV = tok.get_vocab_size(), hidden, 2 * hidden, 2, 4, 2
D = H // NH
cfg = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": V, "hidden_size": H, "intermediate_size": F,
    "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
    "head_dim": D, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "bos_token_id": 0, "eos_token_id": 1,
    "tie_word_embeddings": False,
}
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
rng = np.random.default_rng(0)
t = {"model.embed_tokens.weight": (V, H)}
for l in range(L):
    p = f"model.layers.{l}."
    t[p + "self_attn.q_proj.weight"] = (NH * D, H)
    t[p + "self_attn.k_proj.weight"] = (NKV * D, H)
    t[p + "self_attn.v_proj.weight"] = (NKV * D, H)
    t[p + "self_attn.o_proj.weight"] = (H, NH * D)
    t[p + "mlp.gate_proj.weight"] = (F, H)
    t[p + "mlp.up_proj.weight"] = (F, H)
    t[p + "mlp.down_proj.weight"] = (H, F)
    t[p + "input_layernorm.weight"] = (H,)
    t[p + "post_attention_layernorm.weight"] = (H,)
t["model.norm.weight"] = (H,)
t["lm_head.weight"] = (V, H)
tensors = {}
for name, shape in t.items():
    x = rng.normal(0, std, size=shape).astype(np.float32)
    if len(shape) == 1:
        x = 1.0 + x
    tensors[name] = x.astype(dtype)
names = list(tensors)
per = -(-len(names) // shards)
if shards == 1:
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
else:
    weight_map = {}
    total = 0
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per:(s + 1) * per]}
        save_file(part, os.path.join(out, fn), metadata={"format": "pt"})
        for n, x in part.items():
            weight_map[n] = fn
            total += x.nbytes
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=2)
print(V)
