"""Makes z4ai 0.2.0 deltas for tests/z4ai_delta.rs: python z4ai_delta.py OUTDIR.

For each dtype (BF16, F16, F32) a base and a target safetensors that differ
the ways checkpoints do: a tensor with 2% of its elements changed, one with
every element nudged, one unchanged, one renamed, one removed, one added,
one reshaped to the same byte length (z4ai aligns it: same name, length and
dtype) and one reshaped to another length, plus a zero-length tensor. Then:

  NAME.base.safetensors, NAME.target.safetensors, NAME.z4dm
      z4ai.model_delta.compress(target, base)
  NAME.ref.bin, NAME.cur.bin, NAME.z4dl
      z4ai.compress_delta(cur, ref, dtype=...) on one tensor's bytes
  reupload.*: a target identical to its base (every record COPY).

Deterministic (seeded); plain numpy, no torch.
"""
import json
import os
import struct
import sys

import numpy as np
import z4ai
from z4ai import model_delta


def to_bytes(a, dtype):
    a = np.asarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    # BF16: round-to-nearest-even of the fp32 bits.
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


def safetensors(tensors):
    """tensors: list of (name, dtype, shape, bytes) in data order."""
    header, data, off = {}, bytearray(), 0
    for name, dtype, shape, b in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        data += b
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(data)


def pair(rng, dtype):
    embed = rng.standard_normal((128, 64)).astype(np.float32) * 0.05
    w0 = rng.standard_normal((64, 64)).astype(np.float32) * 0.1
    w1 = rng.standard_normal((64, 64)).astype(np.float32) * 0.1
    b1 = rng.standard_normal(64).astype(np.float32) * 0.01
    old = rng.standard_normal(16).astype(np.float32)
    resh = rng.standard_normal((16, 8)).astype(np.float32)
    grow = rng.standard_normal((16, 8)).astype(np.float32)
    base = [
        ("embed.weight", dtype, embed.shape, to_bytes(embed, dtype)),
        ("layer.0.weight", dtype, w0.shape, to_bytes(w0, dtype)),
        ("layer.1.weight", dtype, w1.shape, to_bytes(w1, dtype)),
        ("layer.1.b", dtype, b1.shape, to_bytes(b1, dtype)),
        ("old.bias", dtype, old.shape, to_bytes(old, dtype)),
        ("reshaped.same_len", dtype, resh.shape, to_bytes(resh, dtype)),
        ("reshaped.other_len", dtype, grow.shape, to_bytes(grow, dtype)),
        ("empty", dtype, (0,), b""),
    ]
    e2 = embed.copy()
    idx = rng.choice(e2.size, e2.size // 50, replace=False)
    e2.flat[idx] += rng.standard_normal(idx.size).astype(np.float32) * 1e-3
    w0b = w0 * np.float32(1.01) + np.float32(1e-4)
    new = rng.standard_normal((8, 8)).astype(np.float32)
    target = [
        ("layer.0.weight", dtype, w0.shape, to_bytes(w0b, dtype)),  # moved first
        ("embed.weight", dtype, embed.shape, to_bytes(e2, dtype)),
        ("layer.1.weight", dtype, w1.shape, to_bytes(w1, dtype)),  # unchanged
        ("layer.1.bias", dtype, b1.shape, to_bytes(b1, dtype)),  # renamed
        ("new.weight", dtype, new.shape, to_bytes(new, dtype)),  # added
        ("reshaped.same_len", dtype, (8, 16), to_bytes(resh.T, dtype)),
        ("reshaped.other_len", dtype, (16, 4), to_bytes(grow[:, :4], dtype)),
        ("empty", dtype, (0,), b""),
    ]  # old.bias removed
    return base, target


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(14)
    zcode = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}
    for dtype in ("BF16", "F16", "F32"):
        base, target = pair(rng, dtype)
        b, t = safetensors(base), safetensors(target)
        name = dtype.lower()
        blob = model_delta.compress(t, b)
        assert model_delta.decompress(blob, b) == t
        for suffix, data in (("base.safetensors", b), ("target.safetensors", t), ("z4dm", blob)):
            with open(os.path.join(out, f"{name}.{suffix}"), "wb") as f:
                f.write(data)
        ref, cur = base[0][3], target[1][3]  # embed.weight before and after
        dl = z4ai.compress_delta(cur, ref, dtype=zcode[dtype])
        assert bytes(z4ai.decompress_delta(dl, ref)) == cur
        for suffix, data in (("ref.bin", ref), ("cur.bin", cur), ("z4dl", dl)):
            with open(os.path.join(out, f"{name}.{suffix}"), "wb") as f:
                f.write(data)
    base, _ = pair(rng, "BF16")
    b = safetensors(base)
    for suffix, data in (
        ("base.safetensors", b),
        ("target.safetensors", b),
        ("z4dm", model_delta.compress(b, b)),
        ("ref.bin", b""),
        ("cur.bin", b""),
        ("z4dl", z4ai.compress_delta(b"", b"")),
    ):
        with open(os.path.join(out, f"reupload.{suffix}"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
