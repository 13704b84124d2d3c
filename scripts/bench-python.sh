#!/usr/bin/env bash
# The Python package against safetensors and ZipNN (issue 42): load of the
# 1 GiB bf16 file (scripts/make_bench_files.py), cold (needs root) and warm,
# and save. A release build of the package goes into a directory of its own
# put first on PYTHONPATH for the benchmark only: the venv keeps the
# development build scripts/test.sh installed.
# Usage: scripts/bench-python.sh [RUNS]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${CKPTFS_VENV:-$PWD/.venv}"
TARGET="${CARGO_TARGET_DIR:-target}"
W=/tmp/ckptfs-bench
[ -f "$W/llama-bf16.safetensors" ] || "$VENV/bin/python" scripts/make_bench_files.py "$W"
cargo build --locked --release -q --bin ckptfs
wheels="$(mktemp -d)"
pkg=/tmp/ckptfs-bench-python-pkg
env VIRTUAL_ENV="$VENV" "$VENV/bin/maturin" build --release --locked -q -o "$wheels"
rm -rf "$pkg"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --target "$pkg" "$wheels"/ckptfs-*.whl
rm -rf "$wheels"
uptime
PYTHONPATH="$pkg" "$VENV/bin/python" scripts/bench_python.py "$TARGET/release/ckptfs" \
  "$W/llama-bf16.safetensors" --runs "${1:-5}"
uptime
