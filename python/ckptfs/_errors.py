"""The exceptions ckptfs raises.

Every error of ckptfs is a :class:`Error`; it is also a built-in exception
that says what kind of failure it is, so that code written for safetensors
(which raises ``SafetensorError``, ``ValueError`` and ``OSError``) catches it:

- :class:`FormatError` (also a ``ValueError``): the file is damaged,
  truncated, hostile, not of a kind ckptfs reads, or an argument is wrong;
- :class:`StorageError` (also an ``OSError``, with ``errno`` when the
  system gave one): the bytes could not be read or written (a missing file,
  a failed read, an unreachable ``s3://`` server).

The message is the CLI's one line, naming the file.
"""


class Error(Exception):
    """Base class of every ckptfs error."""


class FormatError(Error, ValueError):
    """Damaged, truncated, hostile or unsupported input, or a bad argument."""


class StorageError(Error, OSError):
    """Reading or writing failed."""


# Shown as ckptfs.Error etc. in tracebacks (they are exported there).
for _c in (Error, FormatError, StorageError):
    _c.__module__ = "ckptfs"
