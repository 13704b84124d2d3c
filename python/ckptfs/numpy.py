"""``ckptfs.numpy``: safetensors.numpy's functions over ckptfs archives.

bf16 and fp8 tensors come as ``ml_dtypes`` arrays (install ``ml_dtypes``
or ``ckptfs[numpy]``), as safetensors does for them.
"""

import numpy as _np

from . import _core
from ._errors import FormatError

_TYPES = {
    "F64": _np.dtype(_np.float64), "F32": _np.dtype(_np.float32), "F16": _np.dtype(_np.float16),
    "I64": _np.dtype(_np.int64), "U64": _np.dtype(_np.uint64), "I32": _np.dtype(_np.int32),
    "U32": _np.dtype(_np.uint32), "I16": _np.dtype(_np.int16), "U16": _np.dtype(_np.uint16),
    "I8": _np.dtype(_np.int8), "U8": _np.dtype(_np.uint8), "BOOL": _np.dtype(_np.bool_),
    "C64": _np.dtype(_np.complex64),
}
try:
    import ml_dtypes as _ml

    for _name, _attr in [("BF16", "bfloat16"), ("F8_E4M3", "float8_e4m3fn"),
                         ("F8_E5M2", "float8_e5m2"), ("F8_E8M0", "float8_e8m0fnu")]:
        if hasattr(_ml, _attr):
            _TYPES[_name] = _np.dtype(getattr(_ml, _attr))
except ImportError:  # bf16/fp8 then raise, naming ml_dtypes
    pass
_NAMES = {v: k for k, v in _TYPES.items()}


class _Adapter:
    @staticmethod
    def empty(dtype, shape, file, name):
        dt = _TYPES.get(dtype)
        if dt is None:
            hint = " (install ml_dtypes)" if dtype in ("BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0") else ""
            raise FormatError(f"{file}: tensor {name!r}: numpy has no {dtype} arrays{hint}")
        a = _np.empty(tuple(shape), dtype=dt)
        return a, a.__array_interface__["data"][0]

    @staticmethod
    def strided(buf, shape, strides):
        isz = buf.dtype.itemsize
        v = _np.lib.stride_tricks.as_strided(buf, shape=shape, strides=[s * isz for s in strides])
        return _np.ascontiguousarray(v)

    @staticmethod
    def reshape(a, shape):
        return a.reshape(shape)

    @staticmethod
    def to_device(a, device):
        raise FormatError(f"device {device!r}: numpy arrays live on the CPU")

    @staticmethod
    def export(name, a):
        if not isinstance(a, _np.ndarray):
            raise FormatError(f"tensor {name!r}: not a numpy.ndarray ({type(a).__name__})")
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        a = _np.ascontiguousarray(a)
        dtype = _NAMES.get(a.dtype.newbyteorder("=") if a.dtype.byteorder == "<" else a.dtype)
        if dtype is None:
            raise FormatError(f"tensor {name!r}: dtype {a.dtype} has no safetensors name")
        return dtype, list(a.shape), a.__array_interface__["data"][0], a.nbytes, a


_ADAPTER = _Adapter()


def load_file(filename):
    """Every tensor of the checkpoint at ``filename`` (see ``ckptfs.safe_open``)."""
    return _core.load_file(_ADAPTER, filename)


def load(data):
    """Every tensor of a checkpoint held in ``data``."""
    return _core.load(_ADAPTER, data)


def save_file(tensors, filename, metadata=None, *, level=3, compat="ckptfs"):
    """Writes ``tensors`` to ``filename`` as a ``.zstn``, atomically (see
    ``ckptfs.torch.save_file``)."""
    _core.save(_ADAPTER, tensors, metadata, level, filename, compat)


def save(tensors, metadata=None, *, level=3, compat="ckptfs"):
    """The ``.zstn`` of ``tensors``, as bytes."""
    return _core.save(_ADAPTER, tensors, metadata, level, None, compat)
