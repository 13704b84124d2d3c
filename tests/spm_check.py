"""SentencePiece tokenizer.model export checked against sentencepiece:

  python spm_check.py make MODEL_DIR
      trains a small BPE SentencePiece model (llama-style: byte fallback
      on, identity normaliser, so every byte has a <0xXX> piece, which llama.cpp's tokenizer
      requires; <unk> <s> </s> at 0 1 2; at most 300 pieces, the tiny
      llama's vocabulary) on a few sentences and replaces the directory's
      tokenizer.json with it as tokenizer.model;
  python spm_check.py check MODEL_DIR FILE.gguf
      llama.cpp tokenizes each of a few strings to sentencepiece's ids
      (with BOS, as llama does) and its vocabulary is the model's.

Prints one JSON line; exits non-zero with the reason on a mismatch."""

import json
import os
import sys

import sentencepiece as spm

mode, model_dir = sys.argv[1], sys.argv[2]
path = os.path.join(model_dir, "tokenizer.model")
STRINGS = [
    "the quick brown fox jumps over the lazy dog",
    "compressed model checkpoints, served as ordinary files",
    "  leading spaces, a newline\nand bytes: é ü 漢",
    "llama reads gguf files",
]

if mode == "make":
    text = [
        "the quick brown fox jumps over the lazy dog",
        "compressed model checkpoints served as ordinary files",
        "llama reads gguf files; ckptfs writes them from a compressed store",
        "sentencepiece trains a tokenizer in the test itself",
    ] * 50
    import io
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=buf, vocab_size=300, model_type="bpe", byte_fallback=True,
        hard_vocab_limit=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        character_coverage=1.0, minloglevel=2,
        # llama's tokenizer.model: no normalisation, spaces kept as they
        # are (llama.cpp's SentencePiece tokenizer does neither).
        normalization_rule_name="identity", remove_extra_whitespaces=False,
    )
    open(path, "wb").write(buf.getvalue())
    os.remove(os.path.join(model_dir, "tokenizer.json"))
    print(spm.SentencePieceProcessor(model_file=path).vocab_size())
elif mode == "check":
    from llama_cpp import Llama
    sp = spm.SentencePieceProcessor(model_file=path)
    llm = Llama(model_path=sys.argv[3], n_ctx=64, verbose=False, n_threads=1)
    import gguf
    r = gguf.GGUFReader(sys.argv[3])
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    scores = r.fields["tokenizer.ggml.scores"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    for i in range(sp.vocab_size()):
        want_ty = (2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                   else 5 if sp.is_unused(i) else 1)
        if (toks[i], scores[i], types[i]) != (sp.id_to_piece(i), sp.get_score(i), want_ty):
            sys.exit(f"token {i}: GGUF has {(toks[i], scores[i], types[i])}, sentencepiece "
                     f"{(sp.id_to_piece(i), sp.get_score(i), want_ty)}")
    compared = 0
    for s in STRINGS:
        want = [sp.bos_id()] + sp.encode(s)
        got = llm.tokenize(s.encode(), add_bos=True, special=False)
        if got != want:
            sys.exit(f"{sys.argv[3]}: llama.cpp tokenizes {s!r} as {got}, sentencepiece as {want}")
        compared += 1
    print(json.dumps({"strings": compared, "vocab": sp.vocab_size(), "n_vocab": llm.n_vocab()}))
else:
    sys.exit(f"unknown mode {mode}")
