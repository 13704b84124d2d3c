#!/usr/bin/env python3
"""Extract every rANS plane (methods 3/4/5) from the z4ai test vectors.

Uses /work/shared/vectors/ref_decoder.py as the oracle: it decodes every vector
file, and each rANS plane it meets is written to testdata/ as
`<vector>_<idx>_m<method>.bin` (the raw plane payload), with one manifest line
`<file> <method> <orig_len> <fnv1a64 of the decoded plane>` in testdata/planes.txt.
"""
import hashlib, os, sys
VEC = "/work/shared/vectors"
sys.path.insert(0, VEC)
import ref_decoder as rd

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata")
os.makedirs(OUT, exist_ok=True)

def fnv1a64(b):
    h = 0xCBF29CE484222325
    for x in b:
        h ^= x
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h

seen = set()
lines = []
cur = [None, 0]
orig = rd.decode_plane

def spy(method, data, orig_len):
    out = orig(method, data, orig_len)
    if method in (3, 4, 5):
        key = hashlib.sha256(bytes(data)).hexdigest()
        if key not in seen:
            seen.add(key)
            name = f"{cur[0]}_{cur[1]}_m{method}.bin"
            cur[1] += 1
            with open(os.path.join(OUT, name), "wb") as fh:
                fh.write(bytes(data))
            lines.append(f"{name} {method} {orig_len} {fnv1a64(out):016x}")
            print(name, method, orig_len, len(data), flush=True)
    return out

rd.decode_plane = spy
for fn in sorted(os.listdir(VEC)):
    p = os.path.join(VEC, fn)
    src = open(p, "rb").read()
    stem = fn.split(".")[0]
    cur[0], cur[1] = stem, 0
    if fn.endswith(".zstn"):
        rd.decode_zstn(src)
    elif fn.endswith(".z4ai"):
        rd.decode_frame(src)
    elif fn.endswith(".z4dm"):
        base = open(os.path.join(VEC, "finetune.base.safetensors"), "rb").read()
        rd.decode_z4dm(src, base)
    elif fn.endswith(".z4dl"):
        rd.decode_z4dl(src, open(os.path.join(VEC, "delta_plain.ref.bin"), "rb").read())
with open(os.path.join(OUT, "planes.txt"), "w") as fh:
    fh.write("\n".join(lines) + "\n")
