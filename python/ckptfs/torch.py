"""``ckptfs.torch``: safetensors.torch's functions over ckptfs archives.

``load_file``/``load`` read any checkpoint ``ckptfs.safe_open`` opens;
``save_file``/``save`` write a ``.zstn`` (z4ai's ZSTN container, with
ckptfs's checksums) exactly as ``ckptfs pack FILE`` writes it.
"""

import torch as _torch

from . import _core
from ._errors import FormatError

_TYPES = {
    "F64": _torch.float64, "F32": _torch.float32, "F16": _torch.float16,
    "BF16": _torch.bfloat16, "I64": _torch.int64, "I32": _torch.int32,
    "I16": _torch.int16, "I8": _torch.int8, "U8": _torch.uint8,
    "BOOL": _torch.bool, "C64": _torch.complex64,
}
for _name, _attr in [("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"),
                     ("F8_E8M0", "float8_e8m0fnu"), ("U16", "uint16"),
                     ("U32", "uint32"), ("U64", "uint64")]:
    if hasattr(_torch, _attr):
        _TYPES[_name] = getattr(_torch, _attr)
_NAMES = {v: k for k, v in _TYPES.items()}


class _Adapter:
    @staticmethod
    def empty(dtype, shape, file, name):
        try:
            dt = _TYPES[dtype]
        except KeyError:
            raise FormatError(f"{file}: tensor {name!r}: torch has no {dtype} tensors") from None
        t = _torch.empty(list(shape), dtype=dt)
        return t, t.data_ptr()

    @staticmethod
    def strided(buf, shape, strides):
        return buf.as_strided(shape, strides).contiguous()

    @staticmethod
    def reshape(t, shape):
        return t.reshape(shape)

    @staticmethod
    def to_device(t, device):
        return t.to(device)

    @staticmethod
    def export(name, t):
        if not isinstance(t, _torch.Tensor):
            raise FormatError(f"tensor {name!r}: not a torch.Tensor ({type(t).__name__})")
        dtype = _NAMES.get(t.dtype)
        if dtype is None:
            raise FormatError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        return dtype, list(t.shape), t.data_ptr(), t.numel() * t.element_size(), t


_ADAPTER = _Adapter()


def load_file(filename, device="cpu"):
    """Every tensor of the checkpoint at ``filename`` (see ``ckptfs.safe_open``)."""
    return _core.load_file(_ADAPTER, filename, device)


def load(data):
    """Every tensor of a checkpoint held in ``data`` (an archive's or a
    plain safetensors file's bytes)."""
    return _core.load(_ADAPTER, data)


def save_file(tensors, filename, metadata=None, *, level=3, compat="ckptfs"):
    """Writes ``tensors`` to ``filename`` as a ``.zstn`` (atomically:
    a temporary sibling, fsync, rename, fsync of the directory), as
    ``ckptfs pack --level LEVEL --compat COMPAT`` would from their
    safetensors file: ``compat="z4ai"`` writes only frames z4ai 0.2.0
    reads (the default, ``"ckptfs"``, float tensors in split-float frames
    that decode faster)."""
    _core.save(_ADAPTER, tensors, metadata, level, filename, compat)


def save(tensors, metadata=None, *, level=3, compat="ckptfs"):
    """The ``.zstn`` of ``tensors``, as bytes."""
    return _core.save(_ADAPTER, tensors, metadata, level, None, compat)
