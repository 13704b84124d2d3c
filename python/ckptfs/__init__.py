"""ckptfs: load and save compressed model checkpoints without a mount.

- ``ckptfs.safe_open(path, framework="pt"|"np", device="cpu")``: as
  ``safetensors.safe_open``, over ``.zstn``, deltas, plain ``.safetensors``,
  ``.blz`` members (``ARCHIVE.blz/MEMBER``) and ``s3://`` URLs;
- ``ckptfs.torch`` / ``ckptfs.numpy``: ``load_file``, ``load``,
  ``save_file``, ``save``, as ``safetensors.torch`` / ``safetensors.numpy``;
- ``ckptfs.patch()``: unmodified loaders (transformers, sentence-transformers,
  vLLM) read packed models (see ``ckptfs._patch``);
- ``ckptfs.model_dir(path)``: a ``.blz`` or packed store as a directory
  loaders can list;
- ``ckptfs.Error`` (``FormatError``: also a ``ValueError``;
  ``StorageError``: also an ``OSError``).
"""

from ._core import safe_open
from ._errors import Error, FormatError, StorageError
from ._model_dir import model_dir
from ._patch import patch, unpatch

__version__ = "0.1.0"
__all__ = [
    "safe_open", "Error", "FormatError", "StorageError", "patch", "unpatch", "model_dir",
]
