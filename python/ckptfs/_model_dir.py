"""``ckptfs.model_dir``: a model directory of real files for a ``.blz`` or
a store written by ``ckptfs pack -r``, for loaders that list a directory or
take a directory path (``from_pretrained``, vLLM).

Each ``.safetensors`` of the model becomes a small link file (``CKPTFS-LINK``
and a JSON target) that the patched loaders (``ckptfs.patch()``) read through
ckptfs; unpatched safetensors refuses it (its first 8 bytes are not a
plausible header length), so a missing patch fails loudly instead of loading
wrong weights. Other files are extracted from a ``.blz`` (configs,
tokenizers: small), or symlinked from a packed directory.
"""

import hashlib
import json
import os

from . import _native
from ._errors import FormatError
from ._patch import LINK_MAGIC


def _cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ckptfs", "model-dirs")


def _write_link(dest, target):
    tmp = dest + ".tmp"
    with open(tmp, "wb") as f:
        f.write(LINK_MAGIC + json.dumps({"target": target}).encode() + b"\n")
    os.replace(tmp, dest)


def model_dir(path, cache_dir=None):
    """The directory to give loaders for the model at ``path`` (a ``.blz``
    or a directory packed with ``ckptfs pack -r``); made once per version
    of the archive under ``cache_dir`` (default ``~/.cache/ckptfs/model-dirs``)."""
    path = os.path.abspath(os.fspath(path))
    st = os.stat(path)
    key = hashlib.sha256(f"{path}\0{st.st_mtime_ns}\0{st.st_size}".encode()).hexdigest()[:16]
    name = os.path.basename(path.rstrip("/")) or "model"
    out = os.path.join(cache_dir or _cache_root(), f"{name}-{key}")
    if os.path.isdir(out) and os.path.exists(os.path.join(out, ".ckptfs-complete")):
        return out
    os.makedirs(out, exist_ok=True)
    if os.path.isdir(path):
        for root, _dirs, files in os.walk(path):
            rel = os.path.relpath(root, path)
            dst = os.path.normpath(os.path.join(out, rel))
            os.makedirs(dst, exist_ok=True)
            for f in files:
                src = os.path.join(root, f)
                if f.endswith(".zstn"):
                    _write_link(os.path.join(dst, f[: -len(".zstn")] + ".safetensors"), src)
                    continue
                link = os.path.join(dst, f)
                if os.path.lexists(link):
                    os.remove(link)
                os.symlink(src, link)
    else:
        members = _native.members(path)
        if len(members) == 1 and members[0][0] == "":
            raise FormatError(f"{path}: holds one file, not a model directory")
        for member, _size in members:
            dest = os.path.join(out, *member.split("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if member.endswith(".safetensors"):
                _write_link(dest, f"{path}/{member}")
            else:
                _native.extract(path, member, dest)
    open(os.path.join(out, ".ckptfs-complete"), "wb").close()
    return out
