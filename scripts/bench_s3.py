#!/usr/bin/env python3
"""Cold and warm loads of the 1 GiB llama-like model (bench_load.py's) from
an S3-compatible server on 127.0.0.1, one table per server:

  s3-mount-cold   safe_open + get_tensor of every tensor through
                  `ckptfs mount s3://...` with an empty disk cache
  local-mount     the same through `ckptfs mount STORE` of the store on disk
  boto3-download  the plain model downloaded with boto3 (download_file),
                  then loaded from the local disk
  s3-mount-warm   the S3 mount remounted over the disk cache it filled

Servers (BENCH_S3_SERVERS, default "s3s-fs moto"):
  moto    moto's server (Python, tests/s3_server.py), which counts the GETs
          it answers; it reads a whole object for every ranged GET, so
          its cost grows with the number of requests times the object size
  s3s-fs  the s3s-fs server from crates.io (Rust, files on disk;
          scripts/install-s3s-fs.sh, which bench-s3.sh calls, installs
          it in .tools/bin), whose
          request log is counted

Each row is run BENCH_S3_RUNS times (default 3); the table shows the median
seconds, and the object GETs and bytes the server sent of the median run.
The target line compares the cold S3 mount with the plain client's download
and load from the same server. Page cache dropped before every row.
Usage: bench_s3.py CKPTFS_BIN WORKDIR. Root.
"""
import json, os, re, shutil, socket, statistics, subprocess, sys, tempfile, time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from bench_load import LOAD, drop_caches, make_llama, sh  # noqa: E402

PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
SERVER = os.path.join(ROOT, "tests", "s3_server.py")
S3S_FS = os.path.join(ROOT, ".tools", "bin", "s3s-fs")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Moto:
    name = "moto"

    def __init__(self, work):
        self.port = free_port()
        self.ep = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([PY, SERVER, "server", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def reset(self):
        urllib.request.urlopen(f"{self.ep}/__reset").read()

    def stats(self):
        """(object GETs, bytes they returned) since the last reset."""
        s = json.load(urllib.request.urlopen(f"{self.ep}/__stats"))
        return s["gets"], s["get_bytes"]

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class S3sFs:
    """s3s-fs with its request log at debug level: each request's events
    carry the span `s3s::service::call with start_time: T`, which pairs
    the request line (method, URI) with the response (status, length)."""
    name = "s3s-fs"

    def __init__(self, work):
        if not os.access(S3S_FS, os.X_OK):
            sys.exit(f"{S3S_FS} missing: run scripts/install-s3s-fs.sh")
        self.root = tempfile.mkdtemp(dir=work, prefix="s3s-root-")
        self.port = free_port()
        self.ep = f"http://127.0.0.1:{self.port}"
        self.log = os.path.join(work, "s3s-fs.log")
        self.logf = open(self.log, "w")
        env = dict(os.environ, RUST_LOG="s3s::service=debug", NO_COLOR="1")
        self.proc = subprocess.Popen([S3S_FS, "--host", "127.0.0.1", "--port", str(self.port),
                                      "--access-key", "test", "--secret-key", "test", self.root],
                                     stdout=self.logf, stderr=subprocess.STDOUT, env=env)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port)).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            sys.exit("s3s-fs did not start")
        self.mark = 0

    def reset(self):
        self.mark = os.path.getsize(self.log)

    def stats(self):
        with open(self.log, errors="replace") as f:
            f.seek(self.mark)
            text = f.read()
        reqs, resps, last = {}, {}, None
        for line in text.splitlines():
            m = re.search(r"req: Request \{ method: (\w+), uri: (\S+),", line)
            if m:
                last = ("req", m.group(1), m.group(2))
                continue
            m = re.search(r"resp: Response \{ status: (\d+),.*?\"content-length\": \"(\d+)\"", line)
            if m:
                last = ("resp", int(m.group(1)), int(m.group(2)))
                continue
            m = re.search(r"in s3s::service::call with start_time: (.+)$", line)
            if m and last:
                (reqs if last[0] == "req" else resps)[m.group(1)] = last[1:]
                last = None
        gets = nbytes = 0
        for t, (method, uri) in reqs.items():
            if method == "GET" and "?" not in uri and t in resps and resps[t][0] in (200, 206):
                gets += 1
                nbytes += resps[t][1]
        return gets, nbytes

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.logf.close()
        shutil.rmtree(self.root, ignore_errors=True)


