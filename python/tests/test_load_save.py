"""ckptfs.safe_open / ckptfs.torch / ckptfs.numpy against safetensors."""

import json
import os
import struct

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import ckptfs
import ckptfs.numpy
import ckptfs.torch

ALL_TORCH = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
             torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64,
             torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu, torch.uint16,
             torch.uint32, torch.uint64]


def same(a, b):
    """Equal dtype, shape and bytes (NaNs included)."""
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and (
            a.numel() == 0 or a.contiguous().view(-1).view(torch.uint8).equal(
                b.contiguous().view(-1).view(torch.uint8)))
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def raw_tensors(path):
    """Tensors of a safetensors file read by hand (for files safetensors
    refuses but ckptfs reads, e.g. non-contiguous data offsets)."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    h = json.loads(data[8:8 + n])
    h.pop("__metadata__", None)
    return {k: data[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]] for k, v in h.items()}


def sample(dtype, shape=(3, 1000)):
    g = torch.Generator().manual_seed(hash(str(dtype)) & 0xFFFF)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(shape, generator=g, dtype=torch.float32) * 0.05).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def test_every_z4ai_vector_matches_safetensors(vectors):
    n = 0
    for name in sorted(os.listdir(vectors)):
        if not name.endswith(".zstn"):
            continue
        z, plain = vectors / name, vectors / (name[:-5] + ".safetensors")
        try:
            want = safetensors.torch.load_file(plain)
        except Exception:
            want = None
        if want is None:
            # safetensors refuses the file: ckptfs either refuses it too, or
            # (as the mount does) reads the bytes the header names.
            try:
                got = ckptfs.torch.load_file(z)
            except ckptfs.FormatError:
                continue
            raw = raw_tensors(plain)
            assert {k: bytes(v.contiguous().view(-1).view(torch.uint8).numpy()) for k, v in got.items()} == raw
            continue
        got = ckptfs.torch.load_file(z)
        assert list(got) == list(want), name
        for k in want:
            assert same(got[k], want[k]), (name, k)
        with ckptfs.safe_open(z, "np") as f, safetensors.safe_open(plain, "np") as g:
            assert f.keys() == g.keys()
            assert f.metadata() == g.metadata()
            for k in f.keys():
                try:
                    w = g.get_tensor(k)
                except Exception:  # safetensors.numpy lacks fp8
                    continue
                assert f.get_tensor(k).tobytes() == w.tobytes(), (name, k)
        n += 1
    assert n >= 10


def test_every_dtype_round_trips_through_save_file_and_the_cli(tmp_path, cli):
    tensors = {f"t_{str(d).split('.')[1]}": sample(d) for d in ALL_TORCH}
    tensors["scalar"] = torch.tensor(1.5)
    tensors["empty"] = torch.zeros((0, 4))
    meta = {"format": "pt", "note": "ckptfs"}
    out = tmp_path / "all.zstn"
    ckptfs.torch.save_file(tensors, out, metadata=meta)
    cli("verify", out)
    cli("unpack", out, "-o", tmp_path / "all.safetensors")
    back = safetensors.torch.load_file(tmp_path / "all.safetensors")
    got = ckptfs.torch.load_file(out)
    assert set(got) == set(tensors) == set(back)
    for k, v in tensors.items():
        assert same(got[k], v), k
        assert same(back[k], v), k
    with safetensors.safe_open(tmp_path / "all.safetensors", "pt") as f:
        assert f.metadata() == meta
    # save() gives the bytes save_file writes; load() reads them.
    data = ckptfs.torch.save(tensors, metadata=meta)
    assert data == out.read_bytes()
    assert all(same(ckptfs.torch.load(data)[k], v) for k, v in tensors.items())


def test_compat_z4ai_writes_frames_z4ai_reads(tmp_path, cli):
    import z4ai.safetensors

    rng = np.random.default_rng(3)
    w = torch.from_numpy(rng.normal(0, 0.02, (512, 1024)).astype(np.float32)).to(torch.bfloat16)
    tensors = {"w": w, "b": torch.arange(1024, dtype=torch.float32)}
    default, compat = tmp_path / "default.zstn", tmp_path / "z4ai.zstn"
    ckptfs.torch.save_file(tensors, default)
    ckptfs.torch.save_file(tensors, compat, compat="z4ai")
    assert "split-float" in cli("info", default).stdout
    assert "split-float" not in cli("info", compat).stdout
    z4ai.safetensors.decompress_file(str(compat), str(tmp_path / "z4ai.safetensors"))
    back = safetensors.torch.load_file(tmp_path / "z4ai.safetensors")
    assert all(torch.equal(back[k], v) for k, v in tensors.items())
    for f in (default, compat):
        got = ckptfs.torch.load_file(f)
        assert all(torch.equal(got[k], v) for k, v in tensors.items())
    with pytest.raises(ckptfs.Error, match="compat"):
        ckptfs.torch.save(tensors, compat="zipnn")


def test_numpy_dtypes_including_ml_dtypes(tmp_path, cli):
    import ml_dtypes as ml
    rng = np.random.default_rng(1)
    f32 = rng.standard_normal((4, 513)).astype(np.float32)
    arrays = {
        "f64": f32.astype(np.float64), "f32": f32, "f16": f32.astype(np.float16),
        "bf16": f32.astype(ml.bfloat16), "e4m3": f32.astype(ml.float8_e4m3fn),
        "e5m2": f32.astype(ml.float8_e5m2), "i64": rng.integers(-9, 9, 50),
        "i32": rng.integers(-9, 9, 50).astype(np.int32), "u16": np.arange(70, dtype=np.uint16),
        "u8": np.arange(200, dtype=np.uint8), "b": f32[0] > 0, "c64": (f32 + 1j * f32).astype(np.complex64),
        "big_endian": f32.astype(">f4"), "transposed": f32.T,
    }
    out = tmp_path / "np.zstn"
    ckptfs.numpy.save_file(arrays, out)
    cli("verify", out)
    got = ckptfs.numpy.load_file(out)
    for k, v in arrays.items():
        want = np.ascontiguousarray(v.astype(v.dtype.newbyteorder("=")))
        assert got[k].dtype == want.dtype and np.array_equal(got[k].view(np.uint8), want.view(np.uint8)), k
    cli("unpack", out, "-o", tmp_path / "np.safetensors")
    with safetensors.safe_open(tmp_path / "np.safetensors", "np") as f:
        for k in ("f32", "i64", "u8", "b", "big_endian", "transposed"):
            assert np.array_equal(f.get_tensor(k), got[k])


def test_cli_packed_and_plain_files_read_exactly(tmp_path, cli):
    tensors = {"w": sample(torch.bfloat16, (700, 2048)), "b": sample(torch.float32, (2048,)),
               "ids": sample(torch.int64, (5000,))}
    plain = tmp_path / "m.safetensors"
    safetensors.torch.save_file(tensors, plain, metadata={"k": "v"})
    cli("pack", plain, "-o", tmp_path / "m.zstn")
    want = safetensors.torch.load_file(plain)
    for path in (tmp_path / "m.zstn", plain):
        got = ckptfs.torch.load_file(path)
        assert list(got) == list(want)
        assert all(same(got[k], want[k]) for k in want)
        with ckptfs.safe_open(path, "pt") as f:
            assert f.metadata() == {"k": "v"}
    assert ckptfs.torch.load(plain.read_bytes()).keys() == want.keys()
    assert all(same(a, b) for a, b in zip(ckptfs.numpy.load_file(tmp_path / "m.zstn").values(),
                                          safetensors.numpy.load_file(plain).values())
               if a.dtype != object)


@pytest.mark.parametrize("index", [
    0, -1, slice(None), slice(5, 9), slice(1, 700, 7), (slice(None), slice(100, 200)),
    (3, slice(0, 2048, 3)), (Ellipsis, 5), (slice(690, 10000),), (slice(5, 5),), (Ellipsis,),
])
def test_slices_equal_safetensors(tmp_path, cli, index):
    plain = tmp_path / "s.safetensors"
    t = {"w": sample(torch.bfloat16, (700, 2048)), "v": sample(torch.float32, (7, 11, 13))}
    safetensors.torch.save_file(t, plain)
    cli("pack", plain, "-o", tmp_path / "s.zstn")
    with ckptfs.safe_open(tmp_path / "s.zstn", "pt") as f, safetensors.safe_open(plain, "pt") as g:
        for name in ("w", "v"):
            a, b = f.get_slice(name), g.get_slice(name)
            assert a.get_shape() == b.get_shape() and a.get_dtype() == b.get_dtype()
            try:
                want = b[index]
            except Exception:
                with pytest.raises((ckptfs.Error, IndexError, TypeError)):
                    a[index]
                continue
            assert same(a[index], want), (name, index)
    with ckptfs.safe_open(tmp_path / "s.zstn", "np") as f, safetensors.safe_open(plain, "np") as g:
        try:
            want = g.get_slice("v")[index]
        except Exception:
            return
        assert np.array_equal(f.get_slice("v")[index], want)


def test_delta_reads_with_its_base(tmp_path, cli):
    base = {"w": sample(torch.bfloat16, (300, 1024)), "b": sample(torch.float32, (64,))}
    cur = {"w": base["w"].clone(), "b": base["b"] + 1}
    cur["w"][7] += 1
    safetensors.torch.save_file(base, tmp_path / "base.safetensors")
    safetensors.torch.save_file(cur, tmp_path / "cur.safetensors")
    cli("pack", tmp_path / "base.safetensors", "-o", tmp_path / "base.zstn")
    cli("pack", tmp_path / "cur.safetensors", "--base", tmp_path / "base.zstn", "-o", tmp_path / "cur.z4dm")
    got = ckptfs.torch.load_file(tmp_path / "cur.z4dm")
    assert all(same(got[k], cur[k]) for k in cur)
    with ckptfs.safe_open(tmp_path / "cur.z4dm", "pt") as f:
        assert same(f.get_slice("w")[7], cur["w"][7])
    (tmp_path / "base.zstn").unlink()
    with pytest.raises(ckptfs.Error):
        ckptfs.torch.load_file(tmp_path / "cur.z4dm")


@pytest.mark.parametrize("fmt", ["ckptfs", "blazex"])
def test_blz_members(tmp_path, cli, fmt):
    d = tmp_path / "model"
    d.mkdir()
    t = {"w": sample(torch.bfloat16, (64, 512)), "b": sample(torch.float32, (512,))}
    safetensors.torch.save_file(t, d / "model.safetensors", metadata={"format": "pt"})
    (d / "config.json").write_text('{"model_type": "bert"}')
    cli("pack", d, "-o", tmp_path / "m.blz", "--format", fmt)
    got = ckptfs.torch.load_file(f"{tmp_path}/m.blz/model.safetensors")
    assert all(same(got[k], t[k]) for k in t)
    with pytest.raises(ckptfs.FormatError, match="model directory"):
        ckptfs.torch.load_file(tmp_path / "m.blz")
    with pytest.raises(ckptfs.StorageError) as e:
        ckptfs.torch.load_file(f"{tmp_path}/m.blz/other.safetensors")
    assert isinstance(e.value, OSError)


def test_s3_url(tmp_path, cli, s3):
    import boto3

    t = {"w": sample(torch.bfloat16, (128, 1024))}
    safetensors.torch.save_file(t, tmp_path / "x.safetensors")
    cli("pack", tmp_path / "x.safetensors", "-o", tmp_path / "x.zstn")
    boto3.client("s3", endpoint_url=s3).upload_file(str(tmp_path / "x.zstn"), "ckpt", "models/x.zstn")
    got = ckptfs.torch.load_file("s3://ckpt/models/x.zstn")
    assert same(got["w"], t["w"])
    with ckptfs.safe_open("s3://ckpt/models/x.zstn", "pt") as f:
        assert same(f.get_slice("w")[3:5], t["w"][3:5])
    with pytest.raises(ckptfs.StorageError, match="s3://ckpt/models/missing.zstn"):
        ckptfs.torch.load_file("s3://ckpt/models/missing.zstn")


def test_save_file_is_atomic_and_replaces(tmp_path, cli):
    out = tmp_path / "a.zstn"
    ckptfs.torch.save_file({"x": torch.ones(10)}, out)
    ckptfs.torch.save_file({"y": torch.zeros(10)}, out)
    assert list(ckptfs.torch.load_file(out)) == ["y"]
    assert sorted(os.listdir(tmp_path)) == ["a.zstn"]  # no temporary left
    with pytest.raises(ckptfs.FormatError):
        ckptfs.torch.save_file({"x": torch.ones(2)}, out, metadata={"k": 1})
    with pytest.raises(ckptfs.StorageError):
        ckptfs.torch.save_file({"x": torch.ones(2)}, tmp_path / "no" / "dir.zstn")
    assert list(ckptfs.torch.load_file(out)) == ["y"]
