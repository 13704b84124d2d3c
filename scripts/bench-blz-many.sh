#!/usr/bin/env bash
# A `.blz` of 10^6 small files (1000 directories of 1000, as `b_1e6_files`
# in tests/hostile.rs): time of `find -maxdepth 1` in the mounted directory
# (1000 lookups), of `ls` of one subdirectory, and of `ckptfs unpack`.
# Prints figures; asserts no timing. Needs root and /dev/fuse for the mount.
#
#   CKPTFS=target/release/ckptfs bash scripts/bench-blz-many.sh
#   UNPACK_TIMEOUT=60 (seconds; an unpack still running then is stopped and
#   the files it wrote are counted)
set -euo pipefail
CKPTFS=${CKPTFS:-target/release/ckptfs}
PY=${PYTHON:-${CKPTFS_VENV:-.venv}/bin/python}
UNPACK_TIMEOUT=${UNPACK_TIMEOUT:-600}
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-blz-many.XXXXXX")
trap 'fusermount3 -u "$work/mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/store" "$work/mnt"

# The archive, written from doc/FORMAT.md §3 (embedded text files, no blob).
"$PY" - "$work/store/b_1e6_files.blz" <<'PY'
import hashlib, json, struct, sys
import xxhash
files = []
for k in range(1_000_000):
    t = f"{k}\n"
    files.append('{"path":"d%03d/f%06d","kind":"file","size":%d,"xxh3":"%016x","text":%s}'
                 % (k // 1000, k, len(t), xxhash.xxh3_64_intdigest(t.encode()), json.dumps(t)))
body = ('{"data_length":0,"data_sha256":"%s","files":[%s],"blobs":[]'
        % (hashlib.sha256(b"").hexdigest(), ",".join(files))).encode()
h = body + b',"header_xxh3":"%016x"}' % xxhash.xxh3_64_intdigest(body)
with open(sys.argv[1], "wb") as f:
    f.write(b"CKPTBLZ\0" + struct.pack("<IQ", 1, len(h)) + h)
PY
echo "archive: $(stat -c %s "$work/store/b_1e6_files.blz") bytes, 10^6 files"

secs() { local t0=$(date +%s%N); "$@" >/dev/null; awk -v d=$(( $(date +%s%N) - t0 )) 'BEGIN { printf "%.2f", d / 1e9 }'; }

"$CKPTFS" mount "$work/store" "$work/mnt" --read-only
ls "$work/mnt" >/dev/null
echo "first ls of the directory (opens the archive): $(secs ls "$work/mnt/b_1e6_files") s"
echo "find -maxdepth 1 (1000 lookups):              $(secs find "$work/mnt/b_1e6_files" -maxdepth 1) s"
echo "ls -l d500 (1000 lookups in a subdirectory):  $(secs ls -l "$work/mnt/b_1e6_files/d500") s"
fusermount3 -u "$work/mnt"

t0=$(date +%s%N)
if timeout "$UNPACK_TIMEOUT" "$CKPTFS" unpack "$work/store/b_1e6_files.blz" -o "$work/out" >/dev/null 2>&1; then
    echo "unpack: $(awk -v d=$(( $(date +%s%N) - t0 )) 'BEGIN { printf "%.1f", d / 1e9 }') s, $(find "$work/out" -type f | wc -l) files"
else
    n=$(find "$work" -path "$work/store" -prune -o -path "$work/mnt" -prune -o -type f -print | wc -l)
    echo "unpack: stopped after ${UNPACK_TIMEOUT} s with $n of 1000000 files written"
fi
