"""Checks a GGUF file ckptfs exported against its source model directory:
python gguf_check.py MODEL_DIR OUT.gguf CAST. gguf.GGUFReader must read it;
every tensor must be the source tensor (llama's q/k rows permuted as
convert_hf_to_gguf.py does) as f32/f16/bf16 exactly, or, for q8_0/q4_0,
byte for byte what gguf.quants.quantize makes of it; tokenizer arrays
must be the tokenizer's. Prints a summary line."""

import json
import os
import sys

import gguf
import ml_dtypes
import numpy as np
from safetensors.numpy import load_file

src, path, cast = sys.argv[1:4]
r = gguf.GGUFReader(path)
cfg = json.load(open(os.path.join(src, "config.json")))
want = {}
for f in sorted(os.listdir(src)):
    if f.endswith(".safetensors"):
        want.update(load_file(os.path.join(src, f)))


def field(k):
    f = r.fields[k]
    return f.contents()


assert field("general.architecture") == "llama"
assert field("llama.block_count") == cfg["num_hidden_layers"]
assert field("llama.attention.head_count_kv") == cfg["num_key_value_heads"]
tok = json.load(open(os.path.join(src, "tokenizer.json")))
tokens = field("tokenizer.ggml.tokens")
vocab = tok["model"]["vocab"]
for t, i in vocab.items():
    assert tokens[i] == t, (i, t, tokens[i])
merges = field("tokenizer.ggml.merges")
m0 = tok["model"]["merges"]
assert merges == [m if isinstance(m, str) else " ".join(m) for m in m0]
assert field("tokenizer.ggml.bos_token_id") == 0 and field("tokenizer.ggml.eos_token_id") == 1
types = field("tokenizer.ggml.token_type")
assert types[0] == 3 and types[1] == 3 and types[5] == 1, types[:6]

names = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
parts = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
for l in range(cfg["num_hidden_layers"]):
    for hf, g in parts.items():
        names[f"model.layers.{l}.{hf}.weight"] = f"blk.{l}.{g}.weight"


def permute(w, n_head):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


T = gguf.GGMLQuantizationType
got = {t.name: t for t in r.tensors}
assert len(got) == len(want), (len(got), len(want))
counts = {}
for hf, w in want.items():
    t = got[names[hf]]
    x = w.astype(np.float32)
    if hf.endswith("q_proj.weight"):
        x = permute(x, cfg["num_attention_heads"])
    if hf.endswith("k_proj.weight"):
        x = permute(x, cfg["num_key_value_heads"])
    assert list(t.shape) == list(reversed(w.shape)), (hf, t.shape, w.shape)
    raw = np.asarray(t.data).tobytes()
    ty = t.tensor_type
    counts[ty.name] = counts.get(ty.name, 0) + 1
    if x.ndim == 1:
        assert ty == T.F32, (hf, ty)
        assert raw == x.tobytes(), hf
    elif ty == T.F32:
        assert raw == x.tobytes(), hf
    elif ty == T.F16:
        assert raw == x.astype(np.float16).tobytes(), hf
    elif ty == T.BF16:
        assert raw == x.astype(ml_dtypes.bfloat16).tobytes(), hf
    elif ty in (T.Q8_0, T.Q4_0):
        ref = gguf.quants.quantize(x, ty)
        assert raw == ref.tobytes(), hf
        deq = gguf.quants.dequantize(np.frombuffer(raw, np.uint8).reshape(ref.shape), ty)
        assert np.array_equal(deq, gguf.quants.dequantize(ref, ty)), hf
    elif ty == T.Q4_K:
        # gguf.quants has no Q4_K quantiser: dequantise with gguf's own
        # dequantiser and require the reference algorithm's accuracy, at
        # least that of q4_0 on the same rows (q4_k is typically ~2x better).
        deq = gguf.quants.dequantize(np.frombuffer(raw, np.uint8), ty).reshape(x.shape)
        q40 = gguf.quants.dequantize(gguf.quants.quantize(x, T.Q4_0), T.Q4_0)
        e_k = float(np.sqrt(np.mean((deq - x) ** 2)))
        e_0 = float(np.sqrt(np.mean((q40 - x) ** 2)))
        assert e_k < e_0, (hf, e_k, e_0)
        assert e_k < 0.1 * float(np.sqrt(np.mean(x ** 2))), (hf, e_k)
    else:
        raise AssertionError(f"{hf}: unexpected type {ty.name}")
    if cast in ("q8_0", "q4_0") and x.ndim == 2 and x.shape[-1] % 32 == 0:
        assert ty.name == cast.upper(), (hf, ty)
    if cast == "q4_k" and x.ndim == 2:
        want_ty = "Q4_K" if x.shape[-1] % 256 == 0 else "Q4_0"
        assert ty.name == want_ty, (hf, ty)
print("ok", sorted(counts.items()))
