#!/usr/bin/env python3
"""Checkpoint families (issue 47): see scripts/bench-family.sh for what is
measured and how. Usage: bench_family.py WORKDIR BEFORE AFTER RUNS LR CONFIGS"""
import json, os, shutil, statistics, subprocess, sys, tempfile, time

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

W, BEFORE, AFTER, RUNS, LR, CONFIGS = sys.argv[1:7]
RUNS, LR, CONFIGS = int(RUNS), float(LR), CONFIGS.split()
STEPS, KEEP = 13, 8
FROZEN = {4, 5, 6}  # steps that train the top half only
SHARDED, TORCH_BIN = 9, 11
PY = sys.executable


def sh(*a):
    return subprocess.run(a, check=True, capture_output=True, text=True).stdout


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def shapes():
    d, ff, vocab, blocks = 1024, 4096, 32000, 12
    out = [("model.embed_tokens.weight", (vocab, d))]
    for i in range(blocks):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (d,)),
            (p + "self_attn.q_proj.weight", (d, d)),
            (p + "self_attn.k_proj.weight", (d, d)),
            (p + "self_attn.v_proj.weight", (d, d)),
            (p + "self_attn.o_proj.weight", (d, d)),
            (p + "post_attention_layernorm.weight", (d,)),
            (p + "mlp.up_proj.weight", (ff, d)),
            (p + "mlp.down_proj.weight", (d, ff)),
        ]
    out += [("model.norm.weight", (1024,))]
    return out


class Model:
    def __init__(self):
        self.rng = np.random.default_rng(47)
        self.w, self.dir = {}, {}
        for n, s in shapes():
            if "norm" in n:
                self.w[n] = np.ones(s, np.float32)
            else:
                self.w[n] = (self.rng.standard_normal(s, np.float32) * 0.02).astype(np.float32)

    def step(self, k):
        """An Adam-sized step: lr * (0.5..1.5) per element, in a direction
        that persists (momentum): each element's sign flips with
        probability 0.1 per step."""
        for n, v in self.w.items():
            if k in FROZEN and ("embed" in n or any(f"layers.{i}." in n for i in range(6))):
                continue
            if n not in self.dir:
                self.dir[n] = self.rng.integers(0, 2, v.shape, dtype=np.int8) * 2 - 1
            flip = self.rng.random(v.shape, np.float32) < 0.1
            self.dir[n][flip] *= -1
            u = self.rng.random(v.shape, np.float32) + 0.5
            v -= (LR * u * self.dir[n]).astype(np.float32)

    def bf16(self):
        return {n: v.astype(ml_dtypes.bfloat16).view(np.uint16) for n, v in self.w.items()}


def st_bytes(tensors):
    """A .safetensors of bf16 tensors (uint16 views), in memory."""
    header, off, parts = {}, 0, []
    for n, v in tensors.items():
        b = v.tobytes()
        header[n] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        parts.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + b"".join(parts)


def checkpoint_files(model, k):
    """{name: bytes} of checkpoint-k."""
    t = model.bf16()
    files = {"config.json": json.dumps({"step": k, "hidden_size": 1024}).encode()}
    if k == SHARDED:
        names = list(t)
        half = len(names) // 2
        parts = [names[:half], names[half:]]
        idx = {"metadata": {}, "weight_map": {}}
        for i, ns in enumerate(parts):
            fn = f"model-{i + 1:05d}-of-00002.safetensors"
            files[fn] = st_bytes({n: t[n] for n in ns})
            for n in ns:
                idx["weight_map"][n] = fn
        files["model.safetensors.index.json"] = json.dumps(idx).encode()
    elif k == TORCH_BIN:
        import io, torch

        buf = io.BytesIO()
        torch.save({n: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) for n, v in t.items()}, buf)
        files["pytorch_model.bin"] = buf.getvalue()
    else:
        files["model.safetensors"] = st_bytes(t)
    return files


def spool_busy(store):
    d = os.path.join(store, ".ckptfs-spool")
    try:
        return [n for n in os.listdir(d) if n not in ("writer.lock", "family.pending")]
    except FileNotFoundError:
        return []


def store_bytes(store, dirs=None):
    total = 0
    for root, ds, fs in os.walk(store):
        if ".ckptfs-spool" in root:
            continue
        if dirs is not None and root != store and os.path.relpath(root, store).split("/")[0] not in dirs:
            continue
        total += sum(os.lstat(os.path.join(root, f)).st_size for f in fs)
    return total


def wait_quiet(store, log, quiet=3.0, limit=900):
    """Until the spool is empty and STORE unchanged for `quiet` s."""
    t0, last, since = time.time(), None, time.time()
    while time.time() - t0 < limit:
        pending = os.path.exists(os.path.join(store, ".ckptfs-spool", "family.pending"))
        snap = (tuple(spool_busy(store)) + (("family.pending",) if pending else ()),
                store_bytes(store), log_count(log))
        if snap != last or snap[0]:
            last, since = snap, time.time()
        elif time.time() - since > quiet:
            return
        time.sleep(0.2)


def log_count(log):
    try:
        return open(log).read().count("family settled")
    except FileNotFoundError:
        return 0


