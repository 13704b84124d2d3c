#!/usr/bin/env python3
"""Cold and warm loads of the 1 GiB llama-like model (bench_load.py's) from
an S3-compatible server on 127.0.0.1 (moto, tests/s3_server.py), one table:

  s3-mount-cold   safe_open + get_tensor of every tensor through
                  `ckptfs mount s3://...` with an empty disk cache
  local-mount     the same through `ckptfs mount STORE` of the store on disk
  boto3-download  the plain model downloaded with boto3 (download_file),
                  then loaded from the local disk
  s3-mount-warm   the S3 mount remounted over the disk cache it filled

Bytes are what the server sent in object GETs (its own count). Page cache
dropped before every row. Usage: bench_s3.py CKPTFS_BIN WORKDIR. Root.
"""
import json, os, shutil, socket, subprocess, sys, tempfile, time, urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from bench_load import LOAD, drop_caches, make_llama, sh  # noqa: E402

PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "..", "tests", "s3_server.py")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "llama")
    make_llama(model)
    store = os.path.join(work, "store")
    if not os.path.isdir(store):
        sh(binary, "pack", "-r", model, "-o", store)
    port = free_port()
    ep = f"http://127.0.0.1:{port}"
    srv = subprocess.Popen([PY, SERVER, "server", str(port)], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    assert srv.stdout.readline().strip() == "ready"
    env = dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
               AWS_REGION="us-east-1")
    os.environ.update(env)
    try:
        def objs(root, prefix):
            out = []
            for d, _, fs in os.walk(root):
                for f in fs:
                    p = os.path.join(d, f)
                    out.append(f"{prefix}/{os.path.relpath(p, root)}={p}")
            return out
        sh(PY, SERVER, "put", ep, "bench", *objs(store, "store"), *objs(model, "plain"))

        def stats():
            return json.load(urllib.request.urlopen(f"{ep}/__stats"))["get_bytes"]

        def reset():
            urllib.request.urlopen(f"{ep}/__reset").read()

        def load(path):
            return float(sh(PY, "-c", LOAD, path, "numpy").strip().splitlines()[-1])

        rows = []
        cache = tempfile.mkdtemp(dir=work, prefix="s3cache-")

        def s3_mount_row(label):
            mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
            sh(binary, "mount", "s3://bench/store", mnt, "--read-only", "--endpoint-url", ep,
               "--cache-dir", cache, "--log-file", os.path.join(work, "s3.log"))
            try:
                drop_caches()
                reset()
                t = time.perf_counter()
                load(mnt)
                rows.append((label, time.perf_counter() - t, stats()))
            finally:
                sh(binary, "umount", mnt)
                os.rmdir(mnt)

        s3_mount_row("s3-mount-cold")

        mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
        sh(binary, "mount", store, mnt, "--read-only", "--log-file", os.path.join(work, "local.log"))
        try:
            drop_caches()
            t = time.perf_counter()
            load(mnt)
            rows.append(("local-mount", time.perf_counter() - t, 0))
        finally:
            sh(binary, "umount", mnt)
            os.rmdir(mnt)

        import boto3
        s3 = boto3.client("s3", endpoint_url=ep)
        dl = os.path.join(work, "download")
        shutil.rmtree(dl, ignore_errors=True)
        os.makedirs(dl)
        drop_caches()
        reset()
        t = time.perf_counter()
        for o in s3.list_objects_v2(Bucket="bench", Prefix="plain/")["Contents"]:
            s3.download_file("bench", o["Key"], os.path.join(dl, os.path.basename(o["Key"])))
        t_dl = time.perf_counter() - t
        load(dl)
        rows.append(("boto3-download+load", time.perf_counter() - t, stats()))
        rows.append(("  (download alone)", t_dl, stats()))

        s3_mount_row("s3-mount-warm")
    finally:
        srv.kill()
    plain = sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model))
    print(f"model: {plain} bytes plain, store {sum(os.path.getsize(os.path.join(store, f)) for f in os.listdir(store))} bytes")
    print(f"{'row':24} {'seconds':>8} {'bytes from server':>18} {'vs plain':>9}")
    for label, s, b in rows:
        print(f"{label:24} {s:8.2f} {b:18d} {b / plain:9.3f}")


if __name__ == "__main__":
    main()
