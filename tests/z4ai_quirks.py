"""Writes z4ai 0.2.0 files that are awkward for a reader (tests/z4ai_quirks.rs):
OUT/loose.safetensors and OUT/loose.zstn (a header safetensors itself would
reject: no dtype, float data_offsets, non-string metadata, an extra field),
OUT/model.z4ai.safetensors (what z4ai.save_file writes), OUT/plain.safetensors
(its content), OUT/chunked.z4ai (a Z4AIMF01 frame) and OUT/auto.z4ai (ZARA)."""
import json, struct, sys
import numpy as np
import z4ai
import z4ai.chunked
from z4ai import safetensors as zst

out = sys.argv[1]
data = np.arange(64, dtype=np.float32).tobytes()  # a: 16 floats, b: 48
header = {
    "__metadata__": {"format": "pt", "step": 7},
    "a": {"shape": [16], "data_offsets": [0.0, 64.0]},
    "b": {"dtype": "F32", "shape": [48], "data_offsets": [64, 256], "note": "extra"},
}
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
blob = struct.pack("<Q", len(h)) + h + data
open(f"{out}/loose.safetensors", "wb").write(blob)
zst.compress_file(f"{out}/loose.safetensors", f"{out}/loose.zstn")

# z4ai.save_file(state_dict, "model.z4ai.safetensors") is compress_bytes of
# safetensors.torch.save; the test venv has no torch, the numpy bytes are
# the same file.
from safetensors.numpy import save
tensors = {"w": np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64)}
plain = save(tensors)
open(f"{out}/plain.safetensors", "wb").write(plain)
open(f"{out}/model.z4ai.safetensors", "wb").write(zst.compress_bytes(plain))

raw = np.linspace(-1, 1, 1 << 16, dtype=np.float32).tobytes()
open(f"{out}/chunked.z4ai", "wb").write(z4ai.chunked.compress(raw, dtype="float32"))
open(f"{out}/auto.z4ai", "wb").write(z4ai.compress(raw, effort="max"))
