"""The tokenizer's bulk construction equals the per-token loops it replaced, on the real models.

tests/test_tokenizer.py locks the ids to llama.cpp's; here the whole merge
lists are compared, every pair in order, so a difference shows even where no
fixture text would reach it.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from infr import tokenizer_merges as T
from infr.tokenizer import Tokenizer
from infr.gguf_file import open_gguf
from infr.gguf_meta import StrArray


def _plain(gf, **override):
    """The same metadata with string arrays as plain lists (no bulk form): the loops run."""
    meta = {k: (list(v) if isinstance(v, StrArray) else v) for k, v in gf.metadata.items()}
    meta.update(override)
    return SimpleNamespace(get=lambda k, d=None: meta.get(k, d), path=gf.path, metadata=meta)


def _bulk(strings: list[str]) -> StrArray:
    """A StrArray in the bulk form infr.gguf_meta makes: each string after 8 NUL bytes."""
    out = StrArray(strings)
    out.text = "".join("\x00" * 8 + s for s in strings)
    out.blob = np.frombuffer(out.text.encode(), dtype=np.uint8)
    out.lens = np.array([len(s.encode()) for s in strings], dtype=np.int64)
    out.starts = np.cumsum(out.lens + 8) - out.lens
    return out


def test_spm_merges_bulk_equal_the_loop(gemma3_path):
    gf = open_gguf(gemma3_path)
    tokens = gf.get("tokenizer.ggml.tokens")
    assert tokens.blob is not None
    vocab = dict(zip(tokens, range(len(tokens))))
    bulk = T._merges_from_scores(gf, tokens, vocab)
    loop = T._merges_from_scores(_plain(gf), list(tokens), vocab)
    assert len(bulk) > 500_000 and bulk == loop


@pytest.mark.parametrize("fixture", ["smollm2_path", "qwen_coder_path"])
def test_gpt2_merges_bulk_equal_the_loop(fixture, request):
    gf = open_gguf(request.getfixturevalue(fixture))
    assert gf.get("tokenizer.ggml.merges").text is not None
    bulk = T.merges_from_gguf(gf)
    loop = T.merges_from_gguf(_plain(gf))
    assert len(bulk) > 40_000 and bulk == loop


def test_gpt2_merge_rule_on_odd_entries():
    # The first half may start with a space; an entry without a later space is dropped.
    entries = [" a b", "ab", "a  b", "Ġ Ġ", "x y z", "  ", "é ü"] * 20
    blob_text = "".join("\x00" * 8 + e for e in entries)
    merges = StrArray(entries)
    merges.text = blob_text
    gf = SimpleNamespace(get=lambda k, d=None: merges, path=None)
    plain = SimpleNamespace(get=lambda k, d=None: list(entries), path=None)
    assert T.merges_from_gguf(gf) == T.merges_from_gguf(plain)
    assert T.merges_from_gguf(gf)[:6] == [(" a", "b"), ("a", " b"), ("Ġ", "Ġ"), ("x", "y z"), (" ", ""), ("é", "ü")]


def test_spm_merges_fall_back_on_a_hash_collision(gemma3_path, monkeypatch):
    # Hashes only propose pairs; with every hash forced equal the loop must decide, and agree.
    gf = open_gguf(gemma3_path)
    small = _bulk(gf.get("tokenizer.ggml.tokens")[:3000])
    vocab = dict(zip(small, range(len(small))))
    scores = np.asarray(gf.get("tokenizer.ggml.scores"))[:3000]
    fake = SimpleNamespace(get=lambda k, d=None: scores if k == "tokenizer.ggml.scores" else d, path=gf.path)
    want = T._merges_from_scores(fake, list(small), vocab)
    assert T._merges_from_scores(fake, small, vocab) == want
    monkeypatch.setattr(T, "_HASH_BASE", 0)  # every string hashes to its first byte
    monkeypatch.setattr(T, "_HASH_INV", 0)
    assert T._splits_bulk(small, np.arange(len(small))) is None
    assert T._merges_from_scores(fake, small, vocab) == want


# --- the merges cache (infr.tokenizer_cache)

TEXTS = ["Hello world", "  héllo\n\nwörld 123 ありがとう", "<start_of_turn>user\nhi<end_of_turn>"]


def _derivations(monkeypatch) -> list[int]:
    calls = []
    real = T._merges_from_scores

    def counted(*a):
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(T, "_merges_from_scores", counted)
    return calls


def test_merges_cache_round_trip(gemma3_path, tmp_path, monkeypatch):
    from infr import tokenizer_cache

    monkeypatch.setenv("INFR_CACHE", str(tmp_path))
    calls = _derivations(monkeypatch)
    first = Tokenizer.from_gguf(open_gguf(gemma3_path))
    assert first.hf is not None  # built on a thread; this waits for it
    cached = tokenizer_cache.cache_file(gemma3_path)
    assert calls == [1] and cached.exists() and cached.parent.parent == tmp_path
    again = Tokenizer.from_gguf(open_gguf(gemma3_path))
    assert again.hf is not None and calls == [1]  # read back, not derived
    for text in TEXTS:
        assert again.encode(text) == first.encode(text)
    tokens = open_gguf(gemma3_path).get("tokenizer.ggml.tokens")
    pairs = tokenizer_cache.load(gemma3_path, len(tokens))
    vocab = dict(zip(tokens, range(len(tokens))))
    derived = T._merges_from_scores(open_gguf(gemma3_path), tokens, vocab)
    assert [(tokens[a], tokens[b]) for a, b in pairs.tolist()] == derived


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "empty", "garbage_header"])
def test_unsound_merges_cache_is_rebuilt(gemma3_path, tmp_path, monkeypatch, damage):
    from infr import tokenizer_cache

    monkeypatch.setenv("INFR_CACHE", str(tmp_path))
    calls = _derivations(monkeypatch)
    want = Tokenizer.from_gguf(open_gguf(gemma3_path)).encode(TEXTS[1])
    cached = tokenizer_cache.cache_file(gemma3_path)
    data = bytearray(cached.read_bytes())
    if damage == "flip_byte":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) - 12]
    elif damage == "empty":
        data = bytearray()
    else:
        data[:8] = b"NOTMINE!"
    cached.write_bytes(bytes(data))
    assert tokenizer_cache.load(gemma3_path, 262144) is None
    assert Tokenizer.from_gguf(open_gguf(gemma3_path)).encode(TEXTS[1]) == want
    assert calls == [1, 1]  # derived again
    assert tokenizer_cache.load(gemma3_path, 262144) is not None  # and rewritten sound


def test_merges_cache_key_follows_the_file(tmp_path, monkeypatch):
    from infr import tokenizer_cache

    monkeypatch.setenv("INFR_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 60)
    key = tokenizer_cache.cache_file(f)
    os.utime(f, ns=(1_000_000_000, 2_000_000_000))
    assert tokenizer_cache.cache_file(f) != key  # touched: a new key
    f.write_bytes(b"GGUF" + b"\0" * 61)
    os.utime(f, ns=(1_000_000_000, 2_000_000_000))
    assert tokenizer_cache.cache_file(f) != key  # resized
    assert tokenizer_cache.load(f, 262144) is None


def test_unwritable_cache_is_no_error(gemma3_path, tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache directory would go")
    monkeypatch.setenv("INFR_CACHE", str(blocker))
    tok = Tokenizer.from_gguf(open_gguf(gemma3_path))
    assert tok.encode("Hello world", add_special=False)
