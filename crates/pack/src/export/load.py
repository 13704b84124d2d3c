"""Loads what `ckptfs export --to pytorch` wrote: raw little-endian tensors.

    import load
    tensors = load.load("OUT")          # {name: torch.Tensor}
    arrays = load.load_numpy("OUT")     # {name: numpy.ndarray}; BF16 as uint16 bits

manifest.json lists every tensor: name, dtype (safetensors names), shape,
file (relative to this directory) and bytes.
"""

import json
import os

import numpy as np

_NUMPY = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}


def manifest(root):
    with open(os.path.join(root, "manifest.json")) as f:
        return json.load(f)["tensors"]


def load_numpy(root, mmap=True):
    out = {}
    for t in manifest(root):
        path = os.path.join(root, t["file"])
        dtype = np.dtype(_NUMPY[t["dtype"]])
        if mmap and t["bytes"] > 0:
            a = np.memmap(path, dtype=dtype, mode="r")
        else:
            a = np.fromfile(path, dtype=dtype)
        out[t["name"]] = a.reshape(t["shape"])
    return out


def load(root):
    import torch

    out = {}
    for name, a in load_numpy(root, mmap=False).items():
        if a.dtype == np.uint16 and _is_bf16(root, name):
            out[name] = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        else:
            out[name] = torch.from_numpy(a)
    return out


def _is_bf16(root, name, _cache={}):
    if root not in _cache:
        _cache[root] = {t["name"]: t["dtype"] for t in manifest(root)}
    return _cache[root][name] == "BF16"