class Mounted:
    def __init__(self, binary, store, work, extra=()):
        self.bin, self.store, self.extra = binary, store, list(extra)
        self.mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
        self.log = os.path.join(work, "ckptfs.log")

    def __enter__(self):
        sh(self.bin, "mount", self.store, self.mnt, "--log-file", self.log, *self.extra)
        return self

    def __exit__(self, *exc):
        sh(self.bin, "umount", self.mnt)
        os.rmdir(self.mnt)


LOAD = "import sys,time;from safetensors.torch import load_file;t=time.perf_counter();load_file(sys.argv[1]);print(time.perf_counter()-t)"


def cold_load(binary, store, work, rel):
    ts = []
    for _ in range(RUNS):
        with Mounted(binary, store, work, ["--read-only"]) as m:
            drop_caches()
            ts.append(float(sh(PY, "-c", LOAD, os.path.join(m.mnt, rel))))
    return statistics.median(ts)


def run_config(name):
    binary = BEFORE if name == "before" else AFTER
    work = os.path.join(W, name)
    shutil.rmtree(work, ignore_errors=True)
    store = os.path.join(work, "store")
    os.makedirs(store)
    extra = [] if name == "standalone" else ["--delta", "auto"]
    if name == "after" and os.environ.get("FAMILY_DEPTH"):
        extra += ["--family-depth", os.environ["FAMILY_DEPTH"]]
    model = Model()
    commits, rms, plain = [], {}, {}
    with Mounted(binary, store, work, extra) as m:
        for k in range(STEPS):
            model.step(k)
            files = checkpoint_files(model, k)
            d = os.path.join(m.mnt, f"checkpoint-{k}")
            os.makedirs(d)
            t0 = time.perf_counter()
            for fn, b in files.items():
                with open(os.path.join(d, fn), "wb") as f:
                    f.write(b)
            while spool_busy(store) and any(not n.startswith("rewrite-") for n in spool_busy(store)):
                time.sleep(0.02)
            commits.append(time.perf_counter() - t0)
            plain[k] = sum(len(b) for b in files.values())
            if k >= KEEP:
                old = f"checkpoint-{k - KEEP}"
                t0 = time.perf_counter()
                shutil.rmtree(os.path.join(m.mnt, old))
                rms[old] = time.perf_counter() - t0
            print(f"  {name}: checkpoint-{k} committed in {commits[-1]:.2f} s", file=sys.stderr, flush=True)
        wait_quiet(store, m.log)
    kept = [f"checkpoint-{k}" for k in range(STEPS - KEEP, STEPS)]
    models = [c for c in kept if os.path.exists(os.path.join(store, c, "model.zstn"))
              or os.path.exists(os.path.join(store, c, "model.z4dm"))]
    loads = {c: cold_load(binary, store, work, f"{c}/model.safetensors") for c in models}
    return {
        "store": store_bytes(store, set(kept)),
        "plain": sum(plain[k] for k in range(STEPS - KEEP, STEPS)),
        "commit": statistics.median(commits),
        "commits": commits,
        "rm": rms,
        "loads": loads,
        "newest": kept[-1],
        "oldest": models[0],
        "layout": {c: sorted(os.listdir(os.path.join(store, c))) for c in kept},
    }


def main():
    res = {}
    for c in CONFIGS:
        res[c] = run_config(c)
    base = res.get("standalone")
    print(f"13-step bf16 run ({LR=}), last {KEEP} kept; medians of {RUNS} cold loads")
    for c, r in res.items():
        print(f"\n== {c}")
        print(f"store of the 8 kept: {r['store'] / 1e6:.1f} MB; plain {r['plain'] / 1e6:.1f} MB"
              + (f"; {r['store'] / base['store']:.2f}x the 8 standalone ({base['store'] / 1e6:.1f} MB)"
                 f", {r['store'] / r['plain']:.2f}x plain" if base else ""))
        print("rm -rf: " + ", ".join(f"{k} {v:.3f} s" for k, v in r["rm"].items())
              + (f"; max {max(r['rm'].values()):.3f} s" if r["rm"] else ""))
        sc = base["commit"] if base else None
        print(f"commit (median of 13): {r['commit']:.2f} s" + (f", {r['commit'] / sc:.2f}x standalone" if sc else "")
              + "; each: " + " ".join(f"{t:.1f}" for t in r["commits"]))
        for ck, t in r["loads"].items():
            ref = base["loads"].get(ck) if base else None
            tag = " (newest)" if ck == r["newest"] else (" (oldest kept)" if ck == r["oldest"] else "")
            print(f"cold load_file {ck}{tag}: {t:.2f} s" + (f", {t / ref:.2f}x standalone" if ref else ""))
        print("layout: " + "; ".join(f"{c}: {' '.join(n for n in v if n != 'config.json')}" for c, v in r["layout"].items()))
        if base and r["loads"]:
            worst = max(t / base["loads"][ck] for ck, t in r["loads"].items() if ck in base["loads"])
            print(f"slowest kept vs standalone: {worst:.2f}x")
    json.dump(res, open(os.path.join(W, "result.json"), "w"), indent=1)


main()
