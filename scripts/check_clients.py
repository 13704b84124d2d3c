#!/usr/bin/env python3
"""One client load, for scripts/check-clients.sh.

Usage: check_clients.py CLIENT WHERE
  CLIENT  safetensors | transformers | sentence-transformers | fastsafetensors
          | runai-model-streamer | huggingface_hub
  WHERE   a model directory, or hf:CACHE (the repo ckptfs/minilm in the
          huggingface_hub cache CACHE, loaded with HF_HUB_OFFLINE=1)

Prints one line: the load time in seconds and the sha256 of what was loaded
(every tensor's name and bytes in name order, or the embeddings). The caller
compares digests with the same client's load of the plain files.
"""
import hashlib
import os
import sys
import time

client, where = sys.argv[1], sys.argv[2]
repo = None
if where.startswith("hf:"):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_CACHE"] = where[3:]
    repo = "ckptfs/minilm"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import torch  # noqa: E402

torch.set_num_threads(2)


def model_dir():
    if repo is None:
        return where
    from huggingface_hub import snapshot_download

    return snapshot_download(repo, local_files_only=True)


def digest_tensors(items):
    h = hashlib.sha256()
    for k, t in sorted(items, key=lambda kv: kv[0]):
        h.update(k.encode())
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


t0 = time.perf_counter()
if client == "safetensors":
    from safetensors import safe_open

    with safe_open(os.path.join(model_dir(), "model.safetensors"), "pt") as f:
        d = digest_tensors([(k, f.get_tensor(k)) for k in f.keys()])
elif client == "transformers":
    from transformers import AutoModel

    m = AutoModel.from_pretrained(repo or where)
    d = digest_tensors(m.state_dict().items())
elif client == "sentence-transformers":
    from sentence_transformers import SentenceTransformer

    m = SentenceTransformer(repo or where, device="cpu")
    e = m.encode(["ckptfs serves compressed checkpoints", "as ordinary files"])
    d = hashlib.sha256(e.tobytes()).hexdigest()
elif client == "fastsafetensors":
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
    loader.add_filenames({0: [os.path.join(model_dir(), "model.safetensors")]})
    fb = loader.copy_files_to_device()
    d = digest_tensors([(k, fb.get_tensor(k)) for k in loader.get_keys()])
    fb.close()
    loader.close()
elif client == "runai-model-streamer":
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as s:
        s.stream_file(os.path.join(model_dir(), "model.safetensors"))
        d = digest_tensors([(k, t.clone()) for k, t in s.get_tensors()])
elif client == "huggingface_hub":
    if repo is None:
        path = os.path.join(where, "model.safetensors")
    else:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo, "model.safetensors", local_files_only=True)
    with open(path, "rb") as f:
        d = hashlib.sha256(f.read()).hexdigest()
else:
    sys.exit(f"unknown client {client}")
print(f"{time.perf_counter() - t0:.3f} {d}")
