#!/usr/bin/env bash
# Writing a checkpoint through a writable `ckptfs mount s3://...` (moto on
# 127.0.0.1) against a plain boto3 upload of the same file, same run
# (scripts/bench_s3_write.py). Needs root (a mount).
# Usage: scripts/bench-s3-write.sh [WORKDIR] [SIZE_MB]
#        (default /tmp/ckptfs-bench-s3-write, 256)
set -euo pipefail
cd "$(dirname "$0")/.."
W="$(realpath -m "${1:-/tmp/ckptfs-bench-s3-write}")"
bash scripts/setup-test-env.sh >/dev/null
[ -n "${CKPTFS_BIN:-}" ] || cargo build --locked --release -q
BIN="$(realpath "${CKPTFS_BIN:-${CARGO_TARGET_DIR:-target}/release/ckptfs}")"
.venv/bin/python scripts/bench_s3_write.py "$BIN" "$W" "${2:-256}"
