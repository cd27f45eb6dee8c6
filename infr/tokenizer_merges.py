"""A BPE tokenizer's merge list from GGUF metadata: read (gpt2) or derived from scores (llama/SPM).

Split from infr.tokenizer. Both have a bulk path over an infr.gguf_meta.StrArray
(all strings at once, in numpy or one regex pass) beside the plain loop they
replaced; the loop stays for metadata without the bulk form and as the judge
when the bulk path is in doubt. tests/test_tokenizer_build.py checks that
both give the same list.
"""

from __future__ import annotations

import operator
import re
from typing import Sequence

import numpy as np

from infr import tokenizer_cache
from infr.errors import GGUFError


def merges_from_gguf(gf) -> list[tuple[str, str]]:
    merges = gf.get("tokenizer.ggml.merges")
    if merges is None:
        raise GGUFError(f"{gf.path.name}: cannot find tokenizer merges in model file")
    text = getattr(merges, "text", None)
    if text is not None:  # bulk form (infr.gguf_meta.StrArray): the same rule as one regex pass
        return _MERGE_RE.findall(text)
    out = []
    for m in merges:
        cut = m.find(" ", 1)  # a merge's first half may itself be a space
        out.append((m[:cut], m[cut + 1 :]) if cut > 0 else ("", ""))
    return [p for p in out if p[0]]


# A merge "a b": `a` runs to the first space after its first character (which may be a space).
# On a StrArray's text each entry follows 8 NULs and holds none.
_MERGE_RE = re.compile("\x00{8}([^\x00][^ \x00]*) ([^\x00]*)")


def spm_merges(gf, tokens: Sequence[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """`_merges_from_scores`, through infr.tokenizer_cache for large vocabularies."""
    paths = getattr(gf, "paths", None)
    if len(tokens) < tokenizer_cache.MIN_TOKENS or not paths:
        return _merges_from_scores(gf, tokens, vocab)
    pairs = tokenizer_cache.load(paths[0], len(tokens))  # the first shard holds the vocabulary
    if pairs is not None:
        get = tokens.__getitem__
        return list(zip(map(get, pairs[:, 0].tolist()), map(get, pairs[:, 1].tolist())))
    merges = _merges_from_scores(gf, tokens, vocab)
    ids = np.fromiter((vocab[t] for pair in merges for t in pair), dtype=np.int32, count=2 * len(merges))
    tokenizer_cache.save(paths[0], len(tokens), ids.reshape(-1, 2))
    return merges


def _merges_from_scores(gf, tokens: Sequence[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of every token into two tokens, best-scored token first.

    llama.cpp's SPM merges adjacent symbols whose concatenation is a token,
    highest score first; as BPE ranks that is exactly this list.
    """
    scores = gf.get("tokenizer.ggml.scores")
    scores = np.zeros(len(tokens)) if scores is None else np.asarray(scores, dtype=np.float64)[: len(tokens)]
    order = np.lexsort((np.arange(len(tokens)), -scores))  # score descending, then id
    if getattr(tokens, "blob", None) is not None:  # bulk form (infr.gguf_meta.StrArray)
        merges = _splits_bulk(tokens, order)
        if merges is not None:
            return merges
    merges = []
    for i in order.tolist():
        t = tokens[i]
        for k in range(1, len(t)):
            a = t[:k]
            if a in vocab:
                b = t[k:]
                if b in vocab:
                    merges.append((a, b))
    return merges


# Polynomial hashes of byte strings, mod 2**64: h(s) = sum s[j] * B**j.
_HASH_BASE = 0x9E3779B97F4A7C15  # odd, so invertible mod 2**64
_HASH_INV = pow(_HASH_BASE, -1, 1 << 64)


def _powers(base: int, n: int) -> np.ndarray:
    out = np.empty(n + 1, dtype=np.uint64)
    out[0] = 1
    out[1:] = base
    return np.cumprod(out, out=out)  # wraps mod 2**64, as wanted


def _splits_bulk(tokens, order: np.ndarray) -> list[tuple[str, str]] | None:
    """`_merges_from_scores`'s loop on all tokens at once (Gemma 3's 262k tokens, the 2 cores
    shared with other work: 3.1 s in the loop, 2.4 s here; infr.tokenizer_cache then keeps it).

    Every split point of every token (a character boundary: not a UTF-8
    continuation byte) is hashed as prefix and suffix and looked up among the
    tokens' hashes. Hashes only propose: each proposed pair is checked to
    spell its token exactly, and any doubt (two tokens with one hash, a check
    that fails) returns None so the loop decides. Same pairs, same order.
    """
    blob, lens = tokens.blob, tokens.lens
    n = len(tokens)
    if len(lens) != n or not lens.all():
        return None
    with np.errstate(over="ignore"):
        text = blob[blob != 0]  # the tokens' bytes back to back: a StrArray's strings hold no NUL
        if len(text) != int(lens.sum()):
            return None
        first = (np.cumsum(lens) - lens).astype(np.int32)  # each token's first byte in `text`
        tok = np.repeat(np.arange(n, dtype=np.int32), lens)  # each byte's token
        at = np.arange(len(text), dtype=np.int32) - first[tok]  # each byte's place in its token
        prefix = _powers(_HASH_BASE, int(lens.max()))[at]
        prefix *= text
        np.cumsum(prefix, out=prefix)
        base = np.zeros(n, dtype=np.uint64)
        base[1:] = prefix[first[1:] - 1]
        prefix -= base[tok]  # prefix[i]: hash of its token's bytes up to and including i
        whole = prefix[first + lens.astype(np.int32) - 1]
        by_hash = np.argsort(whole)
        sorted_hash = whole[by_hash]
        if (sorted_hash[1:] == sorted_hash[:-1]).any():
            return None

        def lookup(h: np.ndarray) -> np.ndarray:
            i = np.minimum(np.searchsorted(sorted_hash, h), n - 1)
            return np.where(sorted_hash[i] == h, by_hash[i], -1)

        cut = np.flatnonzero((at > 0) & ((text & 0xC0) != 0x80))  # split before byte `cut`
        tid = tok[cut]
        head = prefix[cut - 1]
        a = lookup(head)
        hit = a >= 0
        cut, tid, head, a = cut[hit], tid[hit], head[hit], a[hit]
        tail = (whole[tid] - head) * _powers(_HASH_INV, int(lens.max()))[at[cut]]
        b = lookup(tail)
        hit = b >= 0
        tid, a, b = tid[hit], a[hit], b[hit]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    by_rank = np.argsort(rank[tid], kind="stable")  # best token first, its cuts left to right
    tid, a, b = tid[by_rank].tolist(), a[by_rank].tolist(), b[by_rank].tolist()
    get = tokens.__getitem__
    left, right = list(map(get, a)), list(map(get, b))
    if list(map(operator.add, left, right)) != list(map(get, tid)):
        return None
    return list(zip(left, right))
