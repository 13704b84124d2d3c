#!/usr/bin/env bash
# Cold load of the 1 GiB llama-like model through `ckptfs mount s3://...`
# (s3s-fs and moto on 127.0.0.1) against the same store mounted from local disk and
# against downloading the plain model with boto3 from the same server, the
# bytes each moved, and the warm load from the disk cache: one table from
# one run (scripts/bench_s3.py). Needs root (drop_caches, mounts).
# Usage: scripts/bench-s3.sh [WORKDIR]   (default /tmp/ckptfs-bench-s3)
set -euo pipefail
cd "$(dirname "$0")/.."
W="$(realpath -m "${1:-/tmp/ckptfs-bench-s3}")"
bash scripts/setup-test-env.sh >/dev/null
# s3s-fs only when it is benchmarked (the tests do not use it).
case " ${BENCH_S3_SERVERS:-s3s-fs moto} " in
  *" s3s-fs "*) bash scripts/install-s3s-fs.sh ;;
esac
[ -n "${CKPTFS_BIN:-}" ] || cargo build --locked --release -q
BIN="$(realpath "${CKPTFS_BIN:-${CARGO_TARGET_DIR:-target}/release/ckptfs}")"
.venv/bin/python scripts/bench_s3.py "$BIN" "$W"
