#!/usr/bin/env bash
# Issue 14's "Checked by": checkpoint deltas on real fine-tuning sequences
# (scripts/delta_fixtures.py: all-MiniLM-L6-v2 trained with torch on the
# CPU, bf16 and fp32 steps, last-layers-only, a re-upload, renamed/added/
# removed/reshaped tensors, a third of the tensors changed).
#
# Per pair (base -> target), stored bytes of:
#   zstn        a standalone archive:  ckptfs pack TARGET -o X.zstn
#   ckptfs-d    ckptfs's delta:        ckptfs pack TARGET --base BASE -o X.z4dm
#   z4ai-md     z4ai.model_delta.compress(target, base)       (Z4DM)
#   z4ai-cd     z4ai.compress_delta(target, base, dtype)     (Z4DL; equal
#               lengths only)
#   fullxor     blazex-style FullXor patch: zstd level 9 (BLAZE-X's level) of
#               the target's data buffer XOR the base's (the shorter one
#               zero-padded), plus zstd of the target's header
# then pack speed (target MB/s, median of RUNS runs) of ckptfs's delta (the
# whole process: read, encode, write) against z4ai's model_delta (compress
# call only, files already in memory), and the cold read (remount, drop
# caches, dd bs=1M; median of RUNS) through the mount of the delta's
# presented .safetensors against a standalone .zstn of the same target,
# with the base as a plain .safetensors and again with the base packed as a
# .zstn (the delta then packed against it), as a store written through the
# mount holds it.
# A column ckptfs cannot produce yet prints "n/a (why)" instead of aborting.
#
# Usage: scripts/bench-delta.sh [WORKDIR]     (RUNS=3 by default; root for
# drop_caches and mounts; CKPTFS_BIN=PATH measures another build;
# PAIRS="regex" limits the pairs measured)
set -euo pipefail
cd "$(dirname "$0")/.."
W="$(realpath -m "${1:-/tmp/ckptfs-bench-delta}")"
RUNS="${RUNS:-3}"
if [ -z "${CKPTFS_BIN:-}" ]; then
  cargo build --locked --release -q
fi
BIN="$(realpath "${CKPTFS_BIN:-${CARGO_TARGET_DIR:-target}/release/ckptfs}")"
PY="${CKPTFS_VENV:-.venv}/bin/python"
mkdir -p "$W"
[ -f "$W/fixtures/pairs.tsv" ] || "$PY" scripts/delta_fixtures.py "$W/fixtures" >/dev/null 2>&1
exec "$PY" - "$W" "$BIN" "$RUNS" "${PAIRS:-.}" <<'PY'
import json, os, re, shutil, statistics, struct, subprocess, sys, time
import numpy as np, zstandard, z4ai
from z4ai import model_delta

W, BIN, RUNS, PAIRS = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
FX = f"{W}/fixtures"
OUT = f"{W}/out"
MNT = f"{W}/mnt"
os.makedirs(OUT, exist_ok=True)
os.makedirs(MNT, exist_ok=True)


def run(*a):
    return subprocess.run(a, capture_output=True, text=True)


def timed(*a):
    t = time.perf_counter()
    r = run(*a)
    return r, time.perf_counter() - t


def split(b):
    (n,) = struct.unpack_from("<Q", b)
    return b[: 8 + n], b[8 + n :], json.loads(b[8 : 8 + n])


def zdtype(header):
    dts = [v["dtype"] for k, v in header.items() if k != "__metadata__"]
    top = max(set(dts), key=dts.count)
    return {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}.get(top)


def fullxor(base, target):
    th, td, _ = split(target)
    _, bd, _ = split(base)
    n = len(td)
    bd = bd[:n].ljust(n, b"\0")
    x = np.bitwise_xor(np.frombuffer(td, np.uint8), np.frombuffer(bd, np.uint8)).tobytes()
    c = zstandard.ZstdCompressor(level=9, threads=-1)
    return len(c.compress(x)) + len(c.compress(th))


def mounted(p):
    return any(l.split()[4] == p for l in open("/proc/self/mountinfo"))


def umount():
    if mounted(MNT):
        run(BIN, "umount", MNT)
        for _ in range(100):
            if not mounted(MNT):
                break
            time.sleep(0.05)


def cold_read(store, name, want):
    """Median MB/s of a cold whole-file read of STORE/NAME through a fresh
    mount, or the reason it cannot be measured; the presented file must
    equal WANT (checked after the timed reads)."""
    speeds = []
    for _ in range(RUNS):
        umount()
        r = run(BIN, "mount", store, MNT, "--read-only", "--log-file", f"{W}/mount.log")
        if r.returncode != 0:
            return f"n/a (mount failed: {r.stderr.strip()[:60]})"
        path = f"{MNT}/{name}"
        if not os.path.exists(path):
            umount()
            return "n/a (mount does not present it)"
        run("sync")
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError:
            pass
        t = time.perf_counter()
        r = run("dd", f"if={path}", "of=/dev/null", "bs=1M")
        dt = time.perf_counter() - t
        if r.returncode != 0:
            umount()
            return "n/a (read failed: EIO?)"
        speeds.append(os.path.getsize(path) / dt / 1e6)
    same = run("cmp", "-s", f"{MNT}/{name}", want).returncode == 0
    umount()
    return statistics.median(speeds) if same else "WRONG BYTES (differs from the target)"


