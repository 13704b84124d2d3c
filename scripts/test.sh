#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine: installs what the tests need
# (fuse3, a Python venv with pinned z4ai/safetensors/numpy), then runs every test.
# Real-mount tests need root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
# A fresh clone needs about 7 GB here: the venv with torch, about 5 GB
# (scripts/setup-test-env.sh), and the clippy and test builds, about 1.5 GB
# (Cargo.toml's dev profile keeps debug info small). A full disk fails a run
# at whatever step it reaches first (a linker killed by SIGBUS), so say it up
# front, with the figure.
avail_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "$avail_kb" -lt $((7 * 1024 * 1024)) ]; then
  echo "warning: $((avail_kb / 1024)) MiB free on $(df -P . | awk 'NR == 2 { print $6 }'); a fresh clone's test run needs about 7 GB" >&2
fi
# Incremental compilation data (1.7 GB in a clean test build) only speeds
# up rebuilds after edits; a test run does not need it.
export CARGO_INCREMENTAL=0
# Each step says what it does before it starts and how long it took after,
# so a fresh machine's long first set-up (llama.cpp built from its sdist,
# torch's CUDA wheels downloaded) is not mistaken for a hang.
run_start=$SECONDS
step() {
  local what=$1 t=$SECONDS
  shift
  echo "== $what"
  "$@"
  echo "== $what: done in $((SECONDS - t)) s (total $((SECONDS - run_start)) s)"
}
step "setting up the test environment (first run on a machine: fuse3, a Python venv of about 5 GB with torch, llama.cpp built from source: several minutes)" \
  bash scripts/setup-test-env.sh
step "checking formatting (cargo fmt)" cargo fmt --all -- --check
# --workspace: the Python package's native module (python/) too.
step "linting (cargo clippy; builds the tests)" cargo clippy --locked --workspace --all-targets -q -- -D warnings
# A wedged mount must fail CI, not hang it.
step "running every test (cargo test; about 30 min)" timeout 1800 cargo test --locked --all-targets -q
# The Python package: its native module built into the venv with the dev
# profile and this target directory (the ckptfs crate and its dependencies
# are already compiled: only the binding builds), then its tests, which
# drive the CLI that `cargo test` built.
VENV="${CKPTFS_VENV:-$PWD/.venv}"
step "building the Python package (maturin develop)" \
  env VIRTUAL_ENV="$VENV" "$VENV/bin/maturin" develop --locked -q
step "running the Python package's tests (pytest)" \
  timeout 900 "$VENV/bin/python" -m pytest -q python/tests
