"""``safe_open`` and the reading and writing shared by ckptfs.torch and
ckptfs.numpy: framework-neutral, with a small adapter per framework
(allocate an empty tensor and give its address, view a buffer strided).

Tensors are allocated here, at their final size and dtype, and the native
module decodes straight into their memory with the GIL released, every
tensor of a ``load_file`` at once on all cores.
"""

import os

from . import _native
from ._errors import FormatError

# Element sizes in bytes of the dtypes the frameworks hold (sub-byte
# F4/F6 types are refused: neither numpy nor safetensors' torch loader
# holds them as such).
_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}


def _path(p):
    if isinstance(p, bytes):
        return os.fsdecode(p)
    return os.fspath(p)


def _framework(framework):
    if framework in ("pt", "torch"):
        from . import torch as fw
    elif framework in ("np", "numpy"):
        from . import numpy as fw
    else:
        raise FormatError(f"framework {framework!r}: ckptfs supports 'pt' (torch) and 'np' (numpy)")
    return fw._ADAPTER


class _File:
    """An opened checkpoint: the native reader and its tensor table."""

    def __init__(self, reader):
        self.reader = reader
        self.entries = {}
        for i, (name, dtype, shape, begin, end) in enumerate(reader.tensors()):
            self.entries[name] = (i, dtype, tuple(shape), begin, end)

    @classmethod
    def open(cls, path):
        return cls(_native.open(_path(path)))

    @classmethod
    def from_bytes(cls, data):
        return cls(_native.open_bytes(bytes(data)))

    def entry(self, name):
        try:
            return self.entries[name]
        except KeyError:
            raise FormatError(f"{self.reader.name}: no tensor {name!r}") from None

    def by_offset(self):
        """Tensor names in the order of their data (safetensors' load order)."""
        e = self.entries
        return sorted(e, key=lambda k: e[k][3])

    def load(self, fw, names, device="cpu"):
        """Every tensor of ``names``, decoded in one call."""
        out, targets, keep = {}, [], []
        for name in names:
            i, dtype, shape, begin, end = self.entry(name)
            t, addr = fw.empty(dtype, shape, self.reader.name, name)
            out[name] = t
            if end > begin:
                targets.append((i, 0, end - begin, addr))
                keep.append(t)
        if targets:
            self.reader.read_into(targets)
        if device not in (None, "cpu"):
            out = {k: fw.to_device(v, device) for k, v in out.items()}
        return out

    def load_slice(self, fw, name, index):
        i, dtype, shape, begin, end = self.entry(name)
        size = _SIZES.get(dtype)
        if size is None:
            raise FormatError(f"{self.reader.name}: tensor {name!r}: no slices of {dtype} tensors")
        dims, squeeze = _normalize(index, shape, name)
        out_shape = [len(range(a, b, s)) for a, b, s in dims]
        final_shape = [n for n, sq in zip(out_shape, squeeze) if not sq]
        if any(n == 0 for n in out_shape) or end == begin:
            t, _ = fw.empty(dtype, final_shape, self.reader.name, name)
            return t
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        strides.reverse()
        first = sum(a * st for (a, _, _), st in zip(dims, strides))
        last = sum((a + (n - 1) * s) * st for (a, _, s), n, st in zip(dims, out_shape, strides))
        count = last - first + 1
        buf, addr = fw.empty(dtype, [count], self.reader.name, name)
        # Only the blocks holding elements first..last are decoded.
        self.reader.read_into([(i, first * size, count * size, addr)])
        view = fw.strided(buf, out_shape, [s * st for (_, _, s), st in zip(dims, strides)])
        return fw.reshape(view, final_shape)


