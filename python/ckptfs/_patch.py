"""``ckptfs.patch()``: unmodified loaders read ckptfs archives.

What it replaces, in this process, until ``unpatch()``:

1. ``safetensors.safe_open``, ``safetensors.torch.load_file``,
   ``safetensors.torch.load``, ``safetensors.numpy.load_file`` and
   ``safetensors.numpy.load`` (and the ``safe_open`` that
   ``safetensors.torch``/``safetensors.numpy`` hold), by wrappers that hand
   a checkpoint ckptfs recognises to ckptfs and anything else, unchanged, to
   the original function. Every module already imported that holds one of
   these functions under any name (``transformers.modeling_utils``'s
   ``safe_open``, ``vllm``'s weight iterators, ...) gets the wrapper too;
   modules imported later find it in ``safetensors``.
2. ``os.path.isfile`` and ``os.path.exists``: they also answer True for a
   path ``X.safetensors`` that does not exist when ckptfs reads it:
   ``X.zstn`` beside it (what ``ckptfs pack -r`` leaves in place of each
   ``.safetensors``), or a member of a ``.blz`` named as
   ``ARCHIVE.blz/MEMBER.safetensors``. That is how ``from_pretrained``
   finds ``model.safetensors`` in a packed directory (the
   ``model.safetensors.index.json`` of a sharded model is copied by
   ``pack -r`` as it is, and names the shards' ``.safetensors`` paths).
   Every other path gets the original answer.

What ckptfs recognises: a file whose first bytes are an archive's (a
``.zstn``, a ``.blz``, a delta), a ``ckptfs.model_dir`` link file, and the
two missing-path forms of 2. A plain safetensors file is always left to
safetensors itself.

``.blz`` archives, and loaders that list a directory (vLLM globs
``*.safetensors``): ``ckptfs.model_dir(path)`` gives a directory of
real files (a ``.blz``'s config and tokenizer files extracted, small link
files in place of its safetensors, or of a packed directory's ``.zstn``),
which loaders read as a model directory while patched.

The patch lives in this process: worker processes started with ``spawn``
(vLLM's engine core, DataLoader workers) must call ``ckptfs.patch()``
themselves.
"""

import json
import os
import sys
import threading

from . import _core, _native

LINK_MAGIC = b"CKPTFS-LINK\n"

_lock = threading.Lock()
_depth = 0
_saved = {}  # (owner object, attribute) -> original


def _head(path, n=512):
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def read_link(path):
    """The path a ``model_dir`` link file stands for, or None."""
    head = _head(path, 1 << 16)
    if not head.startswith(LINK_MAGIC):
        return None
    try:
        return json.loads(head[len(LINK_MAGIC):].decode())["target"]
    except (ValueError, KeyError, UnicodeDecodeError):
        return None


def resolve(path):
    """The path ckptfs should open for ``path``, or None when ``path`` is
    not for ckptfs (a plain safetensors file, a missing file)."""
    try:
        p = _core._path(path)
    except TypeError:
        return None
    isfile = _saved.get((os.path, "isfile"), os.path.isfile)
    if isfile(p):
        head = _head(p)
        if head.startswith(LINK_MAGIC):
            return read_link(p)
        return p if _native.is_archive(head[:8]) else None
    if not p.endswith(".safetensors"):
        return None
    sibling = p[: -len(".safetensors")] + ".zstn"
    if isfile(sibling):
        return sibling
    d = os.path.dirname(p)
    while d and d != os.path.dirname(d):
        if isfile(d):
            return p if _native.is_archive(_head(d)[:8]) else None
        if os.path.isdir(d):
            return None
        d = os.path.dirname(d)
    return None


def _wrap_safe_open(orig):
    def safe_open(filename, framework, device="cpu", **kw):
        r = resolve(filename)
        if r is None:
            return orig(filename, framework, device=device, **kw)
        return _core.safe_open(r, framework, device)

    safe_open.__wrapped__ = orig
    return safe_open


def _wrap_load_file(orig, module):
    def load_file(filename, device="cpu"):
        r = resolve(filename)
        if r is None:
            return orig(filename, device) if module == "torch" else orig(filename)
        if module == "torch":
            from . import torch as ct

            return ct.load_file(r, device)
        from . import numpy as cn

        return cn.load_file(r)

    load_file.__wrapped__ = orig
    return load_file


def _wrap_load(orig, module):
    def load(data):
        if not _native.is_archive(bytes(data[:8])):
            return orig(data)
        if module == "torch":
            from . import torch as ct

            return ct.load(data)
        from . import numpy as cn

        return cn.load(data)

    load.__wrapped__ = orig
    return load


def _wrap_path(orig):
    def check(path):
        if orig(path):
            return True
        try:
            p = _core._path(path)
        except TypeError:
            return False
        return isinstance(p, str) and p.endswith(".safetensors") and resolve(p) is not None

    check.__wrapped__ = orig
    return check


def _set(owner, attr, new):
    _saved.setdefault((owner, attr), getattr(owner, attr))
    setattr(owner, attr, new)


def _apply():
    import safetensors

    replaced = {}
    orig_open = safetensors.safe_open
    new_open = _wrap_safe_open(orig_open)
    replaced[id(orig_open)] = new_open
    _set(safetensors, "safe_open", new_open)
    for modname in ("torch", "numpy"):
        try:
            mod = __import__(f"safetensors.{modname}", fromlist=["_"])
        except ImportError:
            continue
        if getattr(mod, "safe_open", None) is orig_open:
            _set(mod, "safe_open", new_open)
        for attr, wrap in (("load_file", _wrap_load_file), ("load", _wrap_load)):
            orig = getattr(mod, attr)
            new = wrap(orig, modname)
            replaced[id(orig)] = new
            _set(mod, attr, new)
    # Modules that imported these functions by name before the patch.
    for name, mod in list(sys.modules.items()):
        if mod is None or name.startswith(("safetensors", "ckptfs")):
            continue
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for attr, value in list(d.items()):
            new = replaced.get(id(value))
            if new is not None and value is not new:
                _set(mod, attr, new)
    _set(os.path, "isfile", _wrap_path(os.path.isfile))
    _set(os.path, "exists", _wrap_path(os.path.exists))


def _restore():
    for (owner, attr), orig in _saved.items():
        setattr(owner, attr, orig)
    _saved.clear()


class Patch:
    """What ``patch()`` returns: a context manager that undoes it."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        unpatch()
        return False


def patch():
    """Makes safetensors' loaders (and the libraries above them) read ckptfs
    archives; see this module's documentation for exactly what is replaced.
    Nested calls count: the patch stays until as many ``unpatch()`` calls
    (or ``with`` blocks ending)."""
    global _depth
    with _lock:
        if _depth == 0:
            _apply()
        _depth += 1
    return Patch()


def unpatch():
    """Undoes one ``patch()``; the last one restores every original."""
    global _depth
    with _lock:
        if _depth == 0:
            return
        _depth -= 1
        if _depth == 0:
            _restore()
