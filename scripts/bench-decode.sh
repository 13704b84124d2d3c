#!/usr/bin/env bash
# Decode speed of a z4ai-written .zstn: `ckptfs unpack` against z4ai 0.2.0's own
# decompress_file, same file, same machine, same run. The file is a ~335 MB bf16
# llama-like checkpoint (embedding + 2 layers) compressed by z4ai with default settings.
# Both write their output to OUTDIR (default /dev/shm, a tmpfs) so that the figure is
# decoding, not this VM's disk; ckptfs still fsyncs and renames its output.
# Prints medians of RUNS runs (default 3). Usage: scripts/bench-decode.sh [WORKDIR] [OUTDIR]
# CKPTFS_BIN=PATH measures another build of ckptfs (e.g. before a change).
set -euo pipefail
cd "$(dirname "$0")/.."
W="${1:-/tmp/ckptfs-bench}"
RUNS="${RUNS:-3}"
OUT="${2:-/dev/shm}"
bash scripts/setup-test-env.sh >/dev/null
cargo build --locked --release -q
PY=.venv/bin/python
BIN="$(realpath "${CKPTFS_BIN:-${CARGO_TARGET_DIR:-target}/release/ckptfs}")"
$PY scripts/make_bench_files.py "$W" --only llama --layers 2 --name llama2l-bf16.safetensors
SRC="$W/llama2l-bf16.safetensors"
Z="$W/llama2l-bf16.z4ai.zstn"
[ -f "$Z" ] || $PY -c "import sys, z4ai.safetensors as zs; zs.compress_file(sys.argv[1], sys.argv[2])" "$SRC" "$Z"
$PY - "$SRC" "$Z" "$RUNS" "$OUT" "$BIN" <<'PY'
import os, statistics, subprocess, sys, time
import z4ai.safetensors as zs
src, z, runs, outdir, bin_ = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
size = os.path.getsize(src)
want = open(src, "rb").read()
def run(fn, out):
    ts = []
    for _ in range(runs):
        if os.path.exists(out): os.remove(out)
        subprocess.run(["sync"])
        t = time.perf_counter(); fn(out); ts.append(time.perf_counter() - t)
        assert open(out, "rb").read() == want, out
    os.remove(out)
    return statistics.median(ts)
ck = run(lambda o: subprocess.run([bin_, "unpack", "-q", z, "-o", o], check=True), os.path.join(outdir, "ck.out"))
za = run(lambda o: zs.decompress_file(z, o), os.path.join(outdir, "z4.out"))
print(f"ckptfs {bin_}")
print(f"nproc={os.cpu_count()} file={os.path.basename(src)} {size/1e6:.0f} MB (z4ai .zstn {os.path.getsize(z)/1e6:.0f} MB) runs={runs} output in {outdir}")
print("| decoder | seconds | MB/s (original bytes) |")
print("| --- | ---: | ---: |")
print(f"| ckptfs unpack | {ck:.2f} | {size/1e6/ck:.0f} |")
print(f"| z4ai 0.2.0 decompress_file | {za:.2f} | {size/1e6/za:.0f} |")
print(f"speed-up: {za/ck:.1f}x")
PY
