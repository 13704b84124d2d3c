#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine: installs what the tests need
# (fuse3, a Python venv with pinned z4ai/safetensors/numpy), then runs every test.
# Real-mount tests need root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-test-env.sh
cargo fmt --all -- --check
cargo clippy --all-targets -q -- -D warnings
# A wedged mount must fail CI, not hang it.
timeout 1800 cargo test --all-targets -q
