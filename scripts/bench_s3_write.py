#!/usr/bin/env python3
"""Writing a checkpoint into an S3-compatible server on 127.0.0.1 (moto,
tests/s3_server.py), one table from one run:

  boto3-upload-plain   boto3 upload_file of the .safetensors (the reference)
  ckptfs-mount-write   the same file copied into `ckptfs mount s3://...`
                       (writable), until its X.zstn is listed in the bucket
                       (copy + compress + upload; the spool empty)
  boto3-upload-zstn    boto3 upload_file of that X.zstn alone

MB/s is of the plain size for every row (what the user saved). A bf16
safetensors file of SIZE_MB (default 256) Gaussian weights.
Usage: bench_s3_write.py CKPTFS_BIN WORKDIR [SIZE_MB]. Root (a mount).
"""
import os, shutil, socket, subprocess, sys, tempfile, time

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "..", "tests", "s3_server.py")


def sh(*a):
    return subprocess.run(a, check=True, capture_output=True, text=True).stdout


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    binary, work = sys.argv[1], sys.argv[2]
    size_mb = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, f"model-{size_mb}.safetensors")
    if not os.path.exists(src):
        rng = np.random.default_rng(1)
        n = size_mb * (1 << 20) // 2 // 8
        save_file({f"layer.{i}.weight": (rng.standard_normal(n) * 0.02)
                   .astype(ml_dtypes.bfloat16).reshape(-1, 1024) for i in range(8)}, src)
    plain = os.path.getsize(src)
    port = free_port()
    ep = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                      AWS_REGION="us-east-1")
    srv = subprocess.Popen([PY, SERVER, "server", str(port)], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    assert srv.stdout.readline().strip() == "ready"
    rows = []
    try:
        import boto3
        s3 = boto3.client("s3", endpoint_url=ep)
        s3.create_bucket(Bucket="bench")

        t = time.perf_counter()
        s3.upload_file(src, "bench", "plain/model.safetensors")
        rows.append(("boto3-upload-plain", time.perf_counter() - t, plain))

        cache = tempfile.mkdtemp(dir=work, prefix="s3wcache-")
        mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
        sh(binary, "mount", "s3://bench/w", mnt, "--endpoint-url", ep, "--cache-dir", cache,
           "--log-file", os.path.join(work, "s3w.log"))
        try:
            t = time.perf_counter()
            shutil.copyfile(src, os.path.join(mnt, "model.safetensors"))
            spool = os.path.join(cache, "mirror", ".ckptfs-spool")
            while True:
                keys = {o["Key"]: o["Size"] for o in
                        s3.list_objects_v2(Bucket="bench", Prefix="w/").get("Contents", [])}
                staged = [n for n in os.listdir(spool) if n != "writer.lock"]
                if "w/model.zstn" in keys and not staged:
                    break
                time.sleep(0.05)
            rows.append(("ckptfs-mount-write", time.perf_counter() - t, keys["w/model.zstn"]))
        finally:
            sh(binary, "umount", mnt)
            os.rmdir(mnt)

        z = os.path.join(work, "model.zstn")
        s3.download_file("bench", "w/model.zstn", z)
        t = time.perf_counter()
        s3.upload_file(z, "bench", "plain/model.zstn")
        rows.append(("boto3-upload-zstn", time.perf_counter() - t, os.path.getsize(z)))
        shutil.rmtree(cache, ignore_errors=True)
    finally:
        srv.kill()
    print(f"file: {plain} bytes plain ({size_mb} MiB of bf16 weights)")
    print(f"{'row':22} {'seconds':>8} {'bytes uploaded':>15} {'plain MB/s':>11}")
    for label, s, b in rows:
        print(f"{label:22} {s:8.2f} {b:15d} {plain / 1e6 / s:11.1f}")


if __name__ == "__main__":
    main()