def bench(server_cls, binary, work, store, model, runs):
    srv = server_cls(work)
    ep = srv.ep
    env = dict(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
    os.environ.update(env)
    rows = {}

    def add(label, secs, stats):
        rows.setdefault(label, []).append((secs, stats))

    try:
        def objs(root, prefix):
            out = []
            for d, _, fs in os.walk(root):
                for f in fs:
                    p = os.path.join(d, f)
                    out.append(f"{prefix}/{os.path.relpath(p, root)}={p}")
            return out
        sh(PY, SERVER, "put", ep, "bench", *objs(store, "store"), *objs(model, "plain"))

        def load(path):
            return float(sh(PY, "-c", LOAD, path, "numpy").strip().splitlines()[-1])

        def s3_mount_row(label, cache):
            mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
            sh(binary, "mount", "s3://bench/store", mnt, "--read-only", "--endpoint-url", ep,
               "--cache-dir", cache, "--log-file", os.path.join(work, "s3.log"))
            try:
                drop_caches()
                srv.reset()
                t = time.perf_counter()
                load(mnt)
                add(label, time.perf_counter() - t, srv.stats())
            finally:
                sh(binary, "umount", mnt)
                os.rmdir(mnt)

        import boto3
        s3 = boto3.client("s3", endpoint_url=ep)
        for _ in range(runs):
            cache = tempfile.mkdtemp(dir=work, prefix="s3cache-")
            s3_mount_row("s3-mount-cold", cache)

            mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
            sh(binary, "mount", store, mnt, "--read-only", "--log-file",
               os.path.join(work, "local.log"))
            try:
                drop_caches()
                t = time.perf_counter()
                load(mnt)
                add("local-mount", time.perf_counter() - t, (0, 0))
            finally:
                sh(binary, "umount", mnt)
                os.rmdir(mnt)

            dl = os.path.join(work, "download")
            shutil.rmtree(dl, ignore_errors=True)
            os.makedirs(dl)
            drop_caches()
            srv.reset()
            t = time.perf_counter()
            for o in s3.list_objects_v2(Bucket="bench", Prefix="plain/")["Contents"]:
                s3.download_file("bench", o["Key"], os.path.join(dl, os.path.basename(o["Key"])))
            t_dl = time.perf_counter() - t
            got = srv.stats()
            load(dl)
            add("boto3-download+load", time.perf_counter() - t, got)
            add("  (download alone)", t_dl, got)
            shutil.rmtree(dl)

            s3_mount_row("s3-mount-warm", cache)
            shutil.rmtree(cache)
    finally:
        srv.stop()
    return rows


def median_run(v):
    """The run of median seconds (the lower middle one for an even count)."""
    s = sorted(v, key=lambda x: x[0])
    return s[(len(s) - 1) // 2]


def main():
    binary, work = sys.argv[1], sys.argv[2]
    runs = int(os.environ.get("BENCH_S3_RUNS", "3"))
    servers = os.environ.get("BENCH_S3_SERVERS", "s3s-fs moto").split()
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "llama")
    make_llama(model)
    store = os.path.join(work, "store")
    if not os.path.isdir(store):
        sh(binary, "pack", "-r", model, "-o", store)
    plain = sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model))
    stored = sum(os.path.getsize(os.path.join(store, f)) for f in os.listdir(store))
    print(f"binary {binary}; model: {plain} bytes plain, store {stored} bytes; "
          f"{runs} runs a row, median shown", flush=True)
    for name in servers:
        cls = {"moto": Moto, "s3s-fs": S3sFs}[name]
        t0 = time.time()
        rows = bench(cls, binary, work, store, model, runs)
        load = open("/proc/loadavg").read().split()[:3]
        print(f"\nserver {name} (127.0.0.1), {time.time() - t0:.0f} s, load {' '.join(load)}")
        print(f"{'row':22} {'median s':>9} {'all runs s':>22} {'GETs':>6} "
              f"{'bytes from server':>18} {'vs plain':>9}")
        for label, v in rows.items():
            s, (gets, b) = median_run(v)
            each = " ".join(f"{x[0]:.2f}" for x in v)
            print(f"{label:22} {s:9.2f} {each:>22} {gets:6d} {b:18d} {b / plain:9.3f}")
        cold, (cg, cb) = median_run(rows["s3-mount-cold"])
        ref, (rg, rb) = median_run(rows["boto3-download+load"])
        ok = cold <= ref and cb < rb
        print(f"target (cold S3 mount no slower than boto3 download + load, fewer bytes): "
              f"{'met' if ok else 'NOT met'}: {cold:.2f} s vs {ref:.2f} s, "
              f"{cb} vs {rb} bytes, {cg} vs {rg} GETs", flush=True)


if __name__ == "__main__":
    main()
