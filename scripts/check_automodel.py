#!/usr/bin/env python3
"""AutoModel.from_pretrained through the mount loads exactly as from the original directory.

Usage: check_automodel.py ORIGINAL_MODEL_DIR MOUNTED_MODEL_DIR
Loads both with transformers (CPU, offline), compares every parameter and
buffer bit for bit and the embeddings of a fixed input, prints one line, and
exits 1 on any difference. Needs torch and transformers (scripts/requirements-hf.txt,
installed by scripts/setup-test-env.sh).
"""
import os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
import torch
from transformers import AutoModel, AutoTokenizer

orig, mnt = sys.argv[1], sys.argv[2]
a = AutoModel.from_pretrained(orig).eval()
b = AutoModel.from_pretrained(mnt).eval()
sa, sb = a.state_dict(), b.state_dict()
assert sa.keys() == sb.keys(), "parameter names differ"
bad = [k for k in sa if not torch.equal(sa[k], sb[k])]
tok = AutoTokenizer.from_pretrained(mnt)
x = tok(["ckptfs serves compressed checkpoints"], return_tensors="pt")
with torch.no_grad():
    same_out = torch.equal(a(**x).last_hidden_state, b(**x).last_hidden_state)
print(f"{len(sa)} tensors, {len(bad)} differ; outputs identical: {same_out}")
sys.exit(1 if bad or not same_out else 0)
