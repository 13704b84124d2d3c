#!/usr/bin/env python3
"""Unpacks a raw `.blz` archive using nothing but doc/FORMAT.md §3.

Usage: blz_raw_reader.py ARCHIVE OUT_DIR

Checks the prelude, the data-section SHA-256 and every blob's block layout,
then writes every file. Only the standard library: if this script needs more
than the documented layout, the format is not as simple as documented.
"""
import base64, hashlib, json, os, struct, sys


def main(archive, out):
    with open(archive, "rb") as f:
        buf = f.read()
    magic, version, hlen = struct.unpack_from("<8sIQ", buf, 0)
    assert magic == b"CKPTBLZ\0", magic
    assert version == 1, version
    header = json.loads(buf[20:20 + hlen])
    data = memoryview(buf)[20 + hlen:]
    assert len(data) == header["data_length"]
    assert hashlib.sha256(data).hexdigest() == header["data_sha256"]

    def blob(i):
        b = header["blobs"][i]
        assert b["encoding"] == "raw", "not a --raw archive"
        assert b["blocks"][-1]["end"] == b["length"]
        return bytes(data[b["offset"]:b["offset"] + b["length"]])

    for f in header["files"]:
        if f["kind"] == "safetensors":
            h = f["safetensors_header"].encode("utf-8")
            if "data_blob" in f:
                body = blob(f["data_blob"])
            else:
                body = b"".join(blob(t["blob"]) for t in f["tensors"])
            content = struct.pack("<Q", len(h)) + h + body
        elif "text" in f:
            content = f["text"].encode("utf-8")
        elif "base64" in f:
            content = base64.b64decode(f["base64"])
        else:
            content = blob(f["blob"])
        assert len(content) == f["size"], f["path"]
        path = os.path.join(out, *f["path"].split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as g:
            g.write(content)
    print(f"{len(header['files'])} files")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
