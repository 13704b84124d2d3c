#!/usr/bin/env bash
# Installs s3s-fs (an S3 server over a directory, in Rust, from crates.io)
# in .tools/bin for scripts/bench-s3.sh, the only user: the tests use
# moto (tests/s3_server.py), so scripts/setup-test-env.sh does not build
# it. 0.14.1 is the last release that builds with rustc 1.95.
# Idempotent: re-running it only checks the installed version.
set -euo pipefail
cd "$(dirname "$0")/.."
S3S_FS=0.14.1
TOOLS="$PWD/.tools"
if ! "$TOOLS/bin/s3s-fs" --version 2>/dev/null | grep -q " $S3S_FS\$"; then
  # --locked: the versions s3s-fs's own Cargo.lock pins.
  nice -n 10 cargo install -q --locked --root "$TOOLS" "s3s-fs@$S3S_FS" --features binary
fi
