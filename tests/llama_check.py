"""Loads a GGUF that ckptfs exported in llama.cpp (llama-cpp-python) and
checks it against transformers running the original model directory:

  python llama_check.py MODEL_DIR FILE.gguf CAST

- the prompt tokenizes to the same ids in llama.cpp as with the Hugging Face
  tokenizer (tokenizer.json);
- the next-token logits of every prompt position match transformers'
  within the tolerance of CAST (see TOL), and for f32 the top tokens come
  in the same order.

Prints one JSON line with the measured figures; exits non-zero (with the
reason) when a check fails."""

import json
import sys

import numpy as np
import torch
from llama_cpp import Llama
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

model_dir, gguf, cast = sys.argv[1], sys.argv[2], sys.argv[3]

# The tolerance: llama.cpp's logits may differ from transformers' (on the
# original weights) by 1e-4 of the logits' spread (standard deviation), the
# f32 rounding of sums taken in another order, plus twice the difference
# the cast alone makes: transformers run on the weights rounded as the cast
# rounds them (f16: astype; q8_0: gguf.quants, which ckptfs matches byte
# for byte). Twice, because for f16 and q8_0 weights llama.cpp also rounds
# the activations to the same type before each matrix product, an error of
# the same size as the weights'. For f32 the top 5 tokens must also come in
# the same order at every position.
prompt = "the quick brown fox jumps over the lazy dog"
hf_tok = PreTrainedTokenizerFast(tokenizer_file=f"{model_dir}/tokenizer.json")
hf_ids = hf_tok.encode(prompt, add_special_tokens=False)

llm = Llama(model_path=gguf, n_ctx=64, n_batch=64, logits_all=True, verbose=False,
            n_threads=2, seed=0, type_k=0, type_v=0)
cpp_ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
if cpp_ids != hf_ids:
    sys.exit(f"{gguf}: llama.cpp tokenizes {prompt!r} as {cpp_ids}, transformers as {hf_ids}")
bos = llm.token_bos()
if bos != hf_tok.convert_tokens_to_ids("<s>"):
    sys.exit(f"{gguf}: llama.cpp's BOS is {bos}, the tokenizer's <s> is "
             f"{hf_tok.convert_tokens_to_ids('<s>')}")
ids = [bos] + hf_ids

llm.eval(ids)
cpp = np.array(llm.scores[: len(ids)], dtype=np.float64)

model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
model.eval()
with torch.no_grad():
    hf = model(torch.tensor([ids])).logits[0].double().numpy()

def cast_weights(w):
    """A weight matrix as the cast stores it, back in f32."""
    if cast == "f32" or w.ndim < 2:
        return w
    if cast == "f16":
        return w.astype(np.float16).astype(np.float32)
    from gguf import GGMLQuantizationType, quants
    q = GGMLQuantizationType.Q8_0
    return quants.dequantize(quants.quantize(w, q), q).reshape(w.shape)


sd = {k: torch.from_numpy(cast_weights(v.numpy().copy())) for k, v in model.state_dict().items()}
cast_model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
cast_model.load_state_dict(sd)
cast_model.eval()
with torch.no_grad():
    hf_cast = cast_model(torch.tensor([ids])).logits[0].double().numpy()

if cpp.shape != hf.shape:
    sys.exit(f"{gguf}: llama.cpp gives logits of shape {cpp.shape}, transformers {hf.shape}")
spread = float(hf.std())
err = float(np.abs(cpp - hf).max()) / spread
cast_err = float(np.abs(hf_cast - hf).max()) / spread
own_err = float(np.abs(cpp - hf_cast).max()) / spread
TOL = 1e-4 + 2 * cast_err
top_same = all(
    list(np.argsort(-cpp[i])[:5]) == list(np.argsort(-hf[i])[:5]) for i in range(len(ids))
)
next_same = bool((cpp.argmax(-1) == hf.argmax(-1)).all())
print(json.dumps({"cast": cast, "tokens": len(ids), "max_err_over_spread": err,
                  "cast_alone": cast_err, "vs_cast_weights": own_err, "tolerance": TOL, "top5_order_same": top_same,
                  "next_token_same": next_same}))
if err > TOL:
    sys.exit(f"{gguf}: logits differ from transformers' by {err:.3g} of their spread "
             f"(tolerance for {cast}: {TOL})")
if cast == "f32" and not top_same:
    sys.exit(f"{gguf}: f32 logits rank the top 5 tokens differently from transformers")
