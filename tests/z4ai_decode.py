#!/usr/bin/env python3
"""Decodes every X.zstn in DIR with z4ai 0.2.0 and compares it with X.safetensors.

Prints one line per file; exits 1 if any file fails to decode or differs.
Used by tests/interop.rs (run with the venv that scripts/setup-test-env.sh builds).
"""
import os, sys
import z4ai
import z4ai.safetensors as zs

assert z4ai.__version__ == "0.2.0", z4ai.__version__
d = sys.argv[1]
bad = 0
names = sorted(n for n in os.listdir(d) if n.endswith(".zstn"))
for n in names:
    zp = os.path.join(d, n)
    op = os.path.join(d, n[:-5] + ".safetensors")
    out = os.path.join(d, n[:-5] + ".z4ai-out")
    try:
        zs.decompress_file(zp, out)
        same = open(out, "rb").read() == open(op, "rb").read()
        print(("ok   " if same else "DIFF ") + n)
        bad += not same
    except Exception as e:  # report and continue with the others
        print(f"FAIL {n}: {e!r}")
        bad += 1
print(f"{len(names) - bad}/{len(names)} decoded identically by z4ai {z4ai.__version__}")
sys.exit(1 if bad or not names else 0)
