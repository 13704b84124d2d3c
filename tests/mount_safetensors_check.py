"""Loads every tensor of mounted safetensors files with safetensors' numpy
framework and compares it with the original file.

Usage: mount_safetensors_check.py MOUNTED ORIGINAL [MOUNTED ORIGINAL ...]
Prints one line per file; exits 1 on the first mismatch.
"""
import sys
import ml_dtypes  # noqa: F401  (registers bfloat16 / float8 with numpy)
import numpy as np
from safetensors import safe_open


def raw(a):
    # Bitwise comparison (NaNs, -0.0 and exotic dtypes compare exactly).
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def check(mounted, original):
    try:
        safe_open(original, framework="numpy").keys()
    except Exception as e:  # an original safetensors refuses: so must the mount
        try:
            safe_open(mounted, framework="numpy").keys()
        except Exception as e2:
            assert type(e2) is type(e) and str(e2) == str(e), f"{mounted}: {e2!r} vs {e!r}"
            print(f"ok {mounted}: refused like the original ({e})")
            return
        raise AssertionError(f"{mounted}: opens, original fails with {e!r}")
    with safe_open(original, framework="numpy") as o, safe_open(mounted, framework="numpy") as m:
        keys = list(o.keys())
        assert list(m.keys()) == keys, f"{mounted}: keys differ"
        assert m.metadata() == o.metadata(), f"{mounted}: metadata differs"
        for k in keys:
            try:
                want = o.get_tensor(k)
            except Exception as e:  # a dtype numpy cannot hold: must fail alike
                try:
                    m.get_tensor(k)
                except Exception as e2:
                    assert type(e2) is type(e), f"{mounted}:{k}: {e2!r} vs {e!r}"
                    continue
                raise AssertionError(f"{mounted}:{k}: mounted loads, original fails with {e!r}")
            got = m.get_tensor(k)
            assert got.dtype == want.dtype and got.shape == want.shape, f"{mounted}:{k}: dtype/shape"
            assert raw(got) == raw(want), f"{mounted}:{k}: get_tensor bytes differ"
            if want.ndim >= 1 and want.shape[0] > 0:
                n = want.shape[0]
                lo, hi = n // 3, max(n // 3 + 1, (2 * n) // 3)
                gs = m.get_slice(k)[lo:hi]
                ws = o.get_slice(k)[lo:hi]
                assert raw(gs) == raw(ws), f"{mounted}:{k}: get_slice differs"
        print(f"ok {mounted}: {len(keys)} tensors")


def main(args):
    if len(args) % 2:
        sys.exit("pairs of MOUNTED ORIGINAL expected")
    for i in range(0, len(args), 2):
        check(args[i], args[i + 1])


if __name__ == "__main__":
    main(sys.argv[1:])
