#!/usr/bin/env python3
"""Whole-process, file-to-file pack and unpack: `ckptfs pack` / `ckptfs unpack`
against ZipNN 0.5.4 doing the same job (read the file, compress or decompress,
write the output, fsync), same files, same run (issue 11's last codec target).

Every output goes to OUTDIR (default /dev/shm, a tmpfs) so that the figure is the
tool, not this VM's disk; inputs are read from the page cache (read once before
timing). ckptfs runs as its CLI (process start, parse, rayon pool, atomic output
with fsync and rename); ZipNN runs in one Python process already started (its
import is not timed), with threads=THREADS. Speeds are MB/s (1e6 B/s) of original
bytes, medians of RUNS runs; every output is checked byte-exact once.

Usage: bench_files.py CKPTFS_BIN FILE... [--runs N] [--threads T] [--out DIR]
"""
import argparse, os, statistics, subprocess, time

from bench_codec import main_dtype  # the dtype ZipNN is told, as bench_codec.py does


def timed(fn, runs):
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def write_synced(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="/dev/shm")
    a = ap.parse_args()
    from zipnn import ZipNN

    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    print(f"file-to-file, output in {a.out}, {a.threads} threads, median of {a.runs} (MB/s of original bytes)")
    print(f"{'file':28} {'MB':>7} {'ckptfs pack':>12} {'ZipNN comp':>11} {'ckptfs unpack':>14} {'ZipNN decomp':>13}")
    for path in a.files:
        raw = open(path, "rb").read()
        mb = len(raw) / 1e6
        z4 = os.path.join(a.out, "bench-files.zstn")
        back = os.path.join(a.out, "bench-files.safetensors")
        zz = os.path.join(a.out, "bench-files.znn")
        zback = os.path.join(a.out, "bench-files.znn.out")
        run = lambda *args: subprocess.run([a.bin, "-q", *args], check=True, env=env)
        tp = timed(lambda: run("pack", path, "-o", z4, "--force"), a.runs)
        tu = timed(lambda: run("unpack", z4, "-o", back, "--force"), a.runs)
        assert open(back, "rb").read() == raw, "ckptfs round trip differs"
        z = ZipNN(bytearray_dtype=main_dtype(path), threads=a.threads)

        def zc():
            data = bytearray(open(path, "rb").read())
            write_synced(zz, z.compress(data))

        def zd():
            write_synced(zback, z.decompress(open(zz, "rb").read()))

        tzc = timed(zc, a.runs)
        tzd = timed(zd, a.runs)
        assert open(zback, "rb").read() == raw, "ZipNN round trip differs"
        for p in (z4, back, zz, zback):
            os.unlink(p)
        print(f"{os.path.basename(path):28} {mb:7.0f} {mb / tp:12.0f} {mb / tzc:11.0f} {mb / tu:14.0f} {mb / tzd:13.0f}")


if __name__ == "__main__":
    main()
