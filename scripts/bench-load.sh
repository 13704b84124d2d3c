#!/usr/bin/env bash
# Load speed through the mount against the plain files (issue 11), one table of
# every row, then the codec rows the mount depends on:
#   1. scripts/bench_load.py: cold safe_open (numpy, torch), the numpy load
#      again with the disk limited to DISK_MBPS (default 1000,400 MB/s, via a
#      blkio/io cgroup), the numpy loads with the daemon pinned to one core
#      (scaling to more cores reads as the pinned row against the unpinned),
#      AutoModel, two processes, dd cold/warm; every cold row shows the
#      daemon's CPU-seconds per GB;
#   2. scripts/bench-codec.sh at 1 and 2 threads (ckptfs vs ZipNN 0.5.4, zstd, z4ai);
#   3. scripts/bench_files.py: ckptfs pack/unpack as processes, file to file, vs ZipNN;
#   4. scripts/bench-decode.sh (ckptfs unpack vs z4ai's decoder on a z4ai file).
# Medians of RUNS runs (default 3). Needs root (drop_caches, mounts).
# Usage: scripts/bench-load.sh [WORKDIR]   (default /tmp/ckptfs-bench-load)
# CKPTFS_BIN=PATH measures another build of ckptfs (e.g. before a change);
# ONLY=load skips the codec rows; ROWS=REGEX runs only the load rows whose
# label matches (e.g. ROWS='2 shards, .zstn store$|AutoModel').
# Each mounted row also shows the daemon's FUSE reads, their median size and
# the blocks it decoded per block stored (its `user.ckptfs.stats` counters).
set -euo pipefail
cd "$(dirname "$0")/.."
W="$(realpath -m "${1:-/tmp/ckptfs-bench-load}")"
bash scripts/setup-test-env.sh >/dev/null
.venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements-bench.txt
cargo build --locked --release -q
BIN="$(realpath "${CKPTFS_BIN:-${CARGO_TARGET_DIR:-target}/release/ckptfs}")"
echo "## Loads through the mount"
.venv/bin/python scripts/bench_load.py "$BIN" "$W" --runs "${RUNS:-3}" \
  --disk-mbps "${DISK_MBPS-1000,400}"
[ "${ONLY:-}" = load ] && exit 0
for t in 1 2; do
  echo "## Codec, $t thread(s)"
  THREADS=$t bash scripts/bench-codec.sh "$W/codec"
done
echo "## File to file: ckptfs pack/unpack processes against ZipNN"
.venv/bin/python scripts/bench_files.py "$BIN" "$W/codec/minilm-bf16.safetensors" \
  "$W/codec/minilm-fp16.safetensors" "$W/codec/minilm-fp32.safetensors" \
  "$W/codec/llama-bf16.safetensors" --runs "${RUNS:-3}" --threads 2
echo "## z4ai-written .zstn"
bash scripts/bench-decode.sh "$W/codec"
