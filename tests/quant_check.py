"""Compares ckptfs's quantised tensors with llama.cpp's own quantiser,
byte for byte: python quant_check.py F32.gguf QUANT.gguf CAST WORK_DIR
(CAST: q4_k, q8_0 or q4_0)

llama.cpp (llama-cpp-python's llama_model_quantize, "pure" so that every
matrix gets the one type asked for, no importance matrix: the reference
quantize_row_q4_K_ref path) quantises the f32 GGUF that ckptfs exported;
every tensor that is of CAST's type in both files must have the same
bytes. Prints
the number of tensors compared; exits non-zero on any difference."""

import os
import sys

import llama_cpp
from gguf import GGMLQuantizationType, GGUFReader

f32, ours, cast, work = sys.argv[1:5]
ftype, qtype = {
    "q4_k": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S, GGMLQuantizationType.Q4_K),
    "q8_0": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, GGMLQuantizationType.Q8_0),
    "q4_0": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, GGMLQuantizationType.Q4_0),
}[cast]
ref = os.path.join(work, f"llama-cpp-{cast}.gguf")
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = ftype
params.nthread = 2
params.pure = True
rc = llama_cpp.llama_model_quantize(f32.encode(), ref.encode(), params)
if rc != 0:
    sys.exit(f"llama_model_quantize failed ({rc})")

want = {t.name: t for t in GGUFReader(ref).tensors}
got = {t.name: t for t in GGUFReader(ours).tensors}
compared = 0
for name, t in got.items():
    if t.tensor_type != qtype:
        continue
    w = want.get(name)
    if w is None or w.tensor_type != qtype:
        sys.exit(f"{ours}: {name} is {cast} here but {w and w.tensor_type.name} in llama.cpp's")
    if bytes(t.data.tobytes()) != bytes(w.data.tobytes()):
        a, b = t.data.tobytes(), w.data.tobytes()
        at = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
        sys.exit(f"{ours}: {name}: {cast} bytes differ from llama.cpp's at byte {at}")
    compared += 1
if compared == 0:
    sys.exit(f"{ours}: no {cast} tensor to compare")
print(compared)
