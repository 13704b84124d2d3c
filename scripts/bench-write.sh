#!/usr/bin/env bash
# Write performance of `ckptfs mount` on a generated ~1 GiB bf16 llama-like
# checkpoint, against a copy to the raw disk, measured in the same run.
# Prints one table of medians over RUNS runs (default 3). Needs root
# (drop_caches, mounts) and a ckptfs whose mount is writable.
#
# Each run drops the page cache, reads the source file once (so both
# copies measure the write side, as when a trainer saves from memory),
# then:
#   (a) raw: dd bs=1M conv=fsync of the file to WORKDIR/raw-copy, on the
#       same filesystem as the store: MB/s from the start of dd to its exit
#       (after the fsync);
#   (b) mount: the same dd to MNT/x.safetensors on a fresh mount of an
#       empty store: MB/s, and (b)/(a) against the 70% target;
#   (c) settle: from the start of (b) until STORE/x.zstn exists and the
#       spool (STORE/.ckptfs-spool) holds no file, i.e. the daemon has
#       recompressed the closed file in the background;
#   (d) ratio: the file's size / the size of STORE/x.zstn.
# After the last run, MNT/x.safetensors is compared with the source.
#
# Usage: scripts/bench-write.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
W="$(realpath -m "${1:-/tmp/ckptfs-bench-write}")"
RUNS="${RUNS:-3}"
if [ "$(id -u)" != 0 ]; then
  echo "bench-write: needs root (drop_caches, mounts)" >&2
  exit 1
fi
bash scripts/setup-test-env.sh >/dev/null
cargo build --locked --release -q
BIN="$(realpath "${CARGO_TARGET_DIR:-target}/release/ckptfs")"
PY=.venv/bin/python
mkdir -p "$W/src" "$W/store" "$W/mnt" "$W/raw-copy"
$PY scripts/make_bench_files.py "$W/src" --only llama >/dev/null
if [ "$(stat -c %d "$W/store")" != "$(stat -c %d "$W/raw-copy")" ]; then
  echo "bench-write: $W/store and $W/raw-copy are on different filesystems" >&2
  exit 1
fi
exec $PY - "$W" "$BIN" "$RUNS" <<'PY'
import errno, os, shutil, statistics, subprocess, sys, time
W, BIN, RUNS = sys.argv[1], sys.argv[2], int(sys.argv[3])
SRC = f"{W}/src/llama-bf16.safetensors"
SIZE = os.path.getsize(SRC)
STORE, MNT, RAW = f"{W}/store", f"{W}/mnt", f"{W}/raw-copy"
SPOOL = f"{STORE}/.ckptfs-spool"
ZSTN = f"{STORE}/x.zstn"
SETTLE_TIMEOUT = 900

def sh(*a):
    return subprocess.run(a, check=True, capture_output=True, text=True).stdout

def die(msg):
    print(f"bench-write: {msg}", file=sys.stderr)
    sys.exit(1)

def mounted(p):
    return any(l.split()[4] == p for l in open("/proc/self/mountinfo"))

def unmount():
    if mounted(MNT):
        sh(BIN, "umount", MNT)
        while mounted(MNT):
            time.sleep(0.05)
        time.sleep(0.3)  # let the daemon exit

def fresh_mount():
    """Unmounts, empties the store (spool included) and mounts it again."""
    unmount()
    shutil.rmtree(STORE)
    os.mkdir(STORE)
    sh(BIN, "mount", STORE, MNT, "--log-file", f"{W}/ckptfs.log")

def check_writable():
    probe = f"{MNT}/.bench-write-probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    except OSError as e:
        if e.errno == errno.EROFS:
            die(f"{MNT} is read-only: this ckptfs cannot write through the mount")
        die(f"cannot create a file in {MNT}: {e}")
    os.unlink(probe)

def drop_caches_and_warm_source():
    sh("sync")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    sh("dd", f"if={SRC}", "of=/dev/null", "bs=4M")

def copy(dst):
    """dd with fsync before exit; returns the seconds it took."""
    t = time.perf_counter()
    r = subprocess.run(["dd", f"if={SRC}", f"of={dst}", "bs=1M", "conv=fsync"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        die(f"dd to {dst} failed: {r.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - t

def spool_files():
    n = 0
    for _, _, files in os.walk(SPOOL):
        n += len(files)
    return n

res = {"raw": [], "mount": [], "settle": [], "after_close": [], "ratio": []}
try:
    fresh_mount()
    check_writable()
    for run in range(RUNS):
        # (a) the raw disk
        drop_caches_and_warm_source()
        dst = f"{RAW}/x.safetensors"
        res["raw"].append(SIZE / copy(dst) / 1e6)
        os.unlink(dst)
        # (b), (c), (d) the mount
        fresh_mount()
        drop_caches_and_warm_source()
        t0 = time.perf_counter()
        dt = copy(f"{MNT}/x.safetensors")
        res["mount"].append(SIZE / dt / 1e6)
        while not (os.path.exists(ZSTN) and spool_files() == 0):
            if time.perf_counter() - t0 > SETTLE_TIMEOUT:
                die(f"{ZSTN} not there with an empty spool {SETTLE_TIMEOUT} s after the copy "
                    f"started (spool holds {spool_files()} files; log {W}/ckptfs.log)")
            time.sleep(0.02)
        settle = time.perf_counter() - t0
        res["settle"].append(settle)
        res["after_close"].append(settle - dt)
        res["ratio"].append(SIZE / os.path.getsize(ZSTN))
        print(f"run {run + 1}: raw {res['raw'][-1]:.0f} MB/s, mount {res['mount'][-1]:.0f} MB/s, "
              f"settled {settle:.1f} s, ratio {res['ratio'][-1]:.3f}", file=sys.stderr)
    r = subprocess.run(["cmp", SRC, f"{MNT}/x.safetensors"], capture_output=True, text=True)
    content = "identical to the source" if r.returncode == 0 else f"DIFFERS: {r.stdout.strip()}"
finally:
    unmount()

med = {k: statistics.median(v) for k, v in res.items()}
fs = sh("findmnt", "-n", "-o", "FSTYPE", "-T", STORE).strip()
print(f"\nfile: {SRC} ({SIZE/1e9:.2f} GB bf16); store and raw copy on {fs}; "
      f"median of {RUNS} runs; {os.cpu_count()} cores")
print(f"MNT/x.safetensors after the last run, read back through the mount: {content}\n")
pct = med["mount"] / med["raw"]
print("| measure | raw disk | ckptfs mount | mount vs raw |")
print("| --- | --- | --- | --- |")
print(f"| (a)/(b) copy + fsync, dd bs=1M | {med['raw']:.0f} MB/s | {med['mount']:.0f} MB/s | "
      f"{pct:.0%} ({'meets' if pct >= 0.7 else 'below'} the 70% target) |")
print(f"| (c) copy start to x.zstn present and spool empty | | {med['settle']:.1f} s | |")
print(f"|     of which after dd exited (background recompression) | | {med['after_close']:.1f} s | |")
print(f"| (d) stored size | {SIZE/1e9:.3f} GB | {SIZE/med['ratio']/1e9:.3f} GB | "
      f"ratio {med['ratio']:.3f}x |")
if r.returncode != 0:
    die("the file read back through the mount differs from the source")
PY
