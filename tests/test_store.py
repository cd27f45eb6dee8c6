"""MODEL refs: paths, offline names, and models already in the Hugging Face cache."""

from __future__ import annotations

import os
import shutil

import pytest

from infr import store
from infr.errors import InfrError


def _fake_hf_cache(root, repo: str, files: dict[str, bytes]):
    """The layout huggingface_hub writes: blobs, snapshot symlinks, refs/main."""
    base = root / ("models--" + repo.replace("/", "--"))
    rev = "0" * 40
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(rev)
    for i, (name, data) in enumerate(files.items()):
        blob = base / "blobs" / f"{i:064x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = base / "snapshots" / rev / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch, smollm2_path):
    cache = tmp_path / "hub"
    gguf = smollm2_path.read_bytes()[:4096]  # resolution reads names only
    _fake_hf_cache(cache, "acme/tiny-GGUF", {
        "tiny-Q4_K_M.gguf": gguf, "tiny-Q8_0.gguf": gguf, "mmproj-tiny-Q4_K_M.gguf": gguf, "tiny-PQ2_0.gguf": gguf,
    })
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    return cache


def test_default_quant_and_side_files(hf_cache):
    assert store.resolve("acme/tiny-GGUF").name == "tiny-Q4_K_M.gguf"  # Q4_K_M by default, never mmproj
    assert store.resolve("hf:acme/tiny-GGUF:q8_0").name == "tiny-Q8_0.gguf"  # case-insensitive, hf: prefix
    assert store.resolve("acme/tiny-GGUF/tiny-Q8_0.gguf").name == "tiny-Q8_0.gguf"


def test_quant_not_found_lists_what_exists(hf_cache):
    with pytest.raises(InfrError, match=r"acme/tiny-GGUF: no cached file matches Q2_0; cached: mmproj-tiny-Q4_K_M.gguf, "):
        store.resolve("acme/tiny-GGUF:Q2_0")  # Q2_0 must not match PQ2_0


def test_repo_not_cached(hf_cache):
    with pytest.raises(InfrError, match=r"other/model is not in the Hugging Face cache"):
        store.resolve("other/model")


def test_quant_token_boundaries():
    assert store.quant_matches("model-Q4_K_M.gguf", "Q4_K_M")
    assert store.quant_matches("model.q4_k_m.gguf", "Q4_K_M")
    assert not store.quant_matches("model-PQ2_0.gguf", "Q2_0")
    assert not store.quant_matches("model-Q4_K_M.gguf", "Q4_K")


def test_paths_and_offline_names(smollm2_path, tmp_path):
    assert store.resolve(str(smollm2_path)) == smollm2_path
    assert store.resolve("smollm2").name == smollm2_path.name
    with pytest.raises(InfrError, match="no such file: absent.gguf"):
        store.resolve("absent.gguf")
    copy = tmp_path / "m.gguf"
    shutil.copyfile(smollm2_path, copy)
    assert store.resolve(str(copy)) == copy
