"""GGUF export of gpt2 and BERT checked against llama.cpp (llama-cpp-python):

  python gguf_arch_check.py make_gpt2 OUT
      writes a tiny random GPT2LMHeadModel (transformers, 2 layers, n_embd
      64, 4 heads, 128 positions) with a byte-level BPE tokenizer trained by
      `tokenizers`, as a model directory;
  python gguf_arch_check.py gpt2 MODEL_DIR FILE.gguf
      llama.cpp tokenizes a prompt as the Hugging Face tokenizer does, and
      its logits at every position match transformers' (f32);
  python gguf_arch_check.py log FILE.gguf
      loads the file in llama.cpp with its log (on stderr) on;
  python gguf_arch_check.py bert MODEL_DIR FILE.gguf
      llama.cpp (embedding=True, the GGUF's mean pooling) tokenizes as the
      Hugging Face tokenizer does (with [CLS] and [SEP]) and its normalised
      sentence embedding matches sentence-transformers'.

Prints one JSON line of measured figures; exits non-zero with the reason
when a check fails."""

import json
import os
import sys

import numpy as np

mode = sys.argv[1]


def make_gpt2(out):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel

    os.makedirs(out, exist_ok=True)
    text = [
        "the quick brown fox jumps over the lazy dog",
        "compressed model checkpoints served as ordinary files",
        "gpt2 reads gguf files; ckptfs writes them from a compressed store",
    ] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(text, trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
               "tokenizer_class": "PreTrainedTokenizerFast"},
              open(os.path.join(out, "tokenizer_config.json"), "w"))
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=128, n_embd=64, n_layer=2,
                     n_head=4, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(out, safe_serialization=True)


def hf_tokenizer(model_dir):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"))


def check_gpt2(model_dir, path):
    import torch
    from llama_cpp import Llama
    from transformers import GPT2LMHeadModel

    prompt = "the quick brown fox jumps over the lazy dog"
    hf_ids = hf_tokenizer(model_dir).encode(prompt, add_special_tokens=False)
    llm = Llama(model_path=path, n_ctx=64, n_batch=64, logits_all=True, verbose=False,
                n_threads=2, seed=0, type_k=0, type_v=0)
    cpp_ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
    if cpp_ids != hf_ids:
        sys.exit(f"{path}: llama.cpp tokenizes {prompt!r} as {cpp_ids}, transformers as {hf_ids}")
    llm.eval(hf_ids)
    cpp = np.array(llm.scores[: len(hf_ids)], dtype=np.float64)
    model = GPT2LMHeadModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        hf = model(torch.tensor([hf_ids])).logits[0].double().numpy()
    # Tolerance: f32 weights on both sides. What separates them is the
    # rounding of sums taken in another order and ggml's GELU, which
    # (GGML_GELU_FP16, ggml-cpu/vec.h) looks the tanh GELU up in a table by
    # the activation rounded to f16: a relative error up to 2^-11 (4.9e-4)
    # on every MLP activation. Measured: 7e-4 of the logits' spread.
    # Allowed: 2e-3 of the spread, and the same top token at every
    # position; a wrong tensor mapping or an untransposed Conv1D weight
    # gives errors of the order of the spread itself.
    err = float(np.abs(cpp - hf).max()) / float(hf.std())
    same = bool((cpp.argmax(-1) == hf.argmax(-1)).all())
    print(json.dumps({"arch": "gpt2", "tokens": len(hf_ids), "max_err_over_spread": err,
                      "tolerance": 2e-3, "next_token_same": same}))
    if err > 2e-3 or not same:
        sys.exit(f"{path}: gpt2 logits differ from transformers' by {err:.3g} of their spread")


def check_bert(model_dir, path):
    from llama_cpp import Llama
    from sentence_transformers import SentenceTransformer

    sentence = "Compressed checkpoints are served as ordinary files."
    hf_ids = hf_tokenizer(model_dir).encode(sentence)
    llm = Llama(model_path=path, embedding=True, n_ctx=128, n_batch=128, verbose=False,
                n_threads=2, seed=0)
    cpp_ids = llm.tokenize(sentence.encode(), add_bos=True, special=False)
    if cpp_ids != hf_ids:
        sys.exit(f"{path}: llama.cpp tokenizes {sentence!r} as {cpp_ids}, transformers as {hf_ids}")
    got = np.array(llm.embed(sentence, normalize=True), dtype=np.float64)
    st = SentenceTransformer(model_dir, device="cpu")
    want = st.encode([sentence], normalize_embeddings=True)[0].astype(np.float64)
    if got.shape != want.shape:
        sys.exit(f"{path}: embedding of shape {got.shape}, sentence-transformers {want.shape}")
    err = float(np.abs(got - want).max())
    cos = float(got @ want)
    # Tolerance: both are unit vectors of f32 computations on the same
    # weights; what separates them is the rounding of sums taken in
    # another order and ggml's GELU (a tanh approximation evaluated from an
    # f16 table, see check_gpt2) where BERT uses the exact erf GELU, an
    # error of ~1e-3 on each activation that pooling and normalising
    # average down. Measured: 2.6e-4 per component, cosine 0.999999. Allowed: 2e-3 per component and cosine > 0.9999;
    # a wrong tensor mapping, transposition or pooling gives errors of 1e-2
    # and more (cosine well below 0.99).
    print(json.dumps({"arch": "bert", "tokens": len(hf_ids), "max_abs_err": err, "cosine": cos,
                      "tolerance": 2e-3, "cosine_min": 0.9999}))
    if err > 2e-3 or cos < 0.9999:
        sys.exit(f"{path}: embedding differs from sentence-transformers' by {err:.3g} (cosine {cos})")


if mode == "make_gpt2":
    make_gpt2(sys.argv[2])
elif mode == "gpt2":
    check_gpt2(sys.argv[2], sys.argv[3])
elif mode == "log":
    # Loads the file with llama.cpp's logging on (to stderr), for the
    # caller to read.
    from llama_cpp import Llama
    Llama(model_path=sys.argv[2], n_ctx=64, verbose=True, n_threads=1)
elif mode == "bert":
    check_bert(sys.argv[2], sys.argv[3])
else:
    sys.exit(f"unknown mode {mode}")
