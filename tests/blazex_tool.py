#!/usr/bin/env python3
"""An independent BLAZE-X `.blz` v1 writer and reader, from the layout alone.

Written from ../shared/blazex-format.md (doc/FORMAT.md §5), not from ckptfs's
code: the tests use it to make BLAZE-X archives as `blazex pack` would and to
read what `ckptfs pack --format blazex` writes. Standard library plus
`xxhash`.

Usage:
  blazex_tool.py pack MODEL_DIR OUT.blz
      tensors of every *.safetensors in MODEL_DIR (files in sorted name
      order, tensors in sorted name order within a file), config.json as
      model_config, tokenizer.json verbatim, the sidecars blazex embeds.
  blazex_tool.py export ARCHIVE OUT_DIR
      checks magic, version, every tensor's xxh3 and the data SHA-256, then
      writes what `blazex export --to safetensors` writes. Exits 1 with one
      line on any mismatch.
"""
import base64, hashlib, json, os, struct, sys

import xxhash

MAGIC = b"BLAZXPK\n"
DTYPES = {"F32": ("f32", 4), "F16": ("f16", 2), "BF16": ("bf16", 2), "I8": ("i8", 1),
          "I32": ("i32", 4), "I64": ("i64", 8), "U8": ("u8", 1), "U16": ("u16", 2),
          "U32": ("u32", 4), "BOOL": ("bool", 1)}
SIDECARS = ["tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
            "generation_config.json", "vocab.json", "merges.txt"]


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(buf[8:8 + n])
    header.pop("__metadata__", None)
    data = buf[8 + n:]
    for name in sorted(header):
        e = header[name]
        a, b = e["data_offsets"]
        yield name, e["dtype"], e["shape"], data[a:b]


def pack(model_dir, out):
    tensors, chunks, at = [], [], 0
    sha = hashlib.sha256()
    for fname in sorted(os.listdir(model_dir)):
        if not fname.endswith(".safetensors"):
            continue
        for name, dtype, shape, raw in read_safetensors(os.path.join(model_dir, fname)):
            tensors.append({"name": name, "dtype": DTYPES[dtype][0], "shape": shape,
                            "data_offset": at, "data_len": len(raw),
                            "xxh3": xxhash.xxh3_64_intdigest(raw)})
            chunks.append(raw)
            sha.update(raw)
            at += len(raw)

    def read(name, mode="rb"):
        p = os.path.join(model_dir, name)
        if not os.path.isfile(p):
            return None
        with open(p, mode) as f:
            return f.read()

    config = read("config.json", "r")
    header = {
        "version": 1,
        "created_at": "1700000000",
        "model_config": json.loads(config) if config is not None else None,
        "tokenizer": read("tokenizer.json", "r"),
        "sidecar_files": [
            {"filename": s, "content_b64": base64.b64encode(read(s)).decode()}
            for s in SIDECARS if read(s) is not None
        ],
        "tensors": tensors,
        "data_sha256": sha.hexdigest(),
    }
    hjson = json.dumps(header, indent=2, ensure_ascii=False).encode()
    with open(out, "wb") as f:
        f.write(MAGIC + struct.pack("<IQ", 1, len(hjson)) + hjson)
        for c in chunks:
            f.write(c)


def fail(msg):
    print(f"blazex_tool: {msg}", file=sys.stderr)
    sys.exit(1)


def export(archive, out):
    with open(archive, "rb") as f:
        buf = f.read()
    if buf[:8] != MAGIC:
        fail(f"bad magic {buf[:8]!r}")
    version, hlen = struct.unpack_from("<IQ", buf, 8)
    if version != 1:
        fail(f"version {version}")
    header = json.loads(buf[20:20 + hlen])
    keys = list(header)
    want = ["version", "created_at", "model_config", "tokenizer", "sidecar_files",
            "tensors", "data_sha256"]
    if keys != want:
        fail(f"header members {keys}, expected {want}")
    data = memoryview(buf)[20 + hlen:]
    names = {v[0]: (k, v[1]) for k, v in DTYPES.items()}
    blobs = []
    for t in header["tensors"]:
        raw = bytes(data[t["data_offset"]:t["data_offset"] + t["data_len"]])
        if len(raw) != t["data_len"]:
            fail(f"tensor {t['name']}: truncated")
        if xxhash.xxh3_64_intdigest(raw) != t["xxh3"]:
            fail(f"tensor {t['name']}: xxh3 mismatch")
        n = 1
        for d in t["shape"]:
            n *= d
        if n * names[t["dtype"]][1] != len(raw):
            fail(f"tensor {t['name']}: length does not match dtype and shape")
        blobs.append(raw)
    end = 0
    if header["tensors"]:
        last = header["tensors"][-1]
        end = last["data_offset"] + last["data_len"]
    if hashlib.sha256(data[:end]).hexdigest() != header["data_sha256"]:
        fail("data_sha256 mismatch")
    os.makedirs(out, exist_ok=True)
    st, at = {}, 0
    for t, raw in zip(header["tensors"], blobs):
        st[t["name"]] = {"data_offsets": [at, at + len(raw)],
                         "dtype": names[t["dtype"]][0], "shape": t["shape"]}
        at += len(raw)
    h = json.dumps(st, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for raw in blobs:
            f.write(raw)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(header["model_config"], f, indent=2, sort_keys=True, ensure_ascii=False)
    if header["tokenizer"] is not None:
        with open(os.path.join(out, "tokenizer.json"), "w") as f:
            f.write(header["tokenizer"])
    for s in header["sidecar_files"]:
        with open(os.path.join(out, os.path.basename(s["filename"])), "wb") as f:
            f.write(base64.b64decode(s["content_b64"], validate=True))
    print(f"{len(blobs)} tensors, {at} bytes, all xxh3 and the data SHA-256 match")


if __name__ == "__main__":
    cmd, a, b = sys.argv[1:4]
    {"pack": pack, "export": export}[cmd](a, b)