def _normalize(index, shape, name):
    """Per dimension (start, stop, step) and whether an int dropped it."""
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        k = index.index(Ellipsis)
        fill = len(shape) - (len(index) - 1)
        index = index[:k] + (slice(None),) * max(fill, 0) + index[k + 1:]
    if len(index) > len(shape):
        raise FormatError(f"tensor {name!r}: {len(index)} indices for {len(shape)} dimensions")
    index = index + (slice(None),) * (len(shape) - len(index))
    dims, squeeze = [], []
    for i, n in zip(index, shape):
        if isinstance(i, slice):
            a, b, s = i.indices(n)
            if s <= 0:
                raise FormatError(f"tensor {name!r}: slices take a positive step")
            dims.append((a, max(a, b), s))
            squeeze.append(False)
        else:
            try:
                k = int(i.__index__())
            except (AttributeError, TypeError):
                raise FormatError(f"tensor {name!r}: cannot index with {i!r}") from None
            if k < 0:
                k += n
            if not 0 <= k < n:
                raise FormatError(f"tensor {name!r}: index {i} out of range for dimension of {n}")
            dims.append((k, k + 1, 1))
            squeeze.append(True)
    return dims, squeeze


class safe_open:
    """Opens a checkpoint as ``safetensors.safe_open`` does.

    ``path`` is a ``.zstn``, a delta (its base found as the CLI finds it), a
    plain ``.safetensors``, a safetensors member of a ``.blz`` named as
    ``ARCHIVE.blz/MEMBER`` (e.g. ``model.blz/model.safetensors``), or an
    ``s3://BUCKET/KEY`` URL. ``framework`` is ``"pt"`` or ``"np"``. Other
    keywords safetensors takes (``backend``) are accepted and ignored.
    """

    def __init__(self, filename, framework="pt", device="cpu", **_ignored):
        self._fw = _framework(framework)
        self._device = device
        self._f = _File.open(filename)

    @classmethod
    def _from_bytes(cls, data, framework):
        self = cls.__new__(cls)
        self._fw = _framework(framework)
        self._device = "cpu"
        self._f = _File.from_bytes(data)
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        self._f = None

    def _file(self):
        if self._f is None:
            raise FormatError("the file is closed")
        return self._f

    def keys(self):
        """Tensor names, sorted (as safetensors gives them)."""
        return sorted(self._file().entries)

    def offset_keys(self):
        """Tensor names in the order of their data in the file."""
        return self._file().by_offset()

    def metadata(self):
        return self._file().reader.metadata()

    def get_tensor(self, name):
        return self._file().load(self._fw, [name], self._device)[name]

    def get_tensors(self):
        f = self._file()
        return f.load(self._fw, f.by_offset(), self._device)

    def get_slice(self, name):
        self._file().entry(name)
        return _Slice(self, name)


class _Slice:
    """A tensor not read yet: ``get_shape``, ``get_dtype``, ``[...]``."""

    def __init__(self, opened, name):
        self._opened = opened
        self._name = name

    def _entry(self):
        return self._opened._file().entry(self._name)

    def get_shape(self):
        return list(self._entry()[2])

    def get_dtype(self):
        return self._entry()[1]

    def __len__(self):
        shape = self._entry()[2]
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    def __getitem__(self, index):
        o = self._opened
        f = o._file()
        if index is Ellipsis or (isinstance(index, slice) and index == slice(None)):
            t = f.load(o._fw, [self._name])[self._name]
        else:
            t = f.load_slice(o._fw, self._name, index)
        if o._device not in (None, "cpu"):
            t = o._fw.to_device(t, o._device)
        return t


def load_file(fw, path, device="cpu"):
    f = _File.open(path)
    return f.load(fw, f.by_offset(), device)


def load(fw, data):
    f = _File.from_bytes(data)
    return f.load(fw, f.by_offset())


def _metadata(metadata):
    if metadata is None:
        return None
    items = []
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise FormatError(f"metadata {k!r}: keys and values must be str")
        items.append((k, v))
    return items


def save(fw, tensors, metadata, level, path, compat="ckptfs"):
    items, keep = [], []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise FormatError(f"tensor name {name!r}: must be str")
        dtype, shape, addr, nbytes, held = fw.export(name, t)
        keep.append(held)
        items.append((name, dtype, shape, addr, nbytes))
    return _native.save(items, _metadata(metadata), level, None if path is None else _path(path), compat)
