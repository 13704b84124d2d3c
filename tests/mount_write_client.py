"""Client side of tests/mount_write.rs: what ML tools do when they save
checkpoints, run against a ckptfs mount.

Usage: mount_write_client.py COMMAND ARGS...
  save PATH SEED N           safetensors.numpy.save_file of a bf16 + f32 model
  expect PATH SEED N         load PATH and compare with the model for SEED, N
  version PATH N SEED...     read PATH whole (one open, read to the end):
      prints the SEED whose model the bytes are, or "error: ..." when the
      read failed (cleanly); exits non-zero when the bytes are none of them
  tmp_rename DIR NAME SEED N write DIR/.NAME.tmpXXXX, fsync, os.replace to NAME
  incomplete DIR NAME SEED N write DIR/NAME.incomplete, then rename to NAME
  reader_sees_old PATH SEED_OLD SEED_NEW N
      opens PATH (old version), replaces it by tmp+rename with SEED_NEW,
      checks the open reader still reads SEED_OLD's bytes and a new open
      reads SEED_NEW's.
Exits non-zero with a message on any mismatch.
"""
import os
import sys
import tempfile

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save, save_file

save_bytes = save


def model(seed, n):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(n) * 0.02).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal(n // 4).astype(np.float32)
    return {"layer.weight": w.reshape(-1, 16), "layer.bias": b, "step": np.array([seed], np.int64)}


def same(a, b):
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        x, y = np.ascontiguousarray(a[k]), np.ascontiguousarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert x.view(np.uint8).tobytes() == y.view(np.uint8).tobytes(), f"tensor {k} differs"


def main():
    cmd, *args = sys.argv[1:]
    if cmd == "save":
        path, seed, n = args[0], int(args[1]), int(args[2])
        save_file(model(seed, n), path)
    elif cmd == "expect":
        path, seed, n = args[0], int(args[1]), int(args[2])
        same(load_file(path), model(seed, n))
    elif cmd == "version":
        path, n, seeds = args[0], int(args[1]), [int(x) for x in args[2:]]
        try:
            with open(path, "rb") as f:
                got = f.read()
        except OSError as e:
            print(f"error: {e}")
            return
        for seed in seeds:
            if got == save_bytes(model(seed, n)):
                print(seed)
                return
        sys.exit(f"{path}: {len(got)} bytes, the model of none of {seeds}")
    elif cmd == "tmp_rename":
        d, name, seed, n = args[0], args[1], int(args[2]), int(args[3])
        fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(save_bytes(model(seed, n)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(d, name))
    elif cmd == "incomplete":
        d, name, seed, n = args[0], args[1], int(args[2]), int(args[3])
        part = os.path.join(d, name + ".incomplete")
        with open(part, "wb") as f:
            data = save_bytes(model(seed, n))
            for i in range(0, len(data), 1 << 20):
                f.write(data[i : i + (1 << 20)])
        os.rename(part, os.path.join(d, name))
    elif cmd == "reader_sees_old":
        path, old, new, n = args[0], int(args[1]), int(args[2]), int(args[3])
        want_old = save_bytes(model(old, n))
        want_new = save_bytes(model(new, n))
        with open(path, "rb") as r:
            head = r.read(4096)
            assert head == want_old[:4096], "old version before the overwrite"
            d, name = os.path.split(path)
            fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(want_new)
            os.replace(tmp, path)
            rest = r.read()
            assert head + rest == want_old, "the open reader must keep the old version"
        with open(path, "rb") as f:
            assert f.read() == want_new, "a new open must see the new version"
    else:
        sys.exit(f"unknown command {cmd}")
    print("ok", cmd)


if __name__ == "__main__":
    main()
