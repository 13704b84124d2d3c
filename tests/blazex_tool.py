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
  blazex_tool.py patch BASE.blz TARGET.blz OUT.blzdiff FORMAT [SPLIT_NAME [BAD_NAME]]
      a .blzdiff of file format FORMAT (1: raw blobs; 2: BLXD blobs, the
      encodings taken in turn over the modified tensors so that every open
      one appears: Raw, SparseByte, SparseU16 (2-byte dtypes), FullXor;
      added tensors ZstdOnly). SPLIT_NAME: that tensor's blob is tagged
      SplitStream (4); BAD_NAME: its xxh3_new is off by one ("-" for none).
  blazex_tool.py export ARCHIVE OUT_DIR
      checks magic, version, every tensor's xxh3 and the data SHA-256, then
      writes what `blazex export --to safetensors` writes. Exits 1 with one
      line on any mismatch.
"""
import base64, hashlib, json, os, struct, sys

import xxhash
import zstandard

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
    # blazex's header struct skips members it does not name (ckptfs's
    # header digest, the last member of what it writes or seals).
    keys = [k for k in header if k != "ckptfs_header_xxh3"]
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


def read_archive(path):
    with open(path, "rb") as f:
        buf = f.read()
    assert buf[:8] == MAGIC
    _, hlen = struct.unpack_from("<IQ", buf, 8)
    header = json.loads(buf[20:20 + hlen])
    data = buf[20 + hlen:]
    return header, {t["name"]: (t, data[t["data_offset"]:t["data_offset"] + t["data_len"]])
                    for t in header["tensors"]}


def blxd(code, payload):
    return b"BLXD" + bytes([code]) + payload


def z(b):
    return zstandard.ZstdCompressor(level=9).compress(b)


def sparse(base, target, w, tag):
    n = len(base) // w
    bitmap = bytearray((n + 7) // 8)
    vals = bytearray()
    changed = 0
    for i in range(n):
        a, b = base[i * w:i * w + w], target[i * w:i * w + w]
        if a != b:
            bitmap[i // 8] |= 1 << (i % 8)
            vals += bytes(x ^ y for x, y in zip(a, b))
            changed += 1
    return z(bytes([tag]) + struct.pack("<II", n, changed) + bytes(bitmap) + bytes(vals))


def patch(base_path, target_path, out, fmt, split=None, bad=None):
    fmt = int(fmt)
    _, base = read_archive(base_path)
    theader, target = read_archive(target_path)
    entries, blobs, at, turn = [], [], 0, 0
    for t in theader["tensors"]:
        name, new = t["name"], target[t["name"]][1]
        old = base.get(name)
        if old is not None and old[0]["xxh3"] == t["xxh3"]:
            entries.append({"name": name, "op": "Unchanged", "blob_offset": 0, "blob_len": 0,
                            "xxh3_new": t["xxh3"]})
            continue
        op = "Modified" if old is not None else "Added"
        if fmt == 1:
            blob = new
        elif op == "Added":
            blob = blxd(5, z(new))
        else:
            b = old[1]
            choices = ["raw", "sparse_byte", "full_xor"]
            if len(b) % 2 == 0:
                choices.append("sparse_u16")
            kind = choices[turn % len(choices)]
            turn += 1
            if kind == "raw":
                blob = blxd(0, new)
            elif kind == "sparse_byte":
                blob = blxd(1, sparse(b, new, 1, 0x42))
            elif kind == "sparse_u16":
                blob = blxd(2, sparse(b, new, 2, 0x46))
            else:
                blob = blxd(3, z(bytes(x ^ y for x, y in zip(b, new))))
            if name == split:
                blob = blxd(4, blob[5:])
        xxh = t["xxh3"] + (1 if name == bad else 0)
        entries.append({"name": name, "op": op, "blob_offset": at, "blob_len": len(blob),
                        "xxh3_new": xxh % (1 << 64)})
        blobs.append(blob)
        at += len(blob)
    for name in base:
        if name not in target:
            entries.append({"name": name, "op": "Removed", "blob_offset": 0, "blob_len": 0,
                            "xxh3_new": 0})
    manifest = {"version": 2, "created_at": "1700000000", "target_header": theader,
                "entries": entries}
    m = json.dumps(manifest, indent=2, ensure_ascii=False).encode()
    with open(out, "wb") as f:
        f.write(b"BZXPTCH\n" + struct.pack("<IQ", fmt, len(m)) + m + b"".join(blobs))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "patch":
        args = [None if a == "-" else a for a in args]
    {"pack": pack, "export": export, "patch": patch}[cmd](*args)
