#!/usr/bin/env bash
# Prints one table: ratio, compression and decompression MB/s for ckptfs, zstd -3,
# ZipNN 0.5.4 and z4ai 0.2.0 on MiniLM (bf16, fp16, fp32) and a ~1 GiB llama-like bf16 file.
# Usage: scripts/bench-codec.sh [WORKDIR]   (default /tmp/ckptfs-bench; files are generated once)
# CODEC_BENCH=PATH measures another build's examples/codec_bench (e.g. before a change).
# A second table times `ckptfs --threads 1 unpack` file to file on tmpfs (default and
# --compat z4ai archives) against ZipNN threads=1 decoding its own file; CKPTFS_BIN=PATH
# times another build's ckptfs (UNPACK_T1=0 skips the table).
set -euo pipefail
cd "$(dirname "$0")/.."
W="${1:-/tmp/ckptfs-bench}"
bash scripts/setup-test-env.sh >/dev/null
.venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements-bench.txt
cargo build --locked --release --example codec_bench --bin ckptfs -q
CB="${CODEC_BENCH:-${CARGO_TARGET_DIR:-target}/release/examples/codec_bench}"
CK="${CKPTFS_BIN:-${CARGO_TARGET_DIR:-target}/release/ckptfs}"
T1=()
if [ "${UNPACK_T1:-1}" != 0 ]; then T1=(--ckptfs "$CK"); fi
.venv/bin/python scripts/make_bench_files.py "$W"
.venv/bin/python scripts/bench_codec.py "$CB" \
  "$W/minilm-bf16.safetensors" "$W/minilm-fp16.safetensors" "$W/minilm-fp32.safetensors" \
  "$W/llama-bf16.safetensors" --runs "${RUNS:-3}" --threads "${THREADS:-2}" "${T1[@]}"
