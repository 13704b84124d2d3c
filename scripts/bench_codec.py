#!/usr/bin/env python3
"""Ratio and speed of ckptfs, zstd -3, ZipNN 0.5.4 and z4ai 0.2.0 on the same files, in one run.

Every codec works in memory on the whole file; speeds are MB/s (1e6 B/s) of original
bytes, medians of RUNS runs; every codec is checked byte-exact on its first decode.
ckptfs is measured by its own in-memory benchmark (examples/codec_bench.rs) with
THREADS rayon threads; ZipNN with threads=THREADS; z4ai with its defaults (workers =
cpu count); zstd -3 with python-zstandard, whole file as one frame, THREADS workers.

Usage: bench_codec.py CODEC_BENCH_BIN FILE... [--runs N] [--threads T] [--skip-z4ai-above BYTES]
"""
import argparse, json, os, statistics, subprocess, sys, time

import zstandard


def timed(fn, runs):
    out, times = None, []
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, statistics.median(times)


def bench_zstd(data, runs, threads):
    c = zstandard.ZstdCompressor(level=3, threads=threads)
    comp, tc = timed(lambda: c.compress(data), runs)
    d = zstandard.ZstdDecompressor()
    out, td = timed(lambda: d.decompress(comp, max_output_size=len(data)), runs)
    assert out == data
    return len(comp), tc, td


def bench_zipnn(data, runs, threads, dtype):
    from zipnn import ZipNN
    z = ZipNN(bytearray_dtype=dtype, threads=threads)
    # ZipNN reorders its input buffer in place: give it a fresh copy (the copy
    # is made before the clock starts).
    comps, times = [], []
    for _ in range(runs):
        buf = bytearray(data)
        t = time.perf_counter()
        comps.append(z.compress(buf))
        times.append(time.perf_counter() - t)
    comp, tc = comps[-1], statistics.median(times)
    out, td = timed(lambda: z.decompress(comp), runs)
    assert bytes(out) == data
    return len(comp), tc, td


def bench_z4ai(data, runs):
    import z4ai.safetensors as zs
    comp, tc = timed(lambda: zs.compress_bytes(data), runs)
    out, td = timed(lambda: zs.decompress_bytes(comp), runs)
    assert out == data
    return len(comp), tc, td


def main_dtype(path):
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    sizes = {}
    for k, v in h.items():
        if k != "__metadata__":
            b, e = v["data_offsets"]
            sizes[v["dtype"]] = sizes.get(v["dtype"], 0) + e - b
    d = max(sizes, key=sizes.get)
    return {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}.get(d, "bfloat16")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_bin")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-z4ai-above", type=int, default=0)
    a = ap.parse_args()
    rows = []
    for path in a.files:
        data = open(path, "rb").read()
        mb = len(data) / 1e6
        name = os.path.basename(path)
        env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
        r = json.loads(subprocess.check_output([a.bench_bin, "--runs", str(a.runs), path], env=env))
        rows.append((name, "ckptfs", r["ratio"], r["comp_mbs"], r["decomp_mbs"]))
        n, tc, td = bench_zstd(data, a.runs, a.threads)
        rows.append((name, "zstd -3", len(data) / n, mb / tc, mb / td))
        n, tc, td = bench_zipnn(data, a.runs, a.threads, main_dtype(path))
        rows.append((name, "ZipNN 0.5.4", len(data) / n, mb / tc, mb / td))
        if a.skip_z4ai_above and len(data) > a.skip_z4ai_above:
            rows.append((name, "z4ai 0.2.0", float("nan"), float("nan"), float("nan")))
        else:
            n, tc, td = bench_z4ai(data, 1 if len(data) > 200e6 else a.runs)
            rows.append((name, "z4ai 0.2.0", len(data) / n, mb / tc, mb / td))
        sys.stderr.write(f"done {name}\n")
    print(f"nproc={os.cpu_count()} kernel={os.uname().release} runs={a.runs} threads={a.threads}")
    print(f"| file | codec | ratio | compress MB/s | decompress MB/s |")
    print(f"| --- | --- | ---: | ---: | ---: |")
    for name, codec, ratio, c, d in rows:
        print(f"| {name} | {codec} | {ratio:.4f} | {c:.0f} | {d:.0f} |")


if __name__ == "__main__":
    main()
