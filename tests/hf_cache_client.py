#!/usr/bin/env python3
"""huggingface_hub's own cache code against a local Hub, for tests/mount_hf_cache.rs.

Usage:
  hf_cache_client.py make SRC            a tiny bf16 BERT saved with save_pretrained
  hf_cache_client.py download SRC CACHE [REPO]
                                         serve SRC as repo REPO (ckptfs/tiny-bert)
                                         on 127.0.0.1 and hf_hub_download every
                                         file into CACHE (HF_HUB_CACHE layout)
  hf_cache_client.py load SRC CACHE      HF_HUB_OFFLINE=1: from_pretrained(repo id)
                                         from CACHE equals from_pretrained(SRC)

The server answers HEAD and GET of /{repo}/resolve/{rev}/{file} with the
headers the Hub sends: X-Repo-Commit, ETag (the git blob id of a regular
file), and for LFS files (*.safetensors) X-Linked-Etag (the sha256 of the
content) and X-Linked-Size. It listens on loopback only, serves a bounded
number of requests and stops with the download.
"""
import hashlib
import http.server
import json
import os
import sys
import threading

REPO = "ckptfs/tiny-bert"
COMMIT = "c0ffee" + "0" * 28 + "123456"


def make(src):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=4000, hidden_size=128, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=512,
                     max_position_embeddings=64)
    model = BertModel(cfg).to(torch.bfloat16)
    model.save_pretrained(src)


def files_of(src):
    out = {}
    for root, dirs, names in os.walk(src):
        dirs.sort()
        for n in sorted(names):
            path = os.path.join(root, n)
            name = os.path.relpath(path, src)
            with open(path, "rb") as f:
                data = f.read()
            lfs = name.endswith(".safetensors")
            git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            out[name] = (data, lfs, git, hashlib.sha256(data).hexdigest())
    return out


def download(src, cache, repo=REPO):
    files = files_of(src)
    served = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self, body):
            parts = self.path.split("?")[0].strip("/").split("/")
            # {owner}/{name}/resolve/{rev}/{path}
            if len(parts) < 5 or "/".join(parts[:2]) != repo or parts[2] != "resolve" \
                    or "/".join(parts[4:]) not in files:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            name = "/".join(parts[4:])
            data, lfs, git, sha = files[name]
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Repo-Commit", COMMIT)
            if lfs:
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
            else:
                self.send_header("ETag", f'"{git}"')
            self.end_headers()
            if body:
                self.wfile.write(data)
                served.append(name)

        def do_HEAD(self):
            self.answer(False)

        def do_GET(self):
            self.answer(True)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{srv.server_address[1]}"
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_ETAG_TIMEOUT"] = "30"
    from huggingface_hub import hf_hub_download

    try:
        for name in files:
            p = hf_hub_download(repo, name, cache_dir=cache)
            with open(p, "rb") as f:
                assert f.read() == files[name][0], f"{name}: bytes differ after download"
    finally:
        srv.shutdown()
    # What a test checks in STORE: blob names of each file, the commit.
    print(json.dumps({"commit": COMMIT, "served": served,
                      "blobs": {n: (v[3] if v[1] else v[2]) for n, v in files.items()}}))


def load(src, cache):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_CACHE"] = cache
    import torch
    from transformers import AutoModel

    a = AutoModel.from_pretrained(src).eval()
    b = AutoModel.from_pretrained(REPO).eval()
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys(), "parameter names differ"
    bad = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert sa["embeddings.word_embeddings.weight"].dtype == torch.bfloat16
    print(f"{len(sa)} tensors from the cache, {len(bad)} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"make": make, "download": download, "load": load}[cmd](*args)
