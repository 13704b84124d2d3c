#!/usr/bin/env bash
# The main job on the example store: find or build ckptfs, inspect the archive, mount the
# store, read the presented .safetensors through the mount and check it byte for byte.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v fusermount3 >/dev/null 2>&1; then
  echo "== installing fuse3 (fusermount3)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3
fi
# The ckptfs that README's install line put on PATH, if there is one;
# otherwise this checkout's release build (cargo builds it once and
# afterwards only checks it is up to date). CKPTFS_BIN picks another.
if [ -n "${CKPTFS_BIN:-}" ]; then
  B=$CKPTFS_BIN
elif B=$(command -v ckptfs); then
  echo "== using the installed $B"
else
  echo "== building ckptfs (release; the first build takes a few minutes)"
  cargo build --locked --release -q
  B=target/release/ckptfs
fi
STORE=examples/store
echo "== ckptfs info $STORE/tiny-llama/model.zstn"
$B info --summary "$STORE/tiny-llama/model.zstn"
MNT=$(mktemp -d /tmp/ckptfs-demo.XXXXXX)
cleanup() { $B umount "$MNT" >/dev/null 2>&1 || true; rmdir "$MNT" 2>/dev/null || true; }
trap cleanup EXIT
echo "== ckptfs mount --read-only $STORE $MNT (the demo only reads: the example store stays as committed)"
$B mount --read-only "$STORE" "$MNT"
echo "== ls -l (logical sizes) and du (bytes on disk) through the mount"
ls -l "$MNT/tiny-llama"
du -h --apparent-size "$MNT/tiny-llama/model.safetensors" | sed 's/^/apparent: /'
du -h "$MNT/tiny-llama/model.safetensors" | sed 's/^/on disk:  /'
echo "== reading model.safetensors through the mount"
got=$(sha256sum "$MNT/tiny-llama/model.safetensors" | cut -c1-64)
want=$(cat examples/tiny-llama.safetensors.sha256)
echo "sha256 through the mount: $got"
echo "sha256 of the original:   $want"
[ "$got" = "$want" ] || { echo "MISMATCH"; exit 1; }
if command -v getfattr >/dev/null 2>&1; then getfattr -d -m 'user.ckptfs' "$MNT/tiny-llama/model.safetensors" || true; fi
echo "== ckptfs umount $MNT"
$B umount "$MNT"
trap - EXIT
rmdir "$MNT"
echo "demo OK: the mounted file is byte-identical to the original"