def fmt(v, unit=""):
    if isinstance(v, str):
        return v
    return f"{v:,.0f}{unit}" if unit != " MB/s" else f"{v:,.1f}{unit}"


rows = []
pairs = [l.rstrip("\n").split("\t") for l in open(f"{FX}/pairs.tsv")]
for name, bpath, tpath in pairs:
    if not re.search(PAIRS, name):
        continue
    B, T = f"{FX}/{bpath}", f"{FX}/{tpath}"
    base, target = open(B, "rb").read(), open(T, "rb").read()
    tag = re.sub(r"[^A-Za-z0-9]+", "_", name)
    row = {"pair": name, "target": len(target)}

    # Standalone .zstn.
    z = f"{OUT}/{tag}.zstn"
    r = run(BIN, "pack", "-q", T, "-o", z, "--force")
    row["zstn"] = os.path.getsize(z) if r.returncode == 0 else "n/a (pack failed)"

    # ckptfs's delta, in a store beside its base (for the mount).
    store = f"{OUT}/{tag}.store"
    shutil.rmtree(store, ignore_errors=True)
    os.makedirs(store)
    shutil.copyfile(B, f"{store}/base.safetensors")
    d = f"{store}/target.z4dm"
    secs = []
    for _ in range(RUNS):
        r, dt = timed(BIN, "pack", "-q", T, "--base", f"{store}/base.safetensors", "-o", d, "--force")
        if r.returncode != 0:
            break
        secs.append(dt)
    if secs:
        row["ckptfs-d"] = os.path.getsize(d)
        row["ckptfs MB/s"] = len(target) / statistics.median(secs) / 1e6
    else:
        row["ckptfs-d"] = row["ckptfs MB/s"] = "n/a (pack --base failed)"

    # z4ai's model delta and plain XOR delta.
    secs = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        md = model_delta.compress(target, base)
        secs.append(time.perf_counter() - t0)
    row["z4ai-md"] = len(md)
    row["z4ai MB/s"] = len(target) / statistics.median(secs) / 1e6
    if len(base) == len(target):
        row["z4ai-cd"] = len(z4ai.compress_delta(target, base, dtype=zdtype(split(target)[2])))
    else:
        row["z4ai-cd"] = "n/a (lengths differ)"
    row["fullxor"] = fullxor(base, target)

    # Cold reads through the mount.
    zs = f"{OUT}/{tag}.zstore"
    shutil.rmtree(zs, ignore_errors=True)
    os.makedirs(zs)
    if isinstance(row["zstn"], int):
        os.link(z, f"{zs}/target.zstn")
        row["read zstn"] = cold_read(zs, "target.safetensors", T)
    else:
        row["read zstn"] = "n/a"
    if isinstance(row["ckptfs-d"], int):
        row["read delta"] = cold_read(store, "target.safetensors", T)
    else:
        row["read delta"] = "n/a (no delta)"
    # The same delta over a compressed base, as a store written through
    # the mount holds it: reads decode the base's blocks too.
    zb = f"{OUT}/{tag}.zbstore"
    shutil.rmtree(zb, ignore_errors=True)
    os.makedirs(zb)
    r = run(BIN, "pack", "-q", B, "-o", f"{zb}/base.zstn")
    if r.returncode == 0:
        r = run(BIN, "pack", "-q", T, "--base", f"{zb}/base.zstn", "-o", f"{zb}/target.z4dm")
    if r.returncode == 0:
        row["read delta zb"] = cold_read(zb, "target.safetensors", T)
    else:
        row["read delta zb"] = "n/a (pack failed)"
    rows.append(row)
    print(f"# {name} done", file=sys.stderr, flush=True)

print(f"ckptfs {BIN}; z4ai {z4ai.__version__}; {RUNS} runs (medians); sizes in bytes")
cols = ["pair", "target", "zstn", "ckptfs-d", "z4ai-md", "z4ai-cd", "fullxor"]
print("\n## stored bytes (ratio = target / stored)")
print(" | ".join(cols))
for r in rows:
    cells = [r["pair"], fmt(r["target"])]
    for c in cols[2:]:
        v = r[c]
        cells.append(v if isinstance(v, str) else f"{v:,} ({r['target'] / v:.1f}x)")
    print(" | ".join(cells))
print("\n## pack speed (target MB/s) and cold read through the mount (MB/s)")
print("(read delta: base a plain .safetensors; over .zstn: the base packed too; ratios against read .zstn)")
print(
    "pair | ckptfs delta pack | z4ai model_delta | ratio | read .zstn | read delta | ratio"
    " | read delta over .zstn | ratio"
)


def per(c, d):
    return f"{c / d:.2f}x" if not isinstance(c, str) and not isinstance(d, str) else "n/a"


for r in rows:
    a, b = r["ckptfs MB/s"], r["z4ai MB/s"]
    ra = f"{a / b:.1f}x" if not isinstance(a, str) else "n/a"
    c, e, d = r["read delta"], r["read delta zb"], r["read zstn"]
    print(
        f"{r['pair']} | {fmt(a, ' MB/s')} | {fmt(b, ' MB/s')} | {ra} | {fmt(d, ' MB/s')}"
        f" | {fmt(c, ' MB/s')} | {per(c, d)} | {fmt(e, ' MB/s')} | {per(e, d)}"
    )
PY
