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


def bench_unpack_t1(ckptfs_bin, path, runs, shm, compat=None):
    """`ckptfs --threads 1 unpack` of a packed file, file to file on tmpfs:
    (ratio, MB/s of original bytes, median of RUNS)."""
    name = os.path.basename(path)
    arc = os.path.join(shm, name + ".zstn")
    out = os.path.join(shm, name + ".out")
    cmd = [ckptfs_bin, "pack", "-q", path, "-o", arc, "--force"]
    if compat:
        cmd += ["--compat", compat]
    subprocess.check_call(cmd)
    size = os.path.getsize(path)
    ratio = size / os.path.getsize(arc)
    times = []
    for _ in range(runs):
        if os.path.exists(out):
            os.unlink(out)
        t = time.perf_counter()
        subprocess.check_call([ckptfs_bin, "--threads", "1", "unpack", "-q", arc, "-o", out, "--force"])
        times.append(time.perf_counter() - t)
    ok = open(out, "rb").read() == open(path, "rb").read()
    assert ok, f"{name}: ckptfs unpack differs"
    os.unlink(out)
    os.unlink(arc)
    return ratio, size / 1e6 / statistics.median(times)


def bench_zipnn_file_t1(path, runs, shm, dtype):
    """ZipNN 0.5.4 with threads=1 decoding its own file, file to file on
    tmpfs (read the compressed file, decompress, write): (ratio, MB/s)."""
    from zipnn import ZipNN
    data = open(path, "rb").read()
    z = ZipNN(bytearray_dtype=dtype, threads=1)
    comp = z.compress(bytearray(data))
    name = os.path.basename(path)
    arc = os.path.join(shm, name + ".znn")
    out = os.path.join(shm, name + ".zout")
    with open(arc, "wb") as f:
        f.write(comp)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        with open(arc, "rb") as f:
            c = f.read()
        d = z.decompress(c)
        with open(out, "wb") as f:
            f.write(d)
        times.append(time.perf_counter() - t)
    assert open(out, "rb").read() == data
    os.unlink(out)
    os.unlink(arc)
    return len(data) / len(comp), len(data) / 1e6 / statistics.median(times)


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
    ap.add_argument("--ckptfs", help="ckptfs binary: also time single-thread `unpack` file to file against ZipNN (threads=1)")
    ap.add_argument("--shm", default="/dev/shm", help="tmpfs directory for the file-to-file timings")
    a = ap.parse_args()
    rows = []
    t1 = []
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
        if a.ckptfs:
            r_def, s_def = bench_unpack_t1(a.ckptfs, path, a.runs, a.shm)
            help_ = subprocess.run([a.ckptfs, "pack", "--help"], capture_output=True, text=True).stdout
            if "--compat" in help_:
                r_z4, s_z4 = bench_unpack_t1(a.ckptfs, path, a.runs, a.shm, "z4ai")
            else:  # a build from before --compat: its default is z4ai's layout
                r_z4, s_z4 = r_def, s_def
            r_zn, s_zn = bench_zipnn_file_t1(path, a.runs, a.shm, main_dtype(path))
            t1.append((name, r_def, s_def, r_z4, s_z4, r_zn, s_zn))
        sys.stderr.write(f"done {name}\n")
    print(f"nproc={os.cpu_count()} kernel={os.uname().release} runs={a.runs} threads={a.threads}")
    print(f"| file | codec | ratio | compress MB/s | decompress MB/s |")
    print(f"| --- | --- | ---: | ---: | ---: |")
    for name, codec, ratio, c, d in rows:
        print(f"| {name} | {codec} | {ratio:.4f} | {c:.0f} | {d:.0f} |")
    if t1:
        print()
        print("Single-thread decode, file to file on tmpfs: `ckptfs --threads 1 unpack` (default and --compat z4ai archives) vs ZipNN threads=1 on its own file (MB/s of original bytes)")
        print("| file | ckptfs ratio | ckptfs MB/s | z4ai-compat ratio | z4ai-compat MB/s | ZipNN ratio | ZipNN MB/s | ckptfs / ZipNN |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, rd, sd, rz, sz, rn, sn in t1:
            print(f"| {name} | {rd:.4f} | {sd:.0f} | {rz:.4f} | {sz:.0f} | {rn:.4f} | {sn:.0f} | {sd / sn:.2f}x |")


if __name__ == "__main__":
    main()
