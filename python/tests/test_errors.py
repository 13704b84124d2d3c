"""Damaged, truncated and hostile files raise ckptfs.Error with the CLI's
one-line message; nothing crashes the interpreter."""

import errno
import struct

import pytest
import safetensors.torch
import torch

import ckptfs
import ckptfs.torch


@pytest.fixture
def packed(tmp_path, cli):
    t = {"w": (torch.randn(512, 1024) * 0.02).to(torch.bfloat16), "b": torch.randn(1000)}
    safetensors.torch.save_file(t, tmp_path / "m.safetensors")
    cli("pack", tmp_path / "m.safetensors", "-o", tmp_path / "m.zstn")
    return tmp_path / "m.zstn"


def cli_message(cli, path):
    r = cli("verify", path, check=False)
    assert r.returncode != 0
    return (r.stdout + r.stderr).strip().splitlines()[-1]


def test_flipped_bytes_raise_the_clis_error(packed, cli):
    data = bytearray(packed.read_bytes())
    data[len(data) // 2] ^= 0x55
    bad = packed.with_name("bad.zstn")
    bad.write_bytes(bytes(data))
    with pytest.raises(ckptfs.FormatError) as e:
        ckptfs.torch.load_file(bad)
    assert isinstance(e.value, ValueError) and isinstance(e.value, ckptfs.Error)
    assert str(bad) in str(e.value)
    assert "\n" not in str(e.value)
    # The CLI's line (`verify` prints it after "FAIL").
    assert cli_message(cli, bad).endswith(str(e.value))


@pytest.mark.parametrize("keep", [0, 5, 8, 100, 0.5, 0.99])
def test_truncated_files_raise(packed, keep):
    data = packed.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else keep
    cut = packed.with_name("cut.zstn")
    cut.write_bytes(data[:n])
    with pytest.raises(ckptfs.Error):
        ckptfs.torch.load_file(cut)


@pytest.mark.parametrize("header", [
    struct.pack("<Q", 1 << 62) + b"{}",
    struct.pack("<Q", 10) + b"{not json}",
    struct.pack("<Q", 56) + b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,99]}}',
    struct.pack("<Q", 64) + b'{"a":{"dtype":"F32","shape":[1e30],"data_offsets":[0,4]}}'.ljust(64) + b"xxxx",
    struct.pack("<Q", 56) + b'{"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}}'.ljust(56) + b"xxxx",
])
def test_hostile_plain_headers_raise(tmp_path, header):
    p = tmp_path / "h.safetensors"
    p.write_bytes(header)
    with pytest.raises(ckptfs.FormatError):
        ckptfs.torch.load_file(p)
    with pytest.raises(ckptfs.FormatError):
        ckptfs.torch.load(header)


def test_unrecognised_and_missing_files(tmp_path):
    with pytest.raises(ckptfs.StorageError) as e:
        ckptfs.torch.load_file(tmp_path / "missing.zstn")
    assert e.value.errno == errno.ENOENT
    (tmp_path / "z.z4ai").write_bytes(b"Z4AIMF01" + bytes(64))
    with pytest.raises(ckptfs.FormatError, match="z4ai"):
        ckptfs.torch.load_file(tmp_path / "z.z4ai")
    with pytest.raises(ckptfs.StorageError):
        ckptfs.torch.load_file(tmp_path)


def test_bad_arguments(packed):
    with pytest.raises(ckptfs.FormatError):
        ckptfs.safe_open(packed, framework="jax")
    with ckptfs.safe_open(packed, "pt") as f:
        with pytest.raises(ckptfs.FormatError, match="no tensor"):
            f.get_tensor("nope")
        with pytest.raises(ckptfs.FormatError):
            f.get_slice("w")[0, 0, 0]
        with pytest.raises(ckptfs.FormatError):
            f.get_slice("w")[::-1]
    with pytest.raises(ckptfs.FormatError):
        ckptfs.torch.save_file({"x": "not a tensor"}, packed.with_name("x.zstn"))
