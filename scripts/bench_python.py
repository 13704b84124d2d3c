"""The Python package against safetensors and ZipNN (issue 42), medians of
several runs, each in a fresh process (so a run never finds the previous
one's heap or imports):

- load: ckptfs.torch.load_file of the packed .zstn; safetensors.torch.load_file
  of the plain file; ZipNN's safetensors plugin (zipnn_safetensors(), then
  safetensors.torch.safe_open's get_tensor for every key, what load_file does) on ZipNN's own compressed file; cold (page
  cache dropped before each run: needs root) and warm;
- save: ckptfs.torch.save_file of the tensors vs ZipNN's compress of the same
  tensors (one ZipNN(input_format="torch").compress per tensor, as its plugin
  reads them), and ZipNN's compress plus safetensors' save_file of the result.

Usage: python bench_python.py CKPTFS_BIN FILE.safetensors [--runs N]
Prints a markdown table; times are seconds (a byte of every page read, in
every case), peak is the process's peak RSS growth over the imports (MiB;
it counts the file pages a reader maps, e.g. ckptfs's mapped archive).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, os, resource, sys, time
case, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
import torch, safetensors.torch
if "ckptfs" in case:
    import ckptfs.torch
if "zipnn" in case:
    import zipnn
    from zipnn.util_safetensors import build_compressed_tensor_info, set_compressed_tensors_metadata
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0, m0 = None, rss()
if case == "ckptfs":
    t0 = time.perf_counter(); d = ckptfs.torch.load_file(path)
elif case == "safetensors":
    t0 = time.perf_counter(); d = safetensors.torch.load_file(path)
elif case == "zipnn":
    zipnn.zipnn_safetensors()
    # safetensors 0.8's load_file passes backend=, which ZipNN 0.5.4's
    # SafeOpen does not take: its loop, through the patched safe_open.
    t0 = time.perf_counter()
    with safetensors.torch.safe_open(path, framework="pt") as f:
        d = {k: f.get_tensor(k) for k in f.keys()}
elif case in ("save-ckptfs", "save-zipnn"):
    src = safetensors.torch.load_file(path)
    m0 = rss()
    if case == "save-ckptfs":
        t0 = time.perf_counter(); ckptfs.torch.save_file(src, out); t1 = time.perf_counter()
    else:
        from zipnn.util_safetensors import COMPRESSION_METHOD
        z = zipnn.ZipNN(input_format="torch", method=COMPRESSION_METHOD)
        t0 = time.perf_counter()
        comp, infos = {}, {}
        for k, v in src.items():
            comp[k] = torch.frombuffer(bytearray(z.compress(v)), dtype=torch.uint8)
            infos[k] = build_compressed_tensor_info(v)
        t1 = time.perf_counter()
        meta = {"format": "pt"}
        set_compressed_tensors_metadata(infos, meta)
        safetensors.torch.save_file(comp, out, metadata=meta)
    t2 = time.perf_counter()
    print(json.dumps({"seconds": t2 - t0, "compress": t1 - t0, "peak": rss() - m0,
                      "bytes": os.path.getsize(out)}))
    sys.exit(0)
# safetensors 0.8's load_file returns tensors over its mmap without
# reading them: a byte of every page is read, in every case, so that each
# reader is charged for bringing the data in.
for v in d.values():
    if v.numel():
        v.reshape(-1).view(torch.uint8)[::4096].sum()
t = time.perf_counter() - t0
n = sum(v.numel() * v.element_size() for v in d.values())
print(json.dumps({"seconds": t, "peak": rss() - m0, "bytes": n}))
"""


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def child(case, path, out=""):
    r = subprocess.run([sys.executable, "-c", CHILD, case, path, out], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{case}: {r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("file")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    plain = a.file
    base = plain[: -len(".safetensors")]
    zstn, znn = base + ".zstn", base + ".znn.safetensors"
    if not os.path.exists(zstn):
        subprocess.run([a.cli, "-q", "pack", plain, "-o", zstn, "--force"], check=True)
    if not os.path.exists(znn):
        child("save-zipnn", plain, znn)
    import ckptfs

    print(f"ckptfs {ckptfs.__version__} from {os.path.dirname(ckptfs.__file__)}; "
          f"nproc={os.cpu_count()}; runs={a.runs}; load before: {open('/proc/loadavg').read().split()[:3]}")
    sizes = {p: os.path.getsize(p) for p in (plain, zstn, znn)}
    rows = []
    cold_ok = drop_caches()
    for case, path in (("ckptfs", zstn), ("safetensors", plain), ("zipnn", znn)):
        for temp in ("cold", "warm"):
            if temp == "cold" and not cold_ok:
                continue
            times, peaks = [], []
            if temp == "warm":
                child(case, path)  # fill the page cache
            for _ in range(a.runs):
                if temp == "cold":
                    drop_caches()
                r = child(case, path)
                times.append(r["seconds"])
                peaks.append(r["peak"])
            rows.append((f"load {temp}", case, os.path.basename(path), sizes[path],
                         statistics.median(times), r["bytes"], statistics.median(peaks)))
    for case in ("save-ckptfs", "save-zipnn"):
        times, comp, peaks = [], [], []
        out = f"/tmp/ckptfs-bench-save.{case}"
        for _ in range(a.runs):
            r = child(case, plain, out)
            times.append(r["seconds"])
            comp.append(r["compress"])
            peaks.append(r["peak"])
        n = os.path.getsize(plain)
        label = "ckptfs.torch.save_file" if case == "save-ckptfs" else "ZipNN compress + safetensors save_file"
        rows.append(("save", label, os.path.basename(out), r["bytes"], statistics.median(times), n,
                     statistics.median(peaks)))
        if case == "save-zipnn":
            rows.append(("save", "ZipNN compress only", "-", r["bytes"], statistics.median(comp), n, float("nan")))
        os.remove(out)
    print(f"load after: {open('/proc/loadavg').read().split()[:3]}")
    print("| what | reader/writer | file | file bytes | median s | GB/s (decoded) | peak RSS growth MiB |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for what, who, name, fbytes, s, n, peak in rows:
        print(f"| {what} | {who} | {name} | {fbytes} | {s:.3f} | {n / s / 1e9:.2f} | {peak:.0f} |")


if __name__ == "__main__":
    main()
