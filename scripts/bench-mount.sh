#!/usr/bin/env bash
# Read performance of `ckptfs mount` on a generated ~1 GiB bf16 llama-like
# checkpoint, against the raw file on disk and squashfuse on a zstd squashfs
# image of the same file, all measured in the same run. Prints one table of
# medians over RUNS runs (default 3). Needs root (drop_caches, mounts),
# squashfs-tools, squashfuse and fio.
#
# Rows: cold sequential read (dd bs=1M after a remount and drop_caches),
# warm re-read (page cache), random 64 KiB O_DIRECT reads (fio, 10 s), and
# cold safetensors safe_open + get_tensor of every tensor (numpy).
#
# Usage: scripts/bench-mount.sh [WORKDIR]
# CKPTFS_BIN=PATH measures another build of ckptfs (e.g. before a change).
set -euo pipefail
cd "$(dirname "$0")/.."
W="$(realpath -m "${1:-/tmp/ckptfs-bench-mount}")"
RUNS="${RUNS:-3}"
for t in mksquashfs squashfuse fio; do
  command -v $t >/dev/null || { echo "bench-mount: $t is required" >&2; exit 1; }
done
bash scripts/setup-test-env.sh >/dev/null
cargo build --locked --release -q
BIN="${CKPTFS_BIN:-${CARGO_TARGET_DIR:-target}/release/ckptfs}"
PY=.venv/bin/python
mkdir -p "$W/raw" "$W/store" "$W/mnt-ckptfs" "$W/mnt-squash"
$PY scripts/make_bench_files.py "$W/raw" --only llama >/dev/null
SRC="$W/raw/llama-bf16.safetensors"
[ -f "$W/store/llama-bf16.zstn" ] || "$BIN" pack -q "$SRC" -o "$W/store/llama-bf16.zstn"
[ -f "$W/llama.sqfs" ] || mksquashfs "$W/raw" "$W/llama.sqfs" -comp zstd -quiet -noappend >/dev/null
exec $PY - "$W" "$BIN" "$RUNS" <<'PY'
import json, os, statistics, subprocess, sys, time
W, BIN, RUNS = sys.argv[1], sys.argv[2], int(sys.argv[3])
SRC = f"{W}/raw/llama-bf16.safetensors"
SIZE = os.path.getsize(SRC)
CK, SQ = f"{W}/mnt-ckptfs", f"{W}/mnt-squash"
FILES = {
    "raw file (ext4)": SRC,
    "ckptfs": f"{CK}/llama-bf16.safetensors",
    "squashfuse (zstd)": f"{SQ}/llama-bf16.safetensors",
}

def sh(*a, **k):
    return subprocess.run(a, check=True, capture_output=True, text=True, **k).stdout

def mounted(p):
    return any(l.split()[4] == p for l in open("/proc/self/mountinfo"))

def unmount_all():
    if mounted(CK):
        sh(BIN, "umount", CK)
        while mounted(CK): time.sleep(0.05)
    if mounted(SQ):
        sh("umount", SQ)

def remount():
    unmount_all()
    time.sleep(0.3)  # let the old daemon exit
    sh(BIN, "mount", f"{W}/store", CK, "--cache-size", "1G", "--log-file", f"{W}/ckptfs.log")
    sh("squashfuse", f"{W}/llama.sqfs", SQ)

def drop_caches():
    sh("sync")
    with open("/proc/sys/vm/drop_caches", "w") as f: f.write("3\n")

def dd(path):
    t = time.perf_counter()
    sh("dd", f"if={path}", "of=/dev/null", "bs=1M")
    return SIZE / (time.perf_counter() - t) / 1e9

def fio(path):
    out = sh("fio", "--name=r", f"--filename={path}", "--rw=randread", "--bs=64k", "--direct=1",
             "--ioengine=psync", "--runtime=10", "--time_based", "--readonly", "--output-format=json")
    return json.loads(out)["jobs"][0]["read"]["bw_bytes"] / 1e9

LOAD = ("import sys,time,ml_dtypes\nfrom safetensors import safe_open\nt=time.perf_counter()\n"
        "with safe_open(sys.argv[1],framework='numpy') as f:\n"
        "    for k in f.keys(): f.get_tensor(k)\nprint(time.perf_counter()-t)\n")

def load(path):
    return float(sh(sys.executable, "-c", LOAD, path))

res = {k: {"cold": [], "warm": [], "rand": [], "load": []} for k in FILES}
try:
    for _ in range(RUNS):
        for name, path in FILES.items():
            remount(); drop_caches()
            res[name]["cold"].append(dd(path))
            dd(path)  # warm the page cache
            res[name]["warm"].append(dd(path))
            res[name]["rand"].append(fio(path))
            remount(); drop_caches()
            res[name]["load"].append(load(path))
finally:
    unmount_all()

med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in res.items()}
raw = med["raw file (ext4)"]
print(f"\nfile: {SRC} ({SIZE/1e9:.2f} GB bf16), stored {os.path.getsize(W + '/store/llama-bf16.zstn')/1e9:.2f} GB "
      f"as .zstn, {os.path.getsize(W + '/llama.sqfs')/1e9:.2f} GB as squashfs; median of {RUNS} runs; {os.cpu_count()} cores\n")
print("| measure | raw file (ext4) | ckptfs | squashfuse (zstd) | ckptfs vs raw |")
print("| --- | --- | --- | --- | --- |")
rows = [("cold sequential read (dd bs=1M)", "cold", "{:.2f} GB/s", lambda c, r: f"{c/r:.0%}"),
        ("warm re-read (page cache)", "warm", "{:.2f} GB/s", lambda c, r: f"{c/r:.0%}"),
        ("random 64 KiB O_DIRECT reads (fio)", "rand", "{:.3f} GB/s", lambda c, r: f"{c/r:.0%}"),
        ("cold safe_open, get_tensor of all", "load", "{:.2f} s", lambda c, r: f"{c/r:.2f}x")]
for label, key, fmt, rel in rows:
    cells = [fmt.format(med[n][key]) for n in FILES]
    print(f"| {label} | " + " | ".join(cells) + f" | {rel(med['ckptfs'][key], raw[key])} |")
PY
