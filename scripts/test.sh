#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine: installs what the tests need
# (fuse3, a Python venv with pinned z4ai/safetensors/numpy), then runs every test.
# Real-mount tests need root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
# A fresh clone needs about 15 GB here (the venv with torch, about 6 GB; the
# debug and test builds, about 8 GB). A full disk fails a run at whatever
# step it reaches first, so say it up front, with the figure.
avail_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "$avail_kb" -lt $((15 * 1024 * 1024)) ]; then
  echo "warning: $((avail_kb / 1024)) MiB free on $(df -P . | awk 'NR == 2 { print $6 }'); a fresh clone's test run needs about 15 GB" >&2
fi
bash scripts/setup-test-env.sh
cargo fmt --all -- --check
cargo clippy --all-targets -q -- -D warnings
# A wedged mount must fail CI, not hang it.
timeout 1800 cargo test --all-targets -q
