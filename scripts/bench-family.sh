#!/usr/bin/env bash
# Issue 47's "Checked by": a training run written into a `--delta auto`
# mount as checkpoint families, keeping the last 8 of 13 checkpoints.
#
# The run: a bf16 model of 368 MB (an embedding, 12 blocks of
# attention and MLP weights, norms), fp32 master weights moved each step by
# an Adam-sized update (lr * (0.5..1.5) per element in a direction that
# persists, flipping with probability 0.1 a step, as momentum does;
# LR=5e-5 by default), saved as bf16. Steps 4-6 train the top half only
# (the embedding and the lower blocks frozen: their tensors are COPY);
# checkpoint-9 is sharded (two shards and an index); checkpoint-11 is a
# `torch.save` `pytorch_model.bin` (a plain file to the mount). After
# checkpoint N (N >= 8) is written, `rm -rf checkpoint-(N-8)` runs at once,
# as a trainer's retention does.
#
# Each configuration writes the same run into a fresh store:
#   standalone  AFTER build, no --delta (the baseline of every ratio)
#   before      BEFORE build (an older ckptfs, e.g. one built from the commit
#               before issue 47; only when BEFORE is set), --delta auto
#   after       AFTER build (this tree's release build), --delta auto
# and prints, medians of RUNS (3) where timed: store size of the 8 kept
# checkpoints (vs the same 8 standalone, vs the plain files), each rm -rf's
# time, commit time (close to the archive in STORE; the median over the 13),
# cold load_file (remount, drop caches) of the newest kept and the oldest
# kept model.safetensors and the slowest of all kept ones, each vs the
# same checkpoint in the standalone store.
#
# Usage: scripts/bench-family.sh [WORKDIR]   (root: mounts, drop_caches;
# BEFORE=PATH, AFTER=PATH pick the builds; CONFIGS="standalone after"
# limits the runs; FAMILY_DEPTH=N mounts "after" with --family-depth N;
# the stores, several GB, are removed at the end unless KEEP=1, so a run
# does not leave the disk full for the next build)
set -euo pipefail
cd "$(dirname "$0")/.."
W="$(realpath -m "${1:-/tmp/ckptfs-bench-family}")"
if [ -z "${AFTER:-}" ]; then
  cargo build --locked --release -q
fi
AFTER="$(realpath "${AFTER:-${CARGO_TARGET_DIR:-target}/release/ckptfs}")"
if [ -n "${BEFORE:-}" ]; then
  BEFORE="$(realpath "$BEFORE")"
  DEFAULT_CONFIGS="standalone before after"
else
  BEFORE=none
  DEFAULT_CONFIGS="standalone after"
fi
PY="${CKPTFS_VENV:-.venv}/bin/python"
mkdir -p "$W"
echo "load before: $(uptime)"
"$PY" scripts/bench_family.py "$W" "$BEFORE" "$AFTER" "${RUNS:-3}" "${LR:-5e-5}" \
  "${CONFIGS:-$DEFAULT_CONFIGS}"
echo "load after: $(uptime)"
if [ "${KEEP:-0}" != 1 ]; then
  for c in standalone before after; do
    rm -rf "${W:?}/$c"
  done
  echo "stores removed (KEEP=1 keeps them); results in $W/result.json"
fi
